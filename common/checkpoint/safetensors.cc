#include "stratum/checkpoint/safetensors.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "stratum/util/json_depth.h"
#include "stratum/util/process_info.h"

namespace stratum {
namespace {

const char* SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
    case DType::kUInt8:
      return "U8";
  }
  return "?";
}

std::optional<DType> FromSafetensorsDType(const std::string& name) {
  for (DType dtype : {DType::kFloat32, DType::kInt32, DType::kInt64, DType::kUInt8}) {
    if (name == SafetensorsDType(dtype)) return dtype;
  }
  return std::nullopt;
}

std::string Folder(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// A failed write: a full disk (or quota, or a read-only one) is the machine's state, which
// a retry meets again until someone acts, so FAILED_PRECONDITION with the fix; other I/O
// errors INTERNAL.
absl::Status WriteFailed(const std::string& path, int error) {
  const std::string what = absl::StrCat("cannot write ", path, ": ", std::strerror(error));
  if (error == ENOSPC || error == EDQUOT || error == EROFS) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " (free space on its disk, or write it to another one)"));
  }
  return absl::InternalError(what);
}

// A file descriptor closed when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// `path` relative to the folder `within` ("." for the folder itself): lexically, or else
// with both resolved (a folder given through a link); nullopt when it is not in it.
std::optional<std::filesystem::path> RelativeBelow(const std::string& path,
                                                   const std::string& within) {
  namespace fs = std::filesystem;
  std::error_code error;
  for (bool resolved : {false, true}) {
    fs::path root = fs::absolute(within, error).lexically_normal();
    fs::path target = fs::absolute(path, error).lexically_normal();
    if (resolved) {
      root = fs::weakly_canonical(root, error);
      target = fs::weakly_canonical(target, error);
    }
    if (error) return std::nullopt;
    const fs::path relative = target.lexically_relative(root);
    if (!relative.empty() && *relative.begin() != "..") return relative;  // "." is the folder
  }
  return std::nullopt;
}

// Opens `relative` (a file, or a folder with O_DIRECTORY) beneath the folder open as
// `root`: errno, as open(2) would set it, on failure (EXDEV for an escape).
int OpenBeneath(int root, const std::filesystem::path& relative, uint64_t flags, uint64_t mode) {
  open_how how{};
  how.flags = flags;
  how.mode = mode;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    const long fd = syscall(SYS_openat2, root, relative.c_str(), &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != EINTR && errno != EAGAIN) return -1;
  }
}

// Opens `path` for `flags`: beneath `confinement.within` when set, else as open(2) does.
// -1 with errno on failure; a path outside the folder sets EXDEV.
int OpenConfined(const std::string& path, int flags, mode_t mode, const Confinement& confinement) {
  if (confinement.within.empty()) return open(path.c_str(), flags, mode);
  const std::optional<std::filesystem::path> relative = RelativeBelow(path, confinement.within);
  if (!relative) {
    errno = EXDEV;
    return -1;
  }
  const int root = open(confinement.within.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) return -1;
  const int fd = OpenBeneath(root, *relative, static_cast<uint64_t>(flags), mode);
  const int error = errno;  // the open's, kept across the close
  close(root);
  errno = error;
  return fd;
}

