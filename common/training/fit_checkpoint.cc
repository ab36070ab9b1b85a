#include "stratum/training/fit_checkpoint.h"

#include <cmath>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/checkpoint_reader.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/util/json_text.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

constexpr const char* kFormat = kFitCheckpointFormat;
constexpr char kFile[] = "state.safetensors";

std::string SlotName(const VariableSpec& variable, const std::string& slot) {
  return absl::StrCat(variable.name, "/slot_", slot);
}

// How the optimizer settings that keep `slot` read: with them, and without.
std::pair<std::string, std::string> SlotSetting(const std::string& slot) {
  if (slot == "momentum") return {"has momentum", "without momentum"};
  if (slot == "average_gradient") return {"is centered", "with centered false"};
  return {absl::StrCat("keeps ", slot, " slots"), absl::StrCat("without ", slot, " slots")};
}

// The variable is there but not the slot: the same model, other optimizer settings (SGD
// momentum 0 writes no momentum slots), not another model.
absl::Status MissingSlot(const std::string& dir, const std::string& folder,
                         const Optimizer& optimizer, const VariableSpec& variable,
                         const std::string& slot) {
  const auto [with, without] = SlotSetting(slot);
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", folder, " has no ", slot, " slots (no ", SlotName(variable, slot),
      "): it was written by ", optimizer.name(), " ", without, ", and the job's ", optimizer.name(),
      " ", with, "; use the same optimizer settings as the run that wrote it, or remove ", dir,
      " to train from scratch"));
}

// Why `state`, as a manifest gives it, is a place in training no run can be at (a field
// out of range, or at odds with another), as "<field> <value>, <why>"; empty when it can be.
// Such a manifest was damaged, or edited and sealed again: it is no more to be resumed from
// than one whose checksum does not match.
std::string ImpossiblePlace(const FitState& state) {
  if (state.epoch < 0) {
    return absl::StrCat("epoch ", state.epoch,
                        ", but a count of completed epochs is never negative");
  }
  if (state.step_in_epoch < 0) {
    return absl::StrCat("step_in_epoch ", state.step_in_epoch,
                        ", but a count of steps is never negative");
  }
  if (state.step_in_epoch > state.iteration) {
    return absl::StrCat("step_in_epoch ", state.step_in_epoch, ", more than its step ",
                        state.iteration, " (the steps of the whole run)");
  }
  const int64_t before = state.iteration - state.step_in_epoch;
  if (state.epoch > before) {
    return absl::StrCat("epoch ", state.epoch, ", more epochs than the ", before,
                        " steps before its epoch (an epoch has one step at least)");
  }
  if (!state.history.is_array()) return absl::StrCat("history ", state.history.dump());
  if (static_cast<int64_t>(state.history.size()) != state.epoch) {
    return absl::StrCat("epoch ", state.epoch, ", but its history lists ", state.history.size(),
                        " completed epoch(s)");
  }
  if (state.global_batch < 0) return absl::StrCat("global_batch ", state.global_batch);
  if (state.num_workers < 0) return absl::StrCat("num_workers ", state.num_workers);
  const StepStats& stats = state.epoch_stats;
  if (stats.examples < 0 || stats.correct < 0) {
    return absl::StrCat("epoch_stats with ", stats.correct, " correct of ", stats.examples,
                        " examples");
  }
  // A save whose loss so far is not finite is refused (training diverged).
  if (!std::isfinite(stats.loss_sum)) {
    return absl::StrCat("epoch_stats with loss_sum ", stats.loss_sum,
                        ", which training never saves");
  }
  return "";
}

}  // namespace

