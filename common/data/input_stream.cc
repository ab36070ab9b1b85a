#include "input_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stratum::data_internal {
namespace {

constexpr size_t kCompressedBlock = size_t{1} << 20;

}  // namespace

struct InputStream::Inflater {
  z_stream zs{};
  std::vector<unsigned char> in = std::vector<unsigned char>(kCompressedBlock);
  bool file_ended = false;
  bool stream_ended = false;
  uint64_t compressed_read = 0;
  ~Inflater() { inflateEnd(&zs); }
};

absl::StatusOr<std::unique_ptr<InputStream>> InputStream::Open(const std::string& path,
                                                               Compression compression) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file: check the path"));
    }
    return absl::ErrnoToStatus(error, absl::StrCat("cannot open ", path));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file (a folder, FIFO or device): give a data file"));
  }
  auto stream = std::unique_ptr<InputStream>(
      new InputStream(path, fd, compression, static_cast<uint64_t>(info.st_size)));
  if (compression != Compression::kNone) {
    stream->inflater_ = std::make_unique<Inflater>();
    // 15: the largest window; +16 reads a gzip header and trailer instead of zlib's.
    const int window = compression == Compression::kGzip ? 15 + 16 : 15;
    if (inflateInit2(&stream->inflater_->zs, window) != Z_OK) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot start inflating ", path));
    }
  }
  return stream;
}

InputStream::InputStream(std::string path, int fd, Compression compression, uint64_t file_size)
    : path_(std::move(path)), fd_(fd), compression_(compression), file_size_(file_size) {}

InputStream::~InputStream() { ::close(fd_); }

absl::Status InputStream::ErrnoError(const char* what) const {
  return absl::ErrnoToStatus(errno, absl::StrCat("cannot ", what, " ", path_));
}

absl::StatusOr<size_t> InputStream::ReadFile(char* out, size_t size) {
  while (true) {
    const ssize_t got = ::read(fd_, out, size);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno != EINTR) return ErrnoError("read");
  }
}

absl::StatusOr<size_t> InputStream::Read(char* out, size_t size) {
  if (size == 0) return size_t{0};
  if (!inflater_) {
    absl::StatusOr<size_t> got = ReadFile(out, size);
    if (got.ok()) position_ += *got;
    return got;
  }
  Inflater& inf = *inflater_;
  z_stream& zs = inf.zs;
  zs.next_out = reinterpret_cast<Bytef*>(out);
  zs.avail_out = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
  const uInt wanted = zs.avail_out;
  while (zs.avail_out == wanted) {
    if (zs.avail_in == 0 && !inf.file_ended) {
      absl::StatusOr<size_t> got = ReadFile(reinterpret_cast<char*>(inf.in.data()), inf.in.size());
      if (!got.ok()) return got.status();
      inf.file_ended = *got == 0;
      inf.compressed_read += *got;
      zs.next_in = inf.in.data();
      zs.avail_in = static_cast<uInt>(*got);
    }
    if (inf.stream_ended) {
      if (zs.avail_in == 0 && inf.file_ended) break;
      // Another gzip member follows (gzip streams may be concatenated); zlib has one.
      if (compression_ != Compression::kGzip) {
        return absl::DataLossError(
            absl::StrCat(path_, ": bytes after the end of its ZLIB stream, at compressed offset ",
                         inf.compressed_read - zs.avail_in, ": the file is damaged or not ZLIB"));
      }
      if (zs.avail_in == 0) continue;
      inflateReset(&zs);
      inf.stream_ended = false;
    }
    // An empty file is an empty stream (TensorFlow reads no records from it either).
    if (zs.avail_in == 0 && inf.file_ended && inf.compressed_read == 0) break;
    if (zs.avail_in == 0 && inf.file_ended) {
      return absl::DataLossError(
          absl::StrCat(path_, " ends inside its ", CompressionName(compression_), " stream (after ",
                       inf.compressed_read, " compressed bytes): the file is truncated"));
    }
    const int rc = inflate(&zs, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      inf.stream_ended = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return absl::DataLossError(absl::StrCat(
          path_, ": corrupt ", CompressionName(compression_), " stream near compressed offset ",
          inf.compressed_read - zs.avail_in, " (", zs.msg != nullptr ? zs.msg : "inflate failed",
          "): check compression_type, or replace the file"));
    }
  }
  const size_t produced = wanted - zs.avail_out;
  position_ += produced;
  return produced;
}

}  // namespace stratum::data_internal
