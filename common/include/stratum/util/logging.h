// Process-wide logging set-up. Every line carries the task ("worker:1") so that the
// interleaved output of a whole cluster stays readable. Call once, early in main.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace stratum {

// Configures spdlog's default logger to write to stderr as
//   2026-11-22 07:00:00.123 I worker:1] message
// `level` is one of trace, debug, info, warn, error (an unknown level is an error).
absl::Status InitLogging(const std::string& task, const std::string& level);

// INVALID_ARGUMENT naming the levels when `level` is not one (for a launcher that hands it
// on to the processes it starts).
absl::Status CheckLogLevel(const std::string& level);

}  // namespace stratum
