#include "stratum/util/flags.h"

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/process_info.h"

namespace stratum {
namespace {

// Abseil's parser calls std::exit(1) on any usage error (and on --help). While it runs,
// this handler turns that exit into kExitUsage, or kExitSuccess for an explicit --help.
bool g_parsing = false;
bool g_help_requested = false;

void ExitWithUsageCode() {
  if (!g_parsing) return;
  std::fflush(nullptr);
  _exit(g_help_requested ? kExitSuccess : kExitUsage);
}

bool IsHelpFlag(const char* arg) {
  for (const char* help :
       {"--help", "-help", "--helpfull", "--helpshort", "--helppackage", "--version", "-h"}) {
    if (std::strcmp(arg, help) == 0) return true;
  }
  return false;
}

// --help lists Stratum's own flags (Abseil's default looks for a main file named after the
// binary, and found none: "No flags matched").
bool IsOwnFlagFile(absl::string_view path) { return !absl::StrContains(path, "absl/"); }

}  // namespace

void ParseFlagsOrExit(int argc, char** argv, const char* usage) {
  // Abseil prints "<binary>: <usage>": a usage that names the binary first is not doubled.
  const std::string binary = std::strrchr(argv[0], '/') ? std::strrchr(argv[0], '/') + 1 : argv[0];
  absl::string_view text = usage;
  absl::ConsumePrefix(&text, binary + ": ");
  absl::SetProgramUsageMessage(text);
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = IsOwnFlagFile;
  config.contains_help_flags = IsOwnFlagFile;
  // --version: Stratum's, not Abseil's default (which names only the build type).
  config.version_string = [] { return absl::StrCat("Stratum ", StratumVersion(), "\n"); };
  // --help lists flags by their source file without the checkout's path.
  config.normalize_filename = [](absl::string_view path) {
    absl::ConsumePrefix(&path, STRATUM_SOURCE_ROOT);
    return std::string(path);
  };
  absl::SetFlagsUsageConfig(config);
  // Accept --dry-run for --dry_run: Abseil flag names cannot contain '-'.
  static std::vector<std::string> normalized;
  normalized.reserve(argc);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.rfind("--", 0) == 0) {
      const size_t name_end = std::min(arg.find('='), arg.size());
      std::replace(arg.begin() + 2, arg.begin() + name_end, '-', '_');
      normalized.push_back(std::move(arg));
      argv[i] = normalized.back().data();
    }
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0) argv[i] = const_cast<char*>("--help");
    if (IsHelpFlag(argv[i])) g_help_requested = true;
  }
  std::atexit(ExitWithUsageCode);
  g_parsing = true;
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  g_parsing = false;
  // No wait or deadline of Stratum's is negative (one would spin or expire at once).
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsOwnFlagFile(flag->Filename())) continue;
    const auto value = flag->TryGet<absl::Duration>();
    if (value.has_value() && *value < absl::ZeroDuration()) {
      std::fprintf(stderr,
                   "%s: --%s is %s: a duration cannot be negative; write 0 or more, e.g. %s\n",
                   binary.c_str(), std::string(name).c_str(), absl::FormatDuration(*value).c_str(),
                   flag->DefaultValue().c_str());
      std::exit(kExitUsage);
    }
  }
  if (positional.size() > 1) {
    std::fprintf(stderr,
                 "%s: unexpected argument \"%s\": every option is a flag (--name=value); "
                 "see --help\n",
                 argv[0], positional[1]);
    std::exit(kExitUsage);
  }
}

absl::Status CheckDurationFlag(absl::string_view flag, absl::Duration value, absl::Duration minimum,
                               absl::string_view why, absl::string_view example) {
  if (value >= minimum) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, " is ", absl::FormatDuration(value), ": ",
                                                 why, "; use ", absl::FormatDuration(minimum),
                                                 " or more, e.g. ", example));
}

}  // namespace stratum
