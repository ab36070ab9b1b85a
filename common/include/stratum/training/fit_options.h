// What a training binary's epoch loop takes: the data (FitData, unbatched examples and their
// counts) and the options of Keras' model.fit (FitOptions: epochs, batch, shuffle, progress
// output, backup and restore, preemption). Plain structs, shared by the single-process and
// multi-worker Fit (worker/) and the parameter-server job (coordinator/); copying one is
// cheap (datasets share their source). Not synchronized.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "stratum/data/dataset.h"
#include "stratum/data/input_context.h"
#include "stratum/job/job_spec.h"

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
  // true. Workers agree with a tiny all-reduce about every 0.1 s (the epoch loop's vote),
  // whether or not they have a `stop`; one worker looks at every step.
  const absl::Notification* stop = nullptr;
  // Keras' callbacks (fit.callbacks), run by the epoch loop in this order.
  std::vector<CallbackSpec> callbacks;
  // compile.metrics: the names the epochs' logs give the accuracy (none: the loss alone).
  std::vector<std::string> metrics;
  // The job's model as Keras' to_json() gave it, for the models callbacks save
  // (ModelCheckpoint).
  nlohmann::json model_json;
};

}  // namespace stratum
