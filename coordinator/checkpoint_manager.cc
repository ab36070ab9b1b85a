#include "stratum/coordinator/checkpoint_manager.h"

#include <algorithm>
#include <future>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/checkpoint_reader.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/util/error_kind.h"
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

// Once every call in `running` has ended: the first error, or OK.
absl::Status AllEnded(std::vector<std::future<absl::Status>>& running) {
  absl::Status all = absl::OkStatus();
  for (std::future<absl::Status>& call : running) all.Update(call.get());
  return all;
}

// The shards of a manifest's shard map (name, variable, ps_task, first_row, shape).
absl::StatusOr<std::vector<ShardSpec>> ShardsOfMap(const std::string& folder,
                                                   const nlohmann::json& map) {
  std::vector<ShardSpec> shards;
  for (const nlohmann::json& entry : map.is_array() ? map : nlohmann::json::array()) {
    if (!entry.is_object() || !entry.value("shape", nlohmann::json()).is_array() ||
        !entry.value("variable", nlohmann::json()).is_string() ||
        !entry.value("shard", nlohmann::json()).is_string()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", folder, " has a shard map entry that is not a shard: ", entry.dump(),
          ": the checkpoint is damaged"));
    }
    ShardSpec shard;
    shard.name = entry["shard"].get<std::string>();
    shard.variable = entry["variable"].get<std::string>();
    shard.ps_task = entry.value("ps_task", -1);
    shard.first_row = entry.value("first_row", int64_t{0});
    shard.shape = Shape(entry["shape"].get<std::vector<int64_t>>());
    shards.push_back(std::move(shard));
  }
  return shards;
}

// Each variable's full shape, from its shards, in the order of their first shard.
std::vector<std::pair<std::string, Shape>> VariablesOf(const std::vector<ShardSpec>& shards) {
  std::vector<std::pair<std::string, Shape>> variables;
  std::map<std::string, size_t> index;
  for (const ShardSpec& shard : shards) {
    auto [at, added] = index.emplace(shard.variable, variables.size());
    if (added) variables.emplace_back(shard.variable, shard.shape);
    Shape& shape = variables[at->second].second;
    if (shape.rank() > 0 && shard.shape.rank() > 0) {
      shape = shape.WithFirstDim(std::max(shape.dim(0), shard.first_row + shard.shape.dim(0)));
    }
  }
  return variables;
}

// OK when the checkpoint holds the job's variables (names, full shapes), however split;
// else FAILED_PRECONDITION naming the first variable that differs and how.
absl::Status CheckSameVariables(const std::string& folder, const std::vector<ShardSpec>& saved,
                                const std::vector<ShardSpec>& job) {
  constexpr char kFix[] =
      ": use the model the checkpoint was trained with, or another checkpoint.dir to train "
      "this model from scratch";
  const std::vector<std::pair<std::string, Shape>> saved_variables = VariablesOf(saved);
  const std::map<std::string, Shape> saved_shapes(saved_variables.begin(), saved_variables.end());
  const std::vector<std::pair<std::string, Shape>> job_variables = VariablesOf(job);
  for (const auto& [name, shape] : job_variables) {
    auto it = saved_shapes.find(name);
    if (it == saved_shapes.end()) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", folder,
                                                        " holds no variable \"", name,
                                                        "\", which this job's model has", kFix));
    }
    if (!(it->second == shape)) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", folder, " holds \"", name, "\" as ", it->second.ToString(),
                       ", but this job's model has ", shape.ToString(), kFix));
    }
  }
  const std::map<std::string, Shape> job_shapes(job_variables.begin(), job_variables.end());
  for (const auto& [name, shape] : saved_variables) {
    if (job_shapes.contains(name)) continue;
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", folder, " holds \"", name, "\" as ", shape.ToString(),
                     ", which this job's model does not have", kFix));
  }
  return absl::OkStatus();
}

// FAILED_PRECONDITION when the checkpoint in `folder` (its manifest given) is not a PS job's,
// or holds other variables than `shards` (names, full shapes; their split may differ).
absl::Status CheckHoldsTheModel(const std::string& folder, const nlohmann::json& manifest,
                                const std::vector<ShardSpec>& shards) {
  if (manifest.value("format", "") != kFormat) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", folder, " is not a parameter-server job's checkpoint (format \"",
        manifest.value("format", ""),
        "\"; another kind of job wrote it): point checkpoint.dir at a folder of its own"));
  }
  if (manifest["shards"] == ShardMap(shards)) return absl::OkStatus();
  STRATUM_ASSIGN_OR_RETURN(const std::vector<ShardSpec> saved,
                           ShardsOfMap(folder, manifest["shards"]));
  return CheckSameVariables(folder, saved, shards);
}

