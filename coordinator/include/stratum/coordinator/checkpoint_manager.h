// Checkpoints of a parameter-server job, driven by the coordinator. A checkpoint is a
// folder ckpt-<step>/ holding one safetensors file per PS task (variables and optimizer
// slots, written by the PS itself) and manifest.json (step, files, checksums, variables,
// the shard map), written last and atomically. The file "checkpoint" in the checkpoint
// folder names the latest complete one, and is replaced atomically after the manifest, so
// a crash at any moment leaves the previous checkpoint whole and named. Older checkpoints
// beyond max_to_keep are deleted after the new one is complete.
//
// A save commits only when every PS's file holds all the shards placed on it: a PS that
// restarted since the variables were created on it (and that no push has met since) saves
// an empty store, and restoring that would quietly start its shards afresh.
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
  // and given back by restored_progress() after a restore. FAILED_PRECONDITION "a parameter
  // server is unavailable: <kPsLostItsVariables>: ..." when a PS lacks shards placed on it
  // (nothing is committed); a PS's own errors as they come. Each says that the checkpoint
  // was not saved and which one is still intact (CheckpointNotSaved).
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
  // FAILED_PRECONDITION (see Save) when PS `task`'s save lacks a shard placed on it.
  absl::Status CheckHoldsItsShards(int task, int64_t step, const proto::SaveResponse& saved) const;
  // Save, with the causes of a failed save as they come.
  absl::Status WriteAndCommit(int64_t step, const nlohmann::json& progress);

  std::string dir_;
  int max_to_keep_;
  ShardedVariables& variables_;
  nlohmann::json restored_progress_;
  std::vector<std::string> stopping_in_last_save_;
  std::vector<uint64_t> committed_save_ids_;
};

}  // namespace stratum
