#include "stratum/util/sort_unique.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace stratum {
namespace {

// What std::sort + std::unique give.
std::vector<int64_t> Expected(std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

TEST(SortUniqueTest, MatchesAComparisonSortForEveryNumberOfDigits) {
  std::mt19937_64 rng(7);
  // One, two and three 12-bit digits, around each radix boundary, and 2^31 (four digits'
  // worth of bits are not needed: ids stay within int32).
  for (int64_t bound : {int64_t{1}, int64_t{2}, int64_t{4096}, int64_t{4097}, int64_t{1} << 23,
                        int64_t{1} << 24, (int64_t{1} << 24) + 1, int64_t{1} << 31}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{511}, size_t{512}, size_t{13312}}) {
      std::vector<int64_t> values(count);
      // Skewed: many repeats among small values, as Zipf ids give, and some near the bound.
      for (int64_t& v : values) {
        const uint64_t r = rng();
        v = static_cast<int64_t>((r & 1) ? (r >> 1) % 64 % bound : (r >> 1) % bound);
      }
      const std::vector<int64_t> expected = Expected(values);
      SortUnique(values, bound);
      EXPECT_EQ(values, expected) << "bound " << bound << ", " << count << " values";
    }
  }
}

TEST(SortUniqueTest, ValuesOutsideTheBoundAreStillSorted) {
  // The radix path needs every value in [0, bound); others take the comparison sort.
  std::vector<int64_t> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 999 - static_cast<int64_t>(i % 500);
  values[3] = -5;
  values[7] = int64_t{1} << 40;
  const std::vector<int64_t> expected = Expected(values);
  SortUnique(values, 1000);
  EXPECT_EQ(values, expected);
}

}  // namespace
}  // namespace stratum
