// Flatten: one example's elements as a vector. The buffer is the input's (row-major data is
// already flat), so the model passes it on without a copy.
#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class Flatten final : public Layer {
 public:
  explicit Flatten(bool channels_first) : channels_first_(channels_first) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    if (channels_first_ && inputs[0].rank() >= 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       " has data_format channels_first, which Stratum does not support: use "
                       "channels_last"));
    }
    LayerBuild build;
    build.output = Shape({inputs[0].num_elements()});
    return build;
  }

  bool IsIdentity(bool /*training*/) const override { return true; }
  void Forward(const LayerForward&) const override {}
  void Backward(const LayerBackward&) const override {}

 private:
  const bool channels_first_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeFlatten(const nlohmann::json& config,
                                                   const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {"data_format"}));
  bool channels_first = false;
  if (const nlohmann::json* format = keras::Find(config, "data_format")) {
    if (*format != "channels_first" && *format != "channels_last") {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has data_format ", keras::Dump(*format), ": use \"channels_last\""));
    }
    channels_first = *format == "channels_first";
  }
  return std::make_unique<Flatten>(channels_first);
}

}  // namespace stratum::layers
