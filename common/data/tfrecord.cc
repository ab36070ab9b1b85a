#include "stratum/data/tfrecord.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "input_stream.h"
#include "stratum/data/crc32c.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

constexpr size_t kHeaderBytes = 12;  // length and its CRC
constexpr size_t kFooterBytes = 4;   // the data's CRC
constexpr size_t kReadBlock = size_t{256} << 10;

uint64_t LoadU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // TFRecord is little-endian, as every host Stratum builds for
  return v;
}

uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void StoreU64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
void StoreU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }

}  // namespace

absl::StatusOr<Compression> CompressionFromName(absl::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  if (upper.empty() || upper == "NONE") return Compression::kNone;
  if (upper == "GZIP") return Compression::kGzip;
  if (upper == "ZLIB") return Compression::kZlib;
  return absl::InvalidArgumentError(absl::StrCat("unknown compression_type \"", name,
                                                 "\": use \"\" (none), \"GZIP\" or \"ZLIB\""));
}

const char* CompressionName(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return "uncompressed";
    case Compression::kGzip:
      return "GZIP";
    case Compression::kZlib:
      return "ZLIB";
  }
  return "?";
}

// ---- reader ----

absl::StatusOr<std::unique_ptr<TFRecordReader>> TFRecordReader::Open(const std::string& path,
                                                                     Compression compression) {
  STRATUM_ASSIGN_OR_RETURN(auto stream, data_internal::InputStream::Open(path, compression));
  return std::unique_ptr<TFRecordReader>(
      new TFRecordReader(std::move(stream), compression != Compression::kNone));
}

TFRecordReader::TFRecordReader(std::unique_ptr<data_internal::InputStream> stream, bool compressed)
    : stream_(std::move(stream)), buffer_(kReadBlock, '\0'), compressed_(compressed) {}

TFRecordReader::~TFRecordReader() = default;

const std::string& TFRecordReader::path() const { return stream_->path(); }

absl::Status TFRecordReader::Damaged(absl::string_view what) const {
  return absl::DataLossError(
      absl::StrCat(stream_->path(), ": the record at byte offset ", record_offset_,
                   compressed_ ? " of the uncompressed stream" : "", " is damaged: ", what,
                   ": replace the file (in a job, \"ignore_errors\": true skips the rest of it)"));
}

absl::StatusOr<bool> TFRecordReader::Fill(size_t size, absl::string_view what) {
  if (end_ - begin_ >= size) return true;
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    consumed_ += begin_;
    end_ -= begin_;
    begin_ = 0;
  }
  if (buffer_.size() < size) buffer_.resize(size);
  while (end_ < size) {
    // Read in large blocks, but never more than the buffer holds.
    STRATUM_ASSIGN_OR_RETURN(const size_t got,
                             stream_->Read(buffer_.data() + end_, buffer_.size() - end_));
    if (got == 0) {
      if (end_ == 0) return false;
      return Damaged(absl::StrCat("the file ends inside its ", what, " (", end_,
                                  " bytes of the record's ", size,
                                  " are there): the file is truncated"));
    }
    end_ += got;
  }
  return true;
}

absl::StatusOr<std::optional<absl::string_view>> TFRecordReader::Next() {
  record_offset_ = consumed_ + begin_;
  STRATUM_ASSIGN_OR_RETURN(const bool more, Fill(kHeaderBytes, "header"));
  if (!more) return std::nullopt;
  const char* header = buffer_.data() + begin_;
  const uint64_t length = LoadU64(header);
  if (MaskCrc32c(Crc32c(header, 8)) != LoadU32(header + 8)) {
    // A compressed file read as uncompressed fails here first: say so.
    if (record_offset_ == 0 && !compressed_ && static_cast<unsigned char>(header[0]) == 0x1f &&
        static_cast<unsigned char>(header[1]) == 0x8b) {
      return absl::DataLossError(
          absl::StrCat(stream_->path(),
                       " starts like a GZIP file, not a TFRecord: set compression_type \"GZIP\""));
    }
    return Damaged("its length's CRC32C does not match");
  }
  if (length > kMaxTFRecordBytes) {
    return Damaged(absl::StrCat("it declares ", length, " bytes, more than the ", kMaxTFRecordBytes,
                                " Stratum reads"));
  }
  const size_t whole = kHeaderBytes + static_cast<size_t>(length) + kFooterBytes;
  // A length beyond the end of an uncompressed file is refused before its buffer is made.
  if (!compressed_ && record_offset_ + whole > stream_->file_size()) {
    return Damaged(absl::StrCat("it declares ", length, " bytes of data, but the file ends ",
                                stream_->file_size() - record_offset_,
                                " bytes after its start: the file is truncated"));
  }
  STRATUM_ASSIGN_OR_RETURN(const bool have, Fill(whole, "data"));
  if (!have) return Damaged("the file ends after its header");
  const char* data = buffer_.data() + begin_ + kHeaderBytes;
  if (MaskCrc32c(Crc32c(data, length)) != LoadU32(data + length)) {
    return Damaged("its data's CRC32C does not match");
  }
  begin_ += whole;
  return absl::string_view(data, length);
}

