#include "stratum/data/dataset.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <exception>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "dataset_graph.h"
#include "stratum/data/idx.h"
#include "stratum/util/status_macros.h"

namespace stratum {

using data_internal::DatasetGraph;
using data_internal::DatasetNode;
using data_internal::NodePtr;

using NextResult = absl::StatusOr<std::optional<Element>>;

NextResult Iterator::GetNext() {
  if (finished_) {
    if (!final_status_.ok()) return final_status_;
    return std::nullopt;
  }
  NextResult next = GetNextInternal();
  if (!next.ok()) {
    finished_ = true;
    final_status_ = next.status();
  } else if (!next->has_value()) {
    finished_ = true;
  }
  return next;
}

namespace {

class ErrorIterator : public Iterator {
 public:
  explicit ErrorIterator(absl::Status status) : status_(std::move(status)) {}

 protected:
  NextResult GetNextInternal() override { return status_; }

 private:
  absl::Status status_;
};

absl::Status CheckComponents(const char* op, const Element& components) {
  if (components.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Dataset.", op, ": the element has no components: pass at least one Tensor"));
  }
  for (size_t i = 0; i < components.size(); ++i) {
    if (!components[i].valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Dataset.", op, ": component ", i,
                       " is an empty (default-constructed) Tensor: pass a Tensor with data"));
    }
  }
  return absl::OkStatus();
}

Shape RowShape(const Shape& shape) {
  return Shape(std::vector<int64_t>(shape.dims().begin() + 1, shape.dims().end()));
}

// ---- FromTensorSlices ----

class TensorSlicesNode : public DatasetNode {
 public:
  explicit TensorSlicesNode(Element components)
      : DatasetNode(nullptr), components_(std::move(components)) {
    for (const Tensor& c : components_) row_shapes_.push_back(RowShape(c.shape()));
  }

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override { return components_[0].rows(); }
  std::string Name() const override {
    return absl::StrCat("FromTensorSlices(", Cardinality(), ")");
  }
  NodePtr WithInput(NodePtr) const override { return nullptr; }

  const Element& components() const { return components_; }
  const std::vector<Shape>& row_shapes() const { return row_shapes_; }

 private:
  Element components_;
  std::vector<Shape> row_shapes_;
};

class TensorSlicesIterator : public Iterator {
 public:
  explicit TensorSlicesIterator(std::shared_ptr<const TensorSlicesNode> node)
      : node_(std::move(node)), rows_(node_->Cardinality()) {}

 protected:
  NextResult GetNextInternal() override {
    if (row_ >= rows_) return std::nullopt;
    const Element& components = node_->components();
    Element element;
    element.reserve(components.size());
    for (size_t i = 0; i < components.size(); ++i) {
      // Cannot fail: a row has exactly the elements of the row shape.
      element.push_back(*components[i].SliceRows(row_, row_ + 1).Reshape(node_->row_shapes()[i]));
    }
    ++row_;
    return element;
  }

 private:
  std::shared_ptr<const TensorSlicesNode> node_;
  int64_t rows_;
  int64_t row_ = 0;
};

std::unique_ptr<Iterator> TensorSlicesNode::MakeIterator() const {
  return std::make_unique<TensorSlicesIterator>(Self<TensorSlicesNode>());
}

// ---- FromTensors ----

class TensorsNode : public DatasetNode {
 public:
  explicit TensorsNode(Element components)
      : DatasetNode(nullptr), components_(std::move(components)) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override { return 1; }
  std::string Name() const override { return "FromTensors"; }
  NodePtr WithInput(NodePtr) const override { return nullptr; }
  const Element& components() const { return components_; }

 private:
  Element components_;
};

class TensorsIterator : public Iterator {
 public:
  explicit TensorsIterator(std::shared_ptr<const TensorsNode> node) : node_(std::move(node)) {}

 protected:
  NextResult GetNextInternal() override {
    if (done_) return std::nullopt;
    done_ = true;
    return node_->components();
  }

 private:
  std::shared_ptr<const TensorsNode> node_;
  bool done_ = false;
};

