// PsWorker: what a worker of a parameter-server job does for its coordinator, in plain
// C++ (the gRPC WorkerService is a thin adapter over it; tests drive it directly).
// SetupJob builds the job's model, the worker's own dataset (shuffled with a per-worker
// seed, repeated) when the job has data, and its PS connections; RunClosure runs a
// function by name: the built-in train_step, or one the worker program registered
// (WorkerFunctions), its per-worker arguments resolved to this worker's own.
//   train_step(steps): for each step, pull the variables from the PS tasks (in parallel),
//     run the local replicas as a MirroredStrategy, sum their gradients, push them (in
//     parallel); returns [loss_sum, correct, examples].
// A closure from a coordinator incarnation the worker was not set up by is refused with
// FAILED_PRECONDITION ("not set up"), so a restarted worker is set up again, never used
// half-built. One coordinator at a time holds the worker (CoordinatorLease: its SetupJob
// claims it, its closures keep the claim, Leave ends it): another one is refused, naming
// the holder, while the holder's closures come; it takes over once the holder has been
// silent for the lease, or at once when it is the holder restarted. The PS clients dial with
// `channel` (the task's TLS settings) over gRPC, or over the transport `ps_transport` makes
// when given (PSs in the test's own process). Thread-safe (closures run one at a time).
// Internal to worker/.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.pb.h"
#include "stratum/net/channel.h"
#include "stratum/ps/coordinator_lease.h"
#include "stratum/ps/ps_transport.h"
#include "stratum/worker/worker_functions.h"

namespace stratum {

class WorkerJob;

class PsWorker {
 public:
  PsWorker(ChannelOptions channel, absl::Duration lease, WorkerFunctions functions,
           PsTransportFactory ps_transport = nullptr);
  ~PsWorker();

  // `peer`: where the call came from (PeerHostOf; "" when unknown), which a coordinator
  // restarted on its old address must share with the one it replaces to take over at once.
  absl::StatusOr<proto::SetupJobResponse> SetupJob(const proto::SetupJobRequest& request,
                                                   absl::string_view peer = "");
  absl::StatusOr<proto::RunClosureResponse> RunClosure(const proto::RunClosureRequest& request);
  proto::LeaveResponse Leave(const proto::LeaveRequest& request);

 private:
  // The closure's arguments with per-worker values as this worker's own (its datasets
  // built on first use).
  absl::StatusOr<ClosureArguments> Arguments(const proto::RunClosureRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const ChannelOptions channel_;
  const PsTransportFactory ps_transport_;
  const WorkerFunctions functions_;
  CoordinatorLease lease_;
  absl::Mutex mutex_;
  std::unique_ptr<WorkerJob> job_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace stratum
