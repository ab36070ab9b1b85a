#include "stratum/coordinator/cluster_coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"
#include "stratum/util/counted.h"
#include "stratum/util/error_kind.h"
#include "stratum/util/metrics.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// The closure queue's Prometheus series.
Gauge& QueueDepth() {
  static Gauge& gauge = MetricsRegistry::Global().GetGauge(
      "stratum_coordinator_closures_queued", "Closures scheduled and not yet taken by a worker.");
  return gauge;
}
Counter& ClosuresRun() {
  static Counter& counter = MetricsRegistry::Global().GetCounter(
      "stratum_coordinator_closures_total", "Closure runs on workers, retries included.");
  return counter;
}
Counter& ClosuresRetried() {
  static Counter& counter = MetricsRegistry::Global().GetCounter(
      "stratum_coordinator_closures_retried_total",
      "Closures put back on the queue after their worker failed.");
  return counter;
}

}  // namespace

namespace {

bool IsWorkerFailure(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsAborted(status);
}

}  // namespace

RemoteValueStatus RemoteValue::status() const {
  absl::MutexLock lock(&mutex_);
  if (!result_.has_value()) return RemoteValueStatus::kNotReady;
  return result_->ok() ? RemoteValueStatus::kReady : RemoteValueStatus::kAborted;
}

absl::StatusOr<ClosureOutputs> RemoteValue::Fetch(absl::Duration timeout) const {
  absl::MutexLock lock(&mutex_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return result_.has_value(); };
  if (!mutex_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the closure's result was not ready after ", absl::FormatDuration(timeout)));
  }
  return *result_;
}

void RemoteValue::Set(absl::StatusOr<ClosureOutputs> result) {
  absl::MutexLock lock(&mutex_);
  if (!result_.has_value()) result_ = std::move(result);
}

ClusterCoordinator::ClusterCoordinator(std::vector<std::unique_ptr<WorkerExecutor>> workers,
                                       ClusterCoordinatorOptions options)
    : options_(options), workers_(std::move(workers)), waiting_for_worker_(workers_.size(), 0) {
  for (int slot = 0; slot < options_.closures_per_worker; ++slot) {
    for (size_t worker = 0; worker < workers_.size(); ++worker) {
      threads_.emplace_back([this, worker] { WorkerLoop(worker); });
    }
  }
}

ClusterCoordinator::~ClusterCoordinator() {
  stop_ = true;
  {
    absl::MutexLock lock(&mutex_);
    CancelQueued(absl::CancelledError("the coordinator shut down before the closure ran"));
  }
  // A closure still running (after Drain timed out, say) is on a stuck worker: without this
  // the join would wait for its RPC deadline (30 s), past a pod's grace period.
  for (const std::unique_ptr<WorkerExecutor>& worker : workers_) worker->Cancel();
  for (std::thread& thread : threads_) thread.join();
}

void ClusterCoordinator::CancelQueued(const absl::Status& why) {
  for (Pending& pending : queue_) pending.value->Set(why);
  queue_.clear();
  QueueDepth().Set(0);
}

absl::Status ClusterCoordinator::TakeError() {
  absl::Status error = error_;
  error_ = absl::OkStatus();
  return error;
}