std::unique_ptr<Iterator> TensorsNode::MakeIterator() const {
  return std::make_unique<TensorsIterator>(Self<TensorsNode>());
}

// ---- FromIdxFiles ----

using FilePairs = std::vector<std::pair<std::string, std::string>>;

class IdxFilesNode : public DatasetNode {
 public:
  explicit IdxFilesNode(FilePairs pairs) : DatasetNode(nullptr), pairs_(std::move(pairs)) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override { return kUnknownCardinality; }
  std::string Name() const override {
    return absl::StrCat("FromIdxFiles(", pairs_.size(), " file pairs)");
  }
  NodePtr WithInput(NodePtr) const override { return nullptr; }

  std::vector<std::string> SourceFiles() const override {
    std::vector<std::string> files;
    for (const auto& [images, labels] : pairs_) {
      files.push_back(images);
      files.push_back(labels);
    }
    return files;
  }
  int64_t NumFileUnits() const override { return static_cast<int64_t>(pairs_.size()); }
  NodePtr ShardFiles(int64_t num_shards, int64_t index) const override {
    FilePairs kept;
    for (size_t i = static_cast<size_t>(index); i < pairs_.size();
         i += static_cast<size_t>(num_shards)) {
      kept.push_back(pairs_[i]);
    }
    return std::make_shared<IdxFilesNode>(std::move(kept));
  }

  const FilePairs& pairs() const { return pairs_; }

 private:
  FilePairs pairs_;
};

class IdxFilesIterator : public Iterator {
 public:
  explicit IdxFilesIterator(std::shared_ptr<const IdxFilesNode> node) : node_(std::move(node)) {}

 protected:
  NextResult GetNextInternal() override {
    while (row_ >= rows_) {
      if (next_pair_ >= node_->pairs().size()) return std::nullopt;
      STRATUM_RETURN_IF_ERROR(Open(node_->pairs()[next_pair_++]));
    }
    Element element;
    element.reserve(2);
    element.push_back(*images_.SliceRows(row_, row_ + 1).Reshape(image_shape_));
    element.push_back(*labels_.SliceRows(row_, row_ + 1).Reshape(label_shape_));
    ++row_;
    return element;
  }

 private:
  absl::Status Open(const std::pair<std::string, std::string>& pair) {
    STRATUM_ASSIGN_OR_RETURN(images_, ReadIdxFile(pair.first));
    STRATUM_ASSIGN_OR_RETURN(labels_, ReadIdxFile(pair.second));
    if (images_.shape().rank() < 1 || labels_.shape().rank() < 1 ||
        images_.rows() != labels_.rows()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Dataset.FromIdxFiles: images file \"", pair.first, "\" has shape ",
          images_.shape().ToString(), " but labels file \"", pair.second, "\" has shape ",
          labels_.shape().ToString(),
          ": both need the same number of rows along axis 0; pair each images file with its "
          "own labels file"));
    }
    image_shape_ = RowShape(images_.shape());
    label_shape_ = RowShape(labels_.shape());
    rows_ = images_.rows();
    row_ = 0;
    return absl::OkStatus();
  }

  std::shared_ptr<const IdxFilesNode> node_;
  size_t next_pair_ = 0;
  Tensor images_, labels_;
  Shape image_shape_, label_shape_;
  int64_t rows_ = 0;
  int64_t row_ = 0;
};

std::unique_ptr<Iterator> IdxFilesNode::MakeIterator() const {
  return std::make_unique<IdxFilesIterator>(Self<IdxFilesNode>());
}

// ---- Map ----

class MapNode : public DatasetNode {
 public:
  MapNode(NodePtr input, Dataset::MapFn fn) : DatasetNode(std::move(input)), fn_(std::move(fn)) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override { return input()->Cardinality(); }
  std::string Name() const override { return "Map"; }
  NodePtr WithInput(NodePtr input) const override {
    return std::make_shared<MapNode>(std::move(input), fn_);
  }
  const Dataset::MapFn& fn() const { return fn_; }

 private:
  Dataset::MapFn fn_;
};

