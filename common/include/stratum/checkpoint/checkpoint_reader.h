// Reading a parameter-server job's checkpoints outside the parameter servers (the
// evaluator side-car): the latest complete checkpoint of a folder, and its variables put
// back together from their shards, with every file's checksum checked.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stratum/tensor/tensor.h"

namespace stratum {

// The manifest format of Fit's checkpoints (stratum-train, MultiWorkerMirrored): one
// state.safetensors holding the variables by name and their optimizer slots ("<name>/slot_*").
inline constexpr char kFitCheckpointFormat[] = "stratum-fit-checkpoint-1";

struct CheckpointVariables {
  int64_t step = 0;
  std::string folder;
  std::map<std::string, Tensor> variables;  // whole variables by model name
};

// Reads a small JSON file that must hold an object (a manifest, the latest pointer).
// NOT_FOUND when missing, DATA_LOSS when it is not a JSON object.
absl::StatusOr<nlohmann::json> ReadJsonObjectFile(const std::string& path);

// The step of the latest complete checkpoint in `dir`, or nullopt when there is none yet.
absl::StatusOr<std::optional<int64_t>> LatestCheckpointStep(const std::string& dir);

// Reads the latest complete checkpoint of `dir` (manifest, files, checksums): a PS job's,
// whose shards it joins into whole variables, or Fit's. NOT_FOUND when there is none.
absl::StatusOr<CheckpointVariables> ReadLatestCheckpoint(const std::string& dir);

}  // namespace stratum
