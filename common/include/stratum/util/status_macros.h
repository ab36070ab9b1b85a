// STRATUM_RETURN_IF_ERROR and STRATUM_ASSIGN_OR_RETURN: early returns for absl::Status and
// absl::StatusOr<T>. Debian's Abseil (20220623) predates Abseil's own versions of these.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define STRATUM_STATUS_CONCAT_INNER_(a, b) a##b
#define STRATUM_STATUS_CONCAT_(a, b) STRATUM_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the calling function if not OK.
#define STRATUM_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status stratum_status_ = (expr);           \
    if (!stratum_status_.ok()) return stratum_status_; \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status if not OK, else moves the
// value into `lhs` (which may be a declaration such as `auto x`).
#define STRATUM_ASSIGN_OR_RETURN(lhs, rexpr) \
  STRATUM_ASSIGN_OR_RETURN_IMPL_(STRATUM_STATUS_CONCAT_(stratum_statusor_, __LINE__), lhs, rexpr)

#define STRATUM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()
