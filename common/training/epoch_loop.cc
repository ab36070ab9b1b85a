#include "stratum/training/epoch_loop.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stratum/checkpoint/keras_export.h"
#include "stratum/training/callbacks.h"
#include "stratum/training/evaluate.h"
#include "stratum/training/fit_state.h"
#include "stratum/training/status_page.h"
#include "stratum/training/training_status.h"
#include "stratum/util/metrics.h"
#include "stratum/util/status_macros.h"

namespace stratum {

namespace {

// The training loop's Prometheus series (a coordinator's count the steps it scheduled).
struct TrainingMetrics {
  Counter& steps = MetricsRegistry::Global().GetCounter(
      "stratum_training_steps_total", "Training steps this process's epoch loop ran or scheduled.");
  Counter& examples = MetricsRegistry::Global().GetCounter(
      "stratum_training_examples_total", "Training examples of the epochs ended, every worker's.");
  Histogram& step_seconds = MetricsRegistry::Global().GetHistogram(
      "stratum_training_step_seconds", "Time of one training step on this worker's replicas.",
      SecondsBuckets());
  Gauge& epoch = MetricsRegistry::Global().GetGauge("stratum_training_epoch",
                                                    "The last epoch ended (from 1).");
  Gauge& examples_per_second = MetricsRegistry::Global().GetGauge(
      "stratum_training_examples_per_second", "The last epoch's training speed, every worker's.");
  Gauge& loss = MetricsRegistry::Global().GetGauge("stratum_training_loss",
                                                   "The last epoch's loss.", {{"data", "train"}});
  Gauge& accuracy = MetricsRegistry::Global().GetGauge(
      "stratum_training_accuracy", "The last epoch's accuracy.", {{"data", "train"}});
  Gauge& val_loss = MetricsRegistry::Global().GetGauge(
      "stratum_training_loss", "The last epoch's loss.", {{"data", "validation"}});
  Gauge& val_accuracy = MetricsRegistry::Global().GetGauge(
      "stratum_training_accuracy", "The last epoch's accuracy.", {{"data", "validation"}});
  Gauge& learning_rate = MetricsRegistry::Global().GetGauge(
      "stratum_training_learning_rate", "The optimizer's learning rate at the last epoch's end.");

  static TrainingMetrics& Get() {
    static auto* metrics = new TrainingMetrics();
    return *metrics;
  }
};

}  // namespace

double EpochLoopNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

// Progress in Keras' style: a bar redrawn in place on a terminal, one line per epoch else.
class Progress {
 public:
  explicit Progress(const FitOptions& options) : out_(options.out) {
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
    const double now = EpochLoopNow();
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

  // Ends a bar left half-drawn (training stopped mid-epoch).
  void Interrupt() {
    if (style_ != ProgressStyle::kBar) return;
    std::fprintf(out_, "\n");
    std::fflush(out_);
  }

  void EndEpoch(const EpochLog& log, int epochs, const StepRunner::EpochLineNotes& notes) {
    if (style_ == ProgressStyle::kNone) return;
    std::string text = absl::StrFormat("loss %.4f - accuracy %.4f", log.loss, log.accuracy);
    if (log.auc) absl::StrAppend(&text, absl::StrFormat(" - auc %.4f", *log.auc));
    if (log.validated) {
      absl::StrAppend(&text, absl::StrFormat(" - val_loss %.4f - val_accuracy %.4f", log.val_loss,
                                             log.val_accuracy));
      if (log.val_auc) absl::StrAppend(&text, absl::StrFormat(" - val_auc %.4f", *log.val_auc));
    }
    absl::StrAppend(
        &text, absl::StrFormat(" - %.0f examples/s - %.2fs", log.examples_per_sec, log.seconds));
    if (style_ == ProgressStyle::kBar) {
      std::fprintf(out_, "\r%6lld/%lld - %s\n", static_cast<long long>(log.steps),
                   static_cast<long long>(log.steps), text.c_str());
    } else {
      std::fprintf(out_, "Epoch %d/%d%s - %lld steps%s - %s\n", log.epoch, epochs,
                   notes.after_epoch.c_str(), static_cast<long long>(log.steps),
                   notes.after_steps.c_str(), text.c_str());
    }
    std::fflush(out_);
  }

 private:
  FILE* out_;
  ProgressStyle style_;
  int64_t steps_ = 0;
  double last_draw_ = 0;
};

// FitOptions::stop across workers: whether training stops after a step, the same answer on
// every worker, and whether any worker saw its training diverge. With several workers they
// vote with a 12-byte all-reduce at steps they all
// compute alike: each vote also sums every worker's proposal for the next one, the steps
// it trains in about kStopVoteInterval, so the votes cost little and a stop comes soon.
class StopVote {
 public:
  static constexpr double kStopVoteInterval = 0.1;  // seconds