class MapIterator : public Iterator {
 public:
  explicit MapIterator(std::shared_ptr<const MapNode> node)
      : node_(std::move(node)), input_(node_->input()->MakeIterator()) {}

 protected:
  NextResult GetNextInternal() override {
    STRATUM_ASSIGN_OR_RETURN(std::optional<Element> next, input_->GetNext());
    if (!next) return std::nullopt;
    absl::StatusOr<Element> mapped = node_->fn()(std::move(*next));
    const int64_t index = index_++;
    if (!mapped.ok()) {
      return absl::Status(mapped.status().code(),
                          absl::StrCat("Dataset.Map: the map function failed on element ", index,
                                       ": ", mapped.status().message()));
    }
    return std::move(*mapped);
  }

 private:
  std::shared_ptr<const MapNode> node_;
  std::unique_ptr<Iterator> input_;
  int64_t index_ = 0;
};

std::unique_ptr<Iterator> MapNode::MakeIterator() const {
  return std::make_unique<MapIterator>(Self<MapNode>());
}

// ---- Shuffle ----

// splitmix64: a small, fast generator whose sequence is the same on every platform (the
// standard library's distributions are not), so a seed means the same order everywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) by multiply-shift (Lemire); the bias is below 2^-40 for n < 2^24.
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

class ShuffleNode : public DatasetNode {
 public:
  ShuffleNode(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle)
      : DatasetNode(std::move(input)),
        buffer_size_(buffer_size),
        seed_(seed),
        reshuffle_(reshuffle) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override { return input()->Cardinality(); }
  std::string Name() const override {
    return absl::StrCat("Shuffle(", buffer_size_, ", seed ", seed_, ")");
  }
  NodePtr WithInput(NodePtr input) const override {
    return std::make_shared<ShuffleNode>(std::move(input), buffer_size_, seed_, reshuffle_);
  }
  int64_t buffer_size() const { return buffer_size_; }

 private:
  int64_t buffer_size_;
  uint64_t seed_;
  bool reshuffle_;
  // Epochs started so far: epoch e shuffles with a seed derived from (seed_, e).
  mutable std::atomic<uint64_t> epochs_{0};
};

class ShuffleIterator : public Iterator {
 public:
  ShuffleIterator(std::shared_ptr<const ShuffleNode> node, uint64_t seed)
      : node_(std::move(node)), input_(node_->input()->MakeIterator()), rng_(seed) {
    buffer_.reserve(static_cast<size_t>(std::min<int64_t>(node_->buffer_size(), 1 << 16)));
  }

 protected:
  NextResult GetNextInternal() override {
    const size_t capacity = static_cast<size_t>(node_->buffer_size());
    while (!input_done_ && buffer_.size() < capacity) {
      STRATUM_ASSIGN_OR_RETURN(std::optional<Element> next, input_->GetNext());
      if (!next) {
        input_done_ = true;
        break;
      }
      buffer_.push_back(std::move(*next));
    }
    if (buffer_.empty()) return std::nullopt;
    const size_t pick = static_cast<size_t>(rng_.Below(buffer_.size()));
    Element out = std::move(buffer_[pick]);
    if (pick != buffer_.size() - 1) buffer_[pick] = std::move(buffer_.back());
    buffer_.pop_back();
    return out;
  }

 private:
  std::shared_ptr<const ShuffleNode> node_;
  std::unique_ptr<Iterator> input_;
  SplitMix64 rng_;
  std::vector<Element> buffer_;
  bool input_done_ = false;
};

std::unique_ptr<Iterator> ShuffleNode::MakeIterator() const {
  const uint64_t epoch = reshuffle_ ? epochs_.fetch_add(1, std::memory_order_relaxed) : 0;
  // Two rounds of mixing so that nearby seeds and epochs give unrelated streams.
  SplitMix64 mix(seed_ ^ (epoch * 0xD1B54A32D192ED03ULL));
  mix.Next();
  return std::make_unique<ShuffleIterator>(Self<ShuffleNode>(), mix.Next());
}

// ---- Repeat ----

