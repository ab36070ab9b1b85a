// Strategy: tf.distribute.Strategy in C++. A strategy owns a set of replicas (one per
// device), runs a function on every replica (Run), combines per-replica values (Reduce),
// and places variables (CreateVariables). Default and OneDevice live here; Mirrored and
// CentralStorage (several local devices) in worker/.
//
//   MirroredStrategy strategy({"CPU:0", "CPU:1"});
//   auto scope = strategy.Scope();           // GetStrategy() is now `strategy`
//   auto losses = strategy.Run<float>([&](ReplicaContext& ctx) -> absl::StatusOr<float> {
//     ...; return loss; });
//
// Replicas of a multi-replica strategy run on their own threads (replica 0 on the caller's).
// ReplicaContext::AllReduce synchronises them; every wait has a deadline
// (StrategyOptions::collective_timeout) and names the replicas that did not arrive; when
// one replica fails, the others' waits fail too instead of hanging.
//
// Thread safety: Run, Reduce and the rest are called from one thread (the training loop);
// a ReplicaContext is used only by its replica's thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stratum/strategy/cross_device_ops.h"
#include "stratum/strategy/distributed_dataset.h"
#include "stratum/strategy/per_replica.h"
#include "stratum/strategy/reduce.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

class Strategy;
class ReplicaPool;

class ReplicaContext {
 public:
  ReplicaContext(Strategy& strategy, int local_replica_id)
      : strategy_(strategy), local_replica_id_(local_replica_id) {}

  // This replica's place among all replicas in sync (over every worker of the job).
  int replica_id_in_sync_group() const;
  // Its place among this process's replicas: what indexes per-replica local state.
  int local_replica_id() const { return local_replica_id_; }
  int num_replicas_in_sync() const;
  Strategy& strategy() const { return strategy_; }

  // All-reduces across the replicas in sync: every replica must call it with tensors of
  // the same shapes; each gets the identical SUM (or MEAN).
  absl::StatusOr<Tensor> AllReduce(ReduceOp op, const Tensor& value);
  // In place, for a list of tensors (gradients): one synchronisation for the whole list.
  absl::Status AllReduce(ReduceOp op, std::vector<Tensor>& values);

 private:
  Strategy& strategy_;
  int local_replica_id_;
};

// Sums in place over the replicas in sync as local replica `replica` of `strategy` does
// (ReplicaContext::AllReduce with SUM), callable from that replica's thread during Run: what
// a model workspace's synchronized layers sum through (Workspace::SetReplicaSum).
std::function<absl::Status(std::vector<Tensor>&)> ReplicaSumOf(Strategy& strategy, int replica);

// What ExperimentalDistributeValuesFromFunction hands the value function.
struct ValueContext {
  int replica_id_in_sync_group = 0;
  int num_replicas_in_sync = 1;
};

struct StrategyOptions {
  // How long one replica waits at an all-reduce for the others.
  absl::Duration collective_timeout = absl::Minutes(5);
};

// Variables as a strategy places them. Mirrored: one copy per replica, kept identical.
// CentralStorage: one copy, read by every replica. Default/OneDevice: one copy. They
// remember the strategy that made them (CreateVariables), so that variables made outside
// the Scope() of the strategy that trains them are caught where the two first meet
// (ForReplica, ApplyGradients) instead of indexing a copy that is not there.
class DistributedVariables {
 public:
  DistributedVariables(std::vector<std::vector<Tensor>> copies, bool mirrored,
                       const Strategy* creator = nullptr, std::vector<std::string> names = {});

  // The copy `context`'s replica computes with and updates, as a variable resolves inside
  // tf.distribute's strategy.run. INVALID_ARGUMENT, naming the variables and both
  // strategies, when they were made by another strategy whose copies cannot serve this
  // one's replicas (Strategy::CheckVariables).
  absl::StatusOr<std::vector<Tensor>*> ForReplica(const ReplicaContext& context);

