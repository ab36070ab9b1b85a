#include "stratum/worker/fit.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "fit_internal.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/util/json_text.h"
#include "stratum/util/process_info.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/fit_checkpoint.h"
#include "stratum/worker/multi_worker_mirrored_strategy.h"

namespace stratum {

namespace fit_internal {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t Rows(const PerReplica<Element>& batch) {
  int64_t rows = 0;
  for (const Element& part : batch.values()) rows += part.front().rows();
  return rows;
}

absl::StatusOr<StopVote::Agreed> StopVote::AfterStep(const Strategy& strategy,
                                                     const FitOptions& options, int64_t iteration,
                                                     bool diverged_here) {
  const bool here = options.stop != nullptr && options.stop->HasBeenNotified();
  if (strategy.num_workers() == 1) {
    return Agreed{.stop = here, .diverged = diverged_here, .diverged_workers = diverged_here};
  }
  if (iteration < next_vote_) return Agreed{};
  // This worker's proposal: the steps it trains in about kStopVoteInterval.
  const double now = Now();
  double proposal = 1;
  if (last_vote_iteration_ >= 0 && now > last_vote_time_) {
    const double steps_per_second =
        static_cast<double>(iteration - last_vote_iteration_) / (now - last_vote_time_);
    proposal = std::clamp(std::floor(steps_per_second * kStopVoteInterval), 1.0, 4096.0);
  }
  Tensor vote(DType::kFloat32, Shape({4}));
  vote.data<float>()[0] = here ? 1.0f : 0.0f;
  vote.data<float>()[1] = static_cast<float>(proposal);
  vote.data<float>()[2] = diverged_here ? 1.0f : 0.0f;
  // Summed: the index + 1 of the worker that diverged, when it is the only one.
  vote.data<float>()[3] = diverged_here ? static_cast<float>(strategy.worker_index() + 1) : 0.0f;
  std::vector<Tensor> votes = {std::move(vote)};
  STRATUM_RETURN_IF_ERROR(strategy.AllReduceAcrossWorkers(ReduceOp::kSum, votes));
  const float* sum = votes[0].data<float>();
  // The same sums on every worker, so the same next vote.
  next_vote_ =
      iteration + std::max<int64_t>(1, static_cast<int64_t>(sum[1]) / strategy.num_workers());
  last_vote_iteration_ = iteration;
  last_vote_time_ = now;
  const int diverged_workers = static_cast<int>(std::lround(sum[2]));
  return Agreed{
      .stop = sum[0] > 0.5f,
      .diverged = diverged_workers > 0,
      .diverged_workers = diverged_workers,
      .diverged_worker = diverged_workers == 1 ? static_cast<int>(std::lround(sum[3])) - 1 : -1};
}

std::string WhoseLossDiverged(const Strategy& strategy, const StopVote::Agreed& agreed) {
  if (agreed.diverged_worker < 0) {
    return absl::StrCat("the loss of ", agreed.diverged_workers, " workers is not finite");
  }
  const auto* multi_worker = dynamic_cast<const MultiWorkerMirroredStrategy*>(&strategy);
  const std::vector<std::string> names =
      multi_worker != nullptr ? multi_worker->WorkerNames() : std::vector<std::string>{};
  const size_t index = static_cast<size_t>(agreed.diverged_worker);
  return absl::StrCat(
      "the loss on ",
      index < names.size() ? names[index] : absl::StrCat("worker ", agreed.diverged_worker),
      " is not finite");
}

// Said whatever the progress style: where training starts is not progress.
void SayResumed(const FitOptions& options, const FitState& state, bool has_test) {
  if (state.epoch >= options.epochs) {
    std::fprintf(options.out,
                 "the checkpoint at step %lld in %s already completes this job's %d epochs: %s "
                 "(remove %s to train from scratch)\n",
                 static_cast<long long>(state.iteration), options.checkpoint_dir.c_str(),
                 options.epochs,
                 has_test ? "evaluating its model on data.test" : "nothing left to train",
                 options.checkpoint_dir.c_str());
    return;
  }
  std::fprintf(options.out, "resumed from checkpoint step %lld (epoch %lld, step %lld)\n",
               static_cast<long long>(state.iteration), static_cast<long long>(state.epoch + 1),
               static_cast<long long>(state.step_in_epoch));
}

}  // namespace fit_internal

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The seed of a replica's dropout masks in one step.
uint64_t DropoutSeed(uint64_t seed, int64_t iteration, int replica) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(iteration)) ^
                    static_cast<uint64_t>(replica));
}

}  // namespace

