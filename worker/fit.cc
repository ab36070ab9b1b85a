#include "stratum/worker/fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "fit_internal.h"
#include "spdlog/spdlog.h"
#include "stratum/strategy/distributed_dataset.h"
#include "stratum/training/epoch_loop.h"
#include "stratum/training/fit_state.h"
#include "stratum/util/sort_unique.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/multi_worker_mirrored_strategy.h"

namespace stratum {

namespace fit_internal {

std::vector<std::string> WorkerNames(const Strategy& strategy) {
  const auto* multi_worker = dynamic_cast<const MultiWorkerMirroredStrategy*>(&strategy);
  return multi_worker != nullptr ? multi_worker->WorkerNames() : std::vector<std::string>{};
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

int64_t Rows(const PerReplica<Element>& batch) {
  int64_t rows = 0;
  for (const Element& part : batch.values()) rows += part.front().rows();
  return rows;
}

// The data of one worker's training, as Fit on the CPU takes it: this worker's shard in
// batches of this worker's replicas, and the steps of an epoch.
struct CpuData {
  Dataset batches;
  int64_t steps_per_epoch = 0;
};

absl::StatusOr<CpuData> PlanCpuData(const Strategy& strategy, const Model& model,
                                    const FitData& data, const FitOptions& options) {
  const int workers = strategy.num_workers();
  const int64_t global_batch = GlobalBatch(strategy, options);
  const int64_t worker_batch = options.batch_size_per_replica * strategy.NumLocalReplicas();
  const bool fixed_steps = options.steps_per_epoch > 0;
  // Several workers train in lock-step: each takes its shard in full batches, and all run
  // the same number of steps (that of the smallest shard).
  Dataset train = data.train;
  int64_t steps_per_epoch = (data.train_examples + global_batch - 1) / global_batch;
  if (workers > 1) {
    STRATUM_ASSIGN_OR_RETURN(
        train, AutoShard(data.train, options.auto_shard_policy, workers, strategy.worker_index()));
    STRATUM_ASSIGN_OR_RETURN(
        const int64_t shard,
        SmallestShardExamples(data.train, options.auto_shard_policy, workers, data.train_examples));
    if (strategy.worker_index() == 0) {
      spdlog::info("{}", DescribeAutoShard(data.train, options.auto_shard_policy, workers));
    }
    steps_per_epoch = shard / worker_batch;
  }
  if (fixed_steps) steps_per_epoch = options.steps_per_epoch;
  if (steps_per_epoch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the training data (", data.train_examples, " examples over ", workers,
                     " workers) does not fill one step of ", global_batch,
                     " examples: there is nothing to fit"));
  }
  return CpuData{.batches = MakeBatches(train, model, worker_batch, data.rescale,
                                        options.shuffle_buffer, options.seed, fixed_steps,
                                        /*drop_remainder=*/workers > 1),
                 .steps_per_epoch = steps_per_epoch};
}

// The CPU's StepRunner: a step runs on every local replica (strategy.Run), the gradients
// are reduced and applied by the strategy, and the step's figures come back at once.
class CpuStepRunner : public StepRunner {
 public:
  // `state` is where training starts (StartFitState's answer): every copy of the variables
  // and of the optimizer's slots starts from it.
  CpuStepRunner(Strategy& strategy, const Model& model, const Loss& loss,
                const Optimizer& optimizer, const FitData& data, const FitOptions& options,
                DistributedDataset distributed, int64_t steps_per_epoch, const FitState& state);

  // Resuming: the data sequence is a function of the seed and the epoch, so the epochs
  // and steps `state` has done are replayed from the input pipeline (not trained on).
  absl::Status Replay(const FitState& state);

  bool HasStepStats() const override { return true; }
  absl::Status StartEpoch(int epoch, int64_t first_step) override;
  absl::StatusOr<StepResult> Step(int epoch, int64_t step, int64_t iteration) override;
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status TakeStats(StepStats& /*into*/) override { return absl::OkStatus(); }
  absl::StatusOr<int64_t> ExamplesTrained(int64_t first_step, int64_t last_step) override;
  absl::Status GetState(std::vector<Tensor>* variables,
                        std::vector<std::vector<Tensor>>* slots) override;
  absl::StatusOr<EpochLog> Evaluate() override;
  absl::Status SetLearningRate(float rate) override;
  absl::Status SetVariables(const std::vector<Tensor>& variables) override;

