#include "stratum/worker/coordination_service.h"

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "stratum/util/error_kind.h"

namespace stratum {
namespace {

constexpr char kRestartAdvice[] = "restart the job; it resumes from the last checkpoint";

// "30s", "1.5s", "250ms": rounded, so that a deadline computed a moment before the wait
// began still reads as the timeout the caller asked for.
std::string FormatRounded(absl::Duration d) {
  const absl::Duration unit =
      d >= absl::Seconds(1) ? absl::Milliseconds(100) : absl::Milliseconds(10);
  return absl::FormatDuration(absl::Trunc(d + unit / 2, unit));
}

}  // namespace

uint64_t NewIncarnation() {
  absl::BitGen gen;
  uint64_t value = 0;
  while (value == 0) value = absl::Uniform<uint64_t>(gen);
  return value;
}

CoordinationService::CoordinationService(CoordinationServiceOptions options,
                                         std::function<absl::Time()> now)
    : options_(std::move(options)),
      now_(now ? std::move(now) : [] { return absl::Now(); }),
      incarnation_(NewIncarnation()),
      leader_(options_.leader.ToString()) {
  absl::MutexLock lock(&mutex_);
  for (const TaskKey& task : options_.tasks) tasks_[task] = TaskInfo();
}

CoordinationService::~CoordinationService() { Shutdown(); }

absl::StatusOr<CoordinationService::TaskInfo*> CoordinationService::FindTask(const TaskKey& task) {
  auto it = tasks_.find(task);
  if (it != tasks_.end()) return &it->second;
  std::vector<std::string> known;
  for (const auto& [key, info] : tasks_) known.push_back(key.ToString());
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown task ", task.ToString(), ": the coordination service on ", leader_, " coordinates ",
      absl::StrJoin(known, ", "), "; every task must use the same cluster in TF_CONFIG"));
}

absl::Status CoordinationService::StopStatus() const {
  if (shut_down_) {
    return absl::UnavailableError(
        absl::StrCat("the coordination service on ", leader_, " is shutting down"));
  }
  return cluster_error_;
}

absl::StatusOr<CoordinationService::TaskInfo*> CoordinationService::FindRegisteredTask(
    const TaskKey& task, uint64_t incarnation) {
  absl::StatusOr<TaskInfo*> info = FindTask(task);
  if (!info.ok()) return info.status();
  if ((*info)->state == TaskState::kUnregistered) {
    return absl::FailedPreconditionError(absl::StrCat(
        task.ToString(), " is not registered with the coordination service on ", leader_, " (if ",
        leader_, " restarted, it lost every registration): register first"));
  }
  if ((*info)->incarnation != incarnation) {
    return absl::AbortedError(absl::StrFormat(
        "%s calls with incarnation %#x but registered as %#x: another process claims the "
        "task, or it restarted without registering again",
        task.ToString(), incarnation, (*info)->incarnation));
  }
  return *info;
}

void CoordinationService::SetClusterError(absl::Status error) {
  if (cluster_error_.ok()) cluster_error_ = std::move(error);
  changed_.SignalAll();
}

absl::Status CoordinationService::RegisterTask(const TaskKey& task, uint64_t incarnation) {
  absl::MutexLock lock(&mutex_);
  absl::StatusOr<TaskInfo*> found = FindTask(task);
  if (!found.ok()) return found.status();
  if (incarnation == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(task.ToString(), " registered with incarnation 0, which is reserved"));
  }
  if (absl::Status stop = StopStatus(); !stop.ok()) return stop;
  TaskInfo& info = **found;
  if (info.state != TaskState::kUnregistered && info.incarnation != incarnation) {
    info.state = TaskState::kError;
    SetClusterError(absl::AbortedError(absl::StrFormat(
        "%s restarted (incarnation %#x -> %#x): it lost its state and the cluster cannot go "
        "on without it; %s",
        task.ToString(), info.incarnation, incarnation, kRestartAdvice)));
    return cluster_error_;
  }
  info.state = TaskState::kConnected;
  info.incarnation = incarnation;
  info.last_heartbeat = now_();
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status CoordinationService::Heartbeat(const TaskKey& task, uint64_t incarnation) {
  absl::MutexLock lock(&mutex_);
  if (shut_down_) return StopStatus();
  absl::StatusOr<TaskInfo*> info = FindRegisteredTask(task, incarnation);
  if (!info.ok()) return info.status();
  if (!cluster_error_.ok()) {
    (*info)->told = true;  // the answer carries the cluster error
    changed_.SignalAll();
    return cluster_error_;
  }
  (*info)->last_heartbeat = now_();
  return absl::OkStatus();
}

