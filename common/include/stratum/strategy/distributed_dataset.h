// DistributedDataset: a dataset whose elements are PerReplica batches, as
// tf.distribute's ExperimentalDistributeDataset and DistributeDatasetsFromFunction make.
//
// - FromGlobalBatches (ExperimentalDistributeDataset): the dataset yields GLOBAL batches;
//   it is auto-sharded over the workers at its source, rebatched so that each worker
//   takes global / num_workers examples per step, and each worker's batch is split
//   over the replicas (evenly; a last, partial batch as evenly as it goes, so a replica
//   may get fewer rows or none).
// - FromFunction (DistributeDatasetsFromFunction): the function builds each input
//   pipeline's dataset from an InputContext and yields PER-REPLICA batches; no sharding
//   or splitting is done for the user, and each step takes one batch per replica.
//
// Thread safety: a DistributedDataset is immutable; an iterator is used by one thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/data/dataset.h"
#include "stratum/data/input_context.h"
#include "stratum/strategy/per_replica.h"

namespace stratum {

struct DistributeOptions {
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::kAuto;
  // This process's place among the input pipelines (workers) of the job.
  int num_workers = 1;
  int worker_index = 0;
};

class DistributedIterator {
 public:
  virtual ~DistributedIterator() = default;
  // The next step's batches, one per replica; nullopt at the end.
  virtual absl::StatusOr<std::optional<PerReplica<Element>>> GetNext() = 0;
};

class DistributedDataset {
 public:
  using DatasetFn = std::function<absl::StatusOr<Dataset>(const InputContext&)>;

  static absl::StatusOr<DistributedDataset> FromGlobalBatches(
      const Dataset& dataset, int num_replicas, const DistributeOptions& options = {});
  static absl::StatusOr<DistributedDataset> FromFunction(const DatasetFn& fn, int num_replicas,
                                                         const DistributeOptions& options = {});

  int num_replicas() const { return num_replicas_; }
  // A new epoch.
  std::unique_ptr<DistributedIterator> MakeIterator() const;

 private:
  DistributedDataset(Dataset dataset, int num_replicas, bool split)
      : dataset_(std::move(dataset)), num_replicas_(num_replicas), split_(split) {}

  Dataset dataset_;
  int num_replicas_;
  bool split_;  // global batches to split, or per-replica batches to group
};

// Splits every component along axis 0 over `num_replicas` as evenly as possible (the
// first rows % num_replicas replicas get one row more), sharing the buffers.
// INVALID_ARGUMENT when a component is a scalar or the components' row counts differ
// (a dataset that was not batched before it was distributed).
absl::StatusOr<std::vector<Element>> SplitRowsOverReplicas(const Element& batch, int num_replicas);

}  // namespace stratum
