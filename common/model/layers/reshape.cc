// Reshape: the example's values in another shape (target_shape, one dimension of which may
// be -1: whatever the rest leaves). Row-major data needs no copy: the model passes the
// buffer on.
#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class Reshape final : public Layer {
 public:
  explicit Reshape(std::vector<int64_t> target) : target_(std::move(target)) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    const int64_t elements = inputs[0].num_elements();
    std::vector<int64_t> dims = target_;
    int64_t known = 1;
    int unknown = -1;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] == -1) {
        unknown = static_cast<int>(i);
      } else {
        known *= dims[i];
      }
    }
    if (unknown >= 0 && known > 0 && elements % known == 0) {
      dims[static_cast<size_t>(unknown)] = elements / known;
    }
    if (Shape(dims).num_elements() != elements || (unknown >= 0 && elements % known != 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has target_shape ", Shape(target_).ToString(),
                       " for an input of shape ", keras::ShapeWithBatch(inputs[0]), " (", elements,
                       " values per example): give a shape with as many values"));
    }
    LayerBuild build;
    build.output = Shape(std::move(dims));
    return build;
  }

  bool IsIdentity(bool /*training*/) const override { return true; }
  void Forward(const LayerForward&) const override {}
  void Backward(const LayerBackward&) const override {}

 private:
  const std::vector<int64_t> target_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeReshape(const nlohmann::json& config,
                                                   const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {"target_shape"}));
  const nlohmann::json* target = keras::Find(config, "target_shape");
  std::vector<int64_t> dims;
  bool valid = target != nullptr && target->is_array() && !target->empty() && target->size() <= 8;
  int unknowns = 0;
  for (size_t i = 0; valid && i < target->size(); ++i) {
    const nlohmann::json& dim = (*target)[i];
    valid = dim.is_number_integer() && (dim.get<int64_t>() > 0 || dim.get<int64_t>() == -1) &&
            dim.get<int64_t>() < (int64_t{1} << 31);
    if (valid) {
      dims.push_back(dim.get<int64_t>());
      unknowns += dims.back() == -1;
    }
  }
  if (!valid || unknowns > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has target_shape ", target ? keras::Dump(*target) : std::string("missing"),
        ": give the shape of one example as positive integers, at most one of them -1, such as "
        "[28, 28, 1]"));
  }
  return std::make_unique<Reshape>(std::move(dims));
}

}  // namespace stratum::layers
