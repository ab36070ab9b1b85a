#include "stratum/strategy/reduce.h"

#include "absl/strings/str_cat.h"

namespace stratum {

const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "SUM" : "MEAN"; }

absl::StatusOr<Tensor> ReduceTensors(ReduceOp op, const std::vector<Tensor>& values) {
  if (values.empty()) return absl::InvalidArgumentError("nothing to reduce: no values");
  for (const Tensor& value : values) {
    if (value.dtype() != DType::kFloat32 || !(value.shape() == values[0].shape())) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot reduce ", value.DebugString(), " with ", values[0].DebugString(),
                       ": every replica's value must be float32 of one shape"));
    }
  }
  Tensor result = values[0].Clone();
  auto sum = result.Flat();
  for (size_t i = 1; i < values.size(); ++i) sum += values[i].Flat();
  if (op == ReduceOp::kMean) sum /= static_cast<float>(values.size());
  return result;
}

absl::StatusOr<Tensor> ReduceAlongAxis(ReduceOp op, const Tensor& value, int axis) {
  if (value.dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reduce ", value.DebugString(), ": only float32 reduces"));
  }
  if (axis == -1) {
    const double total = value.Flat().cast<double>().sum();
    const double count = static_cast<double>(std::max<int64_t>(value.num_elements(), 1));
    return Tensor::Scalar(static_cast<float>(op == ReduceOp::kSum ? total : total / count));
  }
  if (axis != 0 || value.shape().rank() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reduce ", value.DebugString(),
                                                   " over axis ", axis,
                                                   ": reduce over axis 0, or -1 for all"));
  }
  std::vector<int64_t> dims(value.shape().dims().begin() + 1, value.shape().dims().end());
  Tensor result(DType::kFloat32, Shape(dims));
  auto out = Eigen::Map<Eigen::RowVectorXf>(result.data<float>(), value.row_size());
  out = value.Matrix().colwise().sum();
  if (op == ReduceOp::kMean && value.rows() > 0) out /= static_cast<float>(value.rows());
  return result;
}

}  // namespace stratum