  // Direct access for code that has checked the variables (CheckVariables) itself: the
  // values replica `replica` computes with, and copy `copy` (0 <= copy < num_copies()).
  const std::vector<Tensor>& ReplicaValues(int replica) const {
    return copies_[mirrored_ ? static_cast<size_t>(replica) : 0];
  }
  std::vector<Tensor>& MutableCopy(int copy) { return copies_[static_cast<size_t>(copy)]; }
  int num_copies() const { return static_cast<int>(copies_.size()); }
  bool mirrored() const { return mirrored_; }
  // The copy checkpoints and evaluation read (copy 0).
  const std::vector<Tensor>& primary() const { return copies_[0]; }
  // The strategy whose CreateVariables made them, by its id (0: made by hand) and name (it
  // may be gone since), and their names when it was given them ("dense/kernel", ...).
  uint64_t creator_id() const { return creator_id_; }
  const std::string& creator_name() const { return creator_name_; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  friend class Strategy;
  std::vector<std::vector<Tensor>> copies_;
  bool mirrored_;
  uint64_t creator_id_ = 0;
  std::string creator_name_;
  std::vector<std::string> names_;
  // Variables that another strategy can use as they are are warned about once.
  std::shared_ptr<std::once_flag> warned_ = std::make_shared<std::once_flag>();
};

class Strategy {
 public:
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  // "DefaultDistributionStrategy", "OneDeviceStrategy", "MirroredStrategy", ...
  virtual std::string name() const = 0;
  // Replicas over the whole job: this process's replicas times the workers in sync.
  int NumReplicasInSync() const { return NumLocalReplicas() * num_workers(); }
  // This process's replicas, one per device in devices().
  int NumLocalReplicas() const { return static_cast<int>(devices_.size()); }
  // Workers training in lock-step (MultiWorkerMirrored: every worker of the job; else 1),
  // and this one's index among them (0 is the chief, which writes checkpoints).
  virtual int num_workers() const { return 1; }
  virtual int worker_index() const { return 0; }
  bool is_chief() const { return worker_index() == 0; }
  // One device per local replica: "CPU:0", "GPU:1", ...
  const std::vector<std::string>& devices() const { return devices_; }
  const CrossDeviceOps& cross_device_ops() const { return *cross_device_ops_; }
  // Unique to this strategy object within the process (never reused).
  uint64_t id() const { return id_; }

  // While the returned object lives, GetStrategy() on this thread returns this strategy.
  class ScopeGuard {
   public:
    explicit ScopeGuard(Strategy* strategy);
    ~ScopeGuard();
    ScopeGuard(const ScopeGuard&) = delete;
    ScopeGuard& operator=(const ScopeGuard&) = delete;
  };
  [[nodiscard]] ScopeGuard Scope() { return ScopeGuard(this); }

  // Runs `fn` on every replica; returns the replicas' results, or the first error.
  template <typename R>
  absl::StatusOr<PerReplica<R>> Run(const std::function<absl::StatusOr<R>(ReplicaContext&)>& fn);
  absl::Status RunEach(const std::function<absl::Status(ReplicaContext&)>& fn);

  // Reduces a per-replica value across replicas; with `axis`, also along that axis of each
  // value (MEAN then divides by the total count along it over all replicas, as in TF).
  absl::StatusOr<Tensor> Reduce(ReduceOp op, const PerReplica<Tensor>& value,
                                std::optional<int> axis = std::nullopt) const;

  template <typename T>
  std::vector<T> ExperimentalLocalResults(const PerReplica<T>& value) const {
    return value.values();
  }

  template <typename T>
  absl::StatusOr<PerReplica<T>> ExperimentalDistributeValuesFromFunction(
      const std::function<absl::StatusOr<T>(const ValueContext&)>& fn) const;

  // tf.distribute's experimental_distribute_dataset: `dataset` yields global batches, each
  // split over this strategy's replicas (auto-sharded over workers first).
  absl::StatusOr<DistributedDataset> ExperimentalDistributeDataset(
      const Dataset& dataset, const DistributeOptions& options = {}) const {
    return DistributedDataset::FromGlobalBatches(dataset, NumLocalReplicas(), WithWorkers(options));
  }
  // tf.distribute's distribute_datasets_from_function: `fn` builds the dataset of each input
  // pipeline from an InputContext; it yields per-replica batches.
  absl::StatusOr<DistributedDataset> DistributeDatasetsFromFunction(
      const DistributedDataset::DatasetFn& fn, const DistributeOptions& options = {}) const {
    return DistributedDataset::FromFunction(fn, NumLocalReplicas(), WithWorkers(options));
  }

  // Places `initial` (one tensor per variable) as this strategy does; `names` (one per
  // variable, optional) name them in messages.
  virtual DistributedVariables CreateVariables(const std::vector<Tensor>& initial,
                                               std::vector<std::string> names = {}) const;
  // Whether `variables` can be trained by this strategy. Made by it (in its Scope()): yes.
  // Made by another strategy (before entering this one's Scope(), the first pitfall of
  // tf.distribute) with the copies this one keeps (one, for Default, OneDevice and
  // CentralStorage): yes, as TensorFlow would silently use them, with a warning naming
  // them, once. Otherwise (a Mirrored strategy given one copy, or copies for another
  // number of replicas): INVALID_ARGUMENT naming the variables, both strategies and the fix.
  absl::Status CheckVariables(const DistributedVariables& variables) const;