absl::Status CoordinationService::DisconnectTask(const TaskKey& task, uint64_t incarnation) {
  absl::MutexLock lock(&mutex_);
  if (shut_down_) return StopStatus();
  absl::StatusOr<TaskInfo*> info = FindRegisteredTask(task, incarnation);
  if (!info.ok()) return info.status();
  // Also after the job failed: the leader serves the failure to the tasks still connected,
  // and need not wait for one that left.
  if ((*info)->state == TaskState::kConnected) (*info)->state = TaskState::kDisconnected;
  for (auto& [id, barrier] : barriers_) UpdateBarrier(id, barrier);
  changed_.SignalAll();
  return StopStatus();
}

absl::Status CoordinationService::SetKeyValue(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mutex_);
  if (absl::Status stop = StopStatus(); !stop.ok()) return stop;
  values_[key] = value;
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> CoordinationService::GetKeyValue(const std::string& key,
                                                             absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mutex_);
  while (true) {
    if (absl::Status stop = StopStatus(); !stop.ok()) return stop;
    if (auto it = values_.find(key); it != values_.end()) return it->second;
    if (absl::Now() >= deadline) break;
    WaitForChange(deadline);
  }
  const std::string unregistered = UnregisteredTasks();
  return absl::DeadlineExceededError(absl::StrCat(
      "key \"", key, "\" was not set within ", FormatRounded(deadline - start), "; ",
      unregistered.empty()
          ? "every task has registered, so the task that sets it is slow or failed before it"
          : absl::StrCat("tasks not registered yet: ", unregistered,
                         " (not started, or cannot reach ", leader_, ")")));
}

absl::StatusOr<std::string> CoordinationService::TryGetKeyValue(const std::string& key) {
  absl::MutexLock lock(&mutex_);
  if (absl::Status stop = StopStatus(); !stop.ok()) return stop;
  if (auto it = values_.find(key); it != values_.end()) return it->second;
  return absl::NotFoundError(absl::StrCat("key \"", key, "\" is not set"));
}

void CoordinationService::UpdateBarrier(const std::string& id, Barrier& barrier) {
  if (barrier.done) return;
  std::vector<std::string> left;
  for (const auto& [task, info] : tasks_) {
    if (barrier.arrived.contains(task)) continue;
    if (info.state == TaskState::kDisconnected) left.push_back(task.ToString());
  }
  if (!left.empty()) {
    barrier.done = true;
    // Not a configuration error: a peer that stopped early can be started again, so
    // launchers may retry the job (ABORTED exits 1, FAILED_PRECONDITION 2).
    barrier.result = absl::AbortedError(
        absl::StrCat("barrier \"", id, "\" cannot complete: ", absl::StrJoin(left, ", "),
                     " disconnected (finished or stopped) before arriving; ", kRestartAdvice));
  } else if (barrier.arrived.size() == tasks_.size()) {
    barrier.done = true;
  }
  if (barrier.done) changed_.SignalAll();
}

absl::Status CoordinationService::WaitAtBarrier(const std::string& id, const TaskKey& task,
                                                absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mutex_);
  absl::StatusOr<TaskInfo*> info = FindTask(task);
  if (!info.ok()) return info.status();
  if (absl::Status stop = StopStatus(); !stop.ok()) return stop;
  if ((*info)->state == TaskState::kUnregistered) {
    return absl::FailedPreconditionError(
        absl::StrCat(task.ToString(), " waits at barrier \"", id,
                     "\" without having registered with the coordination service on ", leader_));
  }
  Barrier& barrier = barriers_[id];
  if (!barrier.done) {
    barrier.arrived.insert(task);
    UpdateBarrier(id, barrier);
  }
  while (!barrier.done) {
    if (absl::Status stop = StopStatus(); !stop.ok()) return stop;
    if (absl::Now() >= deadline) {
      std::vector<std::string> missing;
      for (const auto& [key, unused] : tasks_) {
        if (!barrier.arrived.contains(key)) missing.push_back(DescribeMissing(key));
      }
      barrier.done = true;
      barrier.result = absl::DeadlineExceededError(
          absl::StrCat("barrier \"", id, "\" timed out after ", FormatRounded(deadline - start),
                       ": ", missing.size(), " of ", tasks_.size(),
                       " tasks did not arrive: ", absl::StrJoin(missing, ", ")));
      changed_.SignalAll();
      break;
    }
    WaitForChange(deadline);
  }
  return barrier.result;
}