void ClusterCoordinator::WorkerLoop(size_t worker) {
  WorkerExecutor& executor = *workers_[worker];
  while (true) {
    Pending pending;
    {
      absl::MutexLock lock(&mutex_);
      auto has_work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
        return stop_.load() || !queue_.empty();
      };
      mutex_.Await(absl::Condition(&has_work));
      if (stop_) return;
      pending = std::move(queue_.front());
      queue_.pop_front();
      QueueDepth().Set(static_cast<double>(queue_.size()));
      ++in_flight_;
    }
    ++pending.closure.attempts;
    ClosuresRun().Add();
    absl::StatusOr<ClosureOutputs> result = executor.Execute(pending.closure);

    bool wait_for_worker = false;
    {
      absl::MutexLock lock(&mutex_);
      --in_flight_;
      if (result.ok()) {
        pending.value->Set(*std::move(result));
      } else if (draining_) {  // stopping: not run again, and not the program's error
        pending.value->Set(absl::CancelledError(
            absl::StrCat("the coordinator stopped while the closure failed on ", executor.name(),
                         ": ", result.status().message())));
      } else if (IsWorkerFailure(result.status()) &&
                 pending.closure.attempts < options_.max_attempts && !stop_) {
        // At least once: another worker (or this one, once back) runs it again.
        ++retried_;
        ClosuresRetried().Add();
        queue_.push_front(std::move(pending));
        QueueDepth().Set(static_cast<double>(queue_.size()));
        wait_for_worker = true;
      } else {
        // Named once: the executor's errors often begin with its name already.
        const absl::string_view what =
            absl::StripPrefix(result.status().message(), absl::StrCat(executor.name(), ": "));
        absl::Status error =
            IsWorkerFailure(result.status())
                ? absl::UnavailableError(absl::StrCat("closure \"", pending.closure.function,
                                                      "\" failed on ", pending.closure.attempts,
                                                      " workers in a row, last on ",
                                                      executor.name(), ": ", what))
                // The closure's own error keeps what it is (its ErrorKind).
                : Rewrapped(result.status(), absl::StrCat("closure \"", pending.closure.function,
                                                          "\" on ", executor.name(), ": ", what));
        pending.value->Set(error);
        if (error_.ok()) {
          error_ = error;
          CancelQueued(absl::CancelledError(
              absl::StrCat("cancelled because an earlier closure failed: ", error.message())));
        }
      }
    }
    if (!wait_for_worker) continue;
    CountDown(worker, +1);
    const absl::Status back = executor.WaitUntilAvailable(stop_);
    CountDown(worker, -1);
    if (!back.ok()) return;
  }
}

void ClusterCoordinator::CountDown(size_t worker, int change) {
  absl::MutexLock lock(&mutex_);
  waiting_for_worker_[worker] += change;
  const bool every_worker_down = std::all_of(waiting_for_worker_.begin(), waiting_for_worker_.end(),
                                             [](int waiting) { return waiting > 0; });
  if (!every_worker_down) {
    every_worker_down_since_ = absl::InfiniteFuture();
  } else if (every_worker_down_since_ == absl::InfiniteFuture()) {
    every_worker_down_since_ = clock().Now();
    // Workers left out (they answer, but cannot set the job up) come back only when
    // restarted: when all are, the job ends at once (CheckEveryWorkerDown), waiting for none.
    const bool every_worker_left_out =
        std::all_of(workers_.begin(), workers_.end(),
                    [](const std::unique_ptr<WorkerExecutor>& w) { return !w->LeftOut().ok(); });
    if (!every_worker_left_out) {
      spdlog::warn("every worker is down: training waits for one to come back, for up to {}",
                   absl::FormatDuration(options_.worker_recovery_timeout));
    }
  }
}

void ClusterCoordinator::CheckEveryWorkerDown() {
  if (!error_.ok() || every_worker_down_since_ == absl::InfiniteFuture()) return;
  // Every worker left out (each answers, and cannot set the job up): none will come back
  // by itself, so the job ends now, with their reasons.
  std::vector<std::string> reasons;
  absl::Status first;
  for (const auto& worker : workers_) {
    const absl::Status left_out = worker->LeftOut();
    if (left_out.ok()) break;
    if (first.ok()) first = left_out;
    reasons.emplace_back(left_out.message());
  }
  if (reasons.size() == workers_.size()) {
    error_ = absl::Status(first.code(), absl::StrCat("no worker can set the job up, so no closure "
                                                     "can run: ",
                                                     absl::StrJoin(reasons, "; ")));
    CancelQueued(absl::CancelledError(absl::StrCat("cancelled: ", error_.message())));
    return;
  }
  if (clock().Now() - every_worker_down_since_ <= options_.worker_recovery_timeout) return;
  std::vector<std::string> names;
  for (const auto& worker : workers_) names.push_back(worker->name());
  error_ = absl::UnavailableError(absl::StrCat(
      "every worker has been down for ", absl::FormatDuration(options_.worker_recovery_timeout),
      " (", absl::StrJoin(names, ", "),
      "), so no closure can run: start them again, or raise --worker_recovery_timeout"));
  CancelQueued(absl::CancelledError(absl::StrCat("cancelled: ", error_.message())));
}

