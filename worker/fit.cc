#include "stratum/worker/fit.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stratum {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Progress in Keras' style: a bar redrawn in place on a terminal, one line per epoch else.
class Progress {
 public:
  Progress(const FitOptions& options) : out_(options.out) {
    style_ = options.progress;
    if (style_ == ProgressStyle::kAuto) {
      style_ = isatty(fileno(out_)) ? ProgressStyle::kBar : ProgressStyle::kLines;
    }
  }

  void StartEpoch(int epoch, int epochs, int64_t steps) {
    steps_ = steps;
    last_draw_ = 0;
    if (style_ == ProgressStyle::kBar) std::fprintf(out_, "Epoch %d/%d\n", epoch, epochs);
  }

  void Step(int64_t step, double loss, double accuracy) {
    if (style_ != ProgressStyle::kBar) return;
    const double now = Now();
    if (now - last_draw_ < 0.1 && step != steps_) return;
    last_draw_ = now;
    const int width = 30;
    const int filled =
        steps_ > 0 ? static_cast<int>(width * std::min<double>(1, double(step) / steps_)) : 0;
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < width) bar += '>';
    bar.resize(width, '.');
    std::fprintf(out_, "\r%6lld/%lld [%s] - loss: %.4f - accuracy: %.4f",
                 static_cast<long long>(step), static_cast<long long>(steps_), bar.c_str(), loss,
                 accuracy);
    std::fflush(out_);
  }

  void EndEpoch(const EpochLog& log, int epochs, bool validated) {
    if (style_ == ProgressStyle::kNone) return;
    std::string text = absl::StrFormat("loss %.4f - accuracy %.4f", log.loss, log.accuracy);
    if (validated) {
      absl::StrAppend(&text, absl::StrFormat(" - val_loss %.4f - val_accuracy %.4f", log.val_loss,
                                             log.val_accuracy));
    }
    absl::StrAppend(
        &text, absl::StrFormat(" - %.0f examples/s - %.2fs", log.examples_per_sec, log.seconds));
    if (style_ == ProgressStyle::kBar) {
      std::fprintf(out_, "\r%6lld/%lld - %s\n", static_cast<long long>(log.steps),
                   static_cast<long long>(log.steps), text.c_str());
    } else {
      std::fprintf(out_, "Epoch %d/%d - %lld steps - %s\n", log.epoch, epochs,
                   static_cast<long long>(log.steps), text.c_str());
    }
    std::fflush(out_);
  }

 private:
  FILE* out_;
  ProgressStyle style_;
  int64_t steps_ = 0;
  double last_draw_ = 0;
};

// x: raw features -> float32 [B, ...input_shape] times `rescale`.
absl::StatusOr<Tensor> ToModelInput(const Tensor& x, const Model& model, double rescale) {
  std::vector<int64_t> dims = {x.rows()};
  const Shape input = model.input_shape();
  for (int64_t dim : input.dims()) dims.push_back(dim);
  Shape shape(dims);
  if (shape.num_elements() != x.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data's examples are ", x.DebugString(), " but the model takes ",
        model.input_shape().ToString(), " per example: fix the model's input shape or the data"));
  }
  Tensor out(DType::kFloat32, shape);
  const float scale = static_cast<float>(rescale);
  switch (x.dtype()) {
    case DType::kUInt8:
      out.Flat() = x.Flat<uint8_t>().cast<float>() * scale;
      break;
    case DType::kFloat32:
      out.Flat() = x.Flat() * scale;
      break;
    case DType::kInt32:
      out.Flat() = x.Flat<int32_t>().cast<float>() * scale;
      break;
    case DType::kInt64:
      out.Flat() = x.Flat<int64_t>().cast<float>() * scale;
      break;
  }
  return out;
}

int64_t Rows(const PerReplica<Element>& batch) {
  int64_t rows = 0;
  for (const Element& part : batch.values()) rows += part.front().rows();
  return rows;
}

// Sums per-replica StepStats.
StepStats Total(const PerReplica<StepStats>& stats) {
  StepStats total{};
  for (const StepStats& s : stats.values()) {
    total.loss_sum += s.loss_sum;
    total.correct += s.correct;
    total.examples += s.examples;
  }
  return total;
}

}  // namespace

