// Command-line parsing shared by every Stratum binary, on top of Abseil flags, with
// Stratum's exit codes: a usage error (unknown flag, bad value, stray argument) exits with
// kExitUsage (2), where Abseil on its own would exit with 1; --help exits with 0.
// Flag names may be written with '-' or '_' (--dry-run is --dry_run).
#pragma once

namespace stratum {

// Parses argv into the Abseil flags. `usage` is the one-paragraph help text. Exits the
// process on a usage error or --help, so it is for main only.
void ParseFlagsOrExit(int argc, char** argv, const char* usage);

}  // namespace stratum