  // What every worker agreed on after a step: to stop (FitOptions::stop was notified on
  // some worker), or that training diverged (some worker's loss was not finite).
  struct Agreed {
    bool stop = false;
    bool diverged = false;
    int diverged_workers = 0;  // how many workers saw a loss that is not finite
    int diverged_worker = -1;  // its index, when there is one
  };
  // Call after every step (`iteration` counts from the job's start), on every worker;
  // `diverged_here`: this worker has seen a loss that is not finite.
  absl::StatusOr<Agreed> AfterStep(const Strategy& strategy, const FitOptions& options,
                                   int64_t iteration, bool diverged_here);

 private:
  int64_t next_vote_ = 0;  // the first step of the run votes
  int64_t last_vote_iteration_ = -1;
  double last_vote_time_ = 0;
};

absl::StatusOr<StopVote::Agreed> StopVote::AfterStep(const Strategy& strategy,
                                                     const FitOptions& options, int64_t iteration,
                                                     bool diverged_here) {
  const bool here = options.stop != nullptr && options.stop->HasBeenNotified();
  if (strategy.num_workers() == 1) {
    return Agreed{.stop = here, .diverged = diverged_here, .diverged_workers = diverged_here};
  }
  if (iteration < next_vote_) return Agreed{};
  // This worker's proposal: the steps it trains in about kStopVoteInterval.
  const double now = EpochLoopNow();
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

// What diverged, as TrainingDiverged words it: "the loss on worker:1 is not finite".
std::string WhoseLossDiverged(const std::vector<std::string>& names,
                              const StopVote::Agreed& agreed) {
  if (agreed.diverged_worker < 0) {
    return absl::StrCat("the loss of ", agreed.diverged_workers, " workers is not finite");
  }
  const size_t index = static_cast<size_t>(agreed.diverged_worker);
  return absl::StrCat(
      "the loss on ",
      index < names.size() ? names[index] : absl::StrCat("worker ", agreed.diverged_worker),
      " is not finite");
}

// Says where a Fit that found a checkpoint goes on from, or that the checkpoint already
// completes the job (and whether its model is evaluated on the test set, `has_test`). Said
// whatever the progress style: where training starts is not progress.
void SayResumed(const FitOptions& options, const FitState& state, bool has_test,
                const std::string& stopped_by) {
  if (!stopped_by.empty() && state.epoch < options.epochs) {
    std::fprintf(options.out,
                 "the checkpoint at step %lld completes this job: %s stopped its training after "
                 "epoch %lld; %s (remove %s to train from scratch)\n",
                 static_cast<long long>(state.iteration), stopped_by.c_str(),
                 static_cast<long long>(state.epoch),
                 has_test ? "evaluating its model on data.test" : "nothing left to train",
                 options.checkpoint_dir.c_str());
  } else if (state.epoch >= options.epochs) {
    std::fprintf(options.out,
                 "the checkpoint at step %lld in %s already completes this job's %d epochs: %s "
                 "(remove %s to train from scratch)\n",
                 static_cast<long long>(state.iteration), options.checkpoint_dir.c_str(),
                 options.epochs,
                 has_test ? "evaluating its model on data.test" : "nothing left to train",
                 options.checkpoint_dir.c_str());
  } else {
    std::fprintf(options.out, "resumed from checkpoint step %lld (epoch %lld, step %lld)\n",
                 static_cast<long long>(state.iteration), static_cast<long long>(state.epoch + 1),
                 static_cast<long long>(state.step_in_epoch));
  }
  // Said when it happens, not when a buffer (a pipe's, under a launcher) next fills.
  std::fflush(options.out);
}

// TrainingDiverged when an epoch's loss over every worker is not finite (the same answer
// on every worker); `steps` of the epoch ended after step `iteration`.
absl::Status CheckEpochLoss(double loss, int64_t iteration, int epoch, int64_t steps,
                            const ResumePoint& resume) {
  if (std::isfinite(loss)) return absl::OkStatus();
  return TrainingDiverged(absl::StrCat("the epoch's loss is ", loss), iteration, epoch, steps,
                          steps, resume);
}

// RunEpochs' state: the loop's position (iteration_, stopping_), the history so far and what
// the summary adds up. Its methods are the loop's parts.
class EpochLoop : public CallbackHost {
 public:
  EpochLoop(Strategy& strategy, const Model& model, const Optimizer& optimizer,
            const FitOptions& options, const EpochLoopSpec& spec, FitState state,
            StepRunner& runner)
      : strategy_(strategy),
        model_(model),
        optimizer_(optimizer),
        options_(options),
        spec_(spec),
        state_(std::move(state)),
        runner_(runner),
        progress_(options),
        resume_(ResumeFrom(options, state_)),
        iteration_(state_.iteration) {}

  absl::StatusOr<FitSummary> Run();

  // CallbackHost, for the callbacks.
  bool writes_files() const override { return strategy_.worker_index() == 0; }
  FILE* out() const override { return options_.out; }
  bool has_step_logs() const override { return runner_.HasStepStats(); }
  float learning_rate() const override {
    return learning_rate_.value_or(optimizer_.learning_rate(iteration_));
  }
  absl::Status SetLearningRate(float rate) override;
  absl::StatusOr<std::vector<Tensor>> GetWeights() override;
  absl::Status SetWeights(const std::vector<Tensor>& weights) override;
  absl::Status SaveModel(const std::string& path, bool weights_only) override;

 private:
  absl::Status TrainEpoch(int epoch);
  // How many steps to ask the runner for at `step`: StepsPerCall, clipped at the epoch's end
  // and at the checkpoint cadence.
  int64_t StepsToAsk(int64_t step) const;
  // The steps of `epoch` from `step` on; `step` and `epoch_stats` follow them.
  absl::Status RunSteps(int epoch, int64_t& step, StepStats& epoch_stats);
  // The epoch's figures, validation, line, history and backup.
  absl::Status EndEpoch(int epoch, int64_t first_step, int64_t step, StepStats epoch_stats,
                        double epoch_start);
  // Saves the state after `epochs_done` epochs and `step_in_epoch` steps of the next.
  absl::Status Backup(int64_t epochs_done, int64_t step_in_epoch, const StepStats& epoch_stats);
  // Where a rerun goes on from: the runner's answer, else the loop's record.
  ResumePoint Resume() const { return runner_.ResumeFrom().value_or(resume_); }
  // The summary's test figures: the last epoch's validation, when this run trained it; a
  // checkpoint that completed the job already is evaluated anew (data.test may have changed
  // since it was saved).
  absl::Status Test(int64_t restored_epochs);

  Strategy& strategy_;
  const Model& model_;
  const Optimizer& optimizer_;
  const FitOptions& options_;
  const EpochLoopSpec& spec_;
  FitState state_;
  StepRunner& runner_;
  Progress progress_;
  StopVote stop_vote_;
  ResumePoint resume_;  // where a rerun goes on from: the newest save
  FitSummary summary_;
  int64_t iteration_;
  std::vector<std::unique_ptr<Callback>> callbacks_;
  std::optional<float> learning_rate_;  // set by a callback (ReduceLROnPlateau)
  std::string stopped_by_;              // the callback that stopped training in this run
  bool weights_set_ = false;            // a callback set the variables (restore_best_weights)
  int trained_epochs_ = 0;              // epochs this run trained
  bool stopping_ = false;               // FitOptions::stop: every worker agreed to stop
  bool diverged_here_ = false;          // a step's loss on this worker was not finite
  double train_seconds_ = 0;
  int64_t train_examples_ = 0;
};

absl::StatusOr<FitSummary> EpochLoop::Run() {
  summary_.strategy = strategy_.name();
  summary_.num_replicas_in_sync = strategy_.NumReplicasInSync();
  summary_.num_workers = strategy_.num_workers();
  summary_.resumed_from_step = state_.iteration;
  for (const nlohmann::json& log : state_.history) {
    summary_.history.push_back(EpochLogFromJson(log));
    summary_.steps += summary_.history.back().steps;
  }
  // A callback stopped the run that saved this state: the job is complete.
  const std::string stopped_before = summary_.history.empty() || state_.step_in_epoch > 0
                                         ? ""
                                         : summary_.history.back().stopped_by;
  if ((spec_.say_resumed && (state_.epoch > 0 || state_.step_in_epoch > 0)) ||
      !stopped_before.empty()) {
    SayResumed(options_, state_, spec_.has_test, stopped_before);
  }
  StatusBoard::Global().StartRun(
      spec_.strategy_name.empty() ? strategy_.name() : spec_.strategy_name, options_.epochs,
      spec_.steps_per_epoch, summary_.history);
  STRATUM_ASSIGN_OR_RETURN(callbacks_, MakeCallbacks(options_.callbacks));
  std::vector<Logs> history;
  for (const EpochLog& log : summary_.history) history.push_back(LogsOf(log, options_.metrics));
  for (const std::unique_ptr<Callback>& callback : callbacks_) {
    STRATUM_RETURN_IF_ERROR(callback->OnTrainBegin(history, *this));
  }
  const int64_t restored_epochs = state_.epoch;
  for (int epoch = static_cast<int>(state_.epoch) + 1;
       epoch <= options_.epochs && stopped_before.empty() && stopped_by_.empty(); ++epoch) {
    STRATUM_RETURN_IF_ERROR(TrainEpoch(epoch));
  }
  for (const std::unique_ptr<Callback>& callback : callbacks_) {
    STRATUM_RETURN_IF_ERROR(callback->OnTrainEnd(*this));
  }
  // A callback put other variables in place (restore_best_weights): the job's last
  // checkpoint is saved again with them, so that a run again of the complete job reports the
  // model this run reported.
  if (weights_set_ && trained_epochs_ > 0 && !options_.checkpoint_dir.empty()) {
    STRATUM_RETURN_IF_ERROR(Backup(summary_.history.back().epoch, 0, StepStats{}));
  }
  STRATUM_RETURN_IF_ERROR(Test(restored_epochs));
  summary_.examples_per_sec = static_cast<double>(train_examples_) / std::max(train_seconds_, 1e-9);
  STRATUM_RETURN_IF_ERROR(runner_.GetState(&summary_.variables, nullptr));
  summary_.wall_s = EpochLoopNow() - spec_.start;
  return std::move(summary_);
}

absl::Status EpochLoop::TrainEpoch(int epoch) {
  const bool resuming_mid_epoch = epoch == state_.epoch + 1 && state_.step_in_epoch > 0;
  const int64_t first_step = resuming_mid_epoch ? state_.step_in_epoch : 0;
  STRATUM_RETURN_IF_ERROR(runner_.StartEpoch(epoch, first_step));
  progress_.StartEpoch(epoch, options_.epochs, spec_.steps_per_epoch);
  const double epoch_start = runner_.EpochStart().value_or(EpochLoopNow());
  StepStats epoch_stats = resuming_mid_epoch ? state_.epoch_stats : StepStats{};
  int64_t step = first_step;
  STRATUM_RETURN_IF_ERROR(RunSteps(epoch, step, epoch_stats));
  return EndEpoch(epoch, first_step, step, epoch_stats, epoch_start);
}

int64_t EpochLoop::StepsToAsk(int64_t step) const {
  int64_t steps = std::min(runner_.StepsPerCall(), spec_.steps_per_epoch - step);
  const int64_t every = options_.checkpoint_every_steps;
  if (!options_.checkpoint_dir.empty() && every > 0) {
    steps = std::min(steps, every - iteration_ % every);
  }
  return std::max<int64_t>(steps, 1);
}

absl::Status EpochLoop::RunSteps(int epoch, int64_t& step, StepStats& epoch_stats) {
  const int64_t steps_per_epoch = spec_.steps_per_epoch;
  while (step < steps_per_epoch) {
    const double began = EpochLoopNow();
    STRATUM_ASSIGN_OR_RETURN(const StepRunner::StepResult result,
                             runner_.Steps(epoch, step, iteration_, StepsToAsk(step)));
    if (result.data_ended) break;
    TrainingMetrics::Get().steps.Add(static_cast<double>(result.steps));
    if (runner_.HasStepStats()) {  // the steps ran by now: their time is theirs
      TrainingMetrics::Get().step_seconds.Observe((EpochLoopNow() - began) /
                                                  static_cast<double>(result.steps));
    }
    iteration_ += result.steps;
    step += result.steps;
    StatusBoard::Global().SetStep(epoch, step);
    if (runner_.HasStepStats()) {
      Accumulate(epoch_stats, result.stats);
      const double seen = static_cast<double>(std::max<int64_t>(epoch_stats.examples, 1));
      progress_.Step(step, epoch_stats.loss_sum / seen,
                     static_cast<double>(epoch_stats.correct) / seen);
      if (!std::isfinite(result.stats.loss_sum)) diverged_here_ = true;
      if (!callbacks_.empty()) {
        // This worker's figures of the epoch so far, as Keras' batch logs are a replica's.
        EpochLog so_far;
        so_far.loss = epoch_stats.loss_sum / seen;
        so_far.accuracy = static_cast<double>(epoch_stats.correct) / seen;
        const Logs logs = LogsOf(so_far, options_.metrics);
        for (const std::unique_ptr<Callback>& callback : callbacks_) {
          STRATUM_RETURN_IF_ERROR(callback->OnTrainBatchEnd(iteration_ - 1, logs, *this));
        }
      }
    }
    // Without figures per step, the loss stays on the device until the epoch ends:
    // divergence is found there, or by the check of the variables before a save.
    STRATUM_ASSIGN_OR_RETURN(const StopVote::Agreed agreed,
                             stop_vote_.AfterStep(strategy_, options_, iteration_, diverged_here_));
    if (agreed.diverged) {
      progress_.Interrupt();
      return TrainingDiverged(strategy_.num_workers() == 1
                                  ? absl::StrCat("the loss is ", result.stats.loss_sum)
                                  : WhoseLossDiverged(spec_.worker_names, agreed),
                              iteration_, epoch, step, steps_per_epoch, Resume());
    }
    stopping_ = agreed.stop;
    const bool periodic =
        options_.checkpoint_every_steps > 0 && iteration_ % options_.checkpoint_every_steps == 0;
    if (!options_.checkpoint_dir.empty() && (periodic || stopping_) && step < steps_per_epoch) {
      STRATUM_RETURN_IF_ERROR(runner_.Sync());
      STRATUM_RETURN_IF_ERROR(runner_.TakeStats(epoch_stats));
      STRATUM_RETURN_IF_ERROR(Backup(epoch - 1, step, epoch_stats));
    }
    // Stopped at the epoch's last step: the epoch ends (and is saved) first.
    if (stopping_ && step < steps_per_epoch) {
      STRATUM_RETURN_IF_ERROR(runner_.Sync());
      progress_.Interrupt();
      return StoppedEarly(options_, iteration_, epoch, step, steps_per_epoch);
    }
  }
  return absl::OkStatus();
}

absl::Status EpochLoop::EndEpoch(int epoch, int64_t first_step, int64_t step, StepStats epoch_stats,
                                 double epoch_start) {
  // What the device holds since the last mid-epoch backup (or the checkpoint this run
  // resumed from), then the epoch's figures over every worker.
  STRATUM_RETURN_IF_ERROR(runner_.Sync());
  STRATUM_RETURN_IF_ERROR(runner_.TakeStats(epoch_stats));
  EpochLog log;
  log.epoch = epoch;
  log.steps = step;
  log.seconds = EpochLoopNow() - epoch_start;
  STRATUM_RETURN_IF_ERROR(SumOverWorkers(strategy_, epoch_stats));
  STRATUM_ASSIGN_OR_RETURN(const int64_t trained, runner_.ExamplesTrained(first_step, step));
  const double seen = static_cast<double>(std::max<int64_t>(epoch_stats.examples, 1));
  log.loss = epoch_stats.loss_sum / seen;
  log.accuracy = static_cast<double>(epoch_stats.correct) / seen;
  if (MeasuresAuc(options_.metrics) && !epoch_stats.auc.empty()) log.auc = epoch_stats.auc.Auc();
  if (absl::Status finite = CheckEpochLoss(log.loss, iteration_, epoch, step, Resume());
      !finite.ok()) {
    progress_.Interrupt();
    return finite;
  }
  log.examples_per_sec = static_cast<double>(trained) / std::max(log.seconds, 1e-9);
  train_seconds_ += log.seconds;
  train_examples_ += trained;
  summary_.steps += step;
  if (!runner_.HasStepStats()) progress_.Step(step, log.loss, log.accuracy);
  if (options_.validate && spec_.has_test) {
    STRATUM_ASSIGN_OR_RETURN(const EpochLog val, runner_.Evaluate());
    log.val_loss = val.val_loss;
    log.val_accuracy = val.val_accuracy;
    if (MeasuresAuc(options_.metrics)) log.val_auc = val.val_auc;
    log.validated = true;
  }
  ++trained_epochs_;
  // Keras' on_epoch_end: every callback in order, on one logs dict they may add to.
  Logs logs = LogsOf(log, options_.metrics);
  for (const std::unique_ptr<Callback>& callback : callbacks_) {
    STRATUM_RETURN_IF_ERROR(callback->OnEpochEnd(epoch - 1, logs, log, *this));
    if (callback->stop_training() && stopped_by_.empty()) stopped_by_ = callback->name();
  }
  log.stopped_by = stopped_by_;
  TrainingMetrics& metrics = TrainingMetrics::Get();
  metrics.examples.Add(static_cast<double>(trained));
  metrics.epoch.Set(epoch);
  metrics.examples_per_second.Set(log.examples_per_sec);
  metrics.loss.Set(log.loss);
  metrics.accuracy.Set(log.accuracy);
  if (log.validated) {
    metrics.val_loss.Set(log.val_loss);
    metrics.val_accuracy.Set(log.val_accuracy);
  }
  metrics.learning_rate.Set(learning_rate());
  StatusBoard::Global().EndEpoch(log);
  summary_.history.push_back(log);
  state_.history.push_back(EpochLogJson(log));
  const StepRunner::BackupPolicy backups = runner_.Backups();
  const bool backup = !options_.checkpoint_dir.empty() &&
                      (backups.every_epoch_end || options_.checkpoint_every_steps <= 0 ||
                       iteration_ % options_.checkpoint_every_steps == 0);
  if (backup && backups.before_epoch_line) {
    STRATUM_RETURN_IF_ERROR(Backup(epoch, 0, StepStats{}));
  }
  progress_.EndEpoch(log, options_.epochs, runner_.EpochEnded(log));
  if (backup && !backups.before_epoch_line) {
    STRATUM_RETURN_IF_ERROR(Backup(epoch, 0, StepStats{}));
  }
  if (stopping_ && epoch < options_.epochs) {
    return StoppedEarly(options_, iteration_, epoch, step, spec_.steps_per_epoch);
  }
  return absl::OkStatus();
}

absl::Status EpochLoop::Backup(int64_t epochs_done, int64_t step_in_epoch,
                               const StepStats& epoch_stats) {
  FitState now;
  now.epoch = epochs_done;
  now.step_in_epoch = step_in_epoch;
  now.iteration = iteration_;
  now.epoch_stats = epoch_stats;
  now.history = state_.history;
  if (runner_.Backups().by_runner) {
    STRATUM_RETURN_IF_ERROR(runner_.BackUp(now));
    resume_.newest_step = iteration_;
    return absl::OkStatus();
  }
  STRATUM_RETURN_IF_ERROR(runner_.GetState(&now.variables, &now.slots));
  return BackupFitState(strategy_, model_, optimizer_, options_, spec_.steps_per_epoch,
                        std::move(now), resume_);
}

absl::Status EpochLoop::Test(int64_t restored_epochs) {
  if (!spec_.has_test) return absl::OkStatus();
  summary_.tested = true;
  // The last epoch's validation measured the variables this run ends with, unless a
  // callback set them since.
  if (options_.epochs > restored_epochs && trained_epochs_ > 0 && !weights_set_ &&
      summary_.history.back().validated) {
    summary_.test_loss = summary_.history.back().val_loss;
    summary_.test_accuracy = summary_.history.back().val_accuracy;
    summary_.test_auc = summary_.history.back().val_auc;
    return absl::OkStatus();
  }
  STRATUM_ASSIGN_OR_RETURN(const EpochLog test, runner_.Evaluate());
  summary_.test_loss = test.val_loss;
  summary_.test_accuracy = test.val_accuracy;
  if (MeasuresAuc(options_.metrics)) summary_.test_auc = test.val_auc;
  return absl::OkStatus();
}

absl::Status EpochLoop::SetLearningRate(float rate) {
  if (optimizer_.learning_rate_schedule().is_schedule()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a callback sets the learning rate, and the optimizer's learning_rate is the schedule ",
        optimizer_.learning_rate_schedule().name(),
        ", which decides it at every step (Keras refuses this too): use a constant "
        "learning_rate with ReduceLROnPlateau, or the schedule alone"));
  }
  STRATUM_RETURN_IF_ERROR(runner_.SetLearningRate(rate));
  learning_rate_ = rate;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> EpochLoop::GetWeights() { return runner_.CurrentVariables(); }

absl::Status EpochLoop::SaveModel(const std::string& path, bool weights_only) {
  STRATUM_ASSIGN_OR_RETURN(const std::vector<Tensor> variables, runner_.CurrentVariables());
  return weights_only ? WriteKerasWeightsFile(options_.model_json, model_, variables, path)
                      : ExportKerasModel(options_.model_json, model_, variables, path);
}

absl::Status EpochLoop::SetWeights(const std::vector<Tensor>& weights) {
  STRATUM_RETURN_IF_ERROR(runner_.SetVariables(weights));
  weights_set_ = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FitSummary> RunEpochs(Strategy& strategy, const Model& model,
                                     const Optimizer& optimizer, const FitOptions& options,
                                     const EpochLoopSpec& spec, FitState state,
                                     StepRunner& runner) {
  EpochLoop loop(strategy, model, optimizer, options, spec, std::move(state), runner);
  absl::StatusOr<FitSummary> summary = loop.Run();
  StatusBoard::Global().EndRun(
      !summary.ok() ? std::string(summary.status().message())
      : summary->history.empty() || summary->history.back().stopped_by.empty()
          ? "complete"
          : absl::StrCat("complete: ", summary->history.back().stopped_by, " stopped it"));
  return summary;
}

}  // namespace stratum
