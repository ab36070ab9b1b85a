// What kind of failure a status is, for the code that decides what to do about it: the
// kind (and the task it names) rides in the status as a payload, so control flow never
// reads an error's words, and the words users see stay free to change. Payloads cross the
// gRPC edge both ways (stratum/net/status.h) and the PS's raw data path (its frames carry
// the kind).
//
// Thread safety: functions of their arguments.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace stratum {

enum class ErrorKind : uint32_t {
  kUnspecified = 0,
  // A PS or worker refused: another coordinator holds it (CoordinatorLease).
  kHeldByAnotherCoordinator = 1,
  // A PS refused a call only its holder may make, and no coordinator holds it (it
  // restarted since it was claimed).
  kNoCoordinatorHoldsIt = 2,
  // A worker has no job from this coordinator (it restarted): set it up again.
  kNotSetUp = 3,
  // A PS does not hold the variable asked for (it restarted between two calls).
  kVariableMissing = 4,
  // A parameter server failed (PsFailure): the job waits for it, or ends.
  kPsUnavailable = 5,
  // A parameter server failed and lost the job's variables (it restarted).
  kPsLostItsVariables = 6,
  // A task of a multi-worker job failed first (ErrorTaskOf names it); the job ends.
  kTaskFailed = 7,
};

// `status` (not OK) with `kind`, the task it names ("worker:2") and that task's own error
// message (`cause`, for kTaskFailed), where there are.
absl::Status WithErrorKind(absl::Status status, ErrorKind kind, absl::string_view task = {},
                           absl::string_view cause = {});
// The kind (kUnspecified when none was set), the task and the cause ("" when none).
ErrorKind ErrorKindOf(const absl::Status& status);
std::string ErrorTaskOf(const absl::Status& status);
std::string ErrorCauseOf(const absl::Status& status);
inline bool IsErrorKind(const absl::Status& status, ErrorKind kind) {
  return !status.ok() && ErrorKindOf(status) == kind;
}

// A status of `code` and `message` that keeps every payload of `from` (its kind): for
// wrapping an error in context without losing what it is.
absl::Status Rewrapped(const absl::Status& from, absl::StatusCode code, absl::string_view message);
inline absl::Status Rewrapped(const absl::Status& from, absl::string_view message) {
  return Rewrapped(from, from.code(), message);
}

}  // namespace stratum