class RepeatNode : public DatasetNode {
 public:
  RepeatNode(NodePtr input, int64_t count) : DatasetNode(std::move(input)), count_(count) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override {
    const int64_t in = input()->Cardinality();
    if (count_ == 0 || in == 0) return 0;
    if (in == kUnknownCardinality) return kUnknownCardinality;
    if (count_ < 0 || in == kInfiniteCardinality) return kInfiniteCardinality;
    return in * count_;
  }
  std::string Name() const override { return absl::StrCat("Repeat(", count_, ")"); }
  NodePtr WithInput(NodePtr input) const override {
    return std::make_shared<RepeatNode>(std::move(input), count_);
  }
  int64_t count() const { return count_; }

 private:
  int64_t count_;
};

class RepeatIterator : public Iterator {
 public:
  explicit RepeatIterator(std::shared_ptr<const RepeatNode> node) : node_(std::move(node)) {}

 protected:
  NextResult GetNextInternal() override {
    const int64_t count = node_->count();
    while (count < 0 || done_ < count) {
      if (!input_) {
        input_ = node_->input()->MakeIterator();
        produced_this_round_ = false;
      }
      STRATUM_ASSIGN_OR_RETURN(std::optional<Element> next, input_->GetNext());
      if (next) {
        produced_this_round_ = true;
        return next;
      }
      input_.reset();
      ++done_;
      // An empty input repeated forever would spin: end instead, as TensorFlow does.
      if (!produced_this_round_) return std::nullopt;
    }
    return std::nullopt;
  }

 private:
  std::shared_ptr<const RepeatNode> node_;
  std::unique_ptr<Iterator> input_;
  int64_t done_ = 0;
  bool produced_this_round_ = false;
};

std::unique_ptr<Iterator> RepeatNode::MakeIterator() const {
  return std::make_unique<RepeatIterator>(Self<RepeatNode>());
}

// ---- Batch ----

class BatchNode : public DatasetNode {
 public:
  BatchNode(NodePtr input, int64_t batch_size, bool drop_remainder)
      : DatasetNode(std::move(input)), batch_size_(batch_size), drop_remainder_(drop_remainder) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override {
    const int64_t in = input()->Cardinality();
    if (in < 0) return in;
    // Not (in + batch_size - 1) / batch_size, which overflows for a huge batch_size.
    return in / batch_size_ + (!drop_remainder_ && in % batch_size_ != 0 ? 1 : 0);
  }
  std::string Name() const override {
    return absl::StrCat("Batch(", batch_size_, drop_remainder_ ? ", drop_remainder" : "", ")");
  }
  NodePtr WithInput(NodePtr input) const override {
    return std::make_shared<BatchNode>(std::move(input), batch_size_, drop_remainder_);
  }
  int64_t batch_size() const { return batch_size_; }
  bool drop_remainder() const { return drop_remainder_; }
  int64_t BatchSize() const override { return batch_size_; }
  NodePtr WithBatchSize(int64_t batch_size) const override {
    return std::make_shared<BatchNode>(input(), batch_size, drop_remainder_);
  }

 private:
  int64_t batch_size_;
  bool drop_remainder_;
};

class BatchIterator : public Iterator {
 public:
  explicit BatchIterator(std::shared_ptr<const BatchNode> node)
      : node_(std::move(node)), input_(node_->input()->MakeIterator()) {}

