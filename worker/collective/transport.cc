#include "stratum/worker/collective/transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stratum {

absl::Status RendezvousWaitError(const std::string& peer, const std::string& what,
                                 const absl::Status& error, absl::Time started,
                                 absl::Time deadline) {
  if (error.code() != absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(error.code(), absl::StrCat("stopped waiting for ", peer, "'s ", what, ": ",
                                                   error.message()));
  }
  // Rounded, so that a deadline computed a moment before the wait began still reads as
  // the timeout asked for.
  const absl::Duration waited = std::min(absl::Now(), deadline) - started;
  const absl::Duration unit = absl::Milliseconds(100);
  return absl::DeadlineExceededError(
      absl::StrCat(peer, " did not publish its ", what, " within ",
                   absl::FormatDuration(absl::Trunc(waited + unit / 2, unit)), ": is it running? (",
                   error.message(), ")"));
}

}  // namespace stratum
