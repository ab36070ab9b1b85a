// Conv2D: a 2-D convolution over channels-last images ([height, width, channels] per
// example), with Keras' kernel layout [kernel_h, kernel_w, in_channels, filters], strides,
// dilation, "valid" or "same" padding, bias and activation. The math is the Device's (oneDNN
// on the CPU).
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "common/model/layers/window.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

using keras::Dump;
using keras::Find;

struct ConvOptions {
  int64_t filters = 0;
  std::array<int64_t, 2> kernel{1, 1}, strides{1, 1}, dilation{1, 1};
  bool same = false;
  ActivationKind activation = ActivationKind::kLinear;
  bool use_bias = true;
  keras::Initializer kernel_initializer, bias_initializer;
  keras::Regularizer kernel_regularizer, bias_regularizer;
};

class Conv2D final : public Layer {
 public:
  explicit Conv2D(ConvOptions options) : options_(std::move(options)) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    STRATUM_ASSIGN_OR_RETURN(
        window_, MakeWindow(where, inputs[0], options_.kernel, options_.strides, options_.dilation,
                            options_.same, options_.filters));
    const std::optional<int64_t> kernel =
        keras::CheckedProduct(window_.kernel_h * window_.kernel_w * window_.in_c, options_.filters);
    const std::optional<int64_t> output =
        keras::CheckedProduct(window_.out_h * window_.out_w, options_.filters);
    if (!kernel || !output) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       " needs more than the 2^31 elements Stratum allows per variable or example: "
                       "use fewer filters or a smaller kernel"));
    }
    LayerBuild build;
    build.output = Shape({window_.out_h, window_.out_w, options_.filters});
    build.variables.push_back(keras::MakeVariable(
        "kernel", Shape({window_.kernel_h, window_.kernel_w, window_.in_c, options_.filters}),
        options_.kernel_initializer, options_.kernel_regularizer));
    if (options_.use_bias) {
      build.variables.push_back(keras::MakeVariable(
          "bias", Shape({options_.filters}), options_.bias_initializer, options_.bias_regularizer));
    }
    in_size_ = inputs[0].num_elements();
    out_size_ = build.output.num_elements();
    // The input's gradient, when it must be added to another layer's.
    build.scratch_per_example = in_size_;
    return build;
  }

  void Forward(const LayerForward& args) const override {
    // The bias and the activation in one pass over the output.
    const float* bias = options_.use_bias ? args.variables[1] : nullptr;
    args.device->Conv2D(window_, args.batch, args.inputs[0], args.variables[0], nullptr,
                        args.output);
    args.device->BiasActivation(options_.activation, args.output, bias, args.output,
                                args.batch * window_.out_h * window_.out_w, options_.filters);
  }

  void Backward(const LayerBackward& args) const override {
    const Device& device = *args.device;
    device.ActivationGrad(options_.activation, args.output, args.grad_output,
                          args.batch * window_.out_h * window_.out_w, options_.filters);
    device.Conv2DBackwardWeights(window_, args.batch, args.inputs[0], args.grad_output,
                                 args.grad_variables[0],
                                 options_.use_bias ? args.grad_variables[1] : nullptr);
    float* grad_x = args.grad_inputs[0];
    if (grad_x == nullptr) return;
    if (!args.accumulate[0]) {
      device.Conv2DBackwardData(window_, args.batch, args.grad_output, args.variables[0], grad_x);
      return;
    }
    device.Conv2DBackwardData(window_, args.batch, args.grad_output, args.variables[0],
                              args.scratch);
    device.Copy(args.scratch, grad_x, args.batch * in_size_, true);
  }

 private:
  const ConvOptions options_;
  Window2D window_;
  int64_t in_size_ = 0;
  int64_t out_size_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeConv2D(const nlohmann::json& config,
                                                  const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(
      where, config,
      {"filters", "kernel_size", "strides", "padding", "data_format", "dilation_rate", "groups",
       "activation", "use_bias", "kernel_initializer", "bias_initializer", "kernel_regularizer",
       "bias_regularizer", "kernel_constraint", "bias_constraint"}));
  STRATUM_RETURN_IF_ERROR(
      keras::RefuseSet(where, config, {"kernel_constraint", "bias_constraint"}));
  STRATUM_RETURN_IF_ERROR(RefuseChannelsFirst(where, config));
  if (const nlohmann::json* groups = Find(config, "groups"); groups && *groups != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has groups ", Dump(*groups), ", which Stratum does not support: use groups 1"));
  }
  STRATUM_RETURN_IF_ERROR(keras::RefuseFrozen(where, config));
  ConvOptions options;
  const nlohmann::json* filters = Find(config, "filters");
  if (filters == nullptr || !filters->is_number_integer() || filters->get<int64_t>() <= 0 ||
      filters->get<int64_t>() >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has filters ", filters ? Dump(*filters) : std::string("missing"),
                     ": set filters to a positive integer"));
  }
  options.filters = filters->get<int64_t>();
  if (Find(config, "kernel_size") == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has no kernel_size: set it, such as [3, 3]"));
  }
  STRATUM_ASSIGN_OR_RETURN(options.kernel, ParsePair(where, config, "kernel_size", {1, 1}));
  STRATUM_ASSIGN_OR_RETURN(options.strides, ParsePair(where, config, "strides", {1, 1}));
  STRATUM_ASSIGN_OR_RETURN(options.dilation, ParsePair(where, config, "dilation_rate", {1, 1}));
  STRATUM_ASSIGN_OR_RETURN(options.same, ParseSamePadding(where, config));
  const nlohmann::json* activation = Find(config, "activation");
  STRATUM_ASSIGN_OR_RETURN(
      options.activation,
      keras::ParseActivation(where, activation ? *activation : nlohmann::json()));
  STRATUM_ASSIGN_OR_RETURN(options.use_bias, keras::ParseBool(where, config, "use_bias", true));
  STRATUM_ASSIGN_OR_RETURN(
      options.kernel_initializer,
      keras::ParseInitializer(where, config, "kernel_initializer", "glorot_uniform"));
  STRATUM_ASSIGN_OR_RETURN(options.bias_initializer,
                           keras::ParseInitializer(where, config, "bias_initializer", "zeros"));
  STRATUM_ASSIGN_OR_RETURN(options.kernel_regularizer,
                           keras::ParseRegularizer(where, config, "kernel_regularizer"));
  STRATUM_ASSIGN_OR_RETURN(options.bias_regularizer,
                           keras::ParseRegularizer(where, config, "bias_regularizer"));
  return std::make_unique<Conv2D>(std::move(options));
}

}  // namespace stratum::layers
