// A bound on how deeply JSON from outside (a job file, TF_CONFIG, a request, a checkpoint's
// metadata) may nest. nlohmann parses iteratively, but printing a value (error messages)
// and walking it recurse once per level, so a document nested tens of thousands of levels
// deep would overflow the stack. Real documents nest a handful of levels.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace stratum {

inline constexpr int kMaxJsonDepth = 100;

// The deepest nesting of arrays and objects in `text` (brackets inside strings skipped).
int JsonNestingDepth(absl::string_view text);

// OK, or INVALID_ARGUMENT "<what> nests arrays and objects N levels deep; at most 100 are
// accepted: <fix>".
absl::Status CheckJsonDepth(absl::string_view text, absl::string_view what, absl::string_view fix);

}  // namespace stratum