 private:
  Strategy& strategy_;
  const Model& model_;
  const Loss& loss_;
  const Optimizer* optimizer_;          // the job's, or retuned_
  std::unique_ptr<Optimizer> retuned_;  // the job's with the rate a callback set
  const FitData& data_;
  const FitOptions& options_;
  DistributedDataset distributed_;
  const int64_t steps_per_epoch_;
  const bool fixed_steps_;  // fit.steps_per_epoch: the data repeats, one iterator for all
  DistributedVariables variables_;
  std::vector<std::vector<std::vector<Tensor>>> slots_;  // per copy of the variables
  std::vector<std::unique_ptr<Workspace>> workspaces_;
  PerReplica<std::vector<Tensor>> gradients_;
  std::unique_ptr<DistributedIterator> iterator_;
  StepStats trained_{};  // this worker's examples of this run in this epoch, for examples/s

  // The row-sparse tables (VariableSpec::row_sparse): a step takes them as the rows that
  // some replica of some worker reads, its gradients are those rows' alone, and only they
  // travel in the all-reduce and change (Optimizer::ApplyRows).
  std::vector<int> row_tables_;
  // The rows of each row table this step reads, on every worker (sorted, unique).
  absl::StatusOr<std::vector<std::vector<int64_t>>> RowsReadByAll(const PerReplica<Element>& parts);
  // Replica r's variables for a step on `rows`: its own, the row tables' rows gathered.
  std::vector<Tensor> StepValues(int r, const std::vector<std::vector<int64_t>>& rows) const;

 public:
  // What the row tables' exchange moved across the workers, for the log at the end: the
  // bytes all-reduced per step (the rows every worker read, then their gradients) beside
  // those a dense all-reduce of the whole tables would; empty with no row table or one
  // worker.
  std::string DescribeRowExchange() const;

