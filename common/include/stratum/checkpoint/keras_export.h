// A trained model in Keras' own formats, for people to take away: <dir>/model.json (the
// job's model as Keras' model.to_json() gave it) and <dir>/model.weights.h5 in Keras 3's
// weights layout, so that keras.models.model_from_json(open("model.json").read())
// .load_weights("model.weights.h5") restores it; the same weights also in
// <dir>/model.safetensors under Stratum's names ("dense/kernel").
//
// Keras 3's layout (keras/src/saving/saving_lib.py, H5IOStore): an empty group /vars for
// the model, then /layers/<layer>/vars/0, 1, ... per layer of model.layers, in order,
// each a float32 dataset of the variable's shape, in the layer's own variable order
// (Dense kernel, bias; BatchNormalization gamma, beta, moving_mean, moving_variance). A
// layer's path is its class name in snake case with a counter per class (dense, dense_1,
// conv2d, batch_normalization, re_lu), not its name; a Sequential model's InputLayer has
// no path, a functional model's has one (layers/input_layer). Layers without variables
// get an empty vars group, as Keras writes them. Not thread-safe per folder.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stratum/model/model.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

// Keras' naming.to_snake_case of a class name: "Conv2D" -> "conv2d", "ReLU" -> "re_lu".
std::string KerasSnakeCase(const std::string& class_name);

// Where each layer of the Keras model `model_json` keeps its variables in a .weights.h5:
// per layer of model.layers, its path ("layers/dense_1") and the indices into
// model.variables() of its variables, in order. INVALID_ARGUMENT for a model whose layers
// cannot be matched to `model`'s variables (a nested model).
struct KerasWeightsGroup {
  std::string path;
  std::vector<size_t> variables;
};
absl::StatusOr<std::vector<KerasWeightsGroup>> KerasWeightsLayout(const nlohmann::json& model_json,
                                                                  const Model& model);

// Writes only the weights file, at `path` (ending in .weights.h5, as Keras' save_weights
// wants), under a temporary name renamed once whole; its folder is made when missing.
absl::Status WriteKerasWeightsFile(const nlohmann::json& model_json, const Model& model,
                                   const std::vector<Tensor>& variables, const std::string& path);

// Writes the export of `model` (built from `model_json`) with the trained `variables` into
// `dir` (made when missing). Each file is written under a temporary name and renamed, so
// the folder never holds a half-written one. Errors name the file and the reason.
absl::Status ExportKerasModel(const nlohmann::json& model_json, const Model& model,
                              const std::vector<Tensor>& variables, const std::string& dir);

}  // namespace stratum
