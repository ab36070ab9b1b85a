#include "common/model/layers/pooling.h"

#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/window.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class Pooling2D final : public Layer {
 public:
  struct Options {
    PoolKind kind = PoolKind::kMax;
    std::array<int64_t, 2> pool{2, 2}, strides{2, 2};
    bool same = false;
    bool global = false;    // the window is the whole image
    bool keepdims = false;  // global: [1, 1, channels] rather than [channels]
  };
  explicit Pooling2D(Options options) : options_(options) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    const Shape& in = inputs[0];
    const int64_t channels = in.rank() == 3 ? in.dim(2) : 0;
    std::array<int64_t, 2> pool = options_.pool, strides = options_.strides;
    if (options_.global && in.rank() == 3) {
      pool = {in.dim(0), in.dim(1)};
      strides = {1, 1};
    }
    STRATUM_ASSIGN_OR_RETURN(window_,
                             MakeWindow(where, in, pool, strides, {1, 1}, options_.same, channels));
    LayerBuild build;
    if (!options_.global) {
      build.output = Shape({window_.out_h, window_.out_w, channels});
    } else {
      build.output = options_.keepdims ? Shape({1, 1, channels}) : Shape({channels});
    }
    return build;
  }

  void Forward(const LayerForward& args) const override {
    if (options_.kind == PoolKind::kMax) {
      args.device->MaxPool2D(window_, args.batch, args.inputs[0], args.output);
    } else {
      args.device->AvgPool2D(window_, args.batch, args.inputs[0], args.output);
    }
  }

  void Backward(const LayerBackward& args) const override {
    if (args.grad_inputs[0] == nullptr) return;
    if (options_.kind == PoolKind::kMax) {
      args.device->MaxPool2DBackward(window_, args.batch, args.inputs[0], args.output,
                                     args.grad_output, args.grad_inputs[0], args.accumulate[0]);
    } else {
      args.device->AvgPool2DBackward(window_, args.batch, args.grad_output, args.grad_inputs[0],
                                     args.accumulate[0]);
    }
  }

 private:
  const Options options_;
  Window2D window_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakePooling2D(PoolKind kind, const nlohmann::json& config,
                                                     const std::string& where) {
  STRATUM_RETURN_IF_ERROR(
      keras::RefuseUnknown(where, config, {"pool_size", "strides", "padding", "data_format"}));
  STRATUM_RETURN_IF_ERROR(RefuseChannelsFirst(where, config));
  Pooling2D::Options options;
  options.kind = kind;
  STRATUM_ASSIGN_OR_RETURN(options.pool, ParsePair(where, config, "pool_size", {2, 2}));
  // Keras: strides None means the pool size.
  STRATUM_ASSIGN_OR_RETURN(options.strides, ParsePair(where, config, "strides", options.pool));
  STRATUM_ASSIGN_OR_RETURN(options.same, ParseSamePadding(where, config));
  return std::make_unique<Pooling2D>(options);
}

absl::StatusOr<std::unique_ptr<Layer>> MakeGlobalPooling2D(PoolKind kind,
                                                           const nlohmann::json& config,
                                                           const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {"data_format", "keepdims"}));
  STRATUM_RETURN_IF_ERROR(RefuseChannelsFirst(where, config));
  Pooling2D::Options options;
  options.kind = kind;
  options.global = true;
  STRATUM_ASSIGN_OR_RETURN(options.keepdims, keras::ParseBool(where, config, "keepdims", false));
  return std::make_unique<Pooling2D>(options);
}

}  // namespace stratum::layers
