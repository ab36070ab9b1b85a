// Add: the elementwise sum of its inputs (a residual connection).
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "common/model/layers/merge.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class Add final : public ElementwiseMerge {
 public:
  void Forward(const LayerForward& args) const override {
    args.device->Sum(args.inputs.data(), count_, args.output, args.batch * size_);
  }

  void Backward(const LayerBackward& args) const override {
    for (size_t i = 0; i < args.grad_inputs.size(); ++i) {
      if (args.grad_inputs[i] == nullptr) continue;
      args.device->Copy(args.grad_output, args.grad_inputs[i], args.batch * size_,
                        args.accumulate[i]);
    }
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeAdd(const nlohmann::json& config,
                                               const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {}));
  return std::make_unique<Add>();
}

}  // namespace stratum::layers
