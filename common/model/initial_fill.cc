#include "stratum/model/initial_fill.h"

#include <algorithm>

#include "stratum/device/device.h"

namespace stratum {
namespace {

// SplitMix64's output for state `x` (its counter times the golden gamma, plus the seed).
uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The counter stream's value j as Uniform01 makes one: 24 random bits.
float CounterUniform01(uint64_t seed, int64_t j) {
  const uint64_t state = seed + (static_cast<uint64_t>(j) + 1) * 0x9E3779B97F4A7C15ULL;
  return static_cast<float>(Mix(state) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace

void FillInitialValues(const InitialFill& fill, int64_t first, int64_t count, float* out) {
  switch (fill.kind) {
    case InitialFill::Kind::kZeros:
      std::fill(out, out + count, 0.0f);
      return;
    case InitialFill::Kind::kOnes:
      std::fill(out, out + count, 1.0f);
      return;
    case InitialFill::Kind::kUniform:
    case InitialFill::Kind::kSymmetric:
      break;
  }
  if (fill.counter) {
    for (int64_t j = 0; j < count; ++j) {
      const float u = CounterUniform01(fill.stream_seed, first + j);
      out[j] = fill.kind == InitialFill::Kind::kUniform ? fill.low + fill.span * u
                                                        : fill.limit * (2 * u - 1);
    }
    return;
  }
  RandomStream rng(fill.stream_seed);
  rng.discard(static_cast<unsigned long long>(first));  // one draw per value before `first`
  if (fill.kind == InitialFill::Kind::kUniform) {
    for (int64_t j = 0; j < count; ++j) out[j] = fill.low + fill.span * Uniform01(rng);
  } else {
    for (int64_t j = 0; j < count; ++j) out[j] = fill.limit * (2 * Uniform01(rng) - 1);
  }
}

}  // namespace stratum