 private:
  double row_exchange_bytes_ = 0;  // all-reduced for the row tables, over the steps
  int64_t row_exchange_steps_ = 0;
};

CpuStepRunner::CpuStepRunner(Strategy& strategy, const Model& model, const Loss& loss,
                             const Optimizer& optimizer, const FitData& data,
                             const FitOptions& options, DistributedDataset distributed,
                             int64_t steps_per_epoch, const FitState& state)
    : strategy_(strategy),
      model_(model),
      loss_(loss),
      optimizer_(&optimizer),
      data_(data),
      options_(options),
      distributed_(std::move(distributed)),
      steps_per_epoch_(steps_per_epoch),
      fixed_steps_(options.steps_per_epoch > 0),
      variables_(strategy.CreateVariables(state.variables)),
      slots_(static_cast<size_t>(variables_.num_copies())),
      gradients_(
          std::vector<std::vector<Tensor>>(static_cast<size_t>(strategy.NumLocalReplicas()))) {
  if (!state.slots.empty()) {
    for (auto& copy : slots_) {
      for (const std::vector<Tensor>& held : state.slots) {
        std::vector<Tensor> cloned;
        for (const Tensor& slot : held) cloned.push_back(slot.Clone());
        copy.push_back(std::move(cloned));
      }
    }
  }
  for (int r = 0; r < strategy.NumLocalReplicas(); ++r) {
    workspaces_.push_back(model.NewWorkspace(options.seed * 7919 + static_cast<uint64_t>(r)));
    workspaces_.back()->SetReplicaSum(ReplicaSumOf(strategy, r));
  }
  std::vector<std::string> names;
  for (size_t v = 0; v < model.variables().size(); ++v) {
    if (!model.variables()[v].row_sparse) continue;
    row_tables_.push_back(static_cast<int>(v));
    names.push_back(model.variables()[v].name);
  }
  if (!names.empty() && strategy.worker_index() == 0) {
    spdlog::info(
        "embedding tables {} travel by rows: a step exchanges only the rows its replicas "
        "read",
        absl::StrJoin(names, ", "));
  }
}

absl::StatusOr<std::vector<std::vector<int64_t>>> CpuStepRunner::RowsReadByAll(
    const PerReplica<Element>& parts) {
  std::vector<const Tensor*> xs;
  for (const Element& part : parts.values()) xs.push_back(&part.front());
  STRATUM_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> rows,
                           model_.RowsRead(xs, row_tables_));
  const int workers = strategy_.num_workers();
  if (workers <= 1) return rows;
  // An all-gather made of two sums: every worker's counts at its place, then every worker's
  // rows at its place, as floats: one a row, exact while tables have at most 2^24 rows, else
  // two (the row's bits above 16 and its low 16, each exact).
  const size_t tables = rows.size();
  bool split = false;
  for (int variable : row_tables_) {
    split |= model_.variables()[static_cast<size_t>(variable)].shape.dim(0) > (int64_t{1} << 24);
  }
  const int64_t floats_a_row = split ? 2 : 1;
  const auto me = static_cast<size_t>(strategy_.worker_index());
  std::vector<Tensor> counts = {
      Tensor(DType::kFloat32, Shape({workers * static_cast<int64_t>(tables)}))};
  counts[0].SetZero();
  for (size_t t = 0; t < tables; ++t) {
    counts[0].data<float>()[me * tables + t] = static_cast<float>(rows[t].size());
  }
  STRATUM_RETURN_IF_ERROR(strategy_.AllReduceAcrossWorkers(ReduceOp::kSum, counts));
  int64_t total = 0, mine = 0;
  for (int64_t i = 0; i < counts[0].num_elements(); ++i) {
    if (i == static_cast<int64_t>(me * tables)) mine = total;
    total += std::lround(counts[0].data<float>()[i]);
  }
  std::vector<Tensor> all = {Tensor(DType::kFloat32, Shape({total * floats_a_row}))};
  all[0].SetZero();
  float* at = all[0].data<float>() + mine * floats_a_row;
  for (const std::vector<int64_t>& read : rows) {
    for (int64_t row : read) {
      if (split) {
        *at++ = static_cast<float>(row >> 16);
        *at++ = static_cast<float>(row & 0xffff);
      } else {
        *at++ = static_cast<float>(row);
      }
    }
  }
  STRATUM_RETURN_IF_ERROR(strategy_.AllReduceAcrossWorkers(ReduceOp::kSum, all));
  row_exchange_bytes_ += 4.0 * static_cast<double>(counts[0].num_elements() + total * floats_a_row);
  std::vector<std::vector<int64_t>> every(tables);
  const float* from = all[0].data<float>();
  for (int w = 0; w < workers; ++w) {
    for (size_t t = 0; t < tables; ++t) {
      const int64_t count =
          std::lround(counts[0].data<float>()[static_cast<size_t>(w) * tables + t]);
      for (int64_t i = 0; i < count; ++i) {
        int64_t row = std::lround(*from++);
        if (split) row = (row << 16) + std::lround(*from++);
        every[t].push_back(row);
      }
    }
  }
  for (size_t t = 0; t < tables; ++t) {
    std::vector<int64_t>& table = every[t];
    const Shape& shape = model_.variables()[static_cast<size_t>(row_tables_[t])].shape;
    SortUnique(table, shape.dim(0));
    // Their gradients: one row each, all-reduced with the step's other gradients.
    row_exchange_bytes_ += 4.0 * static_cast<double>(table.size()) *
                           static_cast<double>(shape.num_elements() / shape.dim(0));
  }
  ++row_exchange_steps_;
  return every;
}

std::string CpuStepRunner::DescribeRowExchange() const {
  if (row_exchange_steps_ == 0) return "";
  double dense = 0;
  for (int v : row_tables_) {
    dense +=
        4.0 * static_cast<double>(model_.variables()[static_cast<size_t>(v)].shape.num_elements());
  }
  const double sparse = row_exchange_bytes_ / static_cast<double>(row_exchange_steps_);
  return absl::StrFormat(
      "the embedding tables' exchange all-reduced %.0f bytes per step on average (the rows "
      "the workers read, then their gradients), where a dense all-reduce of the tables would "
      "move %.0f (%.2f%%), over %d steps",
      sparse, dense, 100.0 * sparse / dense, row_exchange_steps_);
}

std::vector<Tensor> CpuStepRunner::StepValues(int r,
                                              const std::vector<std::vector<int64_t>>& rows) const {
  std::vector<Tensor> values = variables_.ReplicaValues(r);  // shares the buffers
  for (size_t t = 0; t < row_tables_.size(); ++t) {
    Tensor& table = values[static_cast<size_t>(row_tables_[t])];
    const int64_t width = table.row_size();
    Tensor gathered(DType::kFloat32,
                    table.shape().WithFirstDim(static_cast<int64_t>(rows[t].size())));
    for (size_t i = 0; i < rows[t].size(); ++i) {
      std::copy_n(table.data<float>() + rows[t][i] * width, width,
                  gathered.data<float>() + static_cast<int64_t>(i) * width);
    }
    table = std::move(gathered);
  }
  return values;
}

absl::Status CpuStepRunner::Replay(const FitState& state) {
  if (state.epoch == 0 && state.step_in_epoch == 0) return absl::OkStatus();
  if (fixed_steps_) {
    iterator_ = distributed_.MakeIterator();
    for (int64_t skip = 0; skip < state.epoch * steps_per_epoch_ + state.step_in_epoch; ++skip) {
      STRATUM_RETURN_IF_ERROR(iterator_->GetNext().status());
    }
  } else {
    for (int64_t epoch = 0; epoch < state.epoch; ++epoch) distributed_.MakeIterator();
  }
  return absl::OkStatus();
}

absl::Status CpuStepRunner::StartEpoch(int /*epoch*/, int64_t first_step) {
  trained_ = StepStats{};
  if (fixed_steps_ && iterator_ != nullptr) return absl::OkStatus();
  iterator_ = distributed_.MakeIterator();
  for (int64_t skip = 0; skip < first_step; ++skip) {
    STRATUM_RETURN_IF_ERROR(iterator_->GetNext().status());
  }
  return absl::OkStatus();
}

absl::StatusOr<StepRunner::StepResult> CpuStepRunner::Step(int /*epoch*/, int64_t /*step*/,
                                                           int64_t iteration) {
  absl::StatusOr<std::optional<PerReplica<Element>>> batch = iterator_->GetNext();
  if (!batch.ok()) return batch.status();
  if (!batch->has_value()) return StepResult{.data_ended = true};
  const PerReplica<Element>& parts = **batch;
  const float loss_scale = 1.0f / static_cast<float>(Rows(parts) * strategy_.num_workers());
  // tf.distribute's scale_regularization_loss: each replica carries 1 / replicas in sync of
  // what a step adds once (regularization, moving statistics), so the shares add up to one;
  // a replica that a partial batch left without examples too.
  const float replica_share = 1.0f / static_cast<float>(strategy_.NumReplicasInSync());
  std::vector<std::vector<int64_t>> rows;
  std::vector<const std::vector<int64_t>*> selection;  // per variable: its rows, or nullptr
  if (!row_tables_.empty()) {
    STRATUM_ASSIGN_OR_RETURN(rows, RowsReadByAll(parts));
    selection.assign(model_.variables().size(), nullptr);
    for (size_t t = 0; t < row_tables_.size(); ++t) {
      selection[static_cast<size_t>(row_tables_[t])] = &rows[t];
    }
    for (const std::unique_ptr<Workspace>& workspace : workspaces_) {
      STRATUM_RETURN_IF_ERROR(workspace->SetVariableRows(row_tables_, rows));
    }
  }
  absl::StatusOr<PerReplica<StepStats>> stats =
      strategy_.Run<StepStats>([&](ReplicaContext& context) -> absl::StatusOr<StepStats> {
        const int r = context.local_replica_id();
        // The dropout masks of a step depend on (seed, step, replica) alone.
        workspaces_[r]->Reseed(
            DropoutSeed(options_.seed, iteration, context.replica_id_in_sync_group()));
        if (row_tables_.empty()) {
          return model_.TrainStep(variables_.ReplicaValues(r), parts[r][0], parts[r][1], loss_,
                                  loss_scale, *workspaces_[r], gradients_[r], replica_share);
        }
        return model_.TrainStep(StepValues(r, rows), parts[r][0], parts[r][1], loss_, loss_scale,
                                *workspaces_[r], gradients_[r], replica_share);
      });
  if (!stats.ok()) return stats.status();
  absl::Status applied = strategy_.ApplyGradients(
      gradients_, variables_,
      [&](int copy, std::vector<Tensor>& vars, const std::vector<Tensor>& grads) {
        optimizer_->Apply(vars, grads, slots_[static_cast<size_t>(copy)], iteration,
                          model_.variables(), selection);
        return absl::OkStatus();
      });
  if (!applied.ok()) return applied;
  const StepStats total = SumOverReplicas(*stats);
  Accumulate(trained_, total);
  return StepResult{.stats = total};
}

absl::StatusOr<int64_t> CpuStepRunner::ExamplesTrained(int64_t /*first_step*/,
                                                       int64_t /*last_step*/) {
  StepStats trained = trained_;
  STRATUM_RETURN_IF_ERROR(SumOverWorkers(strategy_, trained));
  return trained.examples;
}

absl::Status CpuStepRunner::GetState(std::vector<Tensor>* variables,
                                     std::vector<std::vector<Tensor>>* slots) {
  *variables = variables_.primary();
  if (slots != nullptr) *slots = slots_[0];
  return absl::OkStatus();
}

absl::Status CpuStepRunner::SetLearningRate(float rate) {
  STRATUM_ASSIGN_OR_RETURN(retuned_, optimizer_->WithLearningRate(rate));
  optimizer_ = retuned_.get();
  return absl::OkStatus();
}

absl::Status CpuStepRunner::SetVariables(const std::vector<Tensor>& variables) {
  for (int copy = 0; copy < variables_.num_copies(); ++copy) {
    std::vector<Tensor>& held = variables_.MutableCopy(copy);
    for (size_t v = 0; v < held.size(); ++v) held[v].CopyFrom(variables[v]);
  }
  return absl::OkStatus();
}

absl::StatusOr<EpochLog> CpuStepRunner::Evaluate() {
  return EvaluateDataset(strategy_, model_, loss_, variables_.primary(), data_.test, data_.rescale,
                         std::max<int64_t>(GlobalBatch(strategy_, options_), 256));
}

}  // namespace

