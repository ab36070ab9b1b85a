#include "stratum/ps/coordinator_lease.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace stratum {
namespace {

std::string Ago(absl::Time since) {
  return absl::FormatDuration(absl::Trunc(absl::Now() - since, absl::Milliseconds(1)));
}

}  // namespace

bool CoordinatorLease::HolderSilent() const {
  return holder_ == 0 || absl::Now() - last_heard_ > lease_;
}

absl::Status CoordinatorLease::RefusalFor(uint64_t incarnation) const {
  if (auto how = replaced_.find(incarnation); how != replaced_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(wording_.held, " ", kHeldByAnotherCoordinator, ": ", how->second));
  }
  if (holder_ == 0 || holder_ == incarnation || HolderSilent()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(wording_.held, " ", kHeldByAnotherCoordinator,
                                                    " (", holder_claim_.who, "), heard from ",
                                                    Ago(last_heard_), " ago: ", wording_.why));
}

absl::Status CoordinatorLease::Claim(const CoordinatorClaimant& claimant, absl::Duration wait) {
  if (claimant.incarnation == 0) return absl::OkStatus();
  absl::MutexLock lock(&mutex_);
  // Two processes cannot serve on one address of one host: this is the holder restarted.
  const bool restart = holder_ != 0 && holder_ != claimant.incarnation &&
                       !claimant.address.empty() && claimant.address == holder_claim_.address &&
                       claimant.host == holder_claim_.host;
  if (!restart) {
    const absl::Time deadline = absl::Now() + wait;
    while (!RefusalFor(claimant.incarnation).ok() && !replaced_.contains(claimant.incarnation) &&
           absl::Now() < deadline) {
      // Woken by Release; else checked again when the holder's lease may have run out.
      mutex_.AwaitWithDeadline(absl::Condition(
                                   +[](uint64_t* holder) { return *holder == 0; }, &holder_),
                               std::min(deadline, last_heard_ + lease_ + absl::Milliseconds(1)));
    }
    if (absl::Status refused = RefusalFor(claimant.incarnation); !refused.ok()) return refused;
  }
  if (holder_ != claimant.incarnation) {
    if (holder_ != 0) {
      const std::string how =
          restart
              ? absl::StrCat(claimant.who,
                             " took it over: it serves on this coordinator's address on the "
                             "same host, so it is this coordinator restarted")
              : absl::StrCat(claimant.who, " took it over after this coordinator was silent for ",
                             Ago(last_heard_), " (stalled or cut off)");
      spdlog::warn("{} (was: {})", how, holder_claim_.who);
      replaced_[holder_] = how;
    }
    holder_ = claimant.incarnation;
    holder_claim_ = claimant;
  }
  last_heard_ = absl::Now();
  return absl::OkStatus();
}

absl::Status CoordinatorLease::Heartbeat(uint64_t incarnation) {
  absl::MutexLock lock(&mutex_);
  if (absl::Status refused = RefusalFor(incarnation); !refused.ok()) return refused;
  if (incarnation != 0 && holder_ == incarnation) last_heard_ = absl::Now();
  return absl::OkStatus();
}

bool CoordinatorLease::Release(uint64_t incarnation) {
  absl::MutexLock lock(&mutex_);
  if (incarnation == 0 || holder_ != incarnation) return false;
  holder_ = 0;
  holder_claim_ = {};
  last_heard_ = absl::InfinitePast();
  return true;
}

}  // namespace stratum
