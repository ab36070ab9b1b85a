// The pooling layers' one implementation: MaxPooling2D, AveragePooling2D and their global
// forms (a window of the whole image) differ in the reduction and the window alone.
// Internal to common/model/.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "stratum/model/layer.h"

namespace stratum::layers {

enum class PoolKind { kMax, kAverage };

// pool_size (default (2, 2)), strides (default: the pool size), padding, data_format.
absl::StatusOr<std::unique_ptr<Layer>> MakePooling2D(PoolKind kind, const nlohmann::json& config,
                                                     const std::string& where);
// data_format, keepdims (false: [channels] per example; true: [1, 1, channels]).
absl::StatusOr<std::unique_ptr<Layer>> MakeGlobalPooling2D(PoolKind kind,
                                                           const nlohmann::json& config,
                                                           const std::string& where);

}  // namespace stratum::layers
