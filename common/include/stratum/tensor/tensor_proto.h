// Conversion between Tensor and its wire form, proto::TensorProto, with one copy of the
// data each way (into the message's bytes; into a fresh aligned buffer) and a check of
// everything a peer could get wrong.
#pragma once

#include "absl/status/statusor.h"
#include "proto/tensor.pb.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

void TensorToProto(const Tensor& tensor, proto::TensorProto* out);

// INVALID_ARGUMENT naming the problem for an unknown dtype, a negative dimension, or
// content whose size does not match the shape.
absl::StatusOr<Tensor> TensorFromProto(const proto::TensorProto& message);

}  // namespace stratum
