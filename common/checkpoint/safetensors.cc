#include "stratum/checkpoint/safetensors.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "stratum/util/json_depth.h"
#include "stratum/util/process_info.h"
#include "stratum/util/status_macros.h"

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

// Opens `path` to read, as a regular file, and says its size: NOT_FOUND when there is
// none; DATA_LOSS naming it (`named`) when it is no regular file or cannot be opened.
absl::StatusOr<int> OpenForReading(const std::string& path, const std::string& named,
                                   const Confinement& confinement, uint64_t& size) {
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
  size = static_cast<uint64_t>(info.st_size);
  return fd;
}

// Up to `size` bytes at `offset` into `data`: how many there were before the end of the
// file. DATA_LOSS naming the file (`named`) on an I/O error.
absl::StatusOr<size_t> ReadAt(int fd, void* data, size_t size, off_t offset,
                              const std::string& named) {
  char* bytes = static_cast<char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pread(fd, bytes + done, std::min<size_t>(size - done, 1 << 30),
                            offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return absl::DataLossError(absl::StrCat("cannot read ", named, ": ", std::strerror(errno)));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// crc32 of `size` bytes, continuing `crc`, in parts that zlib's 32-bit length takes.
uint32_t Crc32(uint32_t crc, const void* data, size_t size) {
  const auto* bytes = static_cast<const Bytef*>(data);
  while (size > 0) {
    const size_t part = std::min<size_t>(size, size_t{1} << 30);
    crc = static_cast<uint32_t>(crc32(crc, bytes, static_cast<uInt>(part)));
    bytes += part;
    size -= part;
  }
  return crc;
}

// A number for each writer this process starts.
uint64_t NextWriter() {
  static std::atomic<uint64_t> writers{0};
  return writers.fetch_add(1, std::memory_order_relaxed);
}

// A file written under a temporary name in its folder and renamed into place by Commit
// (after an fsync; the folder synced after), so that a crash never leaves half a file
// under the final name. Destroyed before Commit, it leaves nothing.
class AtomicFile {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFile>> Open(const std::string& path,
                                                          const Confinement& confinement) {
    const size_t slash = path.rfind('/');
    auto file = std::unique_ptr<AtomicFile>(new AtomicFile(
        path, slash == std::string::npos ? path : path.substr(slash + 1), confinement));
    if (file->fd_ < 0) {
      if (std::optional<absl::Status> escaped = Escaped(path, confinement, file->open_error_)) {
        return *escaped;
      }
      return absl::FailedPreconditionError(absl::StrCat("cannot write ", path, ": ",
                                                        std::strerror(file->open_error_),
                                                        "; check that its folder exists and is "
                                                        "writable"));
    }
    return file;
  }
  ~AtomicFile() {
    if (fd_ >= 0) close(fd_);
    if (!committed_ && folder_.get() >= 0) unlinkat(folder_.get(), temporary_.c_str(), 0);
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // `size` bytes at the end of what is written so far.
  absl::Status Append(const void* data, size_t size) {
    return WriteAt(data, size, static_cast<off_t>(end_));
  }
  // `size` bytes at `offset` (bytes before the end are overwritten; beyond it, the gap
  // reads as zeros).
  absl::Status WriteAt(const void* data, size_t size, off_t offset) {
    const char* bytes = static_cast<const char*>(data);
    size_t written = 0;
    while (written < size) {
      const ssize_t n = pwrite(fd_, bytes + written, std::min<size_t>(size - written, 1 << 30),
                               offset + static_cast<off_t>(written));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return WriteFailed(path_, n < 0 ? errno : EIO);
      written += static_cast<size_t>(n);
    }
    end_ = std::max<uint64_t>(end_, static_cast<uint64_t>(offset) + size);
    return absl::OkStatus();
  }
  uint64_t size() const { return end_; }
  // fsync, rename over the final name, fsync of the folder.
  absl::Status Commit() {
    const int fd = std::exchange(fd_, -1);
    if (fsync(fd) != 0 || close(fd) != 0 ||
        renameat(folder_.get(), temporary_.c_str(), folder_.get(), name_.c_str()) != 0) {
      return WriteFailed(path_, errno);
    }
    committed_ = true;
    // The rename itself is durable only once the folder is synced (best effort: a folder
    // this user may write but not read cannot be).
    const Fd readable(openat(folder_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (readable.get() >= 0) fsync(readable.get());
    // Those of writers killed between their write and their rename.
    RemoveLeftoversOfDeadProcesses(Folder(path_), absl::StrCat(name_, ".tmp."));
    return absl::OkStatus();
  }

 private:
  AtomicFile(std::string path, std::string name, const Confinement& confinement)
      : path_(std::move(path)),
        name_(std::move(name)),
        // Unique to this writer (writers of one path in one process, such as a save retried
        // while the first still runs, never share a file); the pid last, which the removal
        // of dead writers' leftovers reads.
        temporary_(absl::StrCat(name_, ".tmp.", NextWriter(), ".", getpid())),
        // The folder, opened once (beneath `within` when confined): the temporary file,
        // the rename and the sync all happen in it, whatever changes on the path meanwhile.
        folder_(OpenConfined(Folder(path_), O_PATH | O_DIRECTORY | O_CLOEXEC, 0, confinement)) {
    open_error_ = errno;
    if (folder_.get() < 0) return;
    // O_NOFOLLOW: never written through a link planted at the temporary name.
    fd_ = openat(folder_.get(), temporary_.c_str(),
                 O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    open_error_ = errno;
  }

  const std::string path_, name_, temporary_;
  const Fd folder_;
  int fd_ = -1;
  int open_error_ = 0;
  uint64_t end_ = 0;
  bool committed_ = false;
};

// The safetensors header for `entries` at consecutive offsets and `metadata`, padded with
// spaces to a multiple of 8 (aligned data, as the spec allows) and at least `min_bytes`.
std::string HeaderText(const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata, uint64_t min_bytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& entry : entries) {
    const uint64_t bytes =
        static_cast<uint64_t>(entry.shape.num_elements()) * DTypeSize(entry.dtype);
    header[entry.name] = {{"dtype", SafetensorsDType(entry.dtype)},
                          {"shape", entry.shape.dims()},
                          {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append(std::max<uint64_t>(text.size(), min_bytes) - text.size(), ' ');
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what,
                                          const Confinement& confinement) {
  const std::string named = what.empty() ? path : absl::StrCat(what, " ", path);
  uint64_t size = 0;
  STRATUM_ASSIGN_OR_RETURN(const int opened, OpenForReading(path, named, confinement, size));
  const Fd fd(opened);
  std::string bytes(size, '\0');
  STRATUM_ASSIGN_OR_RETURN(size_t read, ReadAt(fd.get(), bytes.data(), size, 0, named));
  bytes.resize(read);
  // To its end: a file that grew meanwhile, or says no size (as /proc's do), is read whole.
  char part[1 << 16];
  for (;;) {
    STRATUM_ASSIGN_OR_RETURN(
        read, ReadAt(fd.get(), part, sizeof part, static_cast<off_t>(bytes.size()), named));
    if (read == 0) return bytes;
    bytes.append(part, read);
  }
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text,
                                 const Confinement& confinement) {
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Open(path, confinement));
  STRATUM_RETURN_IF_ERROR(file->Append(text.data(), text.size()));
  return file->Commit();
}

uint64_t SafetensorsHeaderBytes(const std::vector<SafetensorsEntry>& entries,
                                const std::map<std::string, std::string>& metadata) {
  return HeaderText(entries, metadata, 0).size();
}

struct SafetensorsWriter::State {
  std::unique_ptr<AtomicFile> file;
  uint64_t header_bytes = 0;
  std::vector<SafetensorsEntry> entries;
  uint32_t data_crc32 = 0;
};

SafetensorsWriter::SafetensorsWriter(std::unique_ptr<State> state) : state_(std::move(state)) {}
SafetensorsWriter::~SafetensorsWriter() = default;

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Open(
    const std::string& path, uint64_t header_bytes, const Confinement& confinement) {
  auto state = std::make_unique<State>();
  STRATUM_ASSIGN_OR_RETURN(state->file, AtomicFile::Open(path, confinement));
  state->header_bytes = (header_bytes + 7) / 8 * 8;
  return std::unique_ptr<SafetensorsWriter>(new SafetensorsWriter(std::move(state)));
}

absl::Status SafetensorsWriter::Add(const std::string& name, const Tensor& tensor) {
  State& state = *state_;
  const uint64_t data_start = 8 + state.header_bytes;
  STRATUM_RETURN_IF_ERROR(
      state.file->WriteAt(tensor.raw_data(), tensor.byte_size(),
                          static_cast<off_t>(std::max<uint64_t>(state.file->size(), data_start))));
  state.data_crc32 = Crc32(state.data_crc32, tensor.raw_data(), tensor.byte_size());
  state.entries.push_back({name, tensor.dtype(), tensor.shape()});
  return absl::OkStatus();
}

absl::StatusOr<WrittenFile> SafetensorsWriter::Finish(
    const std::map<std::string, std::string>& metadata) {
  State& state = *state_;
  std::string header = HeaderText(state.entries, metadata, state.header_bytes);
  if (header.size() != state.header_bytes) {
    return absl::InternalError(absl::StrCat(
        "the header of ", state.entries.size(), " tensors takes ", header.size(),
        " bytes, more than the ", state.header_bytes, " kept for it: keep more room at Open"));
  }
  std::string start(8, '\0');
  for (int i = 0; i < 8; ++i)
    start[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  start += header;
  STRATUM_RETURN_IF_ERROR(state.file->WriteAt(start.data(), start.size(), 0));
  const uint64_t data_bytes = state.file->size() - start.size();
  WrittenFile written;
  written.crc32 = static_cast<uint32_t>(crc32_combine(
      Crc32(0, start.data(), start.size()), state.data_crc32, static_cast<z_off_t>(data_bytes)));
  written.bytes = static_cast<int64_t>(state.file->size());
  STRATUM_RETURN_IF_ERROR(state.file->Commit());
  return written;
}

absl::StatusOr<WrittenFile> WriteSafetensors(const std::string& path, const TensorFile& file,
                                             const Confinement& confinement) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, tensor] : file.tensors) {
    entries.push_back({name, tensor.dtype(), tensor.shape()});
  }
  STRATUM_ASSIGN_OR_RETURN(
      std::unique_ptr<SafetensorsWriter> writer,
      SafetensorsWriter::Open(path, SafetensorsHeaderBytes(entries, file.metadata), confinement));
  for (const auto& [name, tensor] : file.tensors) {
    STRATUM_RETURN_IF_ERROR(writer->Add(name, tensor));
  }
  return writer->Finish(file.metadata);
}

struct SafetensorsReader::State {
  std::string path;
  int fd = -1;
  uint64_t data_start = 0;
  std::vector<SafetensorsEntry> entries;
  std::vector<uint64_t> offsets;  // of each entry's bytes, after data_start
  std::map<std::string, std::string> metadata;

  ~State() {
    if (fd >= 0) close(fd);
  }
  absl::Status Corrupt(const std::string& problem) const {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is corrupt: ", problem,
                                            "; restore an older checkpoint"));
  }
  // `bytes` at `offset` of the file into `data`.
  absl::Status ReadExactly(void* data, uint64_t bytes, uint64_t offset) const {
    STRATUM_ASSIGN_OR_RETURN(const size_t read, ReadAt(fd, data, bytes, static_cast<off_t>(offset),
                                                       absl::StrCat("checkpoint file ", path)));
    if (read != bytes) return Corrupt("it ended while it was read (is it being written?)");
    return absl::OkStatus();
  }
};

SafetensorsReader::SafetensorsReader(std::unique_ptr<State> state) : state_(std::move(state)) {}
SafetensorsReader::~SafetensorsReader() = default;
const std::string& SafetensorsReader::path() const { return state_->path; }
const std::vector<SafetensorsEntry>& SafetensorsReader::entries() const { return state_->entries; }
const std::map<std::string, std::string>& SafetensorsReader::metadata() const {
  return state_->metadata;
}

const SafetensorsEntry* SafetensorsReader::Find(const std::string& name) const {
  for (const SafetensorsEntry& entry : state_->entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::string& path, std::optional<uint32_t> expected_crc32,
    const Confinement& confinement) {
  auto state = std::make_unique<State>();
  State& file = *state;
  file.path = path;
  uint64_t size = 0;
  STRATUM_ASSIGN_OR_RETURN(
      file.fd, OpenForReading(path, absl::StrCat("checkpoint file ", path), confinement, size));
  if (expected_crc32.has_value()) {
    std::vector<char> part(std::min<uint64_t>(size, 4 << 20));
    uint32_t actual = 0;
    for (uint64_t offset = 0; offset < size; offset += part.size()) {
      const uint64_t bytes = std::min<uint64_t>(part.size(), size - offset);
      STRATUM_RETURN_IF_ERROR(file.ReadExactly(part.data(), bytes, offset));
      actual = Crc32(actual, part.data(), bytes);
    }
    if (actual != *expected_crc32) {
      return file.Corrupt(
          absl::StrCat("its checksum is ", actual, " but the manifest says ", *expected_crc32));
    }
  }
  if (size < 8) return file.Corrupt("it is shorter than its 8-byte header length");
  unsigned char length_bytes[8];
  STRATUM_RETURN_IF_ERROR(file.ReadExactly(length_bytes, 8, 0));
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(length_bytes[i]) << (8 * i);
  if (length > size - 8) return file.Corrupt("its header runs past the end of the file");
  std::string header_text(length, '\0');
  STRATUM_RETURN_IF_ERROR(file.ReadExactly(header_text.data(), length, 8));
  if (JsonNestingDepth(header_text) > kMaxJsonDepth) {
    return file.Corrupt("its header nests too deep");
  }
  const nlohmann::json header =
      nlohmann::json::parse(header_text.begin(), header_text.end(), nullptr,
                            /*allow_exceptions=*/false);
  if (!header.is_object()) return file.Corrupt("its header is not a JSON object");
  file.data_start = 8 + length;
  std::vector<std::pair<uint64_t, SafetensorsEntry>> ordered;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return file.Corrupt("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (value.is_string()) file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      return file.Corrupt(
          absl::StrCat("tensor \"", name, "\" has no dtype, shape or data_offsets"));
    }
    const std::optional<DType> dtype = FromSafetensorsDType(entry["dtype"].get<std::string>());
    if (!dtype) return file.Corrupt(absl::StrCat("tensor \"", name, "\" has an unsupported dtype"));
    std::vector<int64_t> dims;
    uint64_t elements = 1;
    for (const auto& dim : entry["shape"]) {
      if (!dim.is_number_unsigned()) {
        return file.Corrupt(absl::StrCat("tensor \"", name, "\" has a bad shape"));
      }
      dims.push_back(dim.get<int64_t>());
      // Checked against the file's size before anything is allocated.
      elements = dims.back() == 0 || elements <= size / static_cast<uint64_t>(dims.back())
                     ? elements * static_cast<uint64_t>(dims.back())
                     : size + 1;
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return file.Corrupt(absl::StrCat("tensor \"", name, "\" has bad data_offsets"));
    }
    const uint64_t begin = offsets[0], end = offsets[1];
    if (end < begin || end > size - file.data_start || elements > size ||
        end - begin != elements * DTypeSize(*dtype)) {
      return file.Corrupt(absl::StrCat("tensor \"", name, "\" ", DTypeName(*dtype),
                                       Shape(dims).ToString(), " does not match its byte range"));
    }
    ordered.push_back({begin, {name, *dtype, Shape(dims)}});
  }
  std::sort(ordered.begin(), ordered.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [offset, entry] : ordered) {
    file.offsets.push_back(offset);
    file.entries.push_back(std::move(entry));
  }
  return std::unique_ptr<SafetensorsReader>(new SafetensorsReader(std::move(state)));
}

absl::Status SafetensorsReader::ReadRows(const std::string& name, int64_t first_row,
                                         int64_t num_rows, void* out) const {
  const SafetensorsEntry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint file ", path(), " has no \"", name, "\""));
  }
  const auto index = static_cast<size_t>(entry - state_->entries.data());
  const Shape& shape = entry->shape;
  const int64_t rows = shape.rank() == 0 ? 1 : shape.dim(0);
  if (first_row < 0 || num_rows < 0 || first_row > rows - num_rows) {
    return absl::OutOfRangeError(absl::StrCat(
        "checkpoint file ", path(), " holds \"", name, "\" as ", DTypeName(entry->dtype),
        shape.ToString(), ", which has no rows [", first_row, ", ", first_row + num_rows, ")"));
  }
  const uint64_t row_bytes =
      rows == 0 ? 0 : static_cast<uint64_t>(shape.num_elements() / rows) * DTypeSize(entry->dtype);
  return state_->ReadExactly(
      out, static_cast<uint64_t>(num_rows) * row_bytes,
      state_->data_start + state_->offsets[index] + static_cast<uint64_t>(first_row) * row_bytes);
}

