// The layer registry: Keras class_name -> the factory that makes the layer from its config.
// The table (layer_registry.cc) lists every layer Stratum implements; a model naming any
// other class is refused by name.
//
// Thread safety: the table is constant; lookups may run from any thread.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stratum/model/layer.h"

namespace stratum {

// Makes a layer from its Keras config (an object), refusing unknown keys and options
// Stratum does not implement by name. `where` names the layer for messages.
using LayerFactory = absl::StatusOr<std::unique_ptr<Layer>> (*)(const nlohmann::json& config,
                                                                const std::string& where);

// The factory for a Keras class name, or nullptr when Stratum has no such layer.
LayerFactory FindLayerFactory(absl::string_view class_name);

// "use InputLayer, Activation, Add, ... or Multiply": the fix when a class is unknown.
std::string SupportedLayersHint();

}  // namespace stratum