absl::Status SaveFitCheckpoint(const std::string& dir, int max_to_keep, const Model& model,
                               const Optimizer& optimizer, const FitState& state) {
  const std::vector<VariableSpec>& specs = model.variables();
  const std::vector<std::string> slot_names = optimizer.SlotNames();
  TensorFile file;
  for (size_t i = 0; i < specs.size(); ++i) {
    file.tensors.emplace_back(specs[i].name, state.variables[i]);
    if (specs[i].trainable && i < state.slots.size() &&
        state.slots[i].size() == slot_names.size()) {
      for (size_t s = 0; s < slot_names.size(); ++s) {
        file.tensors.emplace_back(SlotName(specs[i], slot_names[s]), state.slots[i][s]);
      }
    }
  }
  file.metadata = {{"format", kFormat}};
  absl::StatusOr<std::string> folder = CreateCheckpointFolder(dir, state.iteration);
  if (!folder.ok()) return CheckpointNotSaved(dir, state.iteration, folder.status());
  absl::StatusOr<WrittenFile> written = WriteSafetensors(absl::StrCat(*folder, "/", kFile), file);
  if (!written.ok()) return CheckpointNotSaved(dir, state.iteration, written.status());
  nlohmann::json manifest = {
      {"format", kFormat},
      {"step", state.iteration},
      {"epoch", state.epoch},
      {"step_in_epoch", state.step_in_epoch},
      {"epoch_stats",
       {{"loss_sum", state.epoch_stats.loss_sum},
        {"correct", state.epoch_stats.correct},
        {"examples", state.epoch_stats.examples}}},
      {"history", state.history},
      {"global_batch", state.global_batch},
      {"num_workers", state.num_workers},
      {"optimizer", optimizer.name()},
      {"files", {{{"file", kFile}, {"crc32", written->crc32}, {"bytes", written->bytes}}}}};
  if (state.shuffle_buffer) manifest["shuffle_buffer"] = *state.shuffle_buffer;
  if (state.seed) manifest["seed"] = *state.seed;
  absl::Status committed = CommitCheckpoint(dir, state.iteration, manifest, max_to_keep);
  if (!committed.ok()) return CheckpointNotSaved(dir, state.iteration, committed);
  return absl::OkStatus();
}

namespace {

// Fit never saves a value that is not finite (training stopped as diverged first): a
// checkpoint that holds one is damaged, and resumed from it would train on NaN.
absl::Status CheckFinite(const std::string& folder, const std::string& name, const Tensor& value) {
  if (AllFinite(value)) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("checkpoint ", folder, " holds NaN or infinity in ", name,
                                          ", which training never saves: it is damaged"));
}

