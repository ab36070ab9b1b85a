#include "stratum/training/fit_state.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/training/evaluate.h"
#include "stratum/util/process_info.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// When the checkpoint of the end of the epoch that `state` is in the middle of is there:
// "; or, to resume from the end of epoch N<for_whom>, delete the checkpoint folders newer
// than <it>" (an epoch's end is a place in the data any run can resume from); else empty.
std::string OrResumeFromTheEpochsEnd(const FitOptions& options, const FitState& state,
                                     const std::string& for_whom) {
  const int64_t epoch_end = state.iteration - state.step_in_epoch;
  const std::string epoch_end_folder = CheckpointFolder(options.checkpoint_dir, epoch_end);
  if (epoch_end <= 0 || !ReadCheckpointManifest(epoch_end_folder).ok()) return "";
  return absl::StrCat("; or, to resume from the end of epoch ", state.epoch, for_whom,
                      ", delete the checkpoint folders newer than ", epoch_end_folder);
}

// fit.shuffle_buffer as MakeBatches uses it: 0 and 1 both leave the data in file order.
int64_t ShuffledBy(const FitOptions& options) {
  return options.shuffle_buffer > 1 ? options.shuffle_buffer : 0;
}

std::string DataOrder(int64_t shuffle_buffer, uint64_t seed) {
  if (shuffle_buffer <= 1) return "no shuffle (fit.shuffle_buffer 0)";
  return absl::StrCat("fit.shuffle_buffer ", shuffle_buffer, " and fit.seed ", seed);
}

// A restored `state` this run can resume from where it stands (see StartFitState).
absl::Status CheckResumable(const Strategy& strategy, const FitOptions& options,
                            const FitState& state, int64_t steps_per_epoch) {
  // Mid-epoch, the position in the data is a step count of the old batch over the old
  // shards: with another global batch, or the data sharded over another number of
  // workers, it would skip or repeat data.
  const int64_t global_batch = GlobalBatch(strategy, options);
  const bool other_batch = state.global_batch > 0 && state.global_batch != global_batch;
  const bool other_shards = state.num_workers > 0 && state.num_workers != strategy.num_workers();
  if (state.step_in_epoch > 0 && (other_batch || other_shards)) {
    const std::string or_epoch_end =
        OrResumeFromTheEpochsEnd(options, state, " with this run's workers");
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint at step ", state.iteration, " in ", options.checkpoint_dir,
        " stopped in the middle of epoch ", state.epoch + 1, " with a global batch of ",
        state.global_batch,
        state.num_workers > 0 ? absl::StrCat(" over ", state.num_workers, " worker(s)") : "",
        ", and this run has a global batch of ", global_batch, " over ", strategy.num_workers(),
        " worker(s) (", strategy.num_workers(), " x ", strategy.NumLocalReplicas(),
        " replica(s) x ", options.batch_size_per_replica,
        "): its place in the data would not be the same; resume with its global batch of ",
        state.global_batch,
        state.num_workers > 0 ? absl::StrCat(" over ", state.num_workers, " worker(s)") : "",
        " again (the workers, devices and fit.batch_size_per_replica it was written with), "
        "or remove ",
        options.checkpoint_dir, " to train from scratch", or_epoch_end));
  }
  // Mid-epoch, the steps done are the first of the epoch's order: another shuffle would
  // make them other examples.
  if (state.step_in_epoch > 0 && state.shuffle_buffer.has_value() && state.seed.has_value() &&
      (*state.shuffle_buffer != ShuffledBy(options) ||
       (ShuffledBy(options) > 1 && *state.seed != options.seed))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint at step ", state.iteration, " in ", options.checkpoint_dir,
        " stopped in the middle of epoch ", state.epoch + 1, " of data shuffled with ",
        DataOrder(*state.shuffle_buffer, *state.seed), ", and this run shuffles with ",
        DataOrder(ShuffledBy(options), options.seed),
        ": the rest of the epoch would repeat some examples and skip others; resume with the "
        "earlier fit.shuffle_buffer and fit.seed, or remove ",
        options.checkpoint_dir, " to train from scratch",
        OrResumeFromTheEpochsEnd(options, state, "")));
  }
  // A checkpoint in the middle of an epoch has done fewer of its steps than an epoch has:
  // resumed from one at or past this run's epoch length, the rest of its epoch would be
  // skipped without a word.
  if (state.step_in_epoch >= steps_per_epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", CheckpointFolder(options.checkpoint_dir, state.iteration),
        " gives step_in_epoch ", state.step_in_epoch, ", but an epoch of this run has only ",
        steps_per_epoch,
        " steps: it was written by a run with other data or another fit.steps_per_epoch, or its "
        "manifest was edited; resume with the job's earlier data and steps_per_epoch, or "
        "remove ",
        options.checkpoint_dir, " to train from scratch",
        OrResumeFromTheEpochsEnd(options, state, "")));
  }
  return absl::OkStatus();
}