// The error of an open refused by its confinement, or nullopt for another errno.
std::optional<absl::Status> Escaped(const std::string& path, const Confinement& confinement,
                                    int error) {
  if (confinement.within.empty() || error != EXDEV) return std::nullopt;
  return absl::PermissionDeniedError(absl::StrCat(
      path, " is refused: it leads out of the folder ", confinement.within,
      " (through .., or a link), the only place this server writes and reads these files"));
}

}  // namespace

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what,
                                          const Confinement& confinement) {
  const std::string named = what.empty() ? path : absl::StrCat(what, " ", path);
  // O_NONBLOCK: opening a FIFO in a checkpoint file's place must not wait for a writer (a
  // blocked open would also outlive SIGTERM); it is refused below as not a regular file.
  const int fd = OpenConfined(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0, confinement);
  if (fd < 0) {
    if (std::optional<absl::Status> escaped = Escaped(named, confinement, errno)) return *escaped;
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(named, " is missing"));
    return absl::DataLossError(absl::StrCat("cannot read ", named, ": ", std::strerror(errno)));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    return absl::DataLossError(absl::StrCat(
        "cannot read ", named, ": ",
        S_ISDIR(info.st_mode) ? "it is a folder, not a file" : "it is not a regular file"));
  }
  std::string bytes;
  bytes.reserve(static_cast<size_t>(info.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::DataLossError(absl::StrCat("cannot read ", named, ": ", std::strerror(error)));
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return bytes;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text,
                                 const Confinement& confinement) {
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string temporary = absl::StrCat(name, ".tmp.", getpid());
  // The folder, opened once (beneath `within` when confined): the temporary file, the
  // rename and the sync all happen in it, whatever changes on the path meanwhile.
  const Fd folder(OpenConfined(Folder(path), O_PATH | O_DIRECTORY | O_CLOEXEC, 0, confinement));
  // O_NOFOLLOW: never written through a link planted at the temporary name.
  const int fd = folder.get() < 0
                     ? -1
                     : openat(folder.get(), temporary.c_str(),
                              O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    if (std::optional<absl::Status> escaped = Escaped(path, confinement, errno)) return *escaped;
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", path, ": ",
                                                      std::strerror(errno),
                                                      "; check that its folder exists and is "
                                                      "writable"));
  }
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      close(fd);
      unlinkat(folder.get(), temporary.c_str(), 0);
      return WriteFailed(path, error);
    }
    written += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0 ||
      renameat(folder.get(), temporary.c_str(), folder.get(), name.c_str()) != 0) {
    const int error = errno;
    unlinkat(folder.get(), temporary.c_str(), 0);
    return WriteFailed(path, error);
  }
  // The rename itself is durable only once the folder is synced (best effort: a folder
  // this user may write but not read cannot be).
  const Fd readable(openat(folder.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (readable.get() >= 0) fsync(readable.get());
  // Those of writers killed between their write and their rename.
  RemoveLeftoversOfDeadProcesses(Folder(path), absl::StrCat(name, ".tmp."));
  return absl::OkStatus();
}

absl::StatusOr<WrittenFile> WriteSafetensors(const std::string& path, const TensorFile& file,
                                             const Confinement& confinement) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    header[name] = {{"dtype", SafetensorsDType(tensor.dtype())},
                    {"shape", tensor.shape().dims()},
                    {"data_offsets", {offset, offset + tensor.byte_size()}}};
    offset += tensor.byte_size();
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // aligned data, as the spec allows
  std::string bytes;
  bytes.reserve(8 + header_text.size() + offset);
  const uint64_t length = header_text.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  bytes += header_text;
  for (const auto& [name, tensor] : file.tensors) {
    bytes.append(static_cast<const char*>(tensor.raw_data()), tensor.byte_size());
  }
  if (absl::Status status = WriteFileAtomically(path, bytes, confinement); !status.ok()) {
    return status;
  }
  WrittenFile written;
  written.crc32 = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
  written.bytes = static_cast<int64_t>(bytes.size());
  return written;
}

absl::StatusOr<TensorFile> ReadSafetensors(const std::string& path,
                                           std::optional<uint32_t> expected_crc32,
                                           const Confinement& confinement) {
  absl::StatusOr<std::string> read = ReadWholeFile(path, "checkpoint file", confinement);
  if (!read.ok()) return read.status();
  const std::string& bytes = *read;
  auto corrupt = [&](const std::string& problem) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is corrupt: ", problem,
                                            "; restore an older checkpoint"));
  };
  if (expected_crc32.has_value()) {
    const uint32_t actual = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
    if (actual != *expected_crc32) {
      return corrupt(
          absl::StrCat("its checksum is ", actual, " but the manifest says ", *expected_crc32));
    }
  }
  if (bytes.size() < 8) return corrupt("it is shorter than its 8-byte header length");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (length > bytes.size() - 8) return corrupt("its header runs past the end of the file");
  const absl::string_view header_text(bytes.data() + 8, length);
  if (JsonNestingDepth(header_text) > kMaxJsonDepth) return corrupt("its header nests too deep");
  const nlohmann::json header =
      nlohmann::json::parse(header_text.begin(), header_text.end(), nullptr,
                            /*allow_exceptions=*/false);
  if (!header.is_object()) return corrupt("its header is not a JSON object");
  const size_t data_start = 8 + length;
  TensorFile file;
  std::vector<std::pair<uint64_t, std::pair<std::string, Tensor>>> ordered;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return corrupt("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (value.is_string()) file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      return corrupt(absl::StrCat("tensor \"", name, "\" has no dtype, shape or data_offsets"));
    }
    const std::optional<DType> dtype = FromSafetensorsDType(entry["dtype"].get<std::string>());
    if (!dtype) return corrupt(absl::StrCat("tensor \"", name, "\" has an unsupported dtype"));
    std::vector<int64_t> dims;
    for (const auto& dim : entry["shape"]) {
      if (!dim.is_number_unsigned())
        return corrupt(absl::StrCat("tensor \"", name, "\" has a bad shape"));
      dims.push_back(dim.get<int64_t>());
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return corrupt(absl::StrCat("tensor \"", name, "\" has bad data_offsets"));
    }
    const uint64_t begin = offsets[0], end = offsets[1];
    Tensor tensor(*dtype, Shape(dims));
    if (end < begin || end - begin != tensor.byte_size() || data_start + end > bytes.size()) {
      return corrupt(absl::StrCat("tensor \"", name, "\" ", tensor.DebugString(),
                                  " does not match its byte range"));
    }
    if (tensor.byte_size() > 0) {
      std::memcpy(tensor.raw_data(), bytes.data() + data_start + begin, tensor.byte_size());
    }
    ordered.push_back({begin, {name, std::move(tensor)}});
  }
  std::sort(ordered.begin(), ordered.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [offset, entry] : ordered) file.tensors.push_back(std::move(entry));
  return file;
}

}  // namespace stratum
