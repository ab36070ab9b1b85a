// Average: the elementwise mean of its inputs.
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "common/model/layers/merge.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

class Average final : public ElementwiseMerge {
 public:
  void Forward(const LayerForward& args) const override {
    const int64_t n = args.batch * size_;
    args.device->Sum(args.inputs.data(), count_, args.output, n);
    args.device->Scale(1.0f / static_cast<float>(count_), args.output, args.output, n, false);
  }

  void Backward(const LayerBackward& args) const override {
    const float share = 1.0f / static_cast<float>(count_);
    for (size_t i = 0; i < args.grad_inputs.size(); ++i) {
      if (args.grad_inputs[i] == nullptr) continue;
      args.device->Scale(share, args.grad_output, args.grad_inputs[i], args.batch * size_,
                         args.accumulate[i]);
    }
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeAverage(const nlohmann::json& config,
                                                   const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {}));
  return std::make_unique<Average>();
}

}  // namespace stratum::layers