absl::StatusOr<Tensor> SafetensorsReader::Read(const std::string& name) const {
  const SafetensorsEntry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint file ", path(), " has no \"", name, "\""));
  }
  Tensor tensor(entry->dtype, entry->shape);
  if (tensor.byte_size() > 0) {
    STRATUM_RETURN_IF_ERROR(ReadRows(name, 0, tensor.rows(), tensor.raw_data()));
  }
  return tensor;
}

absl::StatusOr<bool> SafetensorsReader::AllFinite(const std::string& name, int64_t first_row,
                                                  int64_t num_rows) const {
  const SafetensorsEntry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint file ", path(), " has no \"", name, "\""));
  }
  if (entry->dtype != DType::kFloat32) return true;
  const int64_t rows = entry->shape.rank() == 0 ? 1 : entry->shape.dim(0);
  if (rows == 0) return true;
  const int64_t row_size = entry->shape.num_elements() / rows;
  const int64_t part_rows = std::max<int64_t>(1, (1 << 20) / std::max<int64_t>(row_size, 1));
  const int64_t end = num_rows < 0 ? rows : std::min(rows, first_row + num_rows);
  Tensor part(DType::kFloat32, Shape({std::min(rows, part_rows) * row_size}));
  for (int64_t first = std::max<int64_t>(first_row, 0); first < end; first += part_rows) {
    const int64_t count = std::min(part_rows, end - first);
    STRATUM_RETURN_IF_ERROR(ReadRows(name, first, count, part.raw_data()));
    if (!stratum::AllFinite(part.SliceRows(0, count * row_size))) return false;
  }
  return true;
}

absl::StatusOr<TensorFile> ReadSafetensors(const std::string& path,
                                           std::optional<uint32_t> expected_crc32,
                                           const Confinement& confinement) {
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                           SafetensorsReader::Open(path, expected_crc32, confinement));
  TensorFile file;
  file.metadata = reader->metadata();
  for (const SafetensorsEntry& entry : reader->entries()) {
    STRATUM_ASSIGN_OR_RETURN(Tensor tensor, reader->Read(entry.name));
    file.tensors.push_back({entry.name, std::move(tensor)});
  }
  return file;
}

}  // namespace stratum
