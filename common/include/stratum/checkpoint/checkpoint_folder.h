// The layout every Stratum checkpoint shares, whoever writes it (the PS job's coordinator,
// a MultiWorkerMirrored chief, stratum-train): folder <dir>/ckpt-<step>/ holding the data
// files and manifest.json, written last and atomically; the file <dir>/checkpoint names
// the latest complete folder and is replaced atomically after the manifest, so a crash at
// any moment leaves the previous checkpoint whole and named; folders beyond max_to_keep
// are deleted only after the new one is complete. Not thread-safe per folder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace stratum {

// "<dir>/ckpt-000000000042" for step 42.
std::string CheckpointFolder(const std::string& dir, int64_t step);

// Creates the folder of `step` (FAILED_PRECONDITION naming it when it cannot).
absl::StatusOr<std::string> CreateCheckpointFolder(const std::string& dir, int64_t step);

// Completes the checkpoint of `step` whose files are in place: writes its manifest, points
// "checkpoint" at it, and prunes the oldest folders beyond `max_to_keep`.
absl::Status CommitCheckpoint(const std::string& dir, int64_t step, const nlohmann::json& manifest,
                              int max_to_keep);

// The latest complete checkpoint's folder, or nullopt when `dir` has none yet. DATA_LOSS
// when the pointer file is corrupt.
absl::StatusOr<std::optional<std::string>> LatestCheckpointFolder(const std::string& dir);

}  // namespace stratum
