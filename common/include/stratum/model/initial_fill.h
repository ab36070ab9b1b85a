// InitialFill: how a variable's initial values are made, apart from the values themselves:
// the initializer's kind and numbers, and the random stream its values are drawn from, one
// draw per value in row-major order. Any range of a variable's values can be made on its
// own, equal to that range of the whole (FillInitialValues with `first`): a parameter
// server makes its shard's rows itself, so that a coordinator never builds a table of
// millions of rows to send it.
//
// Thread safety: plain values; FillInitialValues is reentrant.
#pragma once

#include <cstdint>

namespace stratum {

struct InitialFill {
  enum class Kind : int {
    kZeros = 0,
    kOnes = 1,
    kUniform = 2,    // low + span * u (RandomUniform)
    kSymmetric = 3,  // limit * (2u - 1) (glorot_uniform, he_uniform, lecun_uniform)
  };
  Kind kind = Kind::kZeros;
  float low = 0;
  float span = 0;
  float limit = 0;
  uint64_t stream_seed = 0;  // seeds the RandomStream (device.h) of the random kinds
  // The random kinds' draws: false, one RandomStream (mt19937_64) in order, whose value j
  // takes j draws to reach; true, value j from SplitMix64's j-th output (a counter), reached
  // at once. Embedding tables (row-sparse variables) use the counter, so that a parameter
  // server makes any shard of a table of billions of values without drawing its way there.
  bool counter = false;
};

// Values [first, first + count) of the variable, in row-major order, into out[0, count).
// With the RandomStream, `first` draws are skipped first: O(first).
void FillInitialValues(const InitialFill& fill, int64_t first, int64_t count, float* out);

}  // namespace stratum