// The chief's `state`, on every worker.
absl::StatusOr<FitState> ShareTheChiefsState(Strategy& strategy, const Optimizer& optimizer,
                                             FitState state) {
  // Header: found, epoch, step_in_epoch, iteration, correct, examples, history bytes.
  const std::string history = state.history.dump();
  Tensor header(DType::kInt64, Shape({7}));
  int64_t* h = header.data<int64_t>();
  const int64_t fields[7] = {state.iteration > 0,
                             state.epoch,
                             state.step_in_epoch,
                             state.iteration,
                             state.epoch_stats.correct,
                             state.epoch_stats.examples,
                             static_cast<int64_t>(history.size())};
  std::copy(fields, fields + 7, h);
  Tensor loss_sum(DType::kFloat32, Shape({1}));
  loss_sum.data<float>()[0] = static_cast<float>(state.epoch_stats.loss_sum);
  std::vector<Tensor> small = {std::move(header), std::move(loss_sum)};
  STRATUM_RETURN_IF_ERROR(strategy.BroadcastFromChief(small));
  h = small[0].data<int64_t>();
  const bool found = h[0] != 0;
  Tensor history_bytes(DType::kUInt8, Shape({h[6]}));
  if (strategy.is_chief()) std::copy(history.begin(), history.end(), history_bytes.data<uint8_t>());
  std::vector<Tensor> payload = {std::move(history_bytes)};
  for (Tensor& variable : state.variables) payload.push_back(std::move(variable));
  if (found) {
    if (state.slots.empty()) {
      for (const Tensor& variable : payload) {
        if (&variable != &payload[0]) state.slots.push_back(optimizer.NewSlots(variable));
      }
    }
    for (std::vector<Tensor>& slots : state.slots) {
      for (Tensor& slot : slots) payload.push_back(std::move(slot));
    }
  }
  STRATUM_RETURN_IF_ERROR(strategy.BroadcastFromChief(payload));
  FitState agreed;
  agreed.epoch = h[1];
  agreed.step_in_epoch = h[2];
  agreed.iteration = h[3];
  agreed.epoch_stats = {static_cast<double>(small[1].data<float>()[0]), h[4], h[5]};
  const uint8_t* text = payload[0].data<uint8_t>();
  agreed.history = nlohmann::json::parse(text, text + h[6], nullptr, false);
  if (!agreed.history.is_array()) agreed.history = nlohmann::json::array();
  // The saved figures are the sum over every worker: counted once, by the chief.
  if (!strategy.is_chief()) agreed.epoch_stats = StepStats{};
  size_t next = 1;
  for (size_t i = 0; i < state.variables.size(); ++i) {
    agreed.variables.push_back(std::move(payload[next++]));
  }
  if (found) {
    for (size_t i = 0; i < state.slots.size(); ++i) {
      std::vector<Tensor> slots;
      for (size_t k = 0; k < state.slots[i].size(); ++k)
        slots.push_back(std::move(payload[next++]));
      agreed.slots.push_back(std::move(slots));
    }
  }
  return agreed;
}

constexpr char kBackupPrefix[] = "stratum-backup-worker-";

}  // namespace

absl::StatusOr<FitState> StartFitState(Strategy& strategy, const Model& model,
                                       const Optimizer& optimizer, const FitOptions& options,
                                       int64_t steps_per_epoch) {
  FitState state;
  state.variables = model.InitialVariables(options.seed);
  if (!options.checkpoint_dir.empty() && strategy.is_chief()) {
    STRATUM_ASSIGN_OR_RETURN(std::optional<FitState> restored,
                             LoadLatestFitCheckpoint(options.checkpoint_dir, model, optimizer));
    if (restored.has_value()) state = *std::move(restored);
    STRATUM_RETURN_IF_ERROR(CheckResumable(strategy, options, state, steps_per_epoch));
  }
  if (strategy.num_workers() == 1) return state;
  return ShareTheChiefsState(strategy, optimizer, std::move(state));
}

absl::Status BackupFitState(const Strategy& strategy, const Model& model,
                            const Optimizer& optimizer, const FitOptions& options,
                            int64_t steps_per_epoch, FitState state, ResumePoint& resume) {
  // The epoch's figures so far are saved summed over the workers (a collective: every
  // worker saves at the same step), with the global batch they were trained at.
  STRATUM_RETURN_IF_ERROR(SumOverWorkers(strategy, state.epoch_stats));
  // Both the same on every worker: the sum, and the variables (identical bit for bit).
  const bool loss_finite = std::isfinite(state.epoch_stats.loss_sum);
  if (!loss_finite || !AllFinite(state.variables)) {
    const bool epoch_end = state.step_in_epoch == 0;
    return TrainingDiverged(
        loss_finite ? "the variables hold NaN or infinity" : "the loss is not finite",
        state.iteration, static_cast<int>(epoch_end ? state.epoch : state.epoch + 1),
        epoch_end ? steps_per_epoch : state.step_in_epoch, steps_per_epoch, resume);
  }
  state.global_batch = GlobalBatch(strategy, options);
  state.num_workers = strategy.num_workers();
  state.shuffle_buffer = ShuffledBy(options);
  state.seed = options.seed;
  const int64_t iteration = state.iteration;
  if (strategy.is_chief()) {
    STRATUM_RETURN_IF_ERROR(
        SaveFitCheckpoint(options.checkpoint_dir, options.max_to_keep, model, optimizer, state));
    resume.newest_step = iteration;
    return absl::OkStatus();
  }
  const std::string temp = std::filesystem::temp_directory_path().string();
  static std::once_flag swept;
  // A worker killed while saving leaves its scratch folder (named by its pid) behind.
  std::call_once(swept, [&temp] { RemoveLeftoversOfDeadProcesses(temp, kBackupPrefix); });
  const std::string scratch =
      absl::StrCat(temp, "/", kBackupPrefix, strategy.worker_index(), "-", getpid());
  absl::Status saved = SaveFitCheckpoint(scratch, 1, model, optimizer, state);
  std::error_code ignored;
  std::filesystem::remove_all(scratch, ignored);
  if (saved.ok()) resume.newest_step = iteration;  // the chief's copy, in the job's folder
  return saved;
}

ResumePoint ResumeFrom(const FitOptions& options, const FitState& started) {
  ResumePoint resume{.checkpoint_dir = options.checkpoint_dir};
  if (started.iteration > 0) resume.newest_step = started.iteration;
  return resume;
}

}  // namespace stratum
