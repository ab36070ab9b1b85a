// TFRecord files, as TensorFlow's TFRecordWriter writes them and tf.data.TFRecordDataset
// reads them: each record is
//   uint64 length | uint32 masked CRC32C of the length | data | uint32 masked CRC32C of data
// (little-endian), the whole stream optionally GZIP or ZLIB compressed (compression_type).
//
// Errors name the file and the byte offset (of the uncompressed stream) of the record that
// is damaged: a CRC that does not match, a length beyond the file, a file that ends inside
// a record. Nothing is skipped silently; a reader that wants TF's ignore_errors does so
// explicitly (see RecordFilesOptions).
//
// Thread safety: a reader or writer is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stratum {

enum class Compression { kNone, kGzip, kZlib };

// "" or "NONE", "GZIP", "ZLIB" (tf.io.TFRecordOptions' compression_type).
absl::StatusOr<Compression> CompressionFromName(absl::string_view name);
const char* CompressionName(Compression compression);

// A record longer than this is taken for a damaged length (TensorFlow has no limit, but
// the largest records written in practice are images of a few MB).
inline constexpr uint64_t kMaxTFRecordBytes = uint64_t{1} << 30;

namespace data_internal {
class InputStream;
}

class TFRecordReader {
 public:
  // NOT_FOUND when the file does not exist; FAILED_PRECONDITION when it is not a regular
  // file; the errno's code when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<TFRecordReader>> Open(const std::string& path,
                                                              Compression compression);
  ~TFRecordReader();
  TFRecordReader(const TFRecordReader&) = delete;
  TFRecordReader& operator=(const TFRecordReader&) = delete;

  // The next record's bytes, valid until the next call; nullopt at the end of the file.
  // DATA_LOSS for a damaged record (the reader is then at its end).
  absl::StatusOr<std::optional<absl::string_view>> Next();
  // Byte offset, in the uncompressed stream, of the record Next() returned last.
  uint64_t record_offset() const { return record_offset_; }
  const std::string& path() const;

 private:
  TFRecordReader(std::unique_ptr<data_internal::InputStream> stream, bool compressed);
  // Makes `size` bytes available at buffer_[begin_]; false at a clean end of the stream
  // (no byte left), DATA_LOSS when it ends inside them.
  absl::StatusOr<bool> Fill(size_t size, absl::string_view what);
  absl::Status Damaged(absl::string_view what) const;

  std::unique_ptr<data_internal::InputStream> stream_;
  std::string buffer_;
  size_t begin_ = 0;  // first unread byte of buffer_
  size_t end_ = 0;    // one past the last byte read into buffer_
  uint64_t record_offset_ = 0;
  uint64_t consumed_ = 0;  // stream bytes before buffer_[begin_]
  bool compressed_;
};

class TFRecordWriter {
 public:
  // Writes into `path` + ".tmp-<pid>", renamed to `path` by Close(): a file that exists is
  // whole. The errno's code when the file cannot be created.
  static absl::StatusOr<std::unique_ptr<TFRecordWriter>> Open(const std::string& path,
                                                              Compression compression);
  // Without Close(), the temporary file is removed.
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  absl::Status Write(absl::string_view record);
  // Flushes, syncs and renames the file into place.
  absl::Status Close();

 private:
  TFRecordWriter(std::string path, std::string temp_path, int fd, Compression compression);
  absl::Status WriteBytes(const char* data, size_t size, bool finish);
  absl::Status FlushOut();

  std::string path_;
  std::string temp_path_;
  int fd_;
  Compression compression_;
  std::string out_;  // bytes waiting to be written (compressed when compression_ is set)
  struct Deflater;
  std::unique_ptr<Deflater> deflater_;
  bool closed_ = false;
};

// The number of records in a TFRecord file, each record's CRCs checked. Errors as
// TFRecordReader.
absl::StatusOr<int64_t> CountTFRecords(const std::string& path, Compression compression);

}  // namespace stratum
