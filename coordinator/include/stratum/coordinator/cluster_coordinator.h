// ClusterCoordinator: tf.distribute.experimental.coordinator.ClusterCoordinator's
// scheduling core. The training program Schedules closures (a registered step function's
// name plus arguments: closures travel by name, never as code); each returns a
// RemoteValue at once. One thread per worker slot takes closures from a bounded queue and
// runs them through that worker's WorkerExecutor.
//
// Semantics kept from TensorFlow:
// - Schedule never waits for the step, only for room in the queue.
// - Closures run at least once: when a worker fails (UNAVAILABLE, or a new incarnation),
//   its closure goes back on the queue for another worker, and the worker is used again
//   once it answers (WorkerExecutor::WaitUntilAvailable).
// - The first error a closure itself raises is returned once, from the next Schedule,
//   Join or Done; every closure still queued is cancelled (its RemoteValue aborted).
// - Join waits until nothing is queued or in flight.
// Better than TensorFlow: every wait can have a deadline, and errors name the worker.
//
// Thread safety: Schedule, Join, Done and RemoteValue methods may be called from any
// thread; executors are called from the coordinator's own threads.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "stratum/tensor/tensor.h"
#include "stratum/util/clock.h"

namespace stratum {

// tf.distribute's PerWorkerValues: one value per worker, each worker's its own. As a
// closure's argument, the worker that runs the closure takes its own. Made by
// ClusterCoordinator::CreatePerWorkerDataset: each worker's iterator over the dataset that
// the function registered on it as `dataset` builds (WorkerFunctions::RegisterDataset).
struct PerWorkerValues {
  int64_t id = 0;
  std::string dataset;
};

// One argument of a closure: a tensor (the same for every worker) or per-worker values.
class ClosureArg {
 public:
  ClosureArg(Tensor tensor) : value_(std::move(tensor)) {}           // NOLINT: implicit
  ClosureArg(PerWorkerValues values) : value_(std::move(values)) {}  // NOLINT: implicit
  // nullptr when the argument is of the other kind.
  const Tensor* tensor() const { return std::get_if<Tensor>(&value_); }
  const PerWorkerValues* per_worker() const { return std::get_if<PerWorkerValues>(&value_); }

 private:
  std::variant<Tensor, PerWorkerValues> value_;
};

struct Closure {
  std::string function;  // a function registered on the workers, e.g. "train_step"
  std::vector<ClosureArg> args;
  int64_t id = 0;    // assigned by Schedule
  int attempts = 0;  // workers it has been tried on
};

using ClosureOutputs = std::vector<Tensor>;

enum class RemoteValueStatus { kNotReady, kReady, kAborted };

// The eventual outputs of one scheduled closure.
class RemoteValue {
 public:
  RemoteValueStatus status() const;
  // Waits until the closure finished or was aborted (or `timeout` passes:
  // DEADLINE_EXCEEDED). An aborted closure gives CANCELLED or the error that aborted it.
  absl::StatusOr<ClosureOutputs> Fetch(absl::Duration timeout = absl::InfiniteDuration()) const;

  // For the coordinator.
  void Set(absl::StatusOr<ClosureOutputs> result);

 private:
  mutable absl::Mutex mutex_;
  std::optional<absl::StatusOr<ClosureOutputs>> result_ ABSL_GUARDED_BY(mutex_);
};

// How the coordinator reaches one worker. Implemented over gRPC by the worker client, and
// by fakes in tests.
class WorkerExecutor {
 public:
  virtual ~WorkerExecutor() = default;
  // "worker:1 at host:port", for messages.
  virtual std::string name() const = 0;
  // Runs the closure on the worker. UNAVAILABLE (and ABORTED for a restarted worker) mean
  // the worker failed and the closure should run elsewhere; any other error is the
  // closure's own and is raised to the program.
  virtual absl::StatusOr<ClosureOutputs> Execute(const Closure& closure) = 0;
  // Blocks until the worker answers again (rebuilding what it lost), or `stop` is set.
  // OK when it is back.
  virtual absl::Status WaitUntilAvailable(const std::atomic<bool>& stop) = 0;
  // Ends the closures running on this worker now (Execute returns CANCELLED) and refuses
  // new ones: the coordinator is shutting down and will not wait for a stuck worker.
  virtual void Cancel() {}
  // Why this worker is left out of the job, when it answers but cannot run it (it could not
  // set the job up: its data cannot be read, say), until it restarts; OK otherwise. Its
  // closures run elsewhere meanwhile; the job fails only when every worker is left out.
  virtual absl::Status LeftOut() const { return absl::OkStatus(); }
};

struct ClusterCoordinatorOptions {
  int max_queue_size = 128;     // Schedule blocks while this many closures are queued
  int closures_per_worker = 1;  // closures in flight per worker
  int max_attempts = 10;        // a closure that failed on this many workers is an error
  // Notified (SIGTERM): Schedule and Join stop waiting (for room in the queue, for the
  // closures, however long the workers stay down) and return CANCELLED.
  const absl::Notification* cancel = nullptr;
  // Every worker down this long ends the waits with UNAVAILABLE naming them (TensorFlow
  // waits without end); one coming back in time resets it.
  absl::Duration worker_recovery_timeout = absl::Minutes(5);
  // Asked by Schedule and Join (cheap, no RPC): an error ends the program's use of the
  // cluster with it, e.g. once another coordinator took its parameter servers over.
  std::function<absl::Status()> check_hold;
  // The time worker_recovery_timeout and Join's timeout count in (a test's FakeClock
  // drives it); null: Clock::Real(). A cancel is noticed within 100 ms of real time.
  const Clock* clock = nullptr;
};

class ClusterCoordinator {
 public:
  ClusterCoordinator(std::vector<std::unique_ptr<WorkerExecutor>> workers,
                     ClusterCoordinatorOptions options = {});
  ~ClusterCoordinator();  // cancels what is queued and stops the worker threads

