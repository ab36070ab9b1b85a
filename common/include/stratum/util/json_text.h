// Parsing JSON that comes from outside (a job file, TF_CONFIG): every way it can be wrong
// is an INVALID_ARGUMENT that says what and how to fix it, never an exception.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace stratum {

// Parses `text`, which is `what` ("TF_CONFIG", "job.json: the job"). Refused, each message
// ending in `fix`: nesting deeper than kMaxJsonDepth, text that is not JSON ("<what> is not
// valid JSON (error at byte N): <fix>"), a number out of range (1e400). Also refused: a key
// given twice in one object, which JSON lets the last win silently, so that a document
// edited by hand would mean other than its author read ("<where>: key \"epochs\" appears
// twice in \"fit\" (...): keep one").
absl::StatusOr<nlohmann::json> ParseJsonText(absl::string_view text, absl::string_view what,
                                             absl::string_view where, absl::string_view fix);

// The number `object[key]`, `missing` when the key is absent. JSON has no NaN or Inf, and
// nlohmann writes them as null: null reads back as NaN (a diverged loss stays diverged).
// A value of another type throws nlohmann::json::type_error.
double JsonNumberOr(const nlohmann::json& object, const char* key, double missing);

}  // namespace stratum