// Per PS task of the job, the saved rows that make up its shards: each job shard takes the
// rows it overlaps from every saved shard of its variable. `file_of_task` maps a saved
// shard's ps_task to its file's index.
absl::StatusOr<std::vector<std::vector<SavedRows>>> PlanReshard(
    const std::string& folder, const std::vector<ShardSpec>& saved,
    const std::vector<ShardSpec>& job, const std::map<int, size_t>& file_of_task, int num_ps) {
  std::vector<std::vector<SavedRows>> rows(static_cast<size_t>(num_ps));
  for (const ShardSpec& shard : job) {
    const int64_t begin = shard.first_row;
    const int64_t end = begin + (shard.shape.rank() == 0 ? 1 : shard.shape.dim(0));
    int64_t covered = 0;
    for (const ShardSpec& from : saved) {
      if (from.variable != shard.variable) continue;
      const int64_t from_end = from.first_row + (from.shape.rank() == 0 ? 1 : from.shape.dim(0));
      const int64_t first = std::max(begin, from.first_row), last = std::min(end, from_end);
      if (first >= last) continue;
      auto file = file_of_task.find(from.ps_task);
      if (file == file_of_task.end()) {
        return absl::DataLossError(absl::StrCat("checkpoint ", folder, " has no file of ps task ",
                                                from.ps_task, ", which held \"", from.name,
                                                "\": the checkpoint is damaged"));
      }
      rows[static_cast<size_t>(shard.ps_task)].push_back({file->second, from.name,
                                                          first - from.first_row, last - first,
                                                          shard.name, first - begin});
      covered += last - first;
    }
    if (covered != end - begin) {
      return absl::DataLossError(absl::StrCat("checkpoint ", folder, "'s shards of \"",
                                              shard.variable, "\" do not hold rows [", begin, ", ",
                                              end, ") once each: the checkpoint is damaged"));
    }
  }
  return rows;
}

}  // namespace

absl::Status CheckLatestCheckpointHoldsModel(const std::string& dir,
                                             const std::vector<std::string>& names,
                                             const std::vector<Shape>& shapes) {
  absl::StatusOr<std::optional<std::string>> latest = LatestCheckpointFolder(dir);
  if (!latest.ok() || !latest->has_value()) return absl::OkStatus();
  absl::StatusOr<nlohmann::json> manifest = ReadCheckpointManifest(**latest);
  if (!manifest.ok()) return absl::OkStatus();
  // The variables whole: how they are split does not matter here.
  std::vector<ShardSpec> whole;
  for (size_t v = 0; v < names.size(); ++v) {
    whole.push_back({.name = names[v], .variable = names[v], .shape = shapes[v]});
  }
  return CheckHoldsTheModel(**latest, *manifest, whole);
}

absl::Status CheckpointManager::CheckHoldsItsShards(int task, int64_t step,
                                                    const proto::SaveResponse& saved) const {
  std::set<std::string> held;
  for (const proto::VariableStatus& variable : saved.variables()) held.insert(variable.name());
  for (const ShardSpec& shard : variables_.shards()) {
    if (shard.ps_task != task || held.contains(shard.name)) continue;
    PsClient& client = variables_.client(task);
    return WithErrorKind(absl::FailedPreconditionError(absl::StrCat(
                             "a parameter server is unavailable: ", kPsLostItsVariables, ": ",
                             client.task(), " at ", client.address(), " saved no \"", shard.name,
                             "\" for the checkpoint at step ", step, ", which is not committed")),
                         ErrorKind::kPsLostItsVariables);
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

absl::Status CheckpointManager::RestoreResharded(const std::string& folder,
                                                 const nlohmann::json& manifest) {
  STRATUM_ASSIGN_OR_RETURN(const std::vector<ShardSpec> saved,
                           ShardsOfMap(folder, manifest["shards"]));
  std::vector<CheckpointFileRef> files;
  std::map<int, size_t> file_of_task;
  const nlohmann::json& listed = manifest["files"];
  for (const nlohmann::json& file : listed.is_array() ? listed : nlohmann::json::array()) {
    file_of_task[file.value("ps_task", -1)] = files.size();
    files.push_back({absl::StrCat(folder, "/", file.value("file", "")), file.value("crc32", 0u)});
  }
  STRATUM_ASSIGN_OR_RETURN(
      const std::vector<std::vector<SavedRows>> rows,
      PlanReshard(folder, saved, variables_.shards(), file_of_task, variables_.num_ps()));
  spdlog::info(
      "checkpoint {} was written with {} shards over {} ps tasks; restoring its variables "
      "re-split into this job's {} shards over {} ps tasks",
      folder, saved.size(), files.size(), variables_.shards().size(), variables_.num_ps());
  std::vector<std::future<absl::Status>> restores;
  for (int task = 0; task < variables_.num_ps(); ++task) {
    if (rows[static_cast<size_t>(task)].empty()) continue;
    restores.push_back(std::async(std::launch::async, [this, task, &files, &rows] {
      return variables_.client(task).Restore(files, rows[static_cast<size_t>(task)]);
    }));
  }
  return AllEnded(restores);
}

absl::StatusOr<std::optional<int64_t>> CheckpointManager::RestoreLatest() {
  int64_t step = 0;
  nlohmann::json progress;
  absl::StatusOr<std::optional<std::string>> restored =
      RestoreNewestIntact(dir_, [&](const std::string& folder) -> absl::Status {
        STRATUM_ASSIGN_OR_RETURN(nlohmann::json manifest, ReadCheckpointManifest(folder));
        STRATUM_RETURN_IF_ERROR(CheckHoldsTheModel(folder, manifest, variables_.shards()));
        step = manifest.value("step", int64_t{0});
        progress = manifest.value("progress", nlohmann::json());
        if (manifest["shards"] != ShardMap(variables_.shards())) {
          return RestoreResharded(folder, manifest);
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
        return AllEnded(restores);
      });
  if (!restored.ok()) return restored.status();
  restored_progress_ = nullptr;
  if (!restored->has_value()) return std::optional<int64_t>();
  restored_progress_ = std::move(progress);
  return std::optional<int64_t>(step);
}

}  // namespace stratum
