// What the merge layers (Add, Average, Multiply, Concatenate) share: they take two or more
// inputs, and the elementwise ones take inputs of one shape. Internal to common/model/.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/model/layer.h"

namespace stratum::layers {

// Two or more inputs, or INVALID_ARGUMENT naming the layer and the fix.
absl::Status CheckMergeInputs(const std::vector<Shape>& inputs, const std::string& where);

// A merge of inputs of one shape into an output of that shape, elementwise.
class ElementwiseMerge : public Layer {
 public:
  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override;

 protected:
  int64_t size_ = 0;  // elements per example
  int count_ = 0;     // inputs
};

}  // namespace stratum::layers
