// Tensors as the PS's gRPC service receives them (Push, Assign, CreateVariables): any
// bytes are a tensor that encodes back to itself, or an error, never a crash or an
// allocation larger than the bytes justify.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "proto/tensor.pb.h"
#include "stratum/tensor/tensor_proto.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  stratum::proto::TensorProto message;
  if (!message.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<stratum::Tensor> tensor = stratum::TensorFromProto(message);
  if (!tensor.ok()) return 0;
  stratum::proto::TensorProto again;
  stratum::TensorToProto(*tensor, &again);
  absl::StatusOr<stratum::Tensor> back = stratum::TensorFromProto(again);
  if (!back.ok() || back->dtype() != tensor->dtype() || back->shape() != tensor->shape() ||
      back->byte_size() != tensor->byte_size() ||
      (tensor->byte_size() > 0 &&
       std::memcmp(back->raw_data(), tensor->raw_data(), tensor->byte_size()) != 0)) {
    std::abort();  // a tensor that does not survive its own encoding
  }
  return 0;
}
