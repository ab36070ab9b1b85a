#include "stratum/util/number_text.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stratum {

std::string PythonFloat(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto [end, error] =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  const std::string text(buffer, end);  // "-1.2345e-05": the shortest digits
  const size_t e = text.find('e');
  const bool negative = text[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (text[i] != '.') digits.push_back(text[i]);
  }
  const int exponent = std::stoi(text.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {  // Python's repr: positional in this range
    if (exponent < 0) {
      absl::StrAppend(&out, "0.", std::string(static_cast<size_t>(-exponent - 1), '0'), digits);
    } else if (digits.size() <= static_cast<size_t>(exponent) + 1) {
      absl::StrAppend(&out, digits,
                      std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0'), ".0");
    } else {
      absl::StrAppend(&out, digits.substr(0, static_cast<size_t>(exponent) + 1), ".",
                      digits.substr(static_cast<size_t>(exponent) + 1));
    }
    return out;
  }
  absl::StrAppend(&out, digits.substr(0, 1));
  if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
  return absl::StrFormat("%se%c%02d", out, exponent < 0 ? '-' : '+', std::abs(exponent));
}

}  // namespace stratum