absl::StatusOr<FitState> LoadFitCheckpoint(const std::string& dir, const std::string& folder,
                                           const Model& model, const Optimizer& optimizer) {
  STRATUM_ASSIGN_OR_RETURN(nlohmann::json manifest, ReadCheckpointManifest(folder));
  if (manifest.value("format", "") != kFormat) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", folder, " is not a training checkpoint of this kind (format \"",
        manifest.value("format", ""), "\"): point checkpoint.dir at a folder of its own"));
  }
  if (manifest.value("optimizer", "") != optimizer.name()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", folder, " was written with optimizer ",
                     manifest.value("optimizer", ""), " but the job uses ", optimizer.name(),
                     ": use the same optimizer or another checkpoint.dir"));
  }
  const nlohmann::json& files = manifest["files"];
  if (!files.is_array() || files.size() != 1) {
    return absl::DataLossError(absl::StrCat(folder, "/manifest.json lists no state file"));
  }
  STRATUM_ASSIGN_OR_RETURN(TensorFile file,
                           ReadSafetensors(absl::StrCat(folder, "/", files[0].value("file", "")),
                                           files[0].value("crc32", 0u)));
  std::map<std::string, Tensor> tensors;
  for (auto& [name, tensor] : file.tensors) tensors[name] = std::move(tensor);

  FitState state;
  state.epoch = manifest.value("epoch", int64_t{0});
  state.step_in_epoch = manifest.value("step_in_epoch", int64_t{0});
  state.iteration = manifest.value("step", int64_t{0});
  const nlohmann::json stats = manifest.value("epoch_stats", nlohmann::json::object());
  state.epoch_stats.loss_sum = JsonNumberOr(stats, "loss_sum", 0);
  state.epoch_stats.correct = stats.value("correct", int64_t{0});
  state.epoch_stats.examples = stats.value("examples", int64_t{0});
  state.history = manifest.value("history", nlohmann::json::array());
  state.global_batch = manifest.value("global_batch", int64_t{0});
  state.num_workers = manifest.value("num_workers", int64_t{0});
  if (manifest.contains("shuffle_buffer") && manifest["shuffle_buffer"].is_number_integer()) {
    state.shuffle_buffer = manifest["shuffle_buffer"].get<int64_t>();
  }
  if (manifest.contains("seed") && manifest["seed"].is_number_unsigned()) {
    state.seed = manifest["seed"].get<uint64_t>();
  }
  if (const std::string why = ImpossiblePlace(state); !why.empty()) {
    return absl::DataLossError(
        absl::StrCat(folder, "/manifest.json gives ", why, ": it is corrupt or was edited"));
  }
  const std::vector<std::string> slot_names = optimizer.SlotNames();
  for (const VariableSpec& spec : model.variables()) {
    auto take = [&](const std::string& name) -> absl::StatusOr<Tensor> {
      auto found = tensors.find(name);
      if (found == tensors.end() || found->second.shape() != spec.shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", folder, " has no ", name, " of shape ", spec.shape.ToString(),
            ": it was written for another model; use the same model or another checkpoint.dir"));
      }
      Tensor taken = std::move(found->second);
      tensors.erase(found);
      return taken;
    };
    STRATUM_ASSIGN_OR_RETURN(Tensor value, take(spec.name));
    STRATUM_RETURN_IF_ERROR(CheckFinite(folder, spec.name, value));
    state.variables.push_back(std::move(value));
    std::vector<Tensor> slots;
    // A non-trainable variable has no optimizer, so no slots.
    for (const std::string& slot : spec.trainable ? slot_names : std::vector<std::string>()) {
      if (tensors.count(SlotName(spec, slot)) == 0) {
        return MissingSlot(dir, folder, optimizer, spec, slot);
      }
      STRATUM_ASSIGN_OR_RETURN(Tensor value, take(SlotName(spec, slot)));
      STRATUM_RETURN_IF_ERROR(CheckFinite(folder, SlotName(spec, slot), value));
      slots.push_back(std::move(value));
    }
    state.slots.push_back(std::move(slots));
  }
  // What the job did not take: variables of layers its model lacks mean another model;
  // slots its optimizer settings do not keep (SGD resumed without momentum) are dropped, as
  // TensorFlow's restore drops unresolved objects, with a warning.
  std::vector<std::string> variables, slots;
  for (const auto& [name, tensor] : tensors) {
    (name.find("/slot_") == std::string::npos ? variables : slots).push_back(name);
  }
  if (!variables.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", folder, " holds ", absl::StrJoin(variables, ", "),
        ", which the job's model does not have: it was written for another model; use the same "
        "model or another checkpoint.dir"));
  }
  if (!slots.empty()) {
    spdlog::warn(
        "checkpoint {} holds optimizer slots that the job's {} does not keep ({}): they are "
        "dropped, and training goes on without them",
        folder, optimizer.name(), absl::StrJoin(slots, ", "));
  }
  return state;
}

}  // namespace

absl::StatusOr<std::optional<FitState>> LoadLatestFitCheckpoint(const std::string& dir,
                                                                const Model& model,
                                                                const Optimizer& optimizer) {
  std::optional<FitState> state;
  STRATUM_ASSIGN_OR_RETURN(
      std::optional<std::string> folder,
      RestoreNewestIntact(dir, [&](const std::string& candidate) -> absl::Status {
        STRATUM_ASSIGN_OR_RETURN(FitState loaded,
                                 LoadFitCheckpoint(dir, candidate, model, optimizer));
        state = std::move(loaded);
        return absl::OkStatus();
      }));
  if (!folder.has_value()) return std::optional<FitState>();
  return state;
}

}  // namespace stratum
