// Datasets of many files, as tf.data reads them: TFRecordDataset (tf.train.Example records,
// uncompressed, GZIP or ZLIB) and make_csv_dataset (CSV rows), each over a list of files,
// read one after the other or interleaved (cycle_length files open at once, block_length
// records from each in turn), optionally with a read-ahead thread per open file.
//
// These sources stream: an iterator holds the open files' read buffers and at most
// `read_ahead` parsed examples per open file, never a whole file, so a data set larger
// than memory trains. They read files, so FILE auto-sharding hands each worker every
// num_workers-th file (AutoShard in input_context.h). With record_counts given (one per
// file, e.g. from CountRecords), Cardinality() is their sum, also after FILE sharding.
//
// Element order: with deterministic (the default) the order is a function of the files and
// options alone, threads or not (TF's interleave order: a slot whose file ends hands the
// turn on; an empty slot opens the next file at once). deterministic false lets a slot
// whose read-ahead is empty be passed over for one that has an example ready.
//
// Thread safety: formats and datasets are immutable; iterate from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stratum/data/dataset.h"
#include "stratum/data/example.h"
#include "stratum/data/tfrecord.h"

namespace stratum {

// Reads one file's examples, in order.
class ExampleReader {
 public:
  virtual ~ExampleReader() = default;
  // The next example; nullopt at the end of the file. Errors name the file and where in it.
  virtual absl::StatusOr<std::optional<Element>> Next() = 0;
};

// A file format: how to read a file's examples and count them.
class RecordFormat {
 public:
  virtual ~RecordFormat() = default;
  virtual absl::StatusOr<std::unique_ptr<ExampleReader>> Open(const std::string& path) const = 0;
  // The file's examples, read without parsing them where the format allows.
  virtual absl::StatusOr<int64_t> Count(const std::string& path) const = 0;
  // "TFRecord (GZIP)", "CSV"
  virtual std::string Name() const = 0;
};

// tf.train.Example records in TFRecord files; each element is one tensor per spec.
std::shared_ptr<const RecordFormat> TFRecordExamples(Compression compression,
                                                     std::vector<FeatureSpec> features);

struct ReadOptions {
  int cycle_length = 1;        // files open at once
  int block_length = 1;        // consecutive examples from one file
  int num_parallel_reads = 1;  // > 1: each open file reads ahead on a thread of its own
  bool deterministic = true;
  int read_ahead = 64;  // examples kept ready per open file, when reading in parallel
  // As tf.data's ignore_errors, at file granularity: an error in a file (a damaged record,
  // an example that does not parse, a file that cannot be opened) ends that file, logged
  // with its file and offset, and the other files are read on. Off: the iterator's error.
  bool ignore_errors = false;
  // One per file when known: Cardinality() is their sum (else kUnknownCardinality).
  std::vector<int64_t> record_counts;
};

// A source over `files` in `format`. An empty list, or counts that do not match the
// files, is a Dataset in an error state.
Dataset RecordFilesDataset(std::vector<std::string> files,
                           std::shared_ptr<const RecordFormat> format, ReadOptions options = {});

// Each file's count, in order, read in parallel (one thread per file, at most `threads`).
// With ignore_errors, a file's count is what an iterator with ignore_errors reads of it:
// its examples parsed up to its first error (logged).
absl::StatusOr<std::vector<int64_t>> CountRecords(const std::vector<std::string>& files,
                                                  const RecordFormat& format, int threads = 4,
                                                  bool ignore_errors = false);

// The local files a job names: each entry a path or a glob pattern (*, ?, [...]), matched
// in sorted order; relative ones under `base_dir`. Remote paths (gs://, s3://, hdfs://,
// http://...) are refused by name: Stratum reads local and mounted files. NOT_FOUND for a
// pattern that matches nothing or a path that does not exist; `field` names the job field.
absl::StatusOr<std::vector<std::string>> ResolveDataFiles(const std::vector<std::string>& entries,
                                                          absl::string_view base_dir,
                                                          absl::string_view field);

}  // namespace stratum
