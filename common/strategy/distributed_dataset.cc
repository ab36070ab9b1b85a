#include "stratum/strategy/distributed_dataset.h"

#include "absl/strings/str_cat.h"

namespace stratum {
namespace {

class SplittingIterator : public DistributedIterator {
 public:
  SplittingIterator(std::unique_ptr<Iterator> input, int num_replicas)
      : input_(std::move(input)), num_replicas_(num_replicas) {}

  absl::StatusOr<std::optional<PerReplica<Element>>> GetNext() override {
    absl::StatusOr<std::optional<Element>> batch = input_->GetNext();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) return std::nullopt;
    absl::StatusOr<std::vector<Element>> parts = SplitRowsOverReplicas(**batch, num_replicas_);
    if (!parts.ok()) return parts.status();
    return PerReplica<Element>(*std::move(parts));
  }

 private:
  std::unique_ptr<Iterator> input_;
  int num_replicas_;
};

class GroupingIterator : public DistributedIterator {
 public:
  GroupingIterator(std::unique_ptr<Iterator> input, int num_replicas)
      : input_(std::move(input)), num_replicas_(num_replicas) {}

  absl::StatusOr<std::optional<PerReplica<Element>>> GetNext() override {
    std::vector<Element> batches;
    for (int replica = 0; replica < num_replicas_; ++replica) {
      absl::StatusOr<std::optional<Element>> batch = input_->GetNext();
      if (!batch.ok()) return batch.status();
      if (!batch->has_value()) break;
      batches.push_back(**std::move(batch));
    }
    if (batches.empty()) return std::nullopt;
    // The data ran out mid-step: the remaining replicas get empty batches.
    while (static_cast<int>(batches.size()) < num_replicas_) {
      Element empty;
      for (const Tensor& component : batches.front()) empty.push_back(component.SliceRows(0, 0));
      batches.push_back(std::move(empty));
    }
    return PerReplica<Element>(std::move(batches));
  }

 private:
  std::unique_ptr<Iterator> input_;
  int num_replicas_;
};

absl::Status CheckReplicas(int num_replicas) {
  if (num_replicas >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("cannot distribute a dataset over ", num_replicas, " replicas"));
}

}  // namespace

absl::StatusOr<std::vector<Element>> SplitRowsOverReplicas(const Element& batch, int num_replicas) {
  if (batch.empty())
    return absl::InvalidArgumentError("cannot split an element with no components");
  const int64_t rows = batch.front().rows();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].shape().rank() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot split the element over ", num_replicas, " replicas: component ", i, " is ",
          batch[i].DebugString(),
          ", which has no batch axis: batch the dataset (.Batch(global_batch_size)) before "
          "distributing it"));
    }
    if (batch[i].rows() != rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot split the batch over ", num_replicas, " replicas: component ", i, " is ",
          batch[i].DebugString(), " but component 0 is ", batch.front().DebugString(),
          ": give every component the same number of rows"));
    }
  }
  if (rows % num_replicas == 0) return SplitBatch(batch, num_replicas);
  std::vector<Element> parts(static_cast<size_t>(num_replicas));
  int64_t begin = 0;
  for (int replica = 0; replica < num_replicas; ++replica) {
    const int64_t count = rows / num_replicas + (replica < rows % num_replicas ? 1 : 0);
    for (const Tensor& component : batch) {
      parts[static_cast<size_t>(replica)].push_back(component.SliceRows(begin, begin + count));
    }
    begin += count;
  }
  return parts;
}

absl::StatusOr<DistributedDataset> DistributedDataset::FromGlobalBatches(
    const Dataset& dataset, int num_replicas, const DistributeOptions& options) {
  if (absl::Status status = CheckReplicas(num_replicas); !status.ok()) return status;
  absl::StatusOr<Dataset> sharded =
      AutoShard(dataset, options.auto_shard_policy, options.num_workers, options.worker_index);
  if (!sharded.ok()) return sharded.status();
  absl::StatusOr<Dataset> rebatched = RebatchForWorkers(*sharded, options.num_workers);
  if (!rebatched.ok()) return rebatched.status();
  return DistributedDataset(*std::move(rebatched), num_replicas, /*split=*/true);
}

absl::StatusOr<DistributedDataset> DistributedDataset::FromFunction(
    const DatasetFn& fn, int num_replicas, const DistributeOptions& options) {
  if (absl::Status status = CheckReplicas(num_replicas); !status.ok()) return status;
  InputContext context;
  context.num_input_pipelines = options.num_workers;
  context.input_pipeline_id = options.worker_index;
  context.num_replicas_in_sync = num_replicas * options.num_workers;
  absl::StatusOr<Dataset> dataset = fn(context);
  if (!dataset.ok()) return dataset.status();
  if (!dataset->status().ok()) return dataset->status();
  return DistributedDataset(*std::move(dataset), num_replicas, /*split=*/false);
}

std::unique_ptr<DistributedIterator> DistributedDataset::MakeIterator() const {
  if (split_) return std::make_unique<SplittingIterator>(dataset_.MakeIterator(), num_replicas_);
  return std::make_unique<GroupingIterator>(dataset_.MakeIterator(), num_replicas_);
}

}  // namespace stratum
