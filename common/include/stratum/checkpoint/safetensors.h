// Tensor files in the safetensors format (8-byte little-endian header length, a JSON
// header naming each tensor's dtype, shape and byte range, then the data), so that
// Python tools read Stratum's checkpoints. Files are written atomically: a temporary
// file, fsync, rename; a crash never leaves half a file under the final name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

struct TensorFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;          // "__metadata__"
};

struct WrittenFile {
  uint32_t crc32 = 0;  // of the whole file
  int64_t bytes = 0;
};

// Files a service writes and reads for others (a PS's Save and Restore) stay in a folder:
// with `within` set, `path` is opened beneath it with openat2(RESOLVE_BENEATH), so no `..`,
// absolute link or link out of the folder is followed, also when something in the folder
// changes between a check of the path and the open (PERMISSION_DENIED naming the path).
// Empty: any path.
struct Confinement {
  std::string within;
};

absl::StatusOr<WrittenFile> WriteSafetensors(const std::string& path, const TensorFile& file,
                                             const Confinement& confinement = {});

// A tensor of a file: what its header says of it.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
};

// The bytes of the header (JSON, padded) of a file of `entries`, in that order, and
// `metadata`.
uint64_t SafetensorsHeaderBytes(const std::vector<SafetensorsEntry>& entries,
                                const std::map<std::string, std::string>& metadata);

// A file written a tensor at a time, so that its writer never holds the whole file (a
// parameter server saves one variable's copy at a time): the tensors go to a temporary file
// as they are added, after room kept for the header, which Finish writes with the metadata
// known by then; then the file appears under its name (atomically, as WriteSafetensors').
// Destroyed before Finish, it leaves nothing.
class SafetensorsWriter {
 public:
  // `header_bytes`: the room kept for the header, at least SafetensorsHeaderBytes of what
  // Finish will write (the rest is padded with spaces).
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Open(
      const std::string& path, uint64_t header_bytes, const Confinement& confinement = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next tensor of the file.
  absl::Status Add(const std::string& name, const Tensor& tensor);
  // Writes the header (INTERNAL when it needs more room than was kept), syncs and renames.
  absl::StatusOr<WrittenFile> Finish(const std::map<std::string, std::string>& metadata);

 private:
  struct State;
  explicit SafetensorsWriter(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Reads and checks a file: header JSON, dtypes, shapes against byte ranges, ranges inside
// the file; with `expected_crc32`, the checksum too. Errors name the file and the problem.
absl::StatusOr<TensorFile> ReadSafetensors(const std::string& path,
                                           std::optional<uint32_t> expected_crc32 = std::nullopt,
                                           const Confinement& confinement = {});

// A file opened to read its tensors one at a time, or some rows of one, straight into the
// caller's memory (a parameter server restores a variable at a time, and a shard from rows
// of other shards, without holding the file). Open checks what ReadSafetensors checks; a
// read is DATA_LOSS naming the file when the file changed since.
class SafetensorsReader {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(
      const std::string& path, std::optional<uint32_t> expected_crc32 = std::nullopt,
      const Confinement& confinement = {});
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const;
  // The tensors, in the order of their bytes in the file.
  const std::vector<SafetensorsEntry>& entries() const;
  const std::map<std::string, std::string>& metadata() const;
  // The entry named `name`, or null.
  const SafetensorsEntry* Find(const std::string& name) const;
  // Tensor `name` (NOT_FOUND naming the file when it has none).
  absl::StatusOr<Tensor> Read(const std::string& name) const;
  // Rows [first_row, first_row + num_rows) of axis 0 of tensor `name` (all of a scalar)
  // into `out`, which holds their bytes; OUT_OF_RANGE naming the rows when it lacks them.
  absl::Status ReadRows(const std::string& name, int64_t first_row, int64_t num_rows,
                        void* out) const;
  // Whether every value of rows [first_row, first_row + num_rows) of tensor `name` is
  // finite (read in parts; other dtypes than float32 always are); num_rows -1: to the end.
  absl::StatusOr<bool> AllFinite(const std::string& name, int64_t first_row = 0,
                                 int64_t num_rows = -1) const;

 private:
  struct State;
  explicit SafetensorsReader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The bytes of the file at `path`: NOT_FOUND when there is none; DATA_LOSS, naming the path
// and the reason, when it is not a regular file (a folder in its place) or cannot be read
// (an I/O error). Never throws, as std::ifstream reads can. Errors call it `what` `path`
// ("checkpoint file /a/b").
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what = "",
                                          const Confinement& confinement = {});

// Writes `text` to `path` atomically (temporary file, fsync, rename, fsync of the folder).
absl::Status WriteFileAtomically(const std::string& path, const std::string& text,
                                 const Confinement& confinement = {});

}  // namespace stratum
