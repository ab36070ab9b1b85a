// The node graph behind Dataset (internal to common/data). A pipeline is a chain: one
// source node and unary operation nodes above it, each holding its input. Nodes are
// immutable once built (a Shuffle's epoch counter aside, which is atomic), so a graph is
// shared freely between Datasets, iterators and threads. Graph rewrites (auto-sharding)
// rebuild the chain from the source up with WithInput().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/data/dataset.h"

namespace stratum::data_internal {

using NodePtr = std::shared_ptr<const DatasetNode>;

class DatasetNode : public std::enable_shared_from_this<DatasetNode> {
 public:
  explicit DatasetNode(NodePtr input) : input_(std::move(input)) {}
  virtual ~DatasetNode() = default;

  // Iterators hold a shared_ptr to their node (shared_from_this): the node outlives
  // every Dataset that named it as long as an iterator runs over it.
  virtual std::unique_ptr<Iterator> MakeIterator() const = 0;
  // A count, kInfiniteCardinality or kUnknownCardinality.
  virtual int64_t Cardinality() const = 0;
  // "Batch(64)"
  virtual std::string Name() const = 0;

  // The input of an operation; null for a source.
  const NodePtr& input() const { return input_; }
  template <typename T>
  std::shared_ptr<const T> Self() const {
    return std::static_pointer_cast<const T>(shared_from_this());
  }
  bool is_source() const { return input_ == nullptr; }
  // A copy of this operation reading from `input` (operations only).
  virtual NodePtr WithInput(NodePtr input) const = 0;

  // A Batch operation's batch size, 0 for any other node; and a copy of the Batch with
  // another size over the same input (Batch only).
  virtual int64_t BatchSize() const { return 0; }
  virtual NodePtr WithBatchSize(int64_t /*batch_size*/) const { return nullptr; }

  // Sources that read files: the files, and the units FILE sharding distributes (for IDX,
  // one unit is an (images, labels) pair).
  virtual std::vector<std::string> SourceFiles() const { return {}; }
  virtual int64_t NumFileUnits() const { return 0; }
  // This source restricted to the file units u with u % num_shards == index.
  virtual NodePtr ShardFiles(int64_t /*num_shards*/, int64_t /*index*/) const { return nullptr; }

 private:
  NodePtr input_;
};

// Access to Dataset internals for the graph rewrites in input_context.cc.
class DatasetGraph {
 public:
  static const NodePtr& Node(const Dataset& dataset) { return dataset.node_; }
  static Dataset Wrap(NodePtr node) { return Dataset(std::move(node)); }
  // A Dataset in an error state, for sources defined outside dataset.cc.
  static Dataset Fail(absl::Status error) { return Dataset(std::move(error)); }
  static NodePtr MakeShard(NodePtr input, int64_t num_shards, int64_t index);
  // The source at the bottom of the chain.
  static const DatasetNode& Source(const Dataset& dataset);
};

}  // namespace stratum::data_internal
