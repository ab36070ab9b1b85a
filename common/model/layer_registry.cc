#include "stratum/model/layer_registry.h"

#include "absl/strings/str_cat.h"
#include "common/model/layers/layers.h"
#include "common/model/layers/pooling.h"

namespace stratum {
namespace {

// The pooling layers: one implementation, four Keras classes.
template <layers::PoolKind kKind, bool kGlobal>
absl::StatusOr<std::unique_ptr<Layer>> MakePooling(const nlohmann::json& config,
                                                   const std::string& where) {
  return kGlobal ? layers::MakeGlobalPooling2D(kKind, config, where)
                 : layers::MakePooling2D(kKind, config, where);
}

struct Registration {
  const char* class_name;
  LayerFactory make;
};

// One line a layer, in alphabetical order (the order messages list them in).
// clang-format off
constexpr Registration kLayers[] = {
    {"Activation", layers::MakeActivation},
    {"Add", layers::MakeAdd},
    {"Average", layers::MakeAverage},
    {"AveragePooling2D", MakePooling<layers::PoolKind::kAverage, false>},
    {"BatchNormalization", layers::MakeBatchNormalization},
    {"Concatenate", layers::MakeConcatenate},
    {"Conv2D", layers::MakeConv2D},
    {"Dense", layers::MakeDense},
    {"Dropout", layers::MakeDropout},
    {"Embedding", layers::MakeEmbedding},
    {"Flatten", layers::MakeFlatten},
    {"GlobalAveragePooling1D", layers::MakeGlobalAveragePooling1D},
    {"GlobalAveragePooling2D", MakePooling<layers::PoolKind::kAverage, true>},
    {"GlobalMaxPooling2D", MakePooling<layers::PoolKind::kMax, true>},
    {"IntegerLookup", layers::MakeIntegerLookup},
    {"MaxPooling2D", MakePooling<layers::PoolKind::kMax, false>},
    {"Multiply", layers::MakeMultiply},
    {"ReLU", layers::MakeReLU},
    {"Reshape", layers::MakeReshape},
    {"SyncBatchNormalization", layers::MakeSyncBatchNormalization},
    {"ZeroPadding2D", layers::MakeZeroPadding2D},
};
// clang-format on

}  // namespace

LayerFactory FindLayerFactory(absl::string_view class_name) {
  for (const Registration& layer : kLayers) {
    if (class_name == layer.class_name) return layer.make;
  }
  return nullptr;
}

std::string SupportedLayersHint() {
  // InputLayer is the model's, not a registered layer, but users write it like one.
  std::string hint = "use InputLayer";
  const size_t n = std::size(kLayers);
  for (size_t i = 0; i < n; ++i)
    absl::StrAppend(&hint, i + 1 < n ? ", " : " or ", kLayers[i].class_name);
  return hint;
}

}  // namespace stratum