 protected:
  NextResult GetNextInternal() override {
    const int64_t batch_size = node_->batch_size();
    // Gather first and allocate for the rows that came, not for batch_size: a batch_size
    // far above the data (a common way to take "everything") must not allocate for it.
    std::vector<Element> elements;
    uint64_t element_bytes = 0;
    while (static_cast<int64_t>(elements.size()) < batch_size) {
      STRATUM_ASSIGN_OR_RETURN(std::optional<Element> next, input_->GetNext());
      if (!next) break;
      const int64_t n = static_cast<int64_t>(elements.size());
      if (n == 0) {
        STRATUM_RETURN_IF_ERROR(CheckComponents("Batch", *next));
        for (const Tensor& c : *next) element_bytes += c.byte_size();
      } else {
        STRATUM_RETURN_IF_ERROR(CheckMatches(elements.front(), *next, n));
      }
      if (element_bytes > 0 && static_cast<uint64_t>(n + 1) > kMaxBatchBytes / element_bytes) {
        return absl::ResourceExhaustedError(
            absl::StrCat("Dataset.Batch: batch ", batches_, " with batch_size ", batch_size, " of ",
                         element_bytes,
                         "-byte elements would exceed the 8 GiB Stratum allows per batch: use "
                         "a smaller batch_size (at most ",
                         kMaxBatchBytes / element_bytes, " here)"));
      }
      elements.push_back(*std::move(next));
    }
    ++batches_;
    const int64_t n = static_cast<int64_t>(elements.size());
    if (n == 0 || (n < batch_size && node_->drop_remainder())) return std::nullopt;
    return Stack(elements);
  }

 private:
  // Most bytes one batch may hold: far above any training batch, far below a size whose
  // allocation would take a machine down.
  static constexpr uint64_t kMaxBatchBytes = uint64_t{8} << 30;

  // The elements stacked along a new axis 0; they match in dtypes and shapes.
  static Element Stack(const std::vector<Element>& elements) {
    const Element& first = elements.front();
    Element batch;
    batch.reserve(first.size());
    for (size_t i = 0; i < first.size(); ++i) {
      const Tensor& c = first[i];
      std::vector<int64_t> dims;
      dims.reserve(c.shape().dims().size() + 1);
      dims.push_back(static_cast<int64_t>(elements.size()));
      dims.insert(dims.end(), c.shape().dims().begin(), c.shape().dims().end());
      Tensor stacked(c.dtype(), Shape(std::move(dims)));
      const size_t bytes = c.byte_size();
      auto* out = static_cast<char*>(stacked.raw_data());
      for (size_t row = 0; row < elements.size(); ++row) {
        std::memcpy(out + row * bytes, elements[row][i].raw_data(), bytes);
      }
      batch.push_back(std::move(stacked));
    }
    return batch;
  }

  absl::Status CheckMatches(const Element& first, const Element& element, int64_t n) const {
    if (element.size() != first.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Dataset.Batch: element ", n, " of batch ", batches_, " has ",
                       element.size(), " components but the batch started with ", first.size(),
                       ": every element of a dataset needs the same components"));
    }
    for (size_t i = 0; i < element.size(); ++i) {
      const Tensor& c = element[i];
      if (!c.valid() || c.dtype() != first[i].dtype() || c.shape() != first[i].shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Dataset.Batch: element ", n, " of batch ", batches_, " has component ", i, " ",
            c.valid() ? c.DebugString() : "(empty Tensor)", " but the batch started with ",
            first[i].DebugString(),
            ": Batch stacks identical shapes and dtypes; resize or pad the elements in a Map "
            "first"));
      }
    }
    return absl::OkStatus();
  }

  std::shared_ptr<const BatchNode> node_;
  std::unique_ptr<Iterator> input_;
  int64_t batches_ = 0;
};

std::unique_ptr<Iterator> BatchNode::MakeIterator() const {
  return std::make_unique<BatchIterator>(Self<BatchNode>());
}

// ---- Shard ----

class ShardNode : public DatasetNode {
 public:
  ShardNode(NodePtr input, int64_t num_shards, int64_t index)
      : DatasetNode(std::move(input)), num_shards_(num_shards), index_(index) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override {
    const int64_t in = input()->Cardinality();
    if (in < 0) return in;
    return in > index_ ? (in - index_ + num_shards_ - 1) / num_shards_ : 0;
  }
  std::string Name() const override {
    return absl::StrCat("Shard(", num_shards_, ", ", index_, ")");
  }
  NodePtr WithInput(NodePtr input) const override {
    return std::make_shared<ShardNode>(std::move(input), num_shards_, index_);
  }
  int64_t num_shards() const { return num_shards_; }
  int64_t index() const { return index_; }

 private:
  int64_t num_shards_;
  int64_t index_;
};

