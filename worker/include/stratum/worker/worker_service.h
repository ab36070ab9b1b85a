// WorkerService: what a worker of a parameter-server job does for the coordinator.
// SetupJob builds the job's model, the worker's own dataset (shuffled with a per-worker
// seed, repeated) and its PS connections; RunClosure runs a named step function:
//   train_step(steps): for each step, pull the variables from the PS tasks (in parallel),
//     run the local replicas as a MirroredStrategy, sum their gradients, push them (in
//     parallel); returns [loss_sum, correct, examples].
// A closure from a coordinator incarnation the worker was not set up by is refused with
// FAILED_PRECONDITION ("not set up"), so a restarted worker is set up again, never used
// half-built. One coordinator at a time holds the worker (CoordinatorLease: its SetupJob
// claims it, its closures keep the claim, Leave ends it): another one is refused, naming
// the holder, while the holder's closures come; it takes over once the holder has been
// silent for the lease, or at once when it is the holder restarted. The PS clients dial with
// `channel` (the task's TLS settings). Thread-safe (closures run one at a time).
#pragma once

#include <memory>

#include "absl/synchronization/mutex.h"
#include "proto/worker.grpc.pb.h"
#include "stratum/net/channel.h"
#include "stratum/ps/coordinator_lease.h"

namespace stratum {

class WorkerJob;

class WorkerService final : public proto::WorkerService::Service {
 public:
  explicit WorkerService(ChannelOptions channel = {}, absl::Duration lease = absl::Seconds(5));
  ~WorkerService() override;

  grpc::Status SetupJob(grpc::ServerContext*, const proto::SetupJobRequest* request,
                        proto::SetupJobResponse* response) override;
  grpc::Status RunClosure(grpc::ServerContext*, const proto::RunClosureRequest* request,
                          proto::RunClosureResponse* response) override;
  grpc::Status Leave(grpc::ServerContext*, const proto::LeaveRequest* request,
                     proto::LeaveResponse* response) override;

 private:
  const ChannelOptions channel_;
  CoordinatorLease lease_;
  absl::Mutex mutex_;
  std::unique_ptr<WorkerJob> job_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace stratum
