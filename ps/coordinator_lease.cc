#include "stratum/ps/coordinator_lease.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace stratum {

bool CoordinatorLease::HolderSilent() const {
  return holder_ == 0 || absl::Now() - last_heard_ > lease_;
}

absl::Status CoordinatorLease::Claim(uint64_t incarnation, const std::string& who,
                                     const std::string& address, absl::Duration wait) {
  if (incarnation == 0) return absl::OkStatus();
  absl::MutexLock lock(&mutex_);
  if (auto successor = replaced_.find(incarnation); successor != replaced_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("this parameter server ",
                                                      kHeldByAnotherCoordinator, " (",
                                                      successor->second, ") that took it over"));
  }
  const bool restart = !address.empty() && address == holder_address_;
  if (holder_ != incarnation && !restart && !HolderSilent()) {
    const absl::Time deadline = absl::Now() + wait;
    while (!HolderSilent() && absl::Now() < deadline) {
      // Woken by Release; else checked again when the holder's lease may have run out.
      mutex_.AwaitWithDeadline(absl::Condition(
                                   +[](uint64_t* holder) { return *holder == 0; }, &holder_),
                               std::min(deadline, last_heard_ + lease_ + absl::Milliseconds(1)));
    }
    if (holder_ != incarnation && !HolderSilent()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this parameter server ", kHeldByAnotherCoordinator, " (", holder_who_, "), heard from ",
          absl::FormatDuration(absl::Trunc(absl::Now() - last_heard_, absl::Milliseconds(1))),
          " ago: two coordinators on one cluster would overwrite each other's variables and "
          "checkpoints; stop that one first, or give this job parameter servers of its own"));
    }
  }
  if (holder_ != incarnation) {
    if (holder_ != 0 && restart) {
      spdlog::info("{} restarted: it holds this parameter server from now", who);
    } else if (holder_ != 0) {
      spdlog::warn("{} takes this parameter server over from {}, silent for {}", who, holder_who_,
                   absl::FormatDuration(absl::Trunc(absl::Now() - last_heard_, absl::Seconds(1))));
    }
    if (holder_ != 0) replaced_[holder_] = who;
    holder_ = incarnation;
    holder_who_ = who;
    holder_address_ = address;
  }
  last_heard_ = absl::Now();
  return absl::OkStatus();
}

void CoordinatorLease::Release(uint64_t incarnation) {
  absl::MutexLock lock(&mutex_);
  if (incarnation == 0 || holder_ != incarnation) return;
  holder_ = 0;
  holder_who_.clear();
  holder_address_.clear();
  last_heard_ = absl::InfinitePast();
}

}  // namespace stratum
