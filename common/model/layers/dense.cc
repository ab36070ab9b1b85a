// Dense: output = activation(input . kernel + bias), applied to the last dimension (Keras'
// Dense on an input of rank > 1 maps each row of the last dimension).
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

using keras::Dump;
using keras::Find;

class Dense final : public Layer {
 public:
  Dense(int64_t units, ActivationKind activation, bool use_bias, keras::Initializer kernel,
        keras::Initializer bias, keras::Regularizer kernel_regularizer,
        keras::Regularizer bias_regularizer)
      : units_(units),
        activation_(activation),
        use_bias_(use_bias),
        kernel_initializer_(std::move(kernel)),
        bias_initializer_(std::move(bias)),
        kernel_regularizer_(kernel_regularizer),
        bias_regularizer_(bias_regularizer) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    const Shape& in = inputs[0];
    in_width_ = in.dim(in.rank() - 1);
    rows_per_example_ = in.num_elements() / in_width_;
    const std::optional<int64_t> kernel = keras::CheckedProduct(in_width_, units_);
    if (!kernel) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has a kernel of ", in_width_, " x ", units_,
                       " elements, more than the 2^31 Stratum allows per variable: use fewer "
                       "units"));
    }
    // The output row is rows_per_example * units; refuse it before Shape counts it.
    if (!keras::CheckedProduct(rows_per_example_, units_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " outputs ", rows_per_example_, " x ", units_,
          " elements per example, more than the 2^31 Stratum allows: use fewer units"));
    }
    LayerBuild build;
    std::vector<int64_t> dims = in.dims();
    dims.back() = units_;
    build.output = Shape(std::move(dims));
    build.variables.push_back(keras::MakeVariable("kernel", Shape({in_width_, units_}),
                                                  kernel_initializer_, kernel_regularizer_));
    if (use_bias_) {
      build.variables.push_back(
          keras::MakeVariable("bias", Shape({units_}), bias_initializer_, bias_regularizer_));
    }
    // A softmax or sigmoid keeps its logits, which a cross-entropy takes instead of the
    // probabilities.
    if (FusableActivation() != ActivationKind::kLinear) {
      build.scratch_per_example = rows_per_example_ * units_;
    }
    return build;
  }

  ActivationKind FusableActivation() const override { return FusableOf(activation_); }
  const float* Logits(const LayerForward& args) const override { return args.scratch; }

  void Forward(const LayerForward& args) const override {
    const Device& device = *args.device;
    const int64_t rows = args.batch * rows_per_example_;
    float* z = FusableActivation() != ActivationKind::kLinear ? args.scratch : args.output;
    device.MatMul(args.inputs[0], false, args.variables[0], false, rows, units_, in_width_, z,
                  false);
    device.BiasActivation(activation_, z, use_bias_ ? args.variables[1] : nullptr, args.output,
                          rows, units_);
  }

  void Backward(const LayerBackward& args) const override {
    const Device& device = *args.device;
    const int64_t rows = args.batch * rows_per_example_;
    float* grad = args.grad_output;
    float* bias_grad = use_bias_ ? args.grad_variables[1] : nullptr;
    device.ActivationGradSumRows(args.fused_activation ? ActivationKind::kLinear : activation_,
                                 args.output, grad, rows, units_, bias_grad);
    device.MatMul(args.inputs[0], true, grad, false, in_width_, units_, rows,
                  args.grad_variables[0], false);
    if (args.grad_inputs[0] != nullptr) {
      device.MatMul(grad, false, args.variables[0], true, rows, in_width_, units_,
                    args.grad_inputs[0], args.accumulate[0]);
    }
  }

 private:
  const int64_t units_;
  const ActivationKind activation_;
  const bool use_bias_;
  const keras::Initializer kernel_initializer_;
  const keras::Initializer bias_initializer_;
  const keras::Regularizer kernel_regularizer_;
  const keras::Regularizer bias_regularizer_;
  int64_t in_width_ = 0;          // the input's last dimension
  int64_t rows_per_example_ = 0;  // rows of in_width_ in one example
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeDense(const nlohmann::json& config,
                                                 const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(
      where, config,
      {"units", "activation", "use_bias", "kernel_initializer", "bias_initializer",
       "kernel_regularizer", "bias_regularizer", "kernel_constraint", "bias_constraint",
       "lora_rank", "lora_alpha", "quantization_config"}));
  STRATUM_RETURN_IF_ERROR(
      keras::RefuseSet(where, config,
                       {"activity_regularizer", "kernel_constraint", "bias_constraint", "lora_rank",
                        "quantization_config"}));
  STRATUM_RETURN_IF_ERROR(keras::RefuseFrozen(where, config));
  const nlohmann::json* units = Find(config, "units");
  if (units == nullptr || !units->is_number_integer() || units->get<int64_t>() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has units ",
                                                   units ? Dump(*units) : std::string("missing"),
                                                   ": set units to a positive integer"));
  }
  const nlohmann::json* activation_json = Find(config, "activation");
  STRATUM_ASSIGN_OR_RETURN(
      const ActivationKind activation,
      keras::ParseActivation(where, activation_json ? *activation_json : nlohmann::json()));
  STRATUM_ASSIGN_OR_RETURN(const bool use_bias, keras::ParseBool(where, config, "use_bias", true));
  STRATUM_ASSIGN_OR_RETURN(
      keras::Initializer kernel,
      keras::ParseInitializer(where, config, "kernel_initializer", "glorot_uniform"));
  STRATUM_ASSIGN_OR_RETURN(keras::Initializer bias,
                           keras::ParseInitializer(where, config, "bias_initializer", "zeros"));
  STRATUM_ASSIGN_OR_RETURN(const keras::Regularizer kernel_regularizer,
                           keras::ParseRegularizer(where, config, "kernel_regularizer"));
  STRATUM_ASSIGN_OR_RETURN(const keras::Regularizer bias_regularizer,
                           keras::ParseRegularizer(where, config, "bias_regularizer"));
  return std::make_unique<Dense>(units->get<int64_t>(), activation, use_bias, std::move(kernel),
                                 std::move(bias), kernel_regularizer, bias_regularizer);
}

}  // namespace stratum::layers
