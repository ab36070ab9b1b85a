// Dataset: a tf.data-like input pipeline. A Dataset is an immutable, cheap-to-copy
// description (a shared pointer into a graph of operation nodes); nothing is read or
// computed until MakeIterator(). Each MakeIterator() call starts a new epoch: a Shuffle
// with reshuffle_each_iteration draws a new order from (seed, epoch number), so the
// sequence of epochs is reproducible from the seed.
//
// Errors: an operation given invalid arguments (Shard index out of range, components with
// different row counts, ...) returns a Dataset in an error state. status() reports it,
// every later operation keeps it, Cardinality() returns it, and an iterator of it returns
// it from the first GetNext(); check status() once after building a pipeline to fail fast.
//
// Thread safety: a Dataset may be shared and iterated from any number of threads (each
// with its own Iterator). An Iterator is used by one thread at a time. Prefetch runs its
// upstream on a background thread that the iterator owns and joins on destruction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

// One element of a dataset: a tuple of components, e.g. {image, label} or, after Batch,
// {images[64, 28, 28], labels[64]}.
using Element = std::vector<Tensor>;

// Cardinality() values besides a count.
inline constexpr int64_t kInfiniteCardinality = -1;
inline constexpr int64_t kUnknownCardinality = -2;
// Prefetch(kAutotune) picks a buffer size.
inline constexpr int64_t kAutotune = -1;

class Iterator {
 public:
  virtual ~Iterator() = default;
  Iterator() = default;
  Iterator(const Iterator&) = delete;
  Iterator& operator=(const Iterator&) = delete;

  // The next element, or nullopt at the end of the epoch. The iterator is finished after
  // the end or an error: later calls return nullopt, or the same error, again.
  absl::StatusOr<std::optional<Element>> GetNext();

 protected:
  // Implementations: the next element, nullopt at the end, or an error. Not called again
  // after it returned nullopt or an error.
  virtual absl::StatusOr<std::optional<Element>> GetNextInternal() = 0;

 private:
  bool finished_ = false;
  absl::Status final_status_;
};

namespace data_internal {
class DatasetNode;
class DatasetGraph;
}  // namespace data_internal

class Dataset {
 public:
  using MapFn = std::function<absl::StatusOr<Element>(Element)>;

  // An empty description in an error state; assign one built by the factories below.
  Dataset();

  // Sources.
  // One element per row of axis 0; components share their buffers with `components`.
  // Every component needs rank >= 1 and the same number of rows.
  static Dataset FromTensorSlices(Element components);
  // Exactly one element: `components` as they are.
  static Dataset FromTensors(Element components);
  // (image, label) rows read from IDX files (plain or gzipped), one pair after the other.
  // Files are read lazily, when an iterator reaches them; FILE auto-sharding splits the
  // pairs over workers.
  static Dataset FromIdxFiles(std::vector<std::pair<std::string, std::string>> image_label_files);

  // Operations; each returns a new Dataset and leaves this one unchanged.
  Dataset Map(MapFn fn) const;
  // TensorFlow's shuffle: a buffer of buffer_size elements; each output is a uniformly
  // drawn buffer entry, replaced by the next input element.
  Dataset Shuffle(int64_t buffer_size, uint64_t seed, bool reshuffle_each_iteration = true) const;
  // count -1 repeats forever; 0 gives an empty dataset.
  Dataset Repeat(int64_t count = -1) const;
  // Stacks batch_size elements along a new axis 0 (components must have identical dtypes
  // and shapes). The last batch may be smaller unless drop_remainder. Memory is allocated
  // for the rows gathered, not for batch_size; a batch over 8 GiB is RESOURCE_EXHAUSTED.
  Dataset Batch(int64_t batch_size, bool drop_remainder = false) const;
  // Every num_shards-th element, starting with element `index`.
  Dataset Shard(int64_t num_shards, int64_t index) const;
  // The first n elements; n -1 takes all.
  Dataset Take(int64_t n) const;
  // A background thread keeps up to buffer_size elements ready (kAutotune: a small default).
  Dataset Prefetch(int64_t buffer_size) const;

  // A new epoch over the dataset.
  std::unique_ptr<Iterator> MakeIterator() const;

  // OK, or the error an operation recorded while the pipeline was built.
  const absl::Status& status() const { return status_; }
  // Number of elements, kInfiniteCardinality or kUnknownCardinality.
  absl::StatusOr<int64_t> Cardinality() const;
  // Whether the source reads files, and which (in the order it reads them).
  bool reads_files() const;
  std::vector<std::string> source_files() const;
  // The operations from source to output, e.g. "FromTensorSlices(60000) -> Batch(64)".
  std::string DebugString() const;

 private:
  friend class data_internal::DatasetGraph;
  explicit Dataset(std::shared_ptr<const data_internal::DatasetNode> node);
  explicit Dataset(absl::Status error);

  std::shared_ptr<const data_internal::DatasetNode> node_;
  absl::Status status_;
};

}  // namespace stratum
