// MultiWorkerMirroredStrategy: synchronous data parallelism across processes. Every worker
// runs the same training program on its local replicas (as MirroredStrategy does); each
// step the gradients are reduced over the local replicas, then over the workers by the
// collectives (ring all-reduce over TCP), then copied back to every local replica, so all
// copies on all workers stay identical bit for bit. On GPUs with communication NCCL one
// NCCL group sums every replica of every worker instead (collective/nccl_across_workers.h). Initial
// and restored variables are broadcast from the chief (worker index 0).
//
// Create takes collectives already connected (see ConnectMultiWorker in
// multi_worker_job.h for the TF_CONFIG path). Thread safety: as Strategy (one training
// thread); the collectives are used from the replica that completes a local reduction.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/worker/collective/collectives.h"
#include "stratum/worker/mirrored_strategy.h"

namespace stratum {

class MultiWorkerMirroredStrategy : public MirroredStrategy {
 public:
  // `collectives`' rank is this worker's index, its size the number of workers.
  // `rendezvous` (the coordination service's key-value store; it must outlive the strategy)
  // forms the NCCL group when the collectives' implementation is NCCL, and may be null
  // otherwise.
  static absl::StatusOr<std::unique_ptr<MultiWorkerMirroredStrategy>> Create(
      const MirroredOptions& local, std::unique_ptr<Collectives> collectives,
      Rendezvous* rendezvous = nullptr);

  std::string name() const override { return "MultiWorkerMirroredStrategy"; }
  int num_workers() const override { return collectives_->size(); }
  int worker_index() const override { return collectives_->rank(); }
  absl::Status AllReduceAcrossWorkers(ReduceOp op, std::vector<Tensor>& values) const override;
  absl::Status BroadcastFromChief(std::vector<Tensor>& values) const override;

  const CommunicationOptions& communication() const { return collectives_->options(); }
  // Every worker's task name, index = worker.
  std::vector<std::string> WorkerNames() const;
  Rendezvous* rendezvous() const { return rendezvous_; }
  // A new number on each call, the same sequence on every worker (they make the same calls):
  // keeps the keys of a second NCCL group (a second Fit) apart from the first's.
  int NextGroupGeneration() const { return group_generation_++; }

 private:
  MultiWorkerMirroredStrategy(std::vector<std::string> devices,
                              std::unique_ptr<CrossDeviceOps> cross_device_ops,
                              StrategyOptions options, std::unique_ptr<Collectives> collectives,
                              Rendezvous* rendezvous)
      : MirroredStrategy(std::move(devices), std::move(cross_device_ops), options),
        collectives_(std::move(collectives)),
        rendezvous_(rendezvous) {}

  std::unique_ptr<Collectives> collectives_;
  Rendezvous* rendezvous_;
  mutable std::atomic<int> group_generation_{0};
};

}  // namespace stratum