std::string CoordinationService::DescribeMissing(const TaskKey& task) const {
  const TaskInfo& info = tasks_.at(task);
  switch (info.state) {
    case TaskState::kUnregistered:
      return absl::StrCat(task.ToString(), " (never registered: not started, or cannot reach ",
                          leader_, ")");
    case TaskState::kConnected: {
      const absl::Duration silent = now_() - info.last_heartbeat;
      if (silent > options_.heartbeat_timeout / 2) {
        return absl::StrCat(task.ToString(), " (no heartbeat for ", FormatRounded(silent),
                            ": it died or hangs)");
      }
      return absl::StrCat(task.ToString(), " (alive, but busy elsewhere)");
    }
    case TaskState::kError:
      return absl::StrCat(task.ToString(), " (failed)");
    case TaskState::kDisconnected:
      return absl::StrCat(task.ToString(), " (disconnected)");
  }
  return task.ToString();
}

std::string CoordinationService::UnregisteredTasks() const {
  std::vector<std::string> names;
  for (const auto& [task, info] : tasks_) {
    if (info.state == TaskState::kUnregistered) names.push_back(task.ToString());
  }
  return absl::StrJoin(names, ", ");
}

absl::Status CoordinationService::ReportError(const TaskKey& task, const absl::Status& error) {
  absl::MutexLock lock(&mutex_);
  absl::StatusOr<TaskInfo*> info = FindTask(task);
  if (!info.ok()) return info.status();
  if (error.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(task.ToString(), " reported an error without one (status OK)"));
  }
  (*info)->state = TaskState::kError;
  SetClusterError(WithErrorKind(
      absl::Status(error.code(), absl::StrCat(task.ToString(), " failed: ", error.message())),
      ErrorKind::kTaskFailed, task.ToString(), error.message()));
  return absl::OkStatus();
}

bool CoordinationService::AwaitEveryTaskTold(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mutex_);
  while (true) {
    const bool none = std::none_of(tasks_.begin(), tasks_.end(), [](const auto& entry) {
      return entry.second.state == TaskState::kConnected && !entry.second.told;
    });
    if (none) return true;
    if (shut_down_ || WaitForChange(deadline)) return false;
  }
}

bool CoordinationService::WaitForChange(absl::Time deadline) {
  ++blocked_callers_;
  const bool timed_out = changed_.WaitWithDeadline(&mutex_, deadline);
  --blocked_callers_;
  return timed_out;
}

bool CoordinationService::AwaitBlockedCallers(int count, absl::Duration timeout) const {
  absl::MutexLock lock(&mutex_);
  auto blocked = [this, count]()
                     ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return blocked_callers_ >= count; };
  return mutex_.AwaitWithTimeout(absl::Condition(&blocked), timeout);
}

void CoordinationService::CheckHeartbeats() {
  absl::MutexLock lock(&mutex_);
  if (shut_down_) return;
  const absl::Time now = now_();
  for (auto& [task, info] : tasks_) {
    if (info.state != TaskState::kConnected) continue;
    const absl::Duration silent = now - info.last_heartbeat;
    if (silent <= options_.heartbeat_timeout) continue;
    info.state = TaskState::kError;
    SetClusterError(absl::UnavailableError(
        absl::StrCat(task.ToString(), " sent no heartbeat for ", FormatRounded(silent),
                     " (the timeout is ", FormatRounded(options_.heartbeat_timeout),
                     "): it died or hangs; see its log, then ", kRestartAdvice)));
  }
}

void CoordinationService::Shutdown() {
  absl::MutexLock lock(&mutex_);
  shut_down_ = true;
  changed_.SignalAll();
}

absl::Status CoordinationService::cluster_error() const {
  absl::MutexLock lock(&mutex_);
  return cluster_error_;
}

}  // namespace stratum
