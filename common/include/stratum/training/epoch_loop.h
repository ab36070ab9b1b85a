// The one epoch loop of Keras' model.fit on a worker's local replicas (Fit on the CPU and
// Fit on GPUs, one worker or several in lock-step): the progress output, the steps of each
// epoch through a StepRunner, the preemption vote and the divergence check after every
// step, backups at the checkpoint cadence and at every epoch's end, validation, the history
// and the summary. What differs between devices is the StepRunner: where the variables and
// the data live and how one step runs. The parameter-server job's closures on its workers
// (coordinator/ps_training.cc) are a StepRunner too; how they differ from Fit (several steps
// a call, their own backups, stop and epoch line) is said through the runner's hooks.
//
// Single-threaded: RunEpochs calls its runner from the calling thread. With several workers
// every worker runs it, and the collectives it makes (the stop vote, an epoch's sums,
// backups) and those its runner makes come in the same order on every worker.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/strategy/strategy.h"
#include "stratum/tensor/tensor.h"
#include "stratum/training/fit_checkpoint.h"
#include "stratum/training/fit_options.h"
#include "stratum/training/fit_summary.h"
#include "stratum/training/training_status.h"

namespace stratum {

// One worker's training steps on its local replicas, or the parameter-server job's closures
// on its workers. RunEpochs owns the order of calls: per epoch StartEpoch, then Steps until
// the epoch's steps are done (with Sync, TakeStats and GetState or BackUp around backups),
// then Sync, TakeStats, ExamplesTrained, Evaluate and EpochEnded.
class StepRunner {
 public:
  virtual ~StepRunner() = default;

  // Whether Step returns each step's figures on the host (the CPU); otherwise they stay on
  // the device and TakeStats collects them (the GPU), and divergence is found from an
  // epoch's loss or from the variables before a save.
  virtual bool HasStepStats() const = 0;

  // Before the steps of `epoch` (from 1), the first of which is `first_step` (> 0 when the
  // run resumes in the middle of the epoch): positions the data.
  virtual absl::Status StartEpoch(int epoch, int64_t first_step) = 0;

  struct StepResult {
    bool data_ended = false;  // the data ended before the epoch's steps: no step ran
    StepStats stats;          // this worker's figures of the step, when HasStepStats
    int64_t steps = 1;        // the steps trained (Steps may train several)
  };
  // Runs step `step` (from 0) of `epoch`, optimizer update `iteration` (from 0 at the job's
  // start) on every local replica, gradients reduced over every replica in sync.
  virtual absl::StatusOr<StepResult> Step(int epoch, int64_t step, int64_t iteration) = 0;

  // Waits, within its deadline, for the work in flight that the host reads next (the GPU's
  // collectives), so the host never blocks behind a dead peer.
  virtual absl::Status Sync() = 0;
  // Adds to `into` the figures the steps left on the device since the last call, and zeroes
  // them there; after Sync. Nothing with HasStepStats.
  virtual absl::Status TakeStats(StepStats& into) = 0;
  // The examples every worker trained in steps [first_step, last_step) of the current
  // epoch, in this run. A collective with several workers.
  virtual absl::StatusOr<int64_t> ExamplesTrained(int64_t first_step, int64_t last_step) = 0;
  // The primary copy of the variables and, when `slots` is set, the optimizer's slots.
  virtual absl::Status GetState(std::vector<Tensor>* variables,
                                std::vector<std::vector<Tensor>>* slots) = 0;
  // The test set's loss and accuracy of the current variables (val_loss, val_accuracy). A
  // collective with several workers.
  virtual absl::StatusOr<EpochLog> Evaluate() = 0;

  // Hooks for a runner that is not Fit's (the parameter-server job's closures); their
  // defaults are Fit's behaviour.

  // How many steps one call of Steps may train (steps_per_execution). The loop asks for at
  // most this many, clipped at the epoch's end and at the checkpoint cadence.
  virtual int64_t StepsPerCall() const { return 1; }
  // Trains up to `count` (<= StepsPerCall) steps from step `step` of `epoch`, iteration
  // `iteration`; StepResult::steps says how many it did. By default one Step.
  virtual absl::StatusOr<StepResult> Steps(int epoch, int64_t step, int64_t iteration,
                                           int64_t /*count*/) {
    return Step(epoch, step, iteration);
  }

