// ReduceOp and the element-wise reductions every strategy and cross-device op shares.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

enum class ReduceOp { kSum, kMean };

const char* ReduceOpName(ReduceOp op);

// Element-wise SUM or MEAN of same-shaped float32 tensors, into a new tensor. The sum is
// taken in index order (values[0] + values[1] + ...), so every caller that reduces the
// same inputs gets the same bits.
absl::StatusOr<Tensor> ReduceTensors(ReduceOp op, const std::vector<Tensor>& values);

// SUM or MEAN of a float32 tensor over `axis` (-1: over every element, giving a scalar).
absl::StatusOr<Tensor> ReduceAlongAxis(ReduceOp op, const Tensor& value, int axis);

}  // namespace stratum
