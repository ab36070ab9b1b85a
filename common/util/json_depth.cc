#include "stratum/util/json_depth.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stratum {

int JsonNestingDepth(absl::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      depth = std::max(0, depth - 1);
    }
  }
  return deepest;
}

absl::Status CheckJsonDepth(absl::string_view text, absl::string_view what, absl::string_view fix) {
  const int depth = JsonNestingDepth(text);
  if (depth <= kMaxJsonDepth) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " nests arrays and objects ", depth,
                                                 " levels deep; at most ", kMaxJsonDepth,
                                                 " are accepted: ", fix));
}

}  // namespace stratum
