// The factories of the layers Stratum implements, one file each in this folder (the pooling
// layers share pooling.h); the registry (layer_registry.cc) maps Keras class names to them.
// Internal to common/model/.
#pragma once

#include "stratum/model/layer_registry.h"

namespace stratum::layers {

absl::StatusOr<std::unique_ptr<Layer>> MakeActivation(const nlohmann::json& config,
                                                      const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeAdd(const nlohmann::json& config,
                                               const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeAverage(const nlohmann::json& config,
                                                   const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeBatchNormalization(const nlohmann::json& config,
                                                              const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeConcatenate(const nlohmann::json& config,
                                                       const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeConv2D(const nlohmann::json& config,
                                                  const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeDense(const nlohmann::json& config,
                                                 const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeDropout(const nlohmann::json& config,
                                                   const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeIntegerLookup(const nlohmann::json& config,
                                                         const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeEmbedding(const nlohmann::json& config,
                                                     const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeGlobalAveragePooling1D(const nlohmann::json& config,
                                                                  const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeFlatten(const nlohmann::json& config,
                                                   const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeMultiply(const nlohmann::json& config,
                                                    const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeReLU(const nlohmann::json& config,
                                                const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeReshape(const nlohmann::json& config,
                                                   const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeSyncBatchNormalization(const nlohmann::json& config,
                                                                  const std::string& where);
absl::StatusOr<std::unique_ptr<Layer>> MakeZeroPadding2D(const nlohmann::json& config,
                                                         const std::string& where);

}  // namespace stratum::layers
