// RemoteWorkerExecutor: the ClusterCoordinator's WorkerExecutor for one worker process
// (stratum-worker), reached through a WorkerConnection (gRPC in a job). It sets the job up
// on the worker on first use and again after the worker restarted (lost its job) or was
// unreachable, and classifies the worker's failures for the coordinator: UNAVAILABLE
// (down) and ABORTED (restarted) run the closure elsewhere; FAILED_PRECONDITION when
// another coordinator holds the worker ends the job. A worker that answers but cannot set
// the job up is left out (LeftOut) until it restarts. Internal to coordinator/ (the PS
// training job builds one per worker).
//
// Thread safety: Execute, Cancel and WaitUntilAvailable may be called from several of the
// coordinator's threads at once (several closures in flight on one worker): one thread sets
// the job up while the others wait (setup_mutex_), and Cancel ends every call in flight.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.pb.h"
#include "stratum/coordinator/cluster_coordinator.h"
#include "worker_connection.h"

namespace stratum {

class RemoteWorkerExecutor : public WorkerExecutor {
 public:
  // `task` ("worker:1") and `address` name the worker; `setup` is the job it is given;
  // `timeout` bounds every call. `may_set_up_again`: asked before the job is set up on the
  // worker again; an error ends the job instead (this coordinator lost the cluster to
  // another one).
  RemoteWorkerExecutor(std::string task, std::string address, proto::SetupJobRequest setup,
                       absl::Duration timeout, std::unique_ptr<WorkerConnection> connection,
                       std::function<absl::Status()> may_set_up_again);

  // Done with the worker (best effort): another coordinator may set it up at once, not
  // only once this one's claim has run out.
  ~RemoteWorkerExecutor() override;

  std::string name() const override;
  absl::StatusOr<ClosureOutputs> Execute(const Closure& closure) override;
  void Cancel() override;
  absl::Status WaitUntilAvailable(const std::atomic<bool>& stop) override;
  absl::Status LeftOut() const override;

 private:
  // Sets the job up on the worker unless it is set up already, and returns the set-up's
  // generation. With several closures in flight, one thread sets up and the others wait.
  absl::StatusOr<uint64_t> EnsureSetUp();

  // A worker that restarted lost its job ("not set up"), one that is unreachable is down:
  // both mean "run the closure elsewhere" and "set it up again", unless another closure has
  // set it up since `generation`; anything else is the job's own error. One that another
  // coordinator holds ends this one's job.
  absl::Status Classify(const absl::Status& status, uint64_t generation, bool locked = false);

  std::string task_;
  std::string address_;
  proto::SetupJobRequest setup_;
  absl::Duration timeout_;
  std::unique_ptr<WorkerConnection> connection_;
  std::function<absl::Status()> may_set_up_again_;
  absl::Mutex setup_mutex_;
  bool set_up_ ABSL_GUARDED_BY(setup_mutex_) = false;
  // Why the worker is left out (OK: it is not), and the worker process that refused: it is
  // tried again once another process (a restart) serves on its address.
  mutable absl::Mutex left_out_mutex_;
  absl::Status left_out_ ABSL_GUARDED_BY(left_out_mutex_);
  uint64_t left_out_incarnation_ ABSL_GUARDED_BY(left_out_mutex_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(setup_mutex_) = 0;  // counts set-ups
  std::atomic<bool> cancelled_ = false;                    // Cancel was called
};

}  // namespace stratum