  // Combines the replicas' gradients and updates the variables with `update`, which
  // applies one copy's gradients to that copy (`copy` indexes DistributedVariables).
  // Mirrored: all-reduce (SUM) then every replica updates its own copy, in parallel.
  // Others: reduce to the one copy, update it once.
  using UpdateFn = std::function<absl::Status(int copy, std::vector<Tensor>& variables,
                                              const std::vector<Tensor>& gradients)>;
  absl::Status ApplyGradients(PerReplica<std::vector<Tensor>>& gradients,
                              DistributedVariables& variables, const UpdateFn& update);

  // For ReplicaContext.
  absl::Status CollectiveAllReduce(int replica, ReduceOp op, std::vector<Tensor>& values);

  // Reduces `values` in place over the workers in sync (one value per worker; nothing to do
  // with one worker). Every worker must call it with the same shapes, in the same order.
  virtual absl::Status AllReduceAcrossWorkers(ReduceOp op, std::vector<Tensor>& values) const;
  // Replaces `values` on every worker by the chief's (initial and restored variables).
  virtual absl::Status BroadcastFromChief(std::vector<Tensor>& values) const;

 protected:
  Strategy(std::vector<std::string> devices, std::unique_ptr<CrossDeviceOps> cross_device_ops,
           StrategyOptions options = {});

 private:
  std::vector<std::string> devices_;
  uint64_t id_;
  std::unique_ptr<CrossDeviceOps> cross_device_ops_;
  StrategyOptions options_;
  std::unique_ptr<ReplicaPool> pool_;  // null for one replica

  DistributeOptions WithWorkers(DistributeOptions options) const {
    options.num_workers = num_workers();
    options.worker_index = worker_index();
    return options;
  }
};

// The strategy of the innermost Scope() on this thread, or the default strategy.
Strategy& GetStrategy();
bool HasStrategy();

// The strategy in effect outside any scope: one replica, on the default device (GPU:0 when
// a GPU is visible, as in TensorFlow; else CPU:0).
class DefaultStrategy : public Strategy {
 public:
  DefaultStrategy();
  std::string name() const override { return "DefaultDistributionStrategy"; }
};

// One replica on the named device ("CPU:0"; a "GPU:n" device needs the CUDA build).
class OneDeviceStrategy : public Strategy {
 public:
  static absl::StatusOr<std::unique_ptr<OneDeviceStrategy>> Create(const std::string& device);
  std::string name() const override { return "OneDeviceStrategy"; }

 private:
  explicit OneDeviceStrategy(std::string device);
};

// Checks a device name: "CPU:n" (logical CPU devices give a strategy several replicas
// without GPUs), or "GPU:n". `/job:...` prefixes are accepted and dropped.
absl::StatusOr<std::string> CanonicalDevice(const std::string& device);

template <typename R>
absl::StatusOr<PerReplica<R>> Strategy::Run(
    const std::function<absl::StatusOr<R>(ReplicaContext&)>& fn) {
  std::vector<std::optional<R>> results(static_cast<size_t>(NumLocalReplicas()));
  absl::Status status = RunEach([&](ReplicaContext& context) -> absl::Status {
    absl::StatusOr<R> result = fn(context);
    if (!result.ok()) return result.status();
    results[static_cast<size_t>(context.local_replica_id())] = *std::move(result);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  std::vector<R> values;
  for (auto& result : results) values.push_back(*std::move(result));
  return PerReplica<R>(std::move(values));
}

template <typename T>
absl::StatusOr<PerReplica<T>> Strategy::ExperimentalDistributeValuesFromFunction(
    const std::function<absl::StatusOr<T>(const ValueContext&)>& fn) const {
  std::vector<T> values;
  for (int replica = 0; replica < NumLocalReplicas(); ++replica) {
    absl::StatusOr<T> value =
        fn(ValueContext{worker_index() * NumLocalReplicas() + replica, NumReplicasInSync()});
    if (!value.ok()) return value.status();
    values.push_back(*std::move(value));
  }
  return PerReplica<T>(std::move(values));
}

}  // namespace stratum
