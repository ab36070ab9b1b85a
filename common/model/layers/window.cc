#include "common/model/layers/window.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"

namespace stratum::layers {

absl::StatusOr<std::array<int64_t, 2>> ParsePair(const std::string& where,
                                                 const nlohmann::json& config, const char* key,
                                                 std::array<int64_t, 2> fallback) {
  const nlohmann::json* value = keras::Find(config, key);
  if (value == nullptr) return fallback;
  auto positive = [](const nlohmann::json& v) {
    return v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() < (int64_t{1} << 31);
  };
  if (positive(*value)) return std::array<int64_t, 2>{value->get<int64_t>(), value->get<int64_t>()};
  if (value->is_array() && value->size() == 2 && positive((*value)[0]) && positive((*value)[1])) {
    return std::array<int64_t, 2>{(*value)[0].get<int64_t>(), (*value)[1].get<int64_t>()};
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has ", key, " ", keras::Dump(*value),
                   ": give a positive integer or a pair of them, such as [3, 3]"));
}

absl::StatusOr<bool> ParseSamePadding(const std::string& where, const nlohmann::json& config) {
  const nlohmann::json* padding = keras::Find(config, "padding");
  if (padding == nullptr || *padding == "valid") return false;
  if (*padding == "same") return true;
  return absl::InvalidArgumentError(absl::StrCat(where, " has padding ", keras::Dump(*padding),
                                                 ", which Stratum does not support: use \"valid\" "
                                                 "or \"same\""));
}

absl::Status RefuseChannelsFirst(const std::string& where, const nlohmann::json& config) {
  const nlohmann::json* format = keras::Find(config, "data_format");
  if (format == nullptr || *format == "channels_last") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has data_format ", keras::Dump(*format),
                   ", which Stratum does not support: use \"channels_last\" (Keras' default)"));
}

absl::StatusOr<Window2D> MakeWindow(const std::string& where, const Shape& input,
                                    std::array<int64_t, 2> kernel, std::array<int64_t, 2> strides,
                                    std::array<int64_t, 2> dilation, bool same, int64_t out_c) {
  if (input.rank() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " takes images of shape (None, height, width, channels), but its input is ",
        keras::ShapeWithBatch(input), ": add a Reshape layer, such as Reshape((28, 28, 1))"));
  }
  Window2D w;
  w.in_h = input.dim(0);
  w.in_w = input.dim(1);
  w.in_c = input.dim(2);
  w.out_c = out_c;
  w.kernel_h = kernel[0];
  w.kernel_w = kernel[1];
  w.stride_h = strides[0];
  w.stride_w = strides[1];
  w.dilation_h = dilation[0];
  w.dilation_w = dilation[1];
  const int64_t extent_h = (w.kernel_h - 1) * w.dilation_h + 1;
  const int64_t extent_w = (w.kernel_w - 1) * w.dilation_w + 1;
  if (same) {
    w.out_h = (w.in_h + w.stride_h - 1) / w.stride_h;
    w.out_w = (w.in_w + w.stride_w - 1) / w.stride_w;
    const int64_t pad_h = std::max<int64_t>((w.out_h - 1) * w.stride_h + extent_h - w.in_h, 0);
    const int64_t pad_w = std::max<int64_t>((w.out_w - 1) * w.stride_w + extent_w - w.in_w, 0);
    w.pad_top = pad_h / 2;
    w.pad_bottom = pad_h - w.pad_top;
    w.pad_left = pad_w / 2;
    w.pad_right = pad_w - w.pad_left;
  } else {
    if (extent_h > w.in_h || extent_w > w.in_w) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has a window of ", extent_h, " x ", extent_w, " on an input of ",
                       w.in_h, " x ", w.in_w,
                       ": with padding \"valid\" the window must fit; use a smaller one or "
                       "padding \"same\""));
    }
    w.out_h = (w.in_h - extent_h) / w.stride_h + 1;
    w.out_w = (w.in_w - extent_w) / w.stride_w + 1;
  }
  return w;
}

}  // namespace stratum::layers
