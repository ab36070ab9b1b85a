// IntegerLookup: integer tokens to vocabulary indices, numbered by TokenLookup
// (stratum/data/lookup.h) as Keras' IntegerLookup with output_mode "int" numbers them.
//
// The indices are ids: an Embedding after the layer looks them up. Tokens reach the layer,
// and indices leave it, as id words (stratum/device/device.h: int32, exact). The layer has no
// gradient and no CUDA kernel (a model with it trains on the CPU, saying so).
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/model/layers/layers.h"
#include "stratum/data/lookup.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class IntegerLookup final : public Layer {
 public:
  explicit IntegerLookup(std::shared_ptr<const TokenLookup> lookup) : lookup_(std::move(lookup)) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& /*where*/) override {
    per_example_ = inputs[0].num_elements();
    LayerBuild build;
    build.output = inputs[0];
    return build;
  }

  bool RunsOnGpu() const override { return false; }
  int64_t LargestToken() const override { return lookup_->LargestIntegerToken(); }

  void Forward(const LayerForward& args) const override {
    const int64_t count = args.batch * per_example_;
    for (int64_t i = 0; i < count; ++i) {
      // Tokens and indices are id words (IdWord); kNoId (a value no int32 holds) is no token.
      const int32_t token = IdOfWord(args.inputs[0][i]);
      args.output[i] = IdWord(token != kNoId ? lookup_->Index(token) : lookup_->NonTokenIndex());
    }
  }

  void Backward(const LayerBackward& args) const override {
    // Tokens have no gradient; a layer before this one (rare) gets zeros.
    if (args.grad_inputs[0] != nullptr && !args.accumulate[0]) {
      args.device->Zero(args.grad_inputs[0], args.batch * per_example_);
    }
  }

 private:
  const std::shared_ptr<const TokenLookup> lookup_;
  int64_t per_example_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeIntegerLookup(const nlohmann::json& config,
                                                         const std::string& where) {
  TokenLookup::Options options;
  options.max_abs_integer_token = INT32_MAX;  // tokens travel as int32 id words
  STRATUM_ASSIGN_OR_RETURN(
      std::shared_ptr<const TokenLookup> lookup,
      TokenLookup::FromConfig(TokenLookup::Kind::kInteger, config, where, options));
  return std::make_unique<IntegerLookup>(std::move(lookup));
}

}  // namespace stratum::layers
