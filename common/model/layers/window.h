// What Conv2D and the pooling layers share: Keras' (height, width) options, given as one
// integer or a pair, its "valid" and "same" padding, and the Window2D they compute with.
// Internal to common/model/.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "stratum/device/device.h"
#include "stratum/tensor/tensor.h"

namespace stratum::layers {

// config[key] as (height, width): an integer n means (n, n); absent is `fallback`. Each must
// be positive.
absl::StatusOr<std::array<int64_t, 2>> ParsePair(const std::string& where,
                                                 const nlohmann::json& config, const char* key,
                                                 std::array<int64_t, 2> fallback);
// config["padding"]: true for "same", false for "valid" (the default).
absl::StatusOr<bool> ParseSamePadding(const std::string& where, const nlohmann::json& config);
// Refuses data_format channels_first, which Stratum does not implement.
absl::Status RefuseChannelsFirst(const std::string& where, const nlohmann::json& config);

// The window over an input of shape [h, w, c] (per example), as Keras computes the output
// size and the padding of "same" (the extra row or column at the bottom or right).
absl::StatusOr<Window2D> MakeWindow(const std::string& where, const Shape& input,
                                    std::array<int64_t, 2> kernel, std::array<int64_t, 2> strides,
                                    std::array<int64_t, 2> dilation, bool same, int64_t out_c);

}  // namespace stratum::layers
