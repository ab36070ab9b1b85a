#include "stratum/ps/coordinator_lease.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stratum/util/error_kind.h"

namespace stratum {
namespace {

// Compares all bytes whatever differs, so the time taken says nothing of the secret.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

}  // namespace

std::string CoordinatorLease::Ago(absl::Time since) const {
  return absl::FormatDuration(absl::Trunc(clock_.Now() - since, absl::Milliseconds(1)));
}

bool CoordinatorLease::HolderSilent() const {
  return holder_ == 0 || clock_.Now() - last_heard_ > lease_;
}

absl::Status CoordinatorLease::ForgeryOf(const CoordinatorCredential& caller) const {
  if (holder_ == 0 || caller.incarnation != holder_ ||
      SameSecret(caller.secret, holder_claim_.secret)) {
    return absl::OkStatus();
  }
  spdlog::warn("refused a call that names the incarnation {:016x} of {} without its secret",
               caller.incarnation, holder_claim_.who);
  return absl::PermissionDeniedError(absl::StrCat(
      wording_.held, " refuses this call: it names the incarnation of the coordinator that holds ",
      "it (", holder_claim_.who,
      ") without that coordinator's secret, and only that coordinator process may act for it"));
}

absl::Status CoordinatorLease::RefusalFor(const CoordinatorCredential& caller) const {
  if (absl::Status forged = ForgeryOf(caller); !forged.ok()) return forged;
  const uint64_t incarnation = caller.incarnation;
  if (auto how = replaced_.find(incarnation); how != replaced_.end()) {
    return WithErrorKind(absl::FailedPreconditionError(absl::StrCat(
                             wording_.held, " ", kHeldByAnotherCoordinator, ": ", how->second)),
                         ErrorKind::kHeldByAnotherCoordinator);
  }
  if (holder_ == 0 || holder_ == incarnation || HolderSilent()) return absl::OkStatus();
  return WithErrorKind(absl::FailedPreconditionError(absl::StrCat(
                           wording_.held, " ", kHeldByAnotherCoordinator, " (", holder_claim_.who,
                           "), heard from ", Ago(last_heard_), " ago: ", wording_.why)),
                       ErrorKind::kHeldByAnotherCoordinator);
}

absl::Status CoordinatorLease::Claim(const CoordinatorClaimant& claimant, absl::Duration wait) {
  if (claimant.incarnation == 0) return absl::OkStatus();
  // A claim proves its coordinator by the secret its later calls present: without one,
  // anyone could present the same nothing and act as the holder.
  if (claimant.secret.empty()) {
    spdlog::warn("refused a claim by {} (incarnation {:016x}) that carries no secret", claimant.who,
                 claimant.incarnation);
    return absl::PermissionDeniedError(absl::StrCat(
        wording_.held, " refuses the claim of ", claimant.who,
        ": it carries no coordinator secret, which every call of the holder must present; a "
        "Stratum coordinator sends one (a client of another version or a hand-made call "
        "does not)"));
  }
  const CoordinatorCredential caller{claimant.incarnation, claimant.secret};
  absl::MutexLock lock(&mutex_);
  if (absl::Status forged = ForgeryOf(caller); !forged.ok()) return forged;
  // Two processes cannot serve on one address of one host: this is the holder restarted,
  // provided it calls from where the holder called (anyone can name the address and host).
  const bool names_holder =
      holder_ != 0 && holder_ != claimant.incarnation && !claimant.address.empty() &&
      claimant.address == holder_claim_.address && claimant.host == holder_claim_.host;
  const bool from_holders_address = !claimant.peer.empty() && claimant.peer == holder_claim_.peer;
  const bool restart = names_holder && from_holders_address;
  if (names_holder && !from_holders_address) {
    spdlog::info(
        "{} names the address and host of the holder ({}) but calls from {}, not {}: it is "
        "taken for the holder restarted only once the holder has been silent for the lease",
        claimant.who, holder_claim_.who,
        claimant.peer.empty() ? "an unknown address" : claimant.peer,
        holder_claim_.peer.empty() ? "an unknown address" : holder_claim_.peer);
  }
  if (!restart) {
    const absl::Time deadline = clock_.Now() + wait;
    while (!RefusalFor(caller).ok() && !replaced_.contains(claimant.incarnation) &&
           clock_.Now() < deadline) {
      // Woken by Release; else checked again when the holder's lease may have run out.
      clock_.AwaitWithDeadline(mutex_,
                               absl::Condition(
                                   +[](uint64_t* holder) { return *holder == 0; }, &holder_),
                               std::min(deadline, last_heard_ + lease_ + absl::Milliseconds(1)));
    }
    if (absl::Status refused = RefusalFor(caller); !refused.ok()) return refused;
  }
  if (holder_ != claimant.incarnation) {
    if (holder_ != 0) {
      const std::string how =
          restart
              ? absl::StrCat(claimant.who,
                             " took it over: it serves on this coordinator's address on the "
                             "same host and calls from the same network address, so it is this "
                             "coordinator restarted")
              : absl::StrCat(claimant.who, " took it over after this coordinator was silent for ",
                             Ago(last_heard_), " (stalled or cut off)");
      spdlog::warn("{} (was: {})", how, holder_claim_.who);
      replaced_[holder_] = how;
    }
    holder_ = claimant.incarnation;
    holder_claim_ = claimant;
  }
  last_heard_ = clock_.Now();
  return absl::OkStatus();
}

absl::Status CoordinatorLease::Heartbeat(const CoordinatorCredential& caller) {
  absl::MutexLock lock(&mutex_);
  if (absl::Status refused = RefusalFor(caller); !refused.ok()) return refused;
  if (caller.incarnation != 0 && holder_ == caller.incarnation) last_heard_ = clock_.Now();
  return absl::OkStatus();
}

absl::StatusOr<std::string> CoordinatorLease::HolderCheckpointDir(
    const CoordinatorCredential& caller, absl::string_view what) {
  absl::MutexLock lock(&mutex_);
  if (absl::Status refused = RefusalFor(caller); !refused.ok()) return refused;
  if (holder_ == 0 || holder_ != caller.incarnation) {
    return WithErrorKind(
        absl::FailedPreconditionError(
            absl::StrCat(what, " is refused: only the coordinator that holds ", wording_.held,
                         " may ask for it, and ",
                         holder_ == 0 ? absl::StrCat(kNoCoordinatorHoldsIt,
                                                     " (a coordinator claims it first, with Watch)")
                                      : absl::StrCat(holder_claim_.who, " holds it"))),
        holder_ == 0 ? ErrorKind::kNoCoordinatorHoldsIt : ErrorKind::kHeldByAnotherCoordinator);
  }
  if (holder_claim_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " is refused: the coordinator that holds ", wording_.held,
        " declared no checkpoint folder when it claimed it, and files are written and read "
        "only there"));
  }
  last_heard_ = clock_.Now();
  return holder_claim_.checkpoint_dir;
}

bool CoordinatorLease::Release(const CoordinatorCredential& caller) {
  absl::MutexLock lock(&mutex_);
  const uint64_t incarnation = caller.incarnation;
  if (incarnation == 0 || holder_ != incarnation) return false;
  if (!ForgeryOf(caller).ok()) return false;  // logged there
  holder_ = 0;
  holder_claim_ = {};
  last_heard_ = absl::InfinitePast();
  return true;
}

}  // namespace stratum
