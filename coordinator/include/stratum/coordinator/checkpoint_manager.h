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
// Restore checks every file's checksum, and the manifest against the job's variables: a
// checkpoint that holds the same variables (names, full shapes) split another way (another
// number of ps tasks, another partitioner) is restored re-split, each PS reading its new
// shards' rows, with their optimizer slots and update counts, from the saved shards' files,
// as TensorFlow restores a ShardedVariable; one of another model is refused, naming the
// first variable that differs. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stratum/ps/sharded_variables.h"

namespace stratum {

// Checked before a job waits for its cluster: FAILED_PRECONDITION, as RestoreLatest says it,
// when the latest checkpoint of `dir` cannot resume a job of the model whose variables are
// `names` of `shapes` (however split): another kind of job wrote it, or it holds other
// variables. OK when `dir` has no checkpoint, or when its latest cannot be read
// (RestoreLatest then tries the ones before it).
absl::Status CheckLatestCheckpointHoldsModel(const std::string& dir,
                                             const std::vector<std::string>& names,
                                             const std::vector<Shape>& shapes);

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
  // Restores the checkpoint in `folder` (its manifest given) whose shard map differs from
  // the job's: FAILED_PRECONDITION naming the first variable that differs when the
  // variables do, else each PS builds its shards from the saved ones' rows.
  absl::Status RestoreResharded(const std::string& folder, const nlohmann::json& manifest);
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