Dataset MakeBatches(const Dataset& examples, const Model& model, int64_t global_batch,
                    double rescale, int64_t shuffle_buffer, uint64_t seed, bool repeat) {
  Dataset dataset = examples;
  if (shuffle_buffer > 1) dataset = dataset.Shuffle(shuffle_buffer, seed);
  if (repeat) dataset = dataset.Repeat();
  return dataset.Batch(global_batch)
      .Map([model, rescale](Element batch) -> absl::StatusOr<Element> {
        absl::StatusOr<Tensor> x = ToModelInput(batch[0], model, rescale);
        if (!x.ok()) return x.status();
        batch[0] = *std::move(x);
        return batch;
      })
      .Prefetch(2);
}

absl::StatusOr<EpochLog> EvaluateDataset(Strategy& strategy, const Model& model, const Loss& loss,
                                         const std::vector<Tensor>& variables, const Dataset& data,
                                         double rescale, int64_t global_batch) {
  const Dataset batches = MakeBatches(data, model, global_batch, rescale, 0, 0, false);
  absl::StatusOr<DistributedDataset> distributed =
      strategy.ExperimentalDistributeDataset(batches, {.auto_shard_policy = AutoShardPolicy::kOff});
  if (!distributed.ok()) return distributed.status();
  std::vector<std::unique_ptr<Workspace>> workspaces;
  for (int r = 0; r < strategy.NumReplicasInSync(); ++r)
    workspaces.push_back(model.NewWorkspace(r));
  auto iterator = distributed->MakeIterator();
  StepStats total{};
  while (true) {
    absl::StatusOr<std::optional<PerReplica<Element>>> batch = iterator->GetNext();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) break;
    const PerReplica<Element>& parts = **batch;
    absl::StatusOr<PerReplica<StepStats>> stats =
        strategy.Run<StepStats>([&](ReplicaContext& context) -> absl::StatusOr<StepStats> {
          const int r = context.replica_id_in_sync_group();
          if (parts[r][0].rows() == 0) return StepStats{};
          return model.Evaluate(variables, parts[r][0], parts[r][1], loss, *workspaces[r]);
        });
    if (!stats.ok()) return stats.status();
    const StepStats step = Total(*stats);
    total.loss_sum += step.loss_sum;
    total.correct += step.correct;
    total.examples += step.examples;
  }
  EpochLog log;
  const double examples = static_cast<double>(std::max<int64_t>(total.examples, 1));
  log.val_loss = total.loss_sum / examples;
  log.val_accuracy = static_cast<double>(total.correct) / examples;
  return log;
}