  // Queues a closure. Returns the first closure error not yet raised, if there is one.
  absl::StatusOr<std::shared_ptr<RemoteValue>> Schedule(std::string function,
                                                        std::vector<ClosureArg> args);
  // tf.distribute's create_per_worker_dataset: per-worker iterators over the dataset that
  // the function registered on the workers as `dataset` builds. Nothing travels now: each
  // worker builds its dataset on the first closure that takes these values, once, and
  // again after it restarted (its job set up anew); an unknown name fails that closure.
  PerWorkerValues CreatePerWorkerDataset(std::string dataset);
  // Waits until nothing is queued or in flight; returns the first error not yet raised.
  // DEADLINE_EXCEEDED after `timeout`, saying how many closures are still pending.
  absl::Status Join(absl::Duration timeout = absl::InfiniteDuration());
  // Whether nothing is queued or in flight; returns the error not yet raised.
  absl::StatusOr<bool> Done();
  // For stopping early: cancels every closure still queued (its RemoteValue says so) and
  // waits, even after `cancel`, until none is in flight. DEADLINE_EXCEEDED after `timeout`.
  absl::Status Drain(absl::Duration timeout);

  int num_workers() const { return static_cast<int>(workers_.size()); }
  // Closures that were put back on the queue because their worker failed.
  int64_t retried_closures() const;
  // Waits until at least `count` callers are blocked in Schedule (the queue is full) or Join,
  // or `timeout` passes; true when they are. Lets a test act once a wait is provably under
  // way instead of sleeping and hoping it is.
  bool AwaitBlockedCallers(int count, absl::Duration timeout) const;

 private:
  struct Pending {
    Closure closure;
    std::shared_ptr<RemoteValue> value;
  };

  void WorkerLoop(size_t worker);
  // Takes the raised-once error, if any. Requires mutex_.
  absl::Status TakeError() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void CancelQueued(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // One of `worker`'s threads begins (+1) or ends (-1) waiting for it to come back.
  void CountDown(size_t worker, int change);
  // Makes it the error when every worker has been down past worker_recovery_timeout.
  void CheckEveryWorkerDown() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Waits for `condition` until `deadline`, checking options_.cancel and whether every
  // worker has been down too long every 100 ms. Returns false at the deadline; CANCELLED
  // (and cancels the queue) when cancel was notified.
  absl::StatusOr<bool> AwaitUnlessCancelled(const absl::Condition& condition, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Clock& clock() const { return options_.clock != nullptr ? *options_.clock : Clock::Real(); }

  const ClusterCoordinatorOptions options_;
  std::vector<std::unique_ptr<WorkerExecutor>> workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mutex_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mutex_);
  int in_flight_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t next_id_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t next_per_worker_id_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t retried_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mutex_);     // raised once, then cleared
  bool draining_ ABSL_GUARDED_BY(mutex_) = false;  // Drain: closures are not run again
  std::vector<int> waiting_for_worker_ ABSL_GUARDED_BY(mutex_);  // threads, per worker
  absl::Time every_worker_down_since_ ABSL_GUARDED_BY(mutex_) = absl::InfiniteFuture();
  // Callers inside AwaitUnlessCancelled's wait (visible under mutex_ only while they block).
  int blocked_callers_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace stratum
