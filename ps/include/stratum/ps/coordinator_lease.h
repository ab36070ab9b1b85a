// Which coordinator a parameter server (or a worker) trains for. Two coordinators on one
// cluster (a second one started by mistake, an old one that came back after a pause) would
// re-seed each other's variables and overwrite each other's checkpoints while both report
// success; two on one worker would take turns setting it up for their own jobs. A
// coordinator claims every PS before it creates variables there; its heartbeats (Watch,
// every 0.5 s) keep the claim. It claims a worker when it sets its job up there; its
// closures keep that claim. Another coordinator may claim the PS only once the holder has
// been silent for the lease (it died, or stalled: it is then refused for good and stops),
// or at once when it is the holder restarted: a new process serving on the holder's address
// on the same host, calling from the network address the holder called from. Address and
// host are public (TF_CONFIG), the caller's network address is not chosen by the caller,
// so a claim from elsewhere that names them waits out the lease like any other.
//
// A coordinator's incarnation is public (status calls report it), so a call that names the
// holder's incarnation must also carry the holder's secret (ProcessSecret(), sent in every
// call, never published): one that does not is refused with PERMISSION_DENIED and logged.
// What touches files (Save, Restore) is the holder's alone, and only inside the checkpoint
// folder it declared when it claimed. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stratum/util/clock.h"

namespace stratum {

// A coordinator as it presents itself; incarnation 0 is a caller that does not say (it
// holds nothing and is let through wherever no other coordinator holds the PS).
struct CoordinatorClaimant {
  uint64_t incarnation = 0;
  std::string secret;   // that coordinator process's secret (see above)
  std::string who;      // for people, e.g. "the coordinator chief:0 at host:port, pid 12 on h"
  std::string address;  // where it serves (TF_CONFIG's chief address), "" when it does not
  std::string host;     // the host it runs on
  // The network address the claim came from (PeerHostOf), "" when unknown.
  std::string peer;
  // Its job's checkpoint folder ("" when it writes none): Save and Restore stay inside it.
  std::string checkpoint_dir;
};

// A caller as it proves who it is: the incarnation it names and the secret it presents.
struct CoordinatorCredential {
  uint64_t incarnation = 0;
  std::string secret;
};

// How a refusal names what is held, and why two coordinators must not share it.
struct LeaseWording {
  std::string held = "this parameter server";
  std::string why =
      "two coordinators on one cluster would overwrite each other's variables and "
      "checkpoints; stop that one first, or give this job parameter servers of its own";
};

class CoordinatorLease {
 public:
  // `clock` tells the time the lease is counted in (a test's FakeClock drives it).
  explicit CoordinatorLease(absl::Duration lease = absl::Seconds(5), LeaseWording wording = {},
                            const Clock& clock = Clock::Real())
      : lease_(lease), wording_(std::move(wording)), clock_(clock) {}

  // Takes the PS for `claimant` (or keeps it). A holder heard from within the lease makes
  // this wait up to `wait` for it to fall silent, then FAILED_PRECONDITION naming it. A
  // claim without a secret is PERMISSION_DENIED.
  absl::Status Claim(const CoordinatorClaimant& claimant,
                     absl::Duration wait = absl::ZeroDuration());
  // A heartbeat, or a call that changes the PS's variables: OK (and the hold kept) for the
  // holder, and for anyone while no live coordinator holds the PS; FAILED_PRECONDITION for
  // a coordinator that another took the PS over from, or while another holds it;
  // PERMISSION_DENIED for the holder's incarnation without its secret.
  absl::Status Heartbeat(const CoordinatorCredential& caller);
  // The checkpoint folder of the holder, for a call that writes or reads files: OK only for
  // the holder itself (FAILED_PRECONDITION while no coordinator holds it or another does,
  // or when the holder declared no folder; PERMISSION_DENIED as for Heartbeat). `what` names
  // the call in the refusal, e.g. "Save".
  absl::StatusOr<std::string> HolderCheckpointDir(const CoordinatorCredential& caller,
                                                  absl::string_view what);
  // The holder is done with the PS: another coordinator may take it at once. False when
  // `caller` did not hold it (then nothing changes).
  bool Release(const CoordinatorCredential& caller);

  absl::Duration lease() const { return lease_; }

 private:
  bool HolderSilent() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // How long ago `since` was, for messages ("401ms").
  std::string Ago(absl::Time since) const;
  absl::Status RefusalFor(const CoordinatorCredential& caller) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The holder's incarnation without the holder's secret: PERMISSION_DENIED, logged.
  absl::Status ForgeryOf(const CoordinatorCredential& caller) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const absl::Duration lease_;
  const LeaseWording wording_;
  const Clock& clock_;
  absl::Mutex mutex_;
  uint64_t holder_ ABSL_GUARDED_BY(mutex_) = 0;  // 0: none
  CoordinatorClaimant holder_claim_ ABSL_GUARDED_BY(mutex_);
  absl::Time last_heard_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  // Holders that were taken over from, refused for good (one per takeover, few), with how
  // it happened.
  absl::flat_hash_map<uint64_t, std::string> replaced_ ABSL_GUARDED_BY(mutex_);
};

// Part of every refusal, for callers that tell it from other failed preconditions.
inline constexpr char kHeldByAnotherCoordinator[] = "is held by another coordinator";
// Part of a refusal of Save or Restore by a PS that no coordinator holds: one that the
// caller had claimed has restarted since.
inline constexpr char kNoCoordinatorHoldsIt[] = "no coordinator holds it";

}  // namespace stratum
