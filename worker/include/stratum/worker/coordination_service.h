// CoordinationService: the state of a MultiWorkerMirrored cluster, kept by its leader task
// (chief:0, else worker:0). Tasks register with an incarnation, send heartbeats, exchange
// small values through a key-value store (transport addresses, the NCCL unique id) and meet
// at barriers. It knows nothing of gRPC: GrpcCoordinationService (coordination_grpc_service.h)
// serves it, CoordinationAgent (coordination_client.h) calls it from every task.
//
// The cluster fails as one, as TensorFlow's does: the first failure of any task (an error
// it reports, a restart, a silence longer than the heartbeat timeout) becomes the cluster
// error; every blocked wait wakes up with it and every later call returns it, so each task
// learns of the failure (through its heartbeats at the latest) and the job restarts from
// its last checkpoint. Every wait has a deadline and, when it passes, names the tasks it
// still waited for.
//
// State of one task:
//
//   unregistered --RegisterTask--> connected --ReportError, or re-registered with a new
//                                      |        incarnation, or silent > heartbeat_timeout
//                                      |                 --> error (sets the cluster error)
//                                      +--DisconnectTask--> disconnected (left cleanly)
//
// Thread-safe: every method may be called from any thread; the waits block only their
// caller.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stratum/cluster/cluster_spec.h"

namespace stratum {

struct CoordinationServiceOptions {
  // Every task that takes part (worker:0..n-1, or chief:0 and the workers).
  std::vector<TaskKey> tasks;
  // A registered task silent this long is dead.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // The task that runs the service, for messages.
  TaskKey leader = {"worker", 0};
};

// A random, non-zero incarnation: what a process registers with.
uint64_t NewIncarnation();

class CoordinationService {
 public:
  // `now` drives the heartbeat bookkeeping only, so that a test can age a task without
  // sleeping (absl::Now when empty); deadlines of waits are always real time.
  explicit CoordinationService(CoordinationServiceOptions options,
                               std::function<absl::Time()> now = nullptr);
  ~CoordinationService();  // Shutdown()

  CoordinationService(const CoordinationService&) = delete;
  CoordinationService& operator=(const CoordinationService&) = delete;

  // Registers `task` as the process with `incarnation` (a random id each process draws at
  // its start). Registering again with the same incarnation is a harmless retry; with a new
  // one the task restarted and lost its state, which fails the cluster.
  //   INVALID_ARGUMENT: `task` is not one of the options' tasks, or incarnation is 0.
  //   ABORTED: the task restarted (this becomes the cluster error).
  //   the cluster error, or UNAVAILABLE after Shutdown.
  absl::Status RegisterTask(const TaskKey& task, uint64_t incarnation);

  // Proof of life. OK while the cluster is healthy, so that agents learn of failures
  // through their heartbeats.
  //   INVALID_ARGUMENT: unknown task.
  //   FAILED_PRECONDITION: the task is not registered (with this service: the leader may
  //     have restarted).
  //   ABORTED: `incarnation` is not the one the task registered with.
  //   the cluster error, or UNAVAILABLE after Shutdown.
  absl::Status Heartbeat(const TaskKey& task, uint64_t incarnation);

  // The task leaves cleanly (its job is done, or failed): its silence is no longer an
  // error, and a barrier that still needs it fails at once instead of timing out.
  //   INVALID_ARGUMENT, FAILED_PRECONDITION, ABORTED: as Heartbeat.
  //   the cluster error (the task has left all the same), or UNAVAILABLE after Shutdown.
  absl::Status DisconnectTask(const TaskKey& task, uint64_t incarnation);

  // Sets `key`, replacing any value, and wakes the tasks waiting for it.
  //   the cluster error, or UNAVAILABLE after Shutdown.
  absl::Status SetKeyValue(const std::string& key, const std::string& value);

  // Waits until `key` is set.
  //   DEADLINE_EXCEEDED at `deadline`, naming the key and the tasks not registered yet.
  //   the cluster error (also when it is recorded during the wait), or UNAVAILABLE after
  //   Shutdown.
  absl::StatusOr<std::string> GetKeyValue(const std::string& key, absl::Time deadline);

  // The value of `key` now. NOT_FOUND when it is not set; the cluster error; UNAVAILABLE
  // after Shutdown.
  absl::StatusOr<std::string> TryGetKeyValue(const std::string& key);

