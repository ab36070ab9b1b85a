#include "stratum/coordinator/checkpoint_manager.h"

#include <future>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/checkpoint_reader.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// A parameter-server job's checkpoints (stratum-train's have a format of their own).
constexpr char kFormat[] = "stratum-checkpoint-1";

nlohmann::json ShardMap(const std::vector<ShardSpec>& shards) {
  nlohmann::json map = nlohmann::json::array();
  for (const ShardSpec& shard : shards) {
    map.push_back({{"variable", shard.variable},
                   {"shard", shard.name},
                   {"ps_task", shard.ps_task},
                   {"first_row", shard.first_row},
                   {"shape", shard.shape.dims()}});
  }
  return map;
}

}  // namespace

absl::Status CheckpointManager::CheckHoldsItsShards(int task, int64_t step,
                                                    const proto::SaveResponse& saved) const {
  std::set<std::string> held;
  for (const proto::VariableStatus& variable : saved.variables()) held.insert(variable.name());
  for (const ShardSpec& shard : variables_.shards()) {
    if (shard.ps_task != task || held.contains(shard.name)) continue;
    PsClient& client = variables_.client(task);
    return absl::FailedPreconditionError(
        absl::StrCat("a parameter server is unavailable: ", kPsLostItsVariables, ": ",
                     client.task(), " at ", client.address(), " saved no \"", shard.name,
                     "\" for the checkpoint at step ", step, ", which is not committed"));
  }
  return absl::OkStatus();
}

CheckpointManager::CheckpointManager(std::string dir, int max_to_keep, ShardedVariables& variables)
    : dir_(std::move(dir)), max_to_keep_(std::max(1, max_to_keep)), variables_(variables) {}

absl::Status CheckpointManager::Save(int64_t step, const nlohmann::json& progress) {
  absl::Status saved = WriteAndCommit(step, progress);
  if (!saved.ok()) return CheckpointNotSaved(dir_, step, saved);
  return absl::OkStatus();
}

absl::Status CheckpointManager::WriteAndCommit(int64_t step, const nlohmann::json& progress) {
  stopping_in_last_save_.clear();
  STRATUM_ASSIGN_OR_RETURN(const std::string folder, CreateCheckpointFolder(dir_, step));
  std::vector<std::future<absl::StatusOr<proto::SaveResponse>>> saves;
  for (int task = 0; task < variables_.num_ps(); ++task) {
    saves.push_back(std::async(std::launch::async, [this, task, folder] {
      return variables_.client(task).Save(absl::StrCat(folder, "/ps-", task, ".safetensors"));
    }));
  }
  nlohmann::json files = nlohmann::json::array();
  std::vector<std::string> stopping;
  std::vector<uint64_t> save_ids;
  for (int task = 0; task < variables_.num_ps(); ++task) {
    absl::StatusOr<proto::SaveResponse> saved = saves[static_cast<size_t>(task)].get();
    if (!saved.ok()) return saved.status();
    STRATUM_RETURN_IF_ERROR(CheckHoldsItsShards(task, step, *saved));
    if (saved->stopping()) stopping.push_back(variables_.client(task).task());
    save_ids.push_back(saved->save_id());
    nlohmann::json held = nlohmann::json::array();
    for (const proto::VariableStatus& variable : saved->variables()) {
      held.push_back(
          {{"name", variable.name()},
           {"shape", std::vector<int64_t>(variable.dims().begin(), variable.dims().end())},
           {"dtype", "float32"},
           {"updates", variable.updates()}});
    }
    files.push_back({{"ps_task", task},
                     {"file", absl::StrCat("ps-", task, ".safetensors")},
                     {"crc32", saved->crc32()},
                     {"bytes", saved->bytes()},
                     {"variables", held}});
  }
  nlohmann::json manifest = {{"format", kFormat},
                             {"step", step},
                             {"files", files},
                             {"shards", ShardMap(variables_.shards())}};
  if (!progress.is_null()) manifest["progress"] = progress;
  // Only now does the checkpoint hold the PSs' files: a stopping PS waits for this.
  STRATUM_RETURN_IF_ERROR(CommitCheckpoint(dir_, step, manifest, max_to_keep_));
  stopping_in_last_save_ = std::move(stopping);
  committed_save_ids_ = std::move(save_ids);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> CheckpointManager::Latest() const {
  return LatestCheckpointFolder(dir_);
}

absl::StatusOr<std::optional<int64_t>> CheckpointManager::RestoreLatest() {
  int64_t step = 0;
  nlohmann::json progress;
  absl::StatusOr<std::optional<std::string>> restored =
      RestoreNewestIntact(dir_, [&](const std::string& folder) -> absl::Status {
        STRATUM_ASSIGN_OR_RETURN(nlohmann::json manifest, ReadCheckpointManifest(folder));
        if (manifest.value("format", "") != kFormat) {
          return absl::FailedPreconditionError(absl::StrCat(
              "checkpoint ", folder, " is not a parameter-server job's checkpoint (format \"",
              manifest.value("format", ""),
              "\"; another kind of job wrote it): point checkpoint.dir at a folder of its own"));
        }
        if (manifest["shards"] != ShardMap(variables_.shards())) {
          return absl::FailedPreconditionError(absl::StrCat(
              "checkpoint ", folder,
              " was written for another model or variable placement (its "
              "shard map differs from this job's): use the same model, partitioner, placement "
              "and number of ps tasks, or another checkpoint.dir"));
        }
        const nlohmann::json& files = manifest["files"];
        if (!files.is_array() || static_cast<int>(files.size()) != variables_.num_ps()) {
          return absl::FailedPreconditionError(
              absl::StrCat("checkpoint ", folder, " has files for ", files.size(),
                           " ps tasks, but the job has ", variables_.num_ps()));
        }
        std::vector<std::future<absl::Status>> restores;
        for (const nlohmann::json& file : files) {
          const int task = file.value("ps_task", -1);
          const std::string path = absl::StrCat(folder, "/", file.value("file", ""));
          const uint32_t crc = file.value("crc32", 0u);
          if (task < 0 || task >= variables_.num_ps()) {
            return absl::DataLossError(
                absl::StrCat("checkpoint ", folder, " names ps task ", task));
          }
          restores.push_back(std::async(std::launch::async, [this, task, path, crc] {
            return variables_.client(task).Restore(path, crc);
          }));
        }
        absl::Status all = absl::OkStatus();
        for (auto& restore : restores) all.Update(restore.get());
        step = manifest.value("step", int64_t{0});
        progress = manifest.value("progress", nlohmann::json());
        return all;
      });
  if (!restored.ok()) return restored.status();
  restored_progress_ = nullptr;
  if (!restored->has_value()) return std::optional<int64_t>();
  restored_progress_ = std::move(progress);
  return std::optional<int64_t>(step);
}

}  // namespace stratum
