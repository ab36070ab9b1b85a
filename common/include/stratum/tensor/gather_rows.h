#pragma once

#include <cstddef>
#include <cstdint>

#include "stratum/tensor/tensor.h"

namespace stratum {

// Copies rows `rows[i]` of `table` (any dtype, rank >= 1; each row in range) to `out`, side
// by side. The rows of an embedding table lie anywhere in memory far larger than the caches:
// the rows a few ahead are fetched while one is copied, so that their misses overlap.
void GatherRows(const Tensor& table, const int64_t* rows, size_t count, void* out);

}  // namespace stratum