  // Waits until every task of the options has arrived at barrier `id`; all of them then
  // get OK, and so does a repeated call of a task that already passed (a retry). Ids are
  // single-use: a barrier that failed answers every later call with its failure.
  //   INVALID_ARGUMENT: unknown task.  FAILED_PRECONDITION: `task` is not registered.
  //   ABORTED naming the tasks the barrier still needs that have disconnected (finished
  //     or stopped): the job cannot complete as it is, but running it again can.
  //   DEADLINE_EXCEEDED at the first waiter's deadline, for every waiter:
  //     barrier "id" timed out after 30s: 1 of 3 tasks did not arrive: worker:2 (...)
  //     where (...) says whether the task never registered or stopped sending heartbeats.
  //   the cluster error (also when it is recorded during the wait), or UNAVAILABLE after
  //     Shutdown.
  absl::Status WaitAtBarrier(const std::string& id, const TaskKey& task, absl::Time deadline);

  // `task` failed with `error`: the first report (or other failure) becomes the cluster
  // error, "worker:1 failed: <error>", with the error's code. Later reports are ignored.
  //   OK once accepted (also when an earlier failure already won).
  //   INVALID_ARGUMENT: unknown task, or `error` is OK.
  absl::Status ReportError(const TaskKey& task, const absl::Status& error);

  // The heartbeat watchdog; the gRPC adapter calls it periodically. A connected task silent
  // longer than heartbeat_timeout goes to the error state and, if it is the first failure,
  // becomes the cluster error (UNAVAILABLE, "worker:1 sent no heartbeat for 10s ...").
  void CheckHeartbeats();

  // After a failure, for the leader before it shuts the service down: waits until every
  // task has learnt it (from the answer to its own report or to a heartbeat) or left (it
  // disconnected, or went silent), or `timeout` passes. True when none is left untold.
  bool AwaitEveryTaskTold(absl::Duration timeout);

  // Wakes every wait with UNAVAILABLE ("the coordination service on worker:0 is shutting
  // down"), which every later call returns too. Idempotent.
  void Shutdown();

  // Waits until at least `count` callers are blocked in GetKeyValue, WaitAtBarrier or
  // AwaitEveryTaskTold, or `timeout` passes; true when they are. Lets a test act once a
  // wait is provably under way instead of sleeping and hoping it is.
  bool AwaitBlockedCallers(int count, absl::Duration timeout) const;

  // OK, or the first failure of the cluster.
  absl::Status cluster_error() const;
  // Random, drawn at construction: agents see a new value when the leader restarted.
  uint64_t incarnation() const { return incarnation_; }
  absl::Duration heartbeat_timeout() const { return options_.heartbeat_timeout; }
  const std::vector<TaskKey>& tasks() const { return options_.tasks; }

 private:
  enum class TaskState { kUnregistered, kConnected, kError, kDisconnected };

  struct TaskInfo {
    TaskState state = TaskState::kUnregistered;
    uint64_t incarnation = 0;
    absl::Time last_heartbeat;
    bool told = false;  // a heartbeat's answer carried the cluster error
  };

  struct Barrier {
    std::set<TaskKey> arrived;
    absl::Status result;  // meaningful once done
    bool done = false;
  };

  // INVALID_ARGUMENT naming the known tasks when `task` is not one of them.
  absl::StatusOr<TaskInfo*> FindTask(const TaskKey& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The shutdown status, else the cluster error, else OK.
  absl::Status StopStatus() const ABSL_SHARED_LOCKS_REQUIRED(mutex_);
  // Checks that `task` is known and registered with `incarnation`.
  absl::StatusOr<TaskInfo*> FindRegisteredTask(const TaskKey& task, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Records the first failure and wakes every wait.
  void SetClusterError(absl::Status error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Completes `barrier` when everyone arrived, or fails it when a missing task left.
  void UpdateBarrier(const std::string& id, Barrier& barrier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // "worker:2 (never registered: ...)", "worker:1 (no heartbeat for 12s)", or the name.
  std::string DescribeMissing(const TaskKey& task) const ABSL_SHARED_LOCKS_REQUIRED(mutex_);
  std::string UnregisteredTasks() const ABSL_SHARED_LOCKS_REQUIRED(mutex_);
  // changed_.WaitWithDeadline, counted in blocked_callers_: true when it timed out.
  bool WaitForChange(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const CoordinationServiceOptions options_;
  const std::function<absl::Time()> now_;
  const uint64_t incarnation_;
  const std::string leader_;

  mutable absl::Mutex mutex_;
  absl::CondVar changed_;  // signalled on every change a wait may be waiting for
  std::map<TaskKey, TaskInfo> tasks_ ABSL_GUARDED_BY(mutex_);
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mutex_);
  std::map<std::string, Barrier> barriers_ ABSL_GUARDED_BY(mutex_);
  absl::Status cluster_error_ ABSL_GUARDED_BY(mutex_);
  bool shut_down_ ABSL_GUARDED_BY(mutex_) = false;
  // Callers inside changed_.WaitWithDeadline (visible under mutex_ only while they block).
  int blocked_callers_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace stratum
