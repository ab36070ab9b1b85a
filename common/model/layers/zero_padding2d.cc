// ZeroPadding2D: rows and columns of zeros around channels-last images. Block copies of
// the Device move each image's rows into place, so it runs wherever the Device does.
#include <array>

#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "common/model/layers/window.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class ZeroPadding2D final : public Layer {
 public:
  // top, bottom, left, right
  explicit ZeroPadding2D(std::array<int64_t, 4> padding) : padding_(padding) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    const Shape& in = inputs[0];
    if (in.rank() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " takes images of shape (None, height, width, channels), but its input is ",
          keras::ShapeWithBatch(in), ": add a Reshape layer, such as Reshape((28, 28, 1))"));
    }
    in_h_ = in.dim(0);
    in_w_ = in.dim(1);
    channels_ = in.dim(2);
    out_h_ = in_h_ + padding_[0] + padding_[1];
    out_w_ = in_w_ + padding_[2] + padding_[3];
    if (!keras::CheckedProduct(out_h_ * out_w_, channels_)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       " pads its input beyond the 2^31 values Stratum allows per example: "
                       "pad less"));
    }
    LayerBuild build;
    build.output = Shape({out_h_, out_w_, channels_});
    return build;
  }

  void Forward(const LayerForward& args) const override {
    const Device& device = *args.device;
    device.Zero(args.output, args.batch * out_h_ * out_w_ * channels_);
    for (int64_t n = 0; n < args.batch; ++n) {
      device.CopyBlocks(args.inputs[0] + n * in_h_ * in_w_ * channels_, in_w_ * channels_,
                        args.output + Offset(n), out_w_ * channels_, in_h_, in_w_ * channels_,
                        false);
    }
  }

  void Backward(const LayerBackward& args) const override {
    if (args.grad_inputs[0] == nullptr) return;
    for (int64_t n = 0; n < args.batch; ++n) {
      args.device->CopyBlocks(args.grad_output + Offset(n), out_w_ * channels_,
                              args.grad_inputs[0] + n * in_h_ * in_w_ * channels_,
                              in_w_ * channels_, in_h_, in_w_ * channels_, args.accumulate[0]);
    }
  }

 private:
  // Where image n's first input row lands in the output.
  int64_t Offset(int64_t n) const {
    return (n * out_h_ * out_w_ + padding_[0] * out_w_ + padding_[2]) * channels_;
  }

  const std::array<int64_t, 4> padding_;
  int64_t in_h_ = 0, in_w_ = 0, channels_ = 0, out_h_ = 0, out_w_ = 0;
};

// Keras' padding: n (all sides), (height, width), or ((top, bottom), (left, right)).
absl::StatusOr<std::array<int64_t, 4>> ParsePadding(const std::string& where,
                                                    const nlohmann::json& config) {
  const nlohmann::json* value = keras::Find(config, "padding");
  if (value == nullptr) return std::array<int64_t, 4>{1, 1, 1, 1};
  auto amount = [](const nlohmann::json& v) {
    return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t{1} << 20);
  };
  if (amount(*value)) {
    const int64_t n = value->get<int64_t>();
    return std::array<int64_t, 4>{n, n, n, n};
  }
  if (value->is_array() && value->size() == 2) {
    const nlohmann::json& h = (*value)[0];
    const nlohmann::json& w = (*value)[1];
    if (amount(h) && amount(w)) {
      return std::array<int64_t, 4>{h.get<int64_t>(), h.get<int64_t>(), w.get<int64_t>(),
                                    w.get<int64_t>()};
    }
    if (h.is_array() && h.size() == 2 && w.is_array() && w.size() == 2 && amount(h[0]) &&
        amount(h[1]) && amount(w[0]) && amount(w[1])) {
      return std::array<int64_t, 4>{h[0].get<int64_t>(), h[1].get<int64_t>(), w[0].get<int64_t>(),
                                    w[1].get<int64_t>()};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, " has padding ", keras::Dump(*value),
      ": give n, [height, width] or [[top, bottom], [left, right]] as non-negative integers"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeZeroPadding2D(const nlohmann::json& config,
                                                         const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {"padding", "data_format"}));
  STRATUM_RETURN_IF_ERROR(RefuseChannelsFirst(where, config));
  STRATUM_ASSIGN_OR_RETURN(const auto padding, ParsePadding(where, config));
  return std::make_unique<ZeroPadding2D>(padding);
}

}  // namespace stratum::layers