class ShardIterator : public Iterator {
 public:
  explicit ShardIterator(std::shared_ptr<const ShardNode> node)
      : node_(std::move(node)), input_(node_->input()->MakeIterator()), skip_(node_->index()) {}

 protected:
  NextResult GetNextInternal() override {
    for (; skip_ > 0; --skip_) {
      STRATUM_ASSIGN_OR_RETURN(std::optional<Element> skipped, input_->GetNext());
      if (!skipped) return std::nullopt;
    }
    STRATUM_ASSIGN_OR_RETURN(std::optional<Element> next, input_->GetNext());
    skip_ = node_->num_shards() - 1;
    return next;
  }

 private:
  std::shared_ptr<const ShardNode> node_;
  std::unique_ptr<Iterator> input_;
  int64_t skip_;
};

std::unique_ptr<Iterator> ShardNode::MakeIterator() const {
  return std::make_unique<ShardIterator>(Self<ShardNode>());
}

// ---- Take ----

class TakeNode : public DatasetNode {
 public:
  TakeNode(NodePtr input, int64_t n) : DatasetNode(std::move(input)), n_(n) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override {
    const int64_t in = input()->Cardinality();
    if (n_ < 0) return in;
    if (in == kInfiniteCardinality) return n_;
    if (in == kUnknownCardinality) return n_ == 0 ? 0 : kUnknownCardinality;
    return std::min(in, n_);
  }
  std::string Name() const override { return absl::StrCat("Take(", n_, ")"); }
  NodePtr WithInput(NodePtr input) const override {
    return std::make_shared<TakeNode>(std::move(input), n_);
  }
  int64_t n() const { return n_; }

 private:
  int64_t n_;
};

class TakeIterator : public Iterator {
 public:
  explicit TakeIterator(std::shared_ptr<const TakeNode> node)
      : node_(std::move(node)), input_(node_->input()->MakeIterator()) {}

 protected:
  NextResult GetNextInternal() override {
    if (node_->n() >= 0 && taken_ >= node_->n()) return std::nullopt;
    ++taken_;
    return input_->GetNext();
  }

 private:
  std::shared_ptr<const TakeNode> node_;
  std::unique_ptr<Iterator> input_;
  int64_t taken_ = 0;
};

std::unique_ptr<Iterator> TakeNode::MakeIterator() const {
  return std::make_unique<TakeIterator>(Self<TakeNode>());
}

// ---- Prefetch ----

constexpr int64_t kAutotunePrefetch = 4;

class PrefetchNode : public DatasetNode {
 public:
  PrefetchNode(NodePtr input, int64_t buffer_size)
      : DatasetNode(std::move(input)), buffer_size_(buffer_size) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override { return input()->Cardinality(); }
  std::string Name() const override { return absl::StrCat("Prefetch(", buffer_size_, ")"); }
  NodePtr WithInput(NodePtr input) const override {
    return std::make_shared<PrefetchNode>(std::move(input), buffer_size_);
  }

 private:
  int64_t buffer_size_;
};

// The producer thread starts on the first GetNext, runs the upstream iterator (which only
// it touches) and stops after the upstream's end or first error, or when the destructor
// cancels it; the destructor joins it, so it never outlives the upstream iterator.
class PrefetchIterator : public Iterator {
 public:
  PrefetchIterator(std::unique_ptr<Iterator> input, int64_t buffer_size)
      : input_(std::move(input)), capacity_(static_cast<size_t>(buffer_size)) {}