absl::StatusOr<bool> ClusterCoordinator::AwaitUnlessCancelled(const absl::Condition& condition,
                                                              absl::Time deadline) {
  constexpr absl::Duration kCancelPoll = absl::Milliseconds(100);
  while (true) {
    // A cancel is looked for every kCancelPoll of real time; the deadline is on the clock.
    const absl::Time now = clock().Now();
    ++blocked_callers_;
    const bool met = mutex_.AwaitWithTimeout(condition, std::min(kCancelPoll, deadline - now));
    --blocked_callers_;
    if (met) return true;
    CheckEveryWorkerDown();
    if (!error_.ok() && condition.Eval()) return true;
    if (options_.cancel != nullptr && options_.cancel->HasBeenNotified()) {
      const std::string pending = absl::StrCat(queue_.size(), " closures queued and ", in_flight_,
                                               " in flight were dropped");
      CancelQueued(absl::CancelledError("the coordinator was stopped by a signal"));
      return absl::CancelledError(
          absl::StrCat("stopped by a signal during training (", pending, ")"));
    }
    if (clock().Now() >= deadline) return false;
  }
}

PerWorkerValues ClusterCoordinator::CreatePerWorkerDataset(std::string dataset) {
  absl::MutexLock lock(&mutex_);
  return PerWorkerValues{++next_per_worker_id_, std::move(dataset)};
}

absl::StatusOr<std::shared_ptr<RemoteValue>> ClusterCoordinator::Schedule(
    std::string function, std::vector<ClosureArg> args) {
  if (options_.check_hold) STRATUM_RETURN_IF_ERROR(options_.check_hold());
  absl::MutexLock lock(&mutex_);
  if (!error_.ok()) return TakeError();
  if (options_.cancel != nullptr && options_.cancel->HasBeenNotified()) {
    return absl::CancelledError("stopped by a signal during training");
  }
  auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
    return static_cast<int>(queue_.size()) < options_.max_queue_size || !error_.ok();
  };
  absl::StatusOr<bool> waited =
      AwaitUnlessCancelled(absl::Condition(&room), absl::InfiniteFuture());
  if (!waited.ok()) return waited.status();
  if (!error_.ok()) return TakeError();
  Pending pending;
  pending.closure.function = std::move(function);
  pending.closure.args = std::move(args);
  pending.closure.id = next_id_++;
  pending.value = std::make_shared<RemoteValue>();
  std::shared_ptr<RemoteValue> value = pending.value;
  queue_.push_back(std::move(pending));
  QueueDepth().Set(static_cast<double>(queue_.size()));
  return value;
}

absl::Status ClusterCoordinator::Join(absl::Duration timeout) {
  if (options_.check_hold) STRATUM_RETURN_IF_ERROR(options_.check_hold());
  absl::MutexLock lock(&mutex_);
  auto idle = [this]()
                  ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return queue_.empty() && in_flight_ == 0; };
  absl::StatusOr<bool> idled =
      AwaitUnlessCancelled(absl::Condition(&idle), clock().Now() + timeout);
  if (!idled.ok()) return idled.status();
  if (!*idled) {
    return absl::DeadlineExceededError(absl::StrCat(
        "Join waited ", absl::FormatDuration(timeout), " with ", queue_.size(),
        " closures queued and ", in_flight_, " in flight: check that the workers are up"));
  }
  if (absl::Status error = TakeError(); !error.ok()) return error;
  return options_.check_hold ? options_.check_hold() : absl::OkStatus();
}

absl::StatusOr<bool> ClusterCoordinator::Done() {
  absl::MutexLock lock(&mutex_);
  if (!error_.ok()) return TakeError();
  return queue_.empty() && in_flight_ == 0;
}

absl::Status ClusterCoordinator::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&mutex_);
  draining_ = true;
  CancelQueued(absl::CancelledError("the coordinator stopped before the closure ran"));
  auto idle = [this]()
                  ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return queue_.empty() && in_flight_ == 0; };
  if (!mutex_.AwaitWithTimeout(absl::Condition(&idle), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat(Counted(in_flight_, "closure was", "closures were"), " still in flight ",
                     absl::FormatDuration(timeout), " later"));
  }
  return absl::OkStatus();
}

int64_t ClusterCoordinator::retried_closures() const {
  absl::MutexLock lock(&mutex_);
  return retried_;
}

bool ClusterCoordinator::AwaitBlockedCallers(int count, absl::Duration timeout) const {
  absl::MutexLock lock(&mutex_);
  auto blocked = [this, count]()
                     ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return blocked_callers_ >= count; };
  return mutex_.AwaitWithTimeout(absl::Condition(&blocked), timeout);
}

}  // namespace stratum
