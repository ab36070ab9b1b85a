// What Fit (fit.cc) and the GPU path of Fit (gpu_fit.cc) share: progress output, the
// epoch log's JSON, the training state at the start (restored or fresh) and backups.
// Internal to worker/. Single-threaded, as Fit.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "stratum/worker/fit.h"
#include "stratum/worker/fit_checkpoint.h"

namespace stratum {

#if STRATUM_WITH_CUDA
// Fit on the strategy's GPUs (every local replica on a GPU; one worker, or several in
// lock-step). UNIMPLEMENTED when the GPU path cannot train this job (the caller then trains
// on the CPU), always before the first collective, so that every worker decides alike;
// other errors are the job's.
absl::StatusOr<FitSummary> FitOnGpus(Strategy& strategy, const Model& model, const Loss& loss,
                                     const Optimizer& optimizer, const FitData& data,
                                     const FitOptions& options);
#endif

namespace fit_internal {

#if STRATUM_WITH_CUDA
// The examples of `dataset` (at most `examples`) as two tensors (features, labels), in
// order. UNIMPLEMENTED when it yields no (features, labels) pairs.
absl::StatusOr<std::pair<Tensor, Tensor>> Materialize(const Dataset& dataset, int64_t examples);
// The same for training data the GPU path keeps on the GPU: also UNIMPLEMENTED when the
// features are not uint8 (the job trains on the CPU), INVALID_ARGUMENT when an example is
// not `model`'s input size.
absl::StatusOr<std::pair<Tensor, Tensor>> MaterializeTrainingData(const Dataset& dataset,
                                                                  int64_t examples,
                                                                  const Model& model);
// The example order of one epoch: full shuffles of the n examples, `length` indices, a
// function of the seed and the epoch.
void DrawOrder(uint64_t seed, int64_t epoch, int64_t n, int64_t length, int32_t* out);
#endif

// Examples per step over every replica of every worker.
inline int64_t GlobalBatch(const Strategy& strategy, const FitOptions& options) {
  return options.batch_size_per_replica * strategy.NumReplicasInSync();
}

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
// What diverged, as TrainingDiverged words it: "the loss on worker:1 is not finite".
std::string WhoseLossDiverged(const Strategy& strategy, const StopVote::Agreed& agreed);

// Says where a Fit that found a checkpoint goes on from, or that the checkpoint already
// completes the job (and whether its model is evaluated on the test set, `has_test`).
void SayResumed(const FitOptions& options, const FitState& state, bool has_test);

// Seconds on a steady clock.
double Now();

// The training state as the chief has it (restored from its checkpoint, or fresh), the same
// on every worker afterwards: the chief decides and broadcasts. A checkpoint this run
// cannot resume from where it stands is refused (FAILED_PRECONDITION, with the fix): one in
// the middle of an epoch with another global batch or number of workers, or one further
// into its epoch than the run's `steps_per_epoch` allow.
absl::StatusOr<FitState> StartState(Strategy& strategy, const Model& model,
                                    const Optimizer& optimizer, const FitOptions& options,
                                    int64_t steps_per_epoch);
// Every worker runs the save path; only the chief's lands in the job's folder. Variables
// that are not finite are never saved: training diverged (TrainingDiverged), and every
// worker, holding the same variables, says so at the same step. A save records its step
// in `resume`.
absl::Status Backup(const Strategy& strategy, const Model& model, const Optimizer& optimizer,
                    const FitOptions& options, int64_t steps_per_epoch, FitState state,
                    ResumePoint& resume);

// Where a run that began at `started` (StartState's answer) resumes from, until it saves.
ResumePoint ResumeFrom(const FitOptions& options, const FitState& started);

// TrainingDiverged when an epoch's loss over every worker is not finite (the same answer
// on every worker); `steps` of the epoch ended after step `iteration`.
absl::Status CheckEpochLoss(double loss, int64_t iteration, int epoch, int64_t steps,
                            const ResumePoint& resume);

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

  // Ends a bar left half-drawn (training stopped mid-epoch).
  void Interrupt() {
    if (style_ != ProgressStyle::kBar) return;
    std::fprintf(out_, "\n");
    std::fflush(out_);
  }

  void EndEpoch(const EpochLog& log, int epochs) {
    if (style_ == ProgressStyle::kNone) return;
    std::string text = absl::StrFormat("loss %.4f - accuracy %.4f", log.loss, log.accuracy);
    if (log.validated) {
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

}  // namespace fit_internal
}  // namespace stratum