absl::StatusOr<FitSummary> Fit(Strategy& strategy, const Model& model, const Loss& loss,
                               const Optimizer& optimizer, const FitData& data,
                               const FitOptions& options) {
  const double fit_start = EpochLoopNow();
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
    if (trained.ok()) trained->on_gpus = true;
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
  if (const std::string note = CpuPrecisionNote(model.dtype_policy());
      !note.empty() && options.progress != ProgressStyle::kNone) {
    std::fprintf(options.out, "%s\n", note.c_str());
  }
  STRATUM_ASSIGN_OR_RETURN(CpuData planned, PlanCpuData(strategy, model, data, options));
  // Already this worker's shard and batch: only split over the local replicas.
  absl::StatusOr<DistributedDataset> distributed =
      DistributedDataset::FromGlobalBatches(planned.batches, strategy.NumLocalReplicas(), {});
  if (!distributed.ok()) return distributed.status();
  STRATUM_ASSIGN_OR_RETURN(
      FitState state, StartFitState(strategy, model, optimizer, options, planned.steps_per_epoch));
  CpuStepRunner runner(strategy, model, loss, optimizer, data, options, *std::move(distributed),
                       planned.steps_per_epoch, state);
  STRATUM_RETURN_IF_ERROR(runner.Replay(state));
  const EpochLoopSpec spec{.steps_per_epoch = planned.steps_per_epoch,
                           .has_test = data.has_test,
                           .start = fit_start,
                           .worker_names = fit_internal::WorkerNames(strategy)};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, optimizer, options, spec, std::move(state), runner);
  if (const std::string exchange = runner.DescribeRowExchange();
      !exchange.empty() && strategy.worker_index() == 0) {
    spdlog::info("{}", exchange);
  }
  return summary;
}

}  // namespace stratum
