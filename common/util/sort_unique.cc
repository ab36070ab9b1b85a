#include "stratum/util/sort_unique.h"

#include <algorithm>
#include <array>
#include <bit>

namespace stratum {

void SortUnique(std::vector<int64_t>& values, int64_t bound) {
  constexpr int kDigitBits = 12;
  constexpr uint64_t kDigitMask = (uint64_t{1} << kDigitBits) - 1;
  constexpr size_t kRadixFrom = 512;  // below, a comparison sort is as fast
  const int bits = bound > 1 ? std::bit_width(static_cast<uint64_t>(bound - 1)) : 1;
  const int passes = (bits + kDigitBits - 1) / kDigitBits;
  const bool in_bound =
      std::all_of(values.begin(), values.end(), [bound](int64_t v) { return v >= 0 && v < bound; });
  if (values.size() < kRadixFrom || passes > 3 || !in_bound) {
    std::sort(values.begin(), values.end());
  } else {
    // Least significant digit first; each pass is stable, so the last leaves them sorted.
    std::vector<int64_t> scratch(values.size());
    std::array<uint32_t, (1u << kDigitBits) + 1> starts;
    for (int pass = 0; pass < passes; ++pass) {
      const int shift = pass * kDigitBits;
      starts.fill(0);
      for (int64_t v : values) ++starts[((static_cast<uint64_t>(v) >> shift) & kDigitMask) + 1];
      for (size_t d = 1; d < starts.size(); ++d) starts[d] += starts[d - 1];
      for (int64_t v : values)
        scratch[starts[(static_cast<uint64_t>(v) >> shift) & kDigitMask]++] = v;
      values.swap(scratch);
    }
  }
  values.erase(std::unique(values.begin(), values.end()), values.end());
}

}  // namespace stratum
