// Concatenate: its inputs joined along one axis (the last by default); the other
// dimensions must agree.
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "common/model/layers/merge.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class Concatenate final : public Layer {
 public:
  explicit Concatenate(int64_t axis) : axis_(axis) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    STRATUM_RETURN_IF_ERROR(CheckMergeInputs(inputs, where));
    const int rank = inputs[0].rank();
    // Keras counts the batch dimension: axis 1 is an example's first; -1 its last.
    const int64_t axis = axis_ < 0 ? rank + axis_ : axis_ - 1;
    if (axis < 0 || axis >= rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has axis ", axis_, ", which its inputs of shape ",
                       keras::ShapeWithBatch(inputs[0]), " do not have",
                       axis_ == 0 ? " (axis 0 is the batch)" : "", ": use an axis from 1 to ", rank,
                       ", or -1 for the last"));
    }
    std::vector<int64_t> out = inputs[0].dims();
    out[axis] = 0;
    for (const Shape& in : inputs) {
      std::vector<int64_t> expected = inputs[0].dims();
      expected[axis] = in.rank() == rank ? in.dim(static_cast<int>(axis)) : 0;
      if (in.dims() != expected) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " takes inputs of shapes ", keras::ShapeWithBatch(inputs[0]),
                         " and ", keras::ShapeWithBatch(in), ", which differ outside the axis ",
                         axis_, " it joins them on: make the other dimensions match"));
      }
      out[axis] += in.dim(static_cast<int>(axis));
      const int64_t inner = std::accumulate(in.dims().begin() + axis + 1, in.dims().end(),
                                            int64_t{1}, std::multiplies<>());
      widths_.push_back(in.dim(static_cast<int>(axis)) * inner);
    }
    outer_per_example_ =
        std::accumulate(out.begin(), out.begin() + axis, int64_t{1}, std::multiplies<>());
    total_width_ = std::accumulate(widths_.begin(), widths_.end(), int64_t{0});
    LayerBuild build;
    build.output = Shape(std::move(out));
    return build;
  }

  void Forward(const LayerForward& args) const override {
    const int64_t rows = args.batch * outer_per_example_;
    int64_t offset = 0;
    for (size_t i = 0; i < widths_.size(); ++i) {
      args.device->CopyBlocks(args.inputs[i], widths_[i], args.output + offset, total_width_, rows,
                              widths_[i], false);
      offset += widths_[i];
    }
  }

  void Backward(const LayerBackward& args) const override {
    const int64_t rows = args.batch * outer_per_example_;
    int64_t offset = 0;
    for (size_t i = 0; i < widths_.size(); ++i) {
      if (args.grad_inputs[i] != nullptr) {
        args.device->CopyBlocks(args.grad_output + offset, total_width_, args.grad_inputs[i],
                                widths_[i], rows, widths_[i], args.accumulate[i]);
      }
      offset += widths_[i];
    }
  }

 private:
  const int64_t axis_;             // as Keras writes it
  std::vector<int64_t> widths_;    // per input: elements of one block (axis and after)
  int64_t total_width_ = 0;        // elements of one output block
  int64_t outer_per_example_ = 0;  // blocks in one example
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeConcatenate(const nlohmann::json& config,
                                                       const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {"axis"}));
  int64_t axis = -1;
  if (const nlohmann::json* value = keras::Find(config, "axis")) {
    if (!value->is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has axis ", keras::Dump(*value),
                                                     ", which is not an integer: use -1"));
    }
    axis = value->get<int64_t>();
  }
  return std::make_unique<Concatenate>(axis);
}

}  // namespace stratum::layers