  ~PrefetchIterator() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    space_.SignalAll();
    if (producer_.joinable()) producer_.join();
  }

 protected:
  NextResult GetNextInternal() override {
    if (!producer_.joinable()) producer_ = std::thread([this] { Produce(); });
    absl::MutexLock lock(&mu_);
    while (queue_.empty()) ready_.Wait(&mu_);
    NextResult next = std::move(queue_.front());
    queue_.pop_front();
    space_.Signal();
    return next;
  }

 private:
  void Produce() {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        while (!cancelled_ && queue_.size() >= capacity_) space_.Wait(&mu_);
        if (cancelled_) return;
      }
      NextResult next = GetNextFromInput();
      const bool last = !next.ok() || !next->has_value();
      {
        absl::MutexLock lock(&mu_);
        queue_.push_back(std::move(next));
      }
      ready_.Signal();
      if (last) return;
    }
  }

  // The upstream's next element; an exception thrown upstream (a Map function, an
  // allocation) becomes an INTERNAL error, since nothing could catch it on this thread.
  NextResult GetNextFromInput() {
    try {
      return input_->GetNext();
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("Dataset.Prefetch: the pipeline before Prefetch threw an exception (",
                       e.what(), "): return errors as absl::Status from Map functions"));
    } catch (...) {
      return absl::InternalError(
          "Dataset.Prefetch: the pipeline before Prefetch threw a non-standard exception: "
          "return errors as absl::Status from Map functions");
    }
  }

  std::unique_ptr<Iterator> input_;
  const size_t capacity_;
  std::thread producer_;
  absl::Mutex mu_;
  absl::CondVar ready_;  // queue_ became non-empty
  absl::CondVar space_;  // queue_ has room, or cancelled_
  std::deque<NextResult> queue_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

std::unique_ptr<Iterator> PrefetchNode::MakeIterator() const {
  return std::make_unique<PrefetchIterator>(input()->MakeIterator(), buffer_size_);
}

}  // namespace

// ---- DatasetGraph ----

namespace data_internal {

NodePtr DatasetGraph::MakeShard(NodePtr input, int64_t num_shards, int64_t index) {
  return std::make_shared<ShardNode>(std::move(input), num_shards, index);
}

const DatasetNode& DatasetGraph::Source(const Dataset& dataset) {
  const DatasetNode* node = dataset.node_.get();
  while (!node->is_source()) node = node->input().get();
  return *node;
}

}  // namespace data_internal

// ---- Dataset ----

Dataset::Dataset()
    : status_(absl::FailedPreconditionError(
          "this Dataset is empty (default-constructed): build one with "
          "Dataset::FromTensorSlices, FromTensors or FromIdxFiles")) {}

Dataset::Dataset(std::shared_ptr<const data_internal::DatasetNode> node) : node_(std::move(node)) {}

Dataset::Dataset(absl::Status error) : status_(std::move(error)) {}

Dataset Dataset::FromTensorSlices(Element components) {
  absl::Status status = CheckComponents("FromTensorSlices", components);
  if (!status.ok()) return Dataset(std::move(status));
  for (size_t i = 0; i < components.size(); ++i) {
    if (components[i].shape().rank() < 1) {
      return Dataset(absl::InvalidArgumentError(absl::StrCat(
          "Dataset.FromTensorSlices: component ", i, " is a scalar (", components[i].DebugString(),
          "): slicing needs rank >= 1; use FromTensors for a single element")));
    }
    if (components[i].rows() != components[0].rows()) {
      return Dataset(absl::InvalidArgumentError(absl::StrCat(
          "Dataset.FromTensorSlices: component ", i, " ", components[i].DebugString(), " has ",
          components[i].rows(), " rows but component 0 ", components[0].DebugString(), " has ",
          components[0].rows(), ": all components need the same size along axis 0")));
    }
  }
  return Dataset(std::make_shared<TensorSlicesNode>(std::move(components)));
}

Dataset Dataset::FromTensors(Element components) {
  absl::Status status = CheckComponents("FromTensors", components);
  if (!status.ok()) return Dataset(std::move(status));
  return Dataset(std::make_shared<TensorsNode>(std::move(components)));
}

Dataset Dataset::FromIdxFiles(std::vector<std::pair<std::string, std::string>> image_label_files) {
  if (image_label_files.empty()) {
    return Dataset(absl::InvalidArgumentError(
        "Dataset.FromIdxFiles: no (images, labels) file pairs given: pass at least one pair"));
  }
  return Dataset(std::make_shared<IdxFilesNode>(std::move(image_label_files)));
}

Dataset Dataset::Map(MapFn fn) const {
  if (!status_.ok()) return *this;
  if (!fn)
    return Dataset(absl::InvalidArgumentError("Dataset.Map: the map function is empty: pass one"));
  return Dataset(std::make_shared<MapNode>(node_, std::move(fn)));
}