absl::StatusOr<FitSummary> Fit(Strategy& strategy, const Model& model, const Loss& loss,
                               const Optimizer& optimizer, const FitData& data,
                               const FitOptions& options) {
  const double fit_start = Now();
  const int replicas = strategy.NumReplicasInSync();
  if (options.epochs < 1 || options.batch_size_per_replica < 1 ||
      options.batch_size_per_replica > (int64_t{1} << 30) / replicas ||
      options.steps_per_epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fit needs epochs >= 1, 1 <= batch_size_per_replica <= ", (int64_t{1} << 30) / replicas,
        " and steps_per_epoch >= 0; got epochs ", options.epochs, ", batch_size_per_replica ",
        options.batch_size_per_replica, ", steps_per_epoch ", options.steps_per_epoch));
  }
  const int64_t global_batch = options.batch_size_per_replica * replicas;
  const bool fixed_steps = options.steps_per_epoch > 0;
  const int64_t steps_per_epoch = fixed_steps
                                      ? options.steps_per_epoch
                                      : (data.train_examples + global_batch - 1) / global_batch;
  if (steps_per_epoch <= 0) {
    return absl::InvalidArgumentError("the training data is empty: there is nothing to fit");
  }

  const Dataset batches = MakeBatches(data.train, model, global_batch, data.rescale,
                                      options.shuffle_buffer, options.seed, fixed_steps);
  absl::StatusOr<DistributedDataset> distributed = strategy.ExperimentalDistributeDataset(batches);
  if (!distributed.ok()) return distributed.status();

  DistributedVariables variables = strategy.CreateVariables(model.InitialVariables(options.seed));
  std::vector<std::vector<std::vector<Tensor>>> slots(static_cast<size_t>(variables.num_copies()));
  std::vector<std::unique_ptr<Workspace>> workspaces;
  for (int r = 0; r < replicas; ++r) {
    workspaces.push_back(model.NewWorkspace(options.seed * 7919 + static_cast<uint64_t>(r)));
  }
  PerReplica<std::vector<Tensor>> gradients{
      std::vector<std::vector<Tensor>>(static_cast<size_t>(replicas))};
  int64_t iteration = 0;

  FitSummary summary;
  summary.strategy = strategy.name();
  summary.num_replicas_in_sync = replicas;
  Progress progress(options);
  std::unique_ptr<DistributedIterator> iterator;
  double train_seconds = 0;
  int64_t train_examples = 0;

  for (int epoch = 1; epoch <= options.epochs; ++epoch) {
    if (!fixed_steps || iterator == nullptr) iterator = distributed->MakeIterator();
    progress.StartEpoch(epoch, options.epochs, steps_per_epoch);
    const double epoch_start = Now();
    StepStats epoch_stats{};
    int64_t step = 0;
    while (step < steps_per_epoch) {
      absl::StatusOr<std::optional<PerReplica<Element>>> batch = iterator->GetNext();
      if (!batch.ok()) return batch.status();
      if (!batch->has_value()) break;
      const PerReplica<Element>& parts = **batch;
      const float loss_scale = 1.0f / static_cast<float>(Rows(parts));
      absl::StatusOr<PerReplica<StepStats>> stats =
          strategy.Run<StepStats>([&](ReplicaContext& context) -> absl::StatusOr<StepStats> {
            const int r = context.replica_id_in_sync_group();
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
      const StepStats total = Total(*stats);
      epoch_stats.loss_sum += total.loss_sum;
      epoch_stats.correct += total.correct;
      epoch_stats.examples += total.examples;
      const double seen = static_cast<double>(std::max<int64_t>(epoch_stats.examples, 1));
      progress.Step(step, epoch_stats.loss_sum / seen,
                    static_cast<double>(epoch_stats.correct) / seen);
    }
    EpochLog log;
    log.epoch = epoch;
    log.steps = step;
    log.seconds = Now() - epoch_start;
    const double seen = static_cast<double>(std::max<int64_t>(epoch_stats.examples, 1));
    log.loss = epoch_stats.loss_sum / seen;
    log.accuracy = static_cast<double>(epoch_stats.correct) / seen;
    log.examples_per_sec = static_cast<double>(epoch_stats.examples) / std::max(log.seconds, 1e-9);
    train_seconds += log.seconds;
    train_examples += epoch_stats.examples;
    summary.steps += step;
    const bool validate = options.validate && data.has_test;
    if (validate) {
      absl::StatusOr<EpochLog> val =
          EvaluateDataset(strategy, model, loss, variables.primary(), data.test, data.rescale,
                          std::max<int64_t>(global_batch, 256));
      if (!val.ok()) return val.status();
      log.val_loss = val->val_loss;
      log.val_accuracy = val->val_accuracy;
    }
    progress.EndEpoch(log, options.epochs, validate);
    summary.history.push_back(log);
  }

  if (data.has_test) {
    const EpochLog& last = summary.history.back();
    if (options.validate) {
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

nlohmann::json FitSummary::ToJson() const {
  nlohmann::json history_json = nlohmann::json::array();
  for (const EpochLog& log : history) {
    history_json.push_back({{"epoch", log.epoch},
                            {"steps", log.steps},
                            {"loss", log.loss},
                            {"accuracy", log.accuracy},
                            {"val_loss", log.val_loss},
                            {"val_accuracy", log.val_accuracy},
                            {"examples_per_sec", log.examples_per_sec},
                            {"seconds", log.seconds}});
  }
  return {{"test_accuracy", test_accuracy},
          {"test_loss", test_loss},
          {"steps", steps},
          {"examples_per_sec", examples_per_sec},
          {"wall_s", wall_s},
          {"strategy", strategy},
          {"num_replicas_in_sync", num_replicas_in_sync},
          {"num_workers", num_workers},
          {"num_ps", num_ps},
          {"epochs", static_cast<int64_t>(history.size())},
          {"history", history_json}};
}

}  // namespace stratum
