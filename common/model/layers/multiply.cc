// Multiply: the elementwise product of its inputs (a gate).
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "common/model/layers/merge.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class Multiply final : public ElementwiseMerge {
 public:
  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    STRATUM_ASSIGN_OR_RETURN(LayerBuild build, ElementwiseMerge::Build(inputs, where));
    build.scratch_per_example = size_;  // the product of the other inputs, in Backward
    return build;
  }

  void Forward(const LayerForward& args) const override {
    const int64_t n = args.batch * size_;
    args.device->Multiply(args.inputs[0], args.inputs[1], args.output, n, false);
    for (int i = 2; i < count_; ++i) {
      args.device->Multiply(args.output, args.inputs[i], args.output, n, false);
    }
  }

  // d/d(input i) = grad_output * the product of the other inputs.
  void Backward(const LayerBackward& args) const override {
    const int64_t n = args.batch * size_;
    for (int i = 0; i < count_; ++i) {
      if (args.grad_inputs[i] == nullptr) continue;
      args.device->Copy(args.grad_output, args.scratch, n, false);
      for (int j = 0; j < count_; ++j) {
        if (j != i) args.device->Multiply(args.scratch, args.inputs[j], args.scratch, n, false);
      }
      args.device->Copy(args.scratch, args.grad_inputs[i], n, args.accumulate[i]);
    }
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeMultiply(const nlohmann::json& config,
                                                    const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {}));
  return std::make_unique<Multiply>();
}

}  // namespace stratum::layers
