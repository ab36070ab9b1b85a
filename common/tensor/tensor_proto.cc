#include "stratum/tensor/tensor_proto.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace stratum {
namespace {

// DType values equal proto::DataType values by design.
static_assert(static_cast<int>(DType::kFloat32) == proto::DT_FLOAT);
static_assert(static_cast<int>(DType::kInt32) == proto::DT_INT32);
static_assert(static_cast<int>(DType::kInt64) == proto::DT_INT64);
static_assert(static_cast<int>(DType::kUInt8) == proto::DT_UINT8);

}  // namespace

void TensorToProto(const Tensor& tensor, proto::TensorProto* out) {
  out->set_dtype(static_cast<proto::DataType>(tensor.dtype()));
  out->clear_dims();
  for (int64_t dim : tensor.shape().dims()) out->add_dims(dim);
  out->set_content(static_cast<const char*>(tensor.raw_data()), tensor.byte_size());
}

absl::StatusOr<Tensor> TensorFromProto(const proto::TensorProto& message) {
  const int dtype = message.dtype();
  if (dtype < proto::DT_FLOAT || dtype > proto::DT_UINT8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor has dtype ", dtype, ", which is not one of float32, int32, int64, uint8"));
  }
  std::vector<int64_t> dims(message.dims().begin(), message.dims().end());
  int64_t elements = 1;
  for (int64_t dim : dims) {
    if (dim < 0 || (dim > 0 && elements > (int64_t{1} << 40) / dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor has dimension ", dim, ", which is negative or too large"));
    }
    elements *= dim;
  }
  // The size is checked before any memory is committed: a 16-byte message may declare
  // terabytes.
  const size_t bytes = static_cast<size_t>(elements) * DTypeSize(static_cast<DType>(dtype));
  if (message.content().size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", DTypeName(static_cast<DType>(dtype)), Shape(dims).ToString(),
                     " needs ", bytes, " bytes but carries ", message.content().size()));
  }
  Tensor tensor(static_cast<DType>(dtype), Shape(std::move(dims)));
  if (tensor.byte_size() > 0) {
    std::memcpy(tensor.raw_data(), message.content().data(), tensor.byte_size());
  }
  return tensor;
}

}  // namespace stratum
