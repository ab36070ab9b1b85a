// Dropout: inverted dropout in training (each element kept with probability 1 - rate and
// scaled by 1 / (1 - rate)); the identity in inference, as in Keras.
#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class Dropout final : public Layer {
 public:
  explicit Dropout(float rate) : rate_(rate) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& /*where*/) override {
    size_ = inputs[0].num_elements();
    LayerBuild build;
    build.output = inputs[0];
    build.scratch_per_example = size_;  // the mask
    return build;
  }

  bool IsIdentity(bool training) const override { return !training || rate_ == 0; }

  void Forward(const LayerForward& args) const override {
    const int64_t n = args.batch * size_;
    args.device->Dropout(*args.rng, rate_, args.inputs[0], args.output, args.scratch, n);
  }

  // Scales the gradient in place (grad_inputs[0] may be grad_output).
  void Backward(const LayerBackward& args) const override {
    if (args.grad_inputs[0] == nullptr) return;
    args.device->Multiply(args.grad_output, args.scratch, args.grad_inputs[0], args.batch * size_,
                          args.accumulate[0]);
  }
  bool BackwardInPlace() const override { return true; }

 private:
  const float rate_;
  int64_t size_ = 0;  // elements per example
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeDropout(const nlohmann::json& config,
                                                   const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {"rate", "noise_shape", "seed"}));
  STRATUM_RETURN_IF_ERROR(keras::RefuseSet(where, config, {"noise_shape"}));
  const nlohmann::json* rate = keras::Find(config, "rate");
  if (rate == nullptr || !rate->is_number() || !(rate->get<double>() >= 0) ||
      rate->get<double>() >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has rate ", rate ? keras::Dump(*rate) : std::string("missing"),
                     ": set rate to a number in [0, 1)"));
  }
  return std::make_unique<Dropout>(rate->get<float>());
}

}  // namespace stratum::layers