  // When the current epoch began (EpochLoopNow()), if before its StartEpoch: a runner that
  // goes on with an epoch it began before (after a failure) keeps its time; nullopt: now.
  virtual std::optional<double> EpochStart() const { return std::nullopt; }

  // Where backups go and when: Fit writes FitState checkpoints itself (BackupFitState) at
  // the cadence and at every epoch's end, after the epoch's line.
  struct BackupPolicy {
    // The runner saves through BackUp (its variables live elsewhere): the loop reads none.
    bool by_runner = false;
    // An epoch's end is saved even off the checkpoint cadence (when it has one).
    bool every_epoch_end = true;
    // The save at an epoch's end comes before its line: an epoch reported is saved.
    bool before_epoch_line = false;
  };
  virtual BackupPolicy Backups() const { return {}; }
  // Where a run of the job again resumes from, for a runner that also saves outside the
  // loop's backups; nullopt: where the loop's own backups (or its start) leave it.
  virtual std::optional<ResumePoint> ResumeFrom() const { return std::nullopt; }
  // Saves `state` (its variables and slots empty), with BackupPolicy::by_runner.
  virtual absl::Status BackUp(const FitState& /*state*/) {
    return absl::UnimplementedError("this step runner has no backup of its own");
  }

  // For callbacks: a copy of the trained variables now (ModelCheckpoint, EarlyStopping's
  // restore_best_weights). By default GetState's.
  virtual absl::StatusOr<std::vector<Tensor>> CurrentVariables() {
    std::vector<Tensor> variables;
    absl::Status got = GetState(&variables, nullptr);
    if (!got.ok()) return got;
    std::vector<Tensor> copies;
    for (const Tensor& variable : variables) copies.push_back(variable.Clone());
    return copies;
  }
  // For callbacks (ReduceLROnPlateau, EarlyStopping's restore_best_weights): the learning
  // rate of the steps from now on, and the variables (every copy, on every worker alike).
  // UNIMPLEMENTED by default.
  virtual absl::Status SetLearningRate(float /*rate*/) {
    return absl::UnimplementedError(
        "this job's training cannot change its learning rate while it trains");
  }
  virtual absl::Status SetVariables(const std::vector<Tensor>& /*variables*/) {
    return absl::UnimplementedError("this job's training cannot set its variables");
  }

  // What the epoch's line adds after "Epoch i/n" and after "N steps" (lines progress).
  struct EpochLineNotes {
    std::string after_epoch;
    std::string after_steps;
  };
  // Called once for each epoch the loop reports, just before its line (after a backup that
  // comes before it): the epoch is done.
  virtual EpochLineNotes EpochEnded(const EpochLog& /*log*/) { return {}; }
};

// What the loop needs besides FitOptions and the runner.
struct EpochLoopSpec {
  int64_t steps_per_epoch = 0;
  bool has_test = false;  // the job has a test set: validation and the summary's test_*
  double start = 0;       // the run's start (EpochLoopNow()), for the summary's wall_s
  // Every worker's name in sync ("worker:1"), for the divergence message; empty: "worker N".
  std::vector<std::string> worker_names;
  // Whether the loop says where a resumed run goes on from (SayResumed); a runner that says
  // it its own way turns it off.
  bool say_resumed = true;
  // The strategy the job trains with, for the status page; empty: the loop's strategy's
  // (the parameter-server job's loop runs on the coordinator's evaluation strategy).
  std::string strategy_name;
};

// Trains the epochs after `state` (StartFitState's answer, the same on every worker) and
// returns the summary, the trained variables included. FitOptions::callbacks run around the
// epochs; one that stops training (EarlyStopping) ends the job after that epoch. Errors: the
// runner's; those of FitOptions::stop (IsStoppedEarly) and of divergence (TrainingDiverged); a
// backup's.
absl::StatusOr<FitSummary> RunEpochs(Strategy& strategy, const Model& model,
                                     const Optimizer& optimizer, const FitOptions& options,
                                     const EpochLoopSpec& spec, FitState state, StepRunner& runner);

// Seconds on a steady clock.
double EpochLoopNow();

}  // namespace stratum
