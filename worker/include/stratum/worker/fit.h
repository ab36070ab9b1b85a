// Fit: Keras' model.fit for the strategies that run in one process (Default, OneDevice,
// Mirrored, CentralStorage): epochs over the training data, one training step per global
// batch on every replica, validation on the test set after each epoch, progress output,
// and a summary. Single-threaded API (the strategy runs the replicas).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "nlohmann/json.hpp"
#include "stratum/data/dataset.h"
#include "stratum/data/input_context.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/strategy/strategy.h"

namespace stratum {

struct FitData {
  // Unbatched (x, y) elements; x is raw (uint8 pixels) and `rescale` turns it to float32.
  Dataset train;
  Dataset test;  // may be empty (no validation)
  bool has_test = false;
  int64_t train_examples = 0;
  int64_t test_examples = 0;
  double rescale = 1.0;
};

enum class ProgressStyle { kAuto, kBar, kLines, kNone };

struct FitOptions {
  int epochs = 1;
  int64_t steps_per_epoch = 0;  // 0: one pass over the data per epoch
  int64_t batch_size_per_replica = 64;
  int64_t shuffle_buffer = 10000;
  uint64_t seed = 1;
  bool validate = true;
  ProgressStyle progress = ProgressStyle::kAuto;  // kAuto: a bar on a terminal, else lines
  FILE* out = stdout;
  // With several workers (MultiWorkerMirrored), how the training data is split over them.
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::kAuto;
  // Backup and restore: when set, the training state is saved at the end of every epoch
  // (and every checkpoint_every_steps steps, when > 0), and a Fit that finds a checkpoint
  // there resumes from it. Only the chief writes into it; other workers run the same save
  // path into a temporary folder of their own that they delete.
  std::string checkpoint_dir;
  int64_t checkpoint_every_steps = 0;
  int max_to_keep = 3;
  // Preemption, as TensorFlow's PreemptionCheckpointHandler: once `stop` is notified (a
  // SIGTERM) on any worker, every worker finishes the same step, the state there is saved
  // into checkpoint_dir (when set), and Fit returns an error for which IsStoppedEarly is
  // true. Workers agree with a tiny all-reduce about every 0.1 s (fit_internal::StopVote),
  // whether or not they have a `stop`; one worker looks at every step.
  const absl::Notification* stop = nullptr;
};

struct EpochLog {
  int epoch = 0;
  int64_t steps = 0;
  double loss = 0;
  double accuracy = 0;
  double val_loss = 0;
  double val_accuracy = 0;
  bool validated = false;  // val_loss and val_accuracy were measured (a test set, validate)
  double examples_per_sec = 0;
  double seconds = 0;
};

// An epoch's line in a checkpoint's manifest and in the summary JSON, and back (a missing
// field reads as 0, and val_* only when validated; a field of another type throws
// nlohmann::json::type_error).
nlohmann::json EpochLogJson(const EpochLog& log);
EpochLog EpochLogFromJson(const nlohmann::json& json);

struct FitSummary {
  std::vector<EpochLog> history;
  double test_loss = 0;
  double test_accuracy = 0;
  bool tested = false;  // test_loss and test_accuracy were measured (the job has a test set)
  int64_t steps = 0;
  // Training examples over training time (validation excluded); 0 when this run trained
  // nothing (its checkpoint completed the job), which the summary writes as null.
  double examples_per_sec = 0;
  double wall_s = 0;
  std::string strategy;
  int num_replicas_in_sync = 1;
  int num_workers = 1;
  int num_ps = 0;
  // Where training started: 0, or the step of the checkpoint it resumed from.
  int64_t resumed_from_step = 0;
  // The trained variables (the primary copy).
  std::vector<Tensor> variables;

  // DESIGN.md's summary: test_accuracy, test_loss (null without a test set), steps,
  // examples_per_sec (null when nothing was trained), wall_s, strategy, num_replicas_in_sync,
  // num_workers, num_ps, and the per-epoch history.
  nlohmann::json ToJson() const;
  // The line a training binary ends with: "test accuracy 0.8826, test loss 0.3297, 80714
  // examples/s, 9.2 s".
  std::string ResultLine() const;
};

absl::StatusOr<FitSummary> Fit(Strategy& strategy, const Model& model, const Loss& loss,
                               const Optimizer& optimizer, const FitData& data,
                               const FitOptions& options);

// Whether `status` is Fit's answer to FitOptions::stop: training stopped early, at a step
// every worker agreed on, with the state saved when the job has a checkpoint folder.
bool IsStoppedEarly(const absl::Status& status);

// What a job run again starts from: its checkpoint folder ("" when it has none) and the step
// of the newest checkpoint this run wrote or resumed from there, if any.
struct ResumePoint {
  std::string checkpoint_dir;
  std::optional<int64_t> newest_step;
};

// Keras' TerminateOnNaN, as an error that says where and what to change: training stopped
// after step `iteration` (step `step` of `steps_per_epoch` in epoch `epoch`) because `what`
// (e.g. "the loss is nan") is no longer finite. Nothing past the checkpoints written before
// is saved (training loops check their variables before each save). FAILED_PRECONDITION:
// the same job run again diverges again, so launchers do not restart it.
absl::Status TrainingDiverged(const std::string& what, int64_t iteration, int epoch, int64_t step,
                              int64_t steps_per_epoch, const ResumePoint& resume);

// The test-set loss and accuracy of `variables`, computed over the strategy's replicas.
absl::StatusOr<EpochLog> EvaluateDataset(Strategy& strategy, const Model& model, const Loss& loss,
                                         const std::vector<Tensor>& variables, const Dataset& data,
                                         double rescale, int64_t global_batch);

// The batch pipeline Fit uses: rescaled float32 features, reshaped to the model's input.
Dataset MakeBatches(const Dataset& examples, const Model& model, int64_t global_batch,
                    double rescale, int64_t shuffle_buffer, uint64_t seed, bool repeat,
                    bool drop_remainder = false);

}  // namespace stratum
