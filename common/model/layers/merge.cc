#include "common/model/layers/merge.h"

#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"

namespace stratum::layers {

absl::Status CheckMergeInputs(const std::vector<Shape>& inputs, const std::string& where) {
  if (inputs.size() >= 2) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, " takes ", inputs.size(),
                   " input: a merge layer takes a list of two or more "
                   "tensors, such as layers.Add()([x, y])"));
}

absl::StatusOr<LayerBuild> ElementwiseMerge::Build(const std::vector<Shape>& inputs,
                                                   const std::string& where) {
  if (absl::Status status = CheckMergeInputs(inputs, where); !status.ok()) return status;
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (inputs[i] != inputs[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " takes inputs of shapes ", keras::ShapeWithBatch(inputs[0]), " and ",
          keras::ShapeWithBatch(inputs[i]),
          ": its inputs must have one shape (Stratum does not broadcast); reshape them or add a "
          "Dense layer to match"));
    }
  }
  size_ = inputs[0].num_elements();
  count_ = static_cast<int>(inputs.size());
  LayerBuild build;
  build.output = inputs[0];
  return build;
}

}  // namespace stratum::layers
