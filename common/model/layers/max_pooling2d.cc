// MaxPooling2D: the maximum of each window of channels-last images, channel by channel;
// the gradient goes to the window's first maximum.
#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "common/model/layers/window.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class MaxPooling2D final : public Layer {
 public:
  MaxPooling2D(std::array<int64_t, 2> pool, std::array<int64_t, 2> strides, bool same)
      : pool_(pool), strides_(strides), same_(same) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    const int64_t channels = inputs[0].rank() == 3 ? inputs[0].dim(2) : 0;
    STRATUM_ASSIGN_OR_RETURN(
        window_, MakeWindow(where, inputs[0], pool_, strides_, {1, 1}, same_, channels));
    LayerBuild build;
    build.output = Shape({window_.out_h, window_.out_w, channels});
    return build;
  }

  void Forward(const LayerForward& args) const override {
    args.device->MaxPool2D(window_, args.batch, args.inputs[0], args.output);
  }

  void Backward(const LayerBackward& args) const override {
    if (args.grad_inputs[0] == nullptr) return;
    args.device->MaxPool2DBackward(window_, args.batch, args.inputs[0], args.output,
                                   args.grad_output, args.grad_inputs[0], args.accumulate[0]);
  }

  bool RunsOnGpu() const override { return false; }  // the GPU issue's

 private:
  const std::array<int64_t, 2> pool_, strides_;
  const bool same_;
  Window2D window_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeMaxPooling2D(const nlohmann::json& config,
                                                        const std::string& where) {
  STRATUM_RETURN_IF_ERROR(
      keras::RefuseUnknown(where, config, {"pool_size", "strides", "padding", "data_format"}));
  STRATUM_RETURN_IF_ERROR(RefuseChannelsFirst(where, config));
  STRATUM_ASSIGN_OR_RETURN(const auto pool, ParsePair(where, config, "pool_size", {2, 2}));
  // Keras: strides None means the pool size.
  STRATUM_ASSIGN_OR_RETURN(const auto strides, ParsePair(where, config, "strides", pool));
  STRATUM_ASSIGN_OR_RETURN(const bool same, ParseSamePadding(where, config));
  return std::make_unique<MaxPooling2D>(pool, strides, same);
}

}  // namespace stratum::layers
