#include "stratum/coordinator/ps_watcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "stratum/ps/coordinator_lease.h"
#include "stratum/util/error_kind.h"

namespace stratum {

PsWatcher::PsWatcher(ShardedVariables& variables, PsWatcherOptions options)
    : variables_(variables),
      options_(options),
      stops_(static_cast<size_t>(variables.num_ps())),
      committed_(static_cast<size_t>(variables.num_ps()), 0) {}

PsWatcher::~PsWatcher() {
  done_.Notify();
  for (std::thread& thread : threads_) thread.join();
  for (int task = 0; task < variables_.num_ps(); ++task) {
    uint64_t committed;
    {
      absl::MutexLock lock(&mutex_);
      committed = committed_[static_cast<size_t>(task)];
    }
    (void)variables_.client(task).Watch(options_.saves_checkpoints, /*leaving=*/true,
                                        /*claim=*/false, committed);
  }
}

absl::Status PsWatcher::Claim() {
  for (int task = 0; task < variables_.num_ps(); ++task) {
    absl::Status claimed = WatchOnce(task, /*claim=*/true);
    if (absl::IsFailedPrecondition(claimed)) {
      for (int held = 0; held < task; ++held) {
        (void)variables_.client(held).Watch(options_.saves_checkpoints, /*leaving=*/true);
      }
      return claimed;
    }
    // Unreachable: the creation that follows meets it as a PS failure.
  }
  if (threads_.empty()) {
    for (int task = 0; task < variables_.num_ps(); ++task) {
      threads_.emplace_back([this, task] { Run(task); });
    }
  }
  return absl::OkStatus();
}

std::string PsWatcher::TakeStopping() {
  absl::MutexLock lock(&mutex_);
  std::vector<std::string> tasks;
  for (int task = 0; task < variables_.num_ps(); ++task) {
    Stop& stop = stops_[static_cast<size_t>(task)];
    if (!stop.stopping || stop.saved || stop.asked) continue;
    stop.asked = true;
    tasks.push_back(variables_.client(task).task());
  }
  return absl::StrJoin(tasks, ", ");
}

void PsWatcher::Committed(const std::vector<uint64_t>& save_ids,
                          const std::vector<std::string>& stopping) {
  std::vector<int> to_tell;
  {
    absl::MutexLock lock(&mutex_);
    for (int task = 0; task < variables_.num_ps(); ++task) {
      const size_t index = static_cast<size_t>(task);
      if (index < save_ids.size() && save_ids[index] != 0) committed_[index] = save_ids[index];
      if (std::find(stopping.begin(), stopping.end(), variables_.client(task).task()) !=
          stopping.end()) {
        stops_[index].asked = true;  // covered, even before the PS has heard so
        to_tell.push_back(task);
      }
    }
  }
  // Now rather than at the next heartbeat: each goes once told. One told in vain (a lost
  // answer) is told again by its heartbeats.
  for (int task : to_tell) (void)WatchOnce(task);
}

void PsWatcher::SaveFailed(const std::string& tasks) {
  absl::MutexLock lock(&mutex_);
  for (absl::string_view name : absl::StrSplit(tasks, ", ", absl::SkipEmpty())) {
    for (int task = 0; task < variables_.num_ps(); ++task) {
      if (variables_.client(task).task() == name) stops_[static_cast<size_t>(task)].asked = false;
    }
  }
}

absl::Status PsWatcher::Lost() {
  absl::MutexLock lock(&mutex_);
  return lost_;
}

absl::Status PsWatcher::CheckHold() {
  for (int task = 0; task < variables_.num_ps() && Lost().ok(); ++task) (void)WatchOnce(task);
  return Lost();
}

void PsWatcher::Run(int task) {
  do {
    (void)WatchOnce(task);
    if (!Lost().ok()) return;  // the PSs are another coordinator's: nothing to keep
    // Unreachable: its failure shows in training.
  } while (!done_.WaitForNotificationWithTimeout(options_.interval));
}

absl::Status PsWatcher::WatchOnce(int task, bool claim) {
  uint64_t committed;
  {
    absl::MutexLock lock(&mutex_);
    committed = committed_[static_cast<size_t>(task)];
  }
  absl::StatusOr<proto::WatchResponse> answer = variables_.client(task).Watch(
      options_.saves_checkpoints, /*leaving=*/false, claim, committed);
  if (!claim) Heard(answer.status());  // a refused claim is Claim's error, not a takeover
  if (answer.ok()) Observed(task, *answer, committed);
  return answer.status();
}

void PsWatcher::Observed(int task, const proto::WatchResponse& answer, uint64_t committed_sent) {
  absl::MutexLock lock(&mutex_);
  Stop& stop = stops_[static_cast<size_t>(task)];
  if (!answer.stopping()) {  // serving (again): a later stop needs a save again
    stop = {};
    return;
  }
  // A new stop, or another process than the stop heard before: restarted and signalled
  // again, with no heartbeat between that saw it serving.
  if (!stop.stopping || answer.incarnation() != stop.incarnation) {
    stop = {.stopping = true, .incarnation = answer.incarnation()};
  }
  // A save committed since this Watch was sent is not in the answer: the next one tells.
  if (committed_[static_cast<size_t>(task)] != committed_sent) return;
  stop.saved = answer.saved();
}

void PsWatcher::Heard(const absl::Status& watched) {
  if (!IsErrorKind(watched, ErrorKind::kHeldByAnotherCoordinator)) return;
  absl::MutexLock lock(&mutex_);
  if (!lost_.ok()) return;
  lost_ = Rewrapped(watched, absl::StrCat(watched.message(),
                                          "; this coordinator stops and leaves the job to it"));
}

}  // namespace stratum