absl::StatusOr<int64_t> CountTFRecords(const std::string& path, Compression compression) {
  STRATUM_ASSIGN_OR_RETURN(auto reader, TFRecordReader::Open(path, compression));
  int64_t count = 0;
  while (true) {
    STRATUM_ASSIGN_OR_RETURN(const auto record, reader->Next());
    if (!record) return count;
    ++count;
  }
}

// ---- writer ----

struct TFRecordWriter::Deflater {
  z_stream zs{};
  ~Deflater() { deflateEnd(&zs); }
};

absl::StatusOr<std::unique_ptr<TFRecordWriter>> TFRecordWriter::Open(const std::string& path,
                                                                     Compression compression) {
  std::string temp = absl::StrCat(path, ".tmp-", ::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", temp));
  auto writer =
      std::unique_ptr<TFRecordWriter>(new TFRecordWriter(path, std::move(temp), fd, compression));
  if (compression != Compression::kNone) {
    writer->deflater_ = std::make_unique<Deflater>();
    const int window = compression == Compression::kGzip ? 15 + 16 : 15;
    if (deflateInit2(&writer->deflater_->zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot start compressing ", path));
    }
  }
  return writer;
}

TFRecordWriter::TFRecordWriter(std::string path, std::string temp_path, int fd,
                               Compression compression)
    : path_(std::move(path)),
      temp_path_(std::move(temp_path)),
      fd_(fd),
      compression_(compression) {}

TFRecordWriter::~TFRecordWriter() {
  if (closed_) return;
  ::close(fd_);
  ::unlink(temp_path_.c_str());
}

absl::Status TFRecordWriter::FlushOut() {
  size_t done = 0;
  while (done < out_.size()) {
    const ssize_t wrote = ::write(fd_, out_.data() + done, out_.size() - done);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", temp_path_));
    }
    done += static_cast<size_t>(wrote);
  }
  out_.clear();
  return absl::OkStatus();
}

absl::Status TFRecordWriter::WriteBytes(const char* data, size_t size, bool finish) {
  if (!deflater_) {
    out_.append(data, size);
  } else {
    z_stream& zs = deflater_->zs;
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
    zs.avail_in = static_cast<uInt>(size);
    char chunk[1 << 16];
    while (true) {
      zs.next_out = reinterpret_cast<Bytef*>(chunk);
      zs.avail_out = sizeof(chunk);
      const int rc = deflate(&zs, finish ? Z_FINISH : Z_NO_FLUSH);
      if (rc == Z_STREAM_ERROR) return absl::InternalError("deflate failed");
      out_.append(chunk, sizeof(chunk) - zs.avail_out);
      if (finish ? rc == Z_STREAM_END : (zs.avail_in == 0 && zs.avail_out != 0)) break;
    }
  }
  if (out_.size() >= kReadBlock || finish) return FlushOut();
  return absl::OkStatus();
}

absl::Status TFRecordWriter::Write(absl::string_view record) {
  if (closed_) return absl::FailedPreconditionError("the TFRecordWriter is closed");
  char header[kHeaderBytes];
  StoreU64(header, record.size());
  StoreU32(header + 8, MaskCrc32c(Crc32c(header, 8)));
  char footer[kFooterBytes];
  StoreU32(footer, MaskCrc32c(Crc32c(record.data(), record.size())));
  STRATUM_RETURN_IF_ERROR(WriteBytes(header, sizeof(header), false));
  STRATUM_RETURN_IF_ERROR(WriteBytes(record.data(), record.size(), false));
  return WriteBytes(footer, sizeof(footer), false);
}

absl::Status TFRecordWriter::Close() {
  if (closed_) return absl::OkStatus();
  STRATUM_RETURN_IF_ERROR(WriteBytes(nullptr, 0, true));
  if (::fsync(fd_) != 0)
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot sync ", temp_path_));
  if (::close(fd_) != 0) {
    closed_ = true;
    ::unlink(temp_path_.c_str());
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot close ", temp_path_));
  }
  closed_ = true;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp_path_.c_str());
    return absl::ErrnoToStatus(error, absl::StrCat("cannot rename ", temp_path_, " to ", path_));
  }
  return absl::OkStatus();
}

}  // namespace stratum
