// Command-line parsing shared by every Stratum binary, on top of Abseil flags, with
// Stratum's exit codes: a usage error (unknown flag, bad value, stray argument) exits with
// kExitUsage (2), where Abseil on its own would exit with 1; --help exits with 0.
// Flag names may be written with '-' or '_' (--dry-run is --dry_run).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace stratum {

// Parses argv into the Abseil flags. `usage` is the one-paragraph help text. Exits the
// process on a usage error or --help, so it is for main only.
void ParseFlagsOrExit(int argc, char** argv, const char* usage);

// OK when the duration flag `flag` ("--cluster_timeout") is at least `minimum`; else
// INVALID_ARGUMENT "--cluster_timeout is 0: <why>; use 1s or more, e.g. <example>".
absl::Status CheckDurationFlag(absl::string_view flag, absl::Duration value, absl::Duration minimum,
                               absl::string_view why, absl::string_view example);

}  // namespace stratum
