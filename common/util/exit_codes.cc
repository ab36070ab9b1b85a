#include "stratum/util/exit_codes.h"

namespace stratum {

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitSuccess;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

}  // namespace stratum
