// InputStream: the bytes of a local file, read in large blocks, inflated when it is GZIP or
// ZLIB compressed (internal to common/data; the TFRecord and CSV readers share it).
//
// Opening never blocks: the file is opened O_NONBLOCK and must be a regular file (a FIFO
// or a device in a data file's place is refused by name instead of hanging the reader).
// Not thread-safe: one reader owns a stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/data/tfrecord.h"

namespace stratum::data_internal {

class InputStream {
 public:
  static absl::StatusOr<std::unique_ptr<InputStream>> Open(const std::string& path,
                                                           Compression compression);
  ~InputStream();
  InputStream(const InputStream&) = delete;
  InputStream& operator=(const InputStream&) = delete;

  // Up to `size` bytes of the (uncompressed) stream into `out`; 0 only at its end.
  absl::StatusOr<size_t> Read(char* out, size_t size);
  // Bytes of the uncompressed stream returned so far.
  uint64_t position() const { return position_; }
  // The file's size on disk (for an uncompressed stream, the stream's length).
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  InputStream(std::string path, int fd, Compression compression, uint64_t file_size);
  absl::StatusOr<size_t> ReadFile(char* out, size_t size);
  absl::Status ErrnoError(const char* what) const;

  std::string path_;
  int fd_;
  Compression compression_;
  uint64_t position_ = 0;
  uint64_t file_size_;
  // Compressed streams: the compressed bytes read ahead and zlib's state.
  struct Inflater;
  std::unique_ptr<Inflater> inflater_;
};

}  // namespace stratum::data_internal