using fit_internal::Backup;
using fit_internal::Now;
using fit_internal::Progress;
using fit_internal::Rows;
using fit_internal::StartState;

namespace fit_internal {

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

// The training state as the chief has it (restored from its checkpoint, or fresh), the same
// on every worker afterwards: the chief decides and broadcasts.
absl::StatusOr<FitState> StartState(Strategy& strategy, const Model& model,
                                    const Optimizer& optimizer, const FitOptions& options,
                                    int64_t steps_per_epoch) {
  FitState state;
  state.variables = model.InitialVariables(options.seed);
  if (!options.checkpoint_dir.empty() && strategy.is_chief()) {
    STRATUM_ASSIGN_OR_RETURN(std::optional<FitState> restored,
                             LoadLatestFitCheckpoint(options.checkpoint_dir, model, optimizer));
    if (restored.has_value()) state = *std::move(restored);
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
  }
  if (strategy.num_workers() == 1) return state;
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

// Every worker runs the save path; only the chief's lands in the job's folder.
absl::Status Backup(const Strategy& strategy, const Model& model, const Optimizer& optimizer,
                    const FitOptions& options, int64_t steps_per_epoch, FitState state,
                    ResumePoint& resume) {
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

absl::Status CheckEpochLoss(double loss, int64_t iteration, int epoch, int64_t steps,
                            const ResumePoint& resume) {
  if (std::isfinite(loss)) return absl::OkStatus();
  return TrainingDiverged(absl::StrCat("the epoch's loss is ", loss), iteration, epoch, steps,
                          steps, resume);
}

}  // namespace fit_internal

absl::StatusOr<FitSummary> Fit(Strategy& strategy, const Model& model, const Loss& loss,
                               const Optimizer& optimizer, const FitData& data,
                               const FitOptions& options) {
  const double fit_start = Now();
  const int replicas = strategy.NumLocalReplicas();
  const int workers = strategy.num_workers();
  if (options.epochs < 1 || options.batch_size_per_replica < 1 ||
      options.batch_size_per_replica > (int64_t{1} << 30) / strategy.NumReplicasInSync() ||
      options.steps_per_epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fit needs epochs >= 1, 1 <= batch_size_per_replica <= ",
        (int64_t{1} << 30) / strategy.NumReplicasInSync(), " and steps_per_epoch >= 0; got epochs ",
        options.epochs, ", batch_size_per_replica ", options.batch_size_per_replica,
        ", steps_per_epoch ", options.steps_per_epoch));
  }
  std::string why_on_cpu;  // why a job on GPUs trains on the CPU
#if STRATUM_WITH_CUDA
  // Every replica on a GPU: the GPU path, unless it cannot train this job (every worker
  // decides alike: the same job on the same kind of devices).
  const bool on_gpus = std::all_of(strategy.devices().begin(), strategy.devices().end(),
                                   [](const std::string& d) { return d.rfind("GPU:", 0) == 0; });
  if (on_gpus) {
    absl::StatusOr<FitSummary> trained = FitOnGpus(strategy, model, loss, optimizer, data, options);
    if (trained.ok() || trained.status().code() != absl::StatusCode::kUnimplemented) {
      return trained;
    }
    why_on_cpu = std::string(trained.status().message());
  }
#endif
  // NCCL sums device buffers: the CPU path would quietly use the ring instead.
  const auto* multi_worker = dynamic_cast<const MultiWorkerMirroredStrategy*>(&strategy);
  if (multi_worker != nullptr &&
      multi_worker->communication().implementation == CommunicationImplementation::kNccl) {
    return absl::FailedPreconditionError(absl::StrCat(
        "communication implementation NCCL sums GPU tensors, and this job trains on the CPU (",
        why_on_cpu.empty() ? "its replicas are on the CPU" : why_on_cpu,
        "): use strategy.communication.implementation RING or AUTO"));
  }
  if (!why_on_cpu.empty() && options.progress != ProgressStyle::kNone) {
    std::fprintf(options.out, "training on the CPU: %s\n", why_on_cpu.c_str());
  }
  const int64_t global_batch = fit_internal::GlobalBatch(strategy, options);
  const int64_t worker_batch = options.batch_size_per_replica * replicas;
  const bool fixed_steps = options.steps_per_epoch > 0;
  // Several workers train in lock-step: each takes its shard in full batches, and all run
  // the same number of steps (that of the smallest shard).
  Dataset train = data.train;
  int64_t steps_per_epoch = (data.train_examples + global_batch - 1) / global_batch;
  if (workers > 1) {
    STRATUM_ASSIGN_OR_RETURN(
        train, AutoShard(data.train, options.auto_shard_policy, workers, strategy.worker_index()));
    const int64_t shard = options.auto_shard_policy == AutoShardPolicy::kOff
                              ? data.train_examples
                              : data.train_examples / workers;
    steps_per_epoch = shard / worker_batch;
  }
  if (fixed_steps) steps_per_epoch = options.steps_per_epoch;
  if (steps_per_epoch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the training data (", data.train_examples, " examples over ", workers,
                     " workers) does not fill one step of ", global_batch,
                     " examples: there is nothing to fit"));
  }

  const Dataset batches = MakeBatches(train, model, worker_batch, data.rescale,
                                      options.shuffle_buffer, options.seed, fixed_steps,
                                      /*drop_remainder=*/workers > 1);
  // Already this worker's shard and batch: only split over the local replicas.
  absl::StatusOr<DistributedDataset> distributed =
      DistributedDataset::FromGlobalBatches(batches, strategy.NumLocalReplicas(), {});
  if (!distributed.ok()) return distributed.status();

  STRATUM_ASSIGN_OR_RETURN(FitState state,
                           StartState(strategy, model, optimizer, options, steps_per_epoch));
  DistributedVariables variables = strategy.CreateVariables(state.variables);
  std::vector<std::vector<std::vector<Tensor>>> slots(static_cast<size_t>(variables.num_copies()));
  if (!state.slots.empty()) {
    for (auto& copy : slots) {
      for (const std::vector<Tensor>& held : state.slots) {
        std::vector<Tensor> cloned;
        for (const Tensor& slot : held) cloned.push_back(slot.Clone());
        copy.push_back(std::move(cloned));
      }
    }
  }
  std::vector<std::unique_ptr<Workspace>> workspaces;
  for (int r = 0; r < replicas; ++r) {
    workspaces.push_back(model.NewWorkspace(options.seed * 7919 + static_cast<uint64_t>(r)));
  }
  PerReplica<std::vector<Tensor>> gradients{
      std::vector<std::vector<Tensor>>(static_cast<size_t>(replicas))};
  int64_t iteration = state.iteration;
  ResumePoint resume = fit_internal::ResumeFrom(options, state);

  FitSummary summary;
  summary.strategy = strategy.name();
  summary.num_replicas_in_sync = strategy.NumReplicasInSync();
  summary.num_workers = workers;
  summary.resumed_from_step = state.iteration;
  for (const nlohmann::json& log : state.history) {
    summary.history.push_back(EpochLogFromJson(log));
    summary.steps += summary.history.back().steps;
  }
  Progress progress(options);
  std::unique_ptr<DistributedIterator> iterator;
  double train_seconds = 0;
  int64_t train_examples = 0;
  bool stopping = false;       // FitOptions::stop: every worker agreed to stop
  bool diverged_here = false;  // a step's loss on this worker was not finite
  fit_internal::StopVote stop_vote;
  // Resuming: the data sequence is a function of the seed and the epoch, so the epochs
  // and steps already done are replayed from the input pipeline (not trained on).
  if (state.epoch > 0 || state.step_in_epoch > 0) {
    if (fixed_steps) {
      iterator = distributed->MakeIterator();
      for (int64_t skip = 0; skip < state.epoch * steps_per_epoch + state.step_in_epoch; ++skip) {
        STRATUM_RETURN_IF_ERROR(iterator->GetNext().status());
      }
    } else {
      for (int64_t epoch = 0; epoch < state.epoch; ++epoch) distributed->MakeIterator();
    }
    fit_internal::SayResumed(options, state, data.has_test);
  }

  const int64_t restored_epochs = state.epoch;
  for (int epoch = static_cast<int>(state.epoch) + 1; epoch <= options.epochs; ++epoch) {
    const bool resuming_mid_epoch = epoch == state.epoch + 1 && state.step_in_epoch > 0;
    if (!fixed_steps || iterator == nullptr) {
      iterator = distributed->MakeIterator();
      if (resuming_mid_epoch) {
        for (int64_t skip = 0; skip < state.step_in_epoch; ++skip) {
          STRATUM_RETURN_IF_ERROR(iterator->GetNext().status());
        }
      }
    }
    progress.StartEpoch(epoch, options.epochs, steps_per_epoch);
    const double epoch_start = Now();
    StepStats epoch_stats = resuming_mid_epoch ? state.epoch_stats : StepStats{};
    int64_t step = resuming_mid_epoch ? state.step_in_epoch : 0;
    StepStats trained{};  // this worker's examples of this run, for examples/s
    while (step < steps_per_epoch) {
      absl::StatusOr<std::optional<PerReplica<Element>>> batch = iterator->GetNext();
      if (!batch.ok()) return batch.status();
      if (!batch->has_value()) break;
      const PerReplica<Element>& parts = **batch;
      const float loss_scale = 1.0f / static_cast<float>(Rows(parts) * workers);
      absl::StatusOr<PerReplica<StepStats>> stats =
          strategy.Run<StepStats>([&](ReplicaContext& context) -> absl::StatusOr<StepStats> {
            const int r = context.local_replica_id();
            std::vector<Tensor>& grads = gradients[r];
            if (parts[r][0].rows() == 0) {  // a partial batch left this replica nothing
              const std::vector<Tensor>& vars = variables.ReplicaValues(r);
              if (grads.size() != vars.size()) {
                grads.clear();
                for (const Tensor& v : vars) grads.emplace_back(DType::kFloat32, v.shape());
              }
              for (Tensor& g : grads) g.SetZero();
              return StepStats{};
            }
            // The dropout masks of a step depend on (seed, step, replica) alone.
            workspaces[r]->Reseed(
                DropoutSeed(options.seed, iteration, context.replica_id_in_sync_group()));
            return model.TrainStep(variables.ReplicaValues(r), parts[r][0], parts[r][1], loss,
                                   loss_scale, *workspaces[r], grads);
          });
      if (!stats.ok()) return stats.status();
      absl::Status applied = strategy.ApplyGradients(
          gradients, variables,
          [&](int copy, std::vector<Tensor>& vars, const std::vector<Tensor>& grads) {
            optimizer.Apply(vars, grads, slots[static_cast<size_t>(copy)], iteration);
            return absl::OkStatus();
          });
      if (!applied.ok()) return applied;
      ++iteration;
      ++step;
      const StepStats total = SumOverReplicas(*stats);
      Accumulate(epoch_stats, total);
      Accumulate(trained, total);
      const double seen = static_cast<double>(std::max<int64_t>(epoch_stats.examples, 1));
      progress.Step(step, epoch_stats.loss_sum / seen,
                    static_cast<double>(epoch_stats.correct) / seen);
      if (!std::isfinite(total.loss_sum)) diverged_here = true;
      STRATUM_ASSIGN_OR_RETURN(const fit_internal::StopVote::Agreed agreed,
                               stop_vote.AfterStep(strategy, options, iteration, diverged_here));
      if (agreed.diverged) {
        progress.Interrupt();
        return TrainingDiverged(workers == 1 ? absl::StrCat("the loss is ", total.loss_sum)
                                             : fit_internal::WhoseLossDiverged(strategy, agreed),
                                iteration, epoch, step, steps_per_epoch, resume);
      }
      stopping = agreed.stop;
      const bool periodic =
          options.checkpoint_every_steps > 0 && iteration % options.checkpoint_every_steps == 0;
      if (!options.checkpoint_dir.empty() && (periodic || stopping) && step < steps_per_epoch) {
        FitState now{epoch - 1,           step,    iteration, epoch_stats, state.history,
                     variables.primary(), slots[0]};
        STRATUM_RETURN_IF_ERROR(
            Backup(strategy, model, optimizer, options, steps_per_epoch, std::move(now), resume));
      }
      // Stopped at the epoch's last step: the epoch ends (and is saved) first.
      if (stopping && step < steps_per_epoch) {
        progress.Interrupt();
        return StoppedEarly(options, iteration, epoch, step, steps_per_epoch);
      }
    }
    EpochLog log;
    log.epoch = epoch;
    log.steps = step;
    log.seconds = Now() - epoch_start;
    // The epoch's figures over every worker.
    STRATUM_RETURN_IF_ERROR(SumOverWorkers(strategy, epoch_stats));
    STRATUM_RETURN_IF_ERROR(SumOverWorkers(strategy, trained));
    const double seen = static_cast<double>(std::max<int64_t>(epoch_stats.examples, 1));
    log.loss = epoch_stats.loss_sum / seen;
    log.accuracy = static_cast<double>(epoch_stats.correct) / seen;
    if (absl::Status finite =
            fit_internal::CheckEpochLoss(log.loss, iteration, epoch, step, resume);
        !finite.ok()) {
      progress.Interrupt();
      return finite;
    }
    log.examples_per_sec = static_cast<double>(trained.examples) / std::max(log.seconds, 1e-9);
    train_seconds += log.seconds;
    train_examples += trained.examples;
    summary.steps += step;
    const bool validate = options.validate && data.has_test;
    if (validate) {
      absl::StatusOr<EpochLog> val =
          EvaluateDataset(strategy, model, loss, variables.primary(), data.test, data.rescale,
                          std::max<int64_t>(global_batch, 256));
      if (!val.ok()) return val.status();
      log.val_loss = val->val_loss;
      log.val_accuracy = val->val_accuracy;
      log.validated = true;
    }
    progress.EndEpoch(log, options.epochs);
    summary.history.push_back(log);
    state.history.push_back(EpochLogJson(log));
    if (!options.checkpoint_dir.empty()) {
      FitState now{epoch, 0, iteration, StepStats{}, state.history, variables.primary(), slots[0]};
      STRATUM_RETURN_IF_ERROR(
          Backup(strategy, model, optimizer, options, steps_per_epoch, std::move(now), resume));
    }
    if (stopping && epoch < options.epochs) {
      return StoppedEarly(options, iteration, epoch, step, steps_per_epoch);
    }
  }

  if (data.has_test) {
    summary.tested = true;
    // The last epoch's validation, when this run trained it; a checkpoint that completed the
    // job already is evaluated anew (data.test may have changed since it was saved).
    if (options.epochs > restored_epochs && summary.history.back().validated) {
      const EpochLog& last = summary.history.back();
      summary.test_loss = last.val_loss;
      summary.test_accuracy = last.val_accuracy;
    } else {
      absl::StatusOr<EpochLog> test =
          EvaluateDataset(strategy, model, loss, variables.primary(), data.test, data.rescale,
                          std::max<int64_t>(global_batch, 256));
      if (!test.ok()) return test.status();
      summary.test_loss = test->val_loss;
      summary.test_accuracy = test->val_accuracy;
    }
  }
  summary.examples_per_sec = static_cast<double>(train_examples) / std::max(train_seconds, 1e-9);
  summary.wall_s = Now() - fit_start;
  summary.variables = variables.primary();
  return summary;
}

}  // namespace stratum
