// Which coordinator a parameter server trains for. Two coordinators on one cluster (a
// second one started by mistake, an old one that came back after a pause) would re-seed
// each other's variables and overwrite each other's checkpoints while both report success.
// The coordinator that creates the variables holds the PS; its heartbeats (Watch, every
// 0.5 s) keep it. Another coordinator gets the PS only once the holder has been silent for
// the lease (it died, or stalled and lost it: its next heartbeat is refused and it stops),
// or at once when it restarted (a new process serving on the holder's address).
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stratum {

class CoordinatorLease {
 public:
  explicit CoordinatorLease(absl::Duration lease = absl::Seconds(5)) : lease_(lease) {}

  // For the coordinator `incarnation` (described by `who`, e.g. "chief:0 at host:port, pid
  // 12", serving on `address`): OK when it holds the PS or may take it, and then it holds
  // it from now. A holder heard from within the lease makes this wait up to `wait` for it
  // to fall silent, then FAILED_PRECONDITION naming the holder; unless the holder served on
  // the same (non-empty) address: then this is its restart, and takes over at once.
  // Incarnation 0 (a caller that does not say) is let through and holds nothing.
  absl::Status Claim(uint64_t incarnation, const std::string& who, const std::string& address,
                     absl::Duration wait = absl::ZeroDuration());
  // The holder is done with the PS: another coordinator may take it at once.
  void Release(uint64_t incarnation);

  absl::Duration lease() const { return lease_; }

 private:
  bool HolderSilent() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const absl::Duration lease_;
  absl::Mutex mutex_;
  uint64_t holder_ ABSL_GUARDED_BY(mutex_) = 0;  // 0: none
  std::string holder_who_ ABSL_GUARDED_BY(mutex_);
  std::string holder_address_ ABSL_GUARDED_BY(mutex_);
  absl::Time last_heard_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  // Holders that were taken over from, refused for good (one per takeover, few), and who
  // took over from each.
  absl::flat_hash_map<uint64_t, std::string> replaced_ ABSL_GUARDED_BY(mutex_);
};

// How a refusal begins, for callers that tell it from other failed preconditions.
inline constexpr char kHeldByAnotherCoordinator[] = "is held by another coordinator";

}  // namespace stratum
