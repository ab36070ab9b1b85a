// A count with its noun, in the singular for one: "1 worker", "2 workers".
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace stratum {

inline std::string Counted(int64_t count, absl::string_view singular, absl::string_view plural) {
  return absl::StrCat(count, " ", count == 1 ? singular : plural);
}

}  // namespace stratum
