// The exit codes every Stratum binary uses, and the mapping from a final absl::Status.
#pragma once

#include "absl/status/status.h"

namespace stratum {

inline constexpr int kExitSuccess = 0;
// Anything that is not a configuration problem: a peer that died, a deadline, a crash.
inline constexpr int kExitFailure = 1;
// Configuration or usage error: bad flags, a broken TF_CONFIG, a missing input file.
inline constexpr int kExitUsage = 2;

// INVALID_ARGUMENT and FAILED_PRECONDITION mean "what you asked for cannot work as given"
// and map to kExitUsage; NOT_FOUND too (a missing file); everything else to kExitFailure.
int ExitCodeFor(const absl::Status& status);

}  // namespace stratum
