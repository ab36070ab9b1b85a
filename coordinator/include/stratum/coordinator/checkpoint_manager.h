// Checkpoints of a parameter-server job, driven by the coordinator. A checkpoint is a
// folder ckpt-<step>/ holding one safetensors file per PS task (variables and optimizer
// slots, written by the PS itself) and manifest.json (step, files, checksums, variables,
// the shard map), written last and atomically. The file "checkpoint" in the checkpoint
// folder names the latest complete one, and is replaced atomically after the manifest, so
// a crash at any moment leaves the previous checkpoint whole and named. Older checkpoints
// beyond max_to_keep are deleted after the new one is complete.
//
// Restore checks the manifest against the job's current variable placement and every
// file's checksum, and says what does not match. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stratum/ps/sharded_variables.h"

namespace stratum {

class CheckpointManager {
 public:
  CheckpointManager(std::string dir, int max_to_keep, ShardedVariables& variables);

  // `progress` (the coordinator's record of the epochs, any JSON) is kept in the manifest
  // and given back by restored_progress() after a restore.
  absl::Status Save(int64_t step, const nlohmann::json& progress = nullptr);
  // The PS tasks ("ps:1") that were stopping (they got a signal) when the last Save wrote
  // their files: they go now, their state saved.
  const std::vector<std::string>& stopping_in_last_save() const { return stopping_in_last_save_; }
  // Per PS task, its save (SaveResponse.save_id) in the checkpoint the last Save committed;
  // empty until one is. A stopping PS goes once told (PsWatcher::Committed).
  const std::vector<uint64_t>& committed_save_ids() const { return committed_save_ids_; }
  // Restores the latest checkpoint; its step, or nullopt when there is none.
  absl::StatusOr<std::optional<int64_t>> RestoreLatest();
  // The progress saved with the checkpoint RestoreLatest restored; null when none.
  const nlohmann::json& restored_progress() const { return restored_progress_; }
  // The latest complete checkpoint's folder, if any.
  absl::StatusOr<std::optional<std::string>> Latest() const;

 private:
  std::string dir_;
  int max_to_keep_;
  ShardedVariables& variables_;
  nlohmann::json restored_progress_;
  std::vector<std::string> stopping_in_last_save_;
  std::vector<uint64_t> committed_save_ids_;
};

}  // namespace stratum
