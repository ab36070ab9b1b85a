// Activation: an activation function on its own, elementwise (softmax per row of the last
// dimension). Keras' ReLU layer is the same with relu, in its plain form (no max_value,
// negative_slope or threshold).
#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class Activation final : public Layer {
 public:
  explicit Activation(ActivationKind kind) : kind_(kind) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& /*where*/) override {
    const Shape& in = inputs[0];
    width_ = in.dim(in.rank() - 1);
    rows_per_example_ = in.num_elements() / width_;
    LayerBuild build;
    build.output = in;
    return build;
  }

  ActivationKind FusableActivation() const override { return FusableOf(kind_); }
  const float* Logits(const LayerForward& args) const override { return args.inputs[0]; }

  void Forward(const LayerForward& args) const override {
    args.device->Activation(kind_, args.inputs[0], args.output, args.batch * rows_per_example_,
                            width_);
  }

  // Transforms the gradient in place (grad_inputs[0] may be grad_output).
  void Backward(const LayerBackward& args) const override {
    const int64_t rows = args.batch * rows_per_example_;
    if (!args.fused_activation) {
      args.device->ActivationGrad(kind_, args.output, args.grad_output, rows, width_);
    }
    if (args.grad_inputs[0] != nullptr) {
      args.device->Copy(args.grad_output, args.grad_inputs[0], rows * width_, args.accumulate[0]);
    }
  }
  bool BackwardInPlace() const override { return true; }

 private:
  const ActivationKind kind_;
  int64_t width_ = 0;
  int64_t rows_per_example_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeActivation(const nlohmann::json& config,
                                                      const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {"activation"}));
  const auto activation = config.find("activation");
  if (activation == config.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has no activation: set activation to relu, softmax, sigmoid, tanh or linear"));
  }
  STRATUM_ASSIGN_OR_RETURN(const ActivationKind kind, keras::ParseActivation(where, *activation));
  return std::make_unique<Activation>(kind);
}

absl::StatusOr<std::unique_ptr<Layer>> MakeReLU(const nlohmann::json& config,
                                                const std::string& where) {
  STRATUM_RETURN_IF_ERROR(
      keras::RefuseUnknown(where, config, {"max_value", "negative_slope", "threshold"}));
  STRATUM_RETURN_IF_ERROR(keras::RefuseSet(where, config, {"max_value"}));
  for (const char* key : {"negative_slope", "threshold"}) {
    const nlohmann::json* value = keras::Find(config, key);
    if (value == nullptr || (value->is_number() && value->get<double>() == 0)) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", key, " ", keras::Dump(*value),
                     ", which Stratum does not support: use 0 (a plain relu)"));
  }
  return std::make_unique<Activation>(ActivationKind::kRelu);
}

}  // namespace stratum::layers