Dataset Dataset::Shuffle(int64_t buffer_size, uint64_t seed, bool reshuffle_each_iteration) const {
  if (!status_.ok()) return *this;
  if (buffer_size < 1) {
    return Dataset(
        absl::InvalidArgumentError(absl::StrCat("Dataset.Shuffle: buffer_size ", buffer_size,
                                                " is not positive: use 1 or more (1 keeps "
                                                "the order; the dataset size shuffles fully)")));
  }
  return Dataset(std::make_shared<ShuffleNode>(node_, buffer_size, seed, reshuffle_each_iteration));
}

Dataset Dataset::Repeat(int64_t count) const {
  if (!status_.ok()) return *this;
  if (count < -1) {
    return Dataset(absl::InvalidArgumentError(absl::StrCat(
        "Dataset.Repeat: count ", count, " is invalid: use -1 (forever) or a count >= 0")));
  }
  return Dataset(std::make_shared<RepeatNode>(node_, count));
}

Dataset Dataset::Batch(int64_t batch_size, bool drop_remainder) const {
  if (!status_.ok()) return *this;
  if (batch_size < 1) {
    return Dataset(absl::InvalidArgumentError(
        absl::StrCat("Dataset.Batch: batch_size ", batch_size, " is not positive: use 1 or more")));
  }
  return Dataset(std::make_shared<BatchNode>(node_, batch_size, drop_remainder));
}

Dataset Dataset::Shard(int64_t num_shards, int64_t index) const {
  if (!status_.ok()) return *this;
  if (num_shards < 1) {
    return Dataset(absl::InvalidArgumentError(
        absl::StrCat("Dataset.Shard: num_shards ", num_shards, " is not positive: use 1 or more")));
  }
  if (index < 0 || index >= num_shards) {
    return Dataset(absl::InvalidArgumentError(
        absl::StrCat("Dataset.Shard: index ", index, " is out of range for num_shards ", num_shards,
                     ": use an index in 0..", num_shards - 1)));
  }
  return Dataset(DatasetGraph::MakeShard(node_, num_shards, index));
}

Dataset Dataset::Take(int64_t n) const {
  if (!status_.ok()) return *this;
  if (n < -1) {
    return Dataset(absl::InvalidArgumentError(
        absl::StrCat("Dataset.Take: n ", n, " is invalid: use -1 (all elements) or a count >= 0")));
  }
  return Dataset(std::make_shared<TakeNode>(node_, n));
}

Dataset Dataset::Prefetch(int64_t buffer_size) const {
  if (!status_.ok()) return *this;
  if (buffer_size == kAutotune) buffer_size = kAutotunePrefetch;
  if (buffer_size < 1) {
    return Dataset(
        absl::InvalidArgumentError(absl::StrCat("Dataset.Prefetch: buffer_size ", buffer_size,
                                                " is invalid: use 1 or more, or kAutotune")));
  }
  return Dataset(std::make_shared<PrefetchNode>(node_, buffer_size));
}

std::unique_ptr<Iterator> Dataset::MakeIterator() const {
  if (!status_.ok()) return std::make_unique<ErrorIterator>(status_);
  return node_->MakeIterator();
}

absl::StatusOr<int64_t> Dataset::Cardinality() const {
  if (!status_.ok()) return status_;
  return node_->Cardinality();
}

bool Dataset::reads_files() const { return !source_files().empty(); }

std::vector<std::string> Dataset::source_files() const {
  if (!status_.ok()) return {};
  return DatasetGraph::Source(*this).SourceFiles();
}

std::string Dataset::DebugString() const {
  if (!status_.ok()) return absl::StrCat("Dataset(error: ", status_.message(), ")");
  std::vector<std::string> names;
  for (const DatasetNode* node = node_.get(); node != nullptr; node = node->input().get()) {
    names.push_back(node->Name());
  }
  std::reverse(names.begin(), names.end());
  return absl::StrJoin(names, " -> ");
}

}  // namespace stratum
