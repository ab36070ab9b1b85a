// What a training run reports: one EpochLog per epoch (Keras' History) and the FitSummary
// every training binary prints and writes with --summary-json (DESIGN.md's summary), with
// their JSON. The same for Fit (worker/) and the parameter-server job (coordinator/).
// Plain values; not synchronized.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "stratum/tensor/tensor.h"

namespace stratum {

struct EpochLog {
  int epoch = 0;
  int64_t steps = 0;
  double loss = 0;
  double accuracy = 0;
  double val_loss = 0;
  double val_accuracy = 0;
  // Keras' AUC, for a model of one sigmoid output (binary_crossentropy); shown when the
  // job's metrics ask for "auc".
  std::optional<double> auc;
  std::optional<double> val_auc;
  bool validated = false;  // val_loss and val_accuracy were measured (a test set, validate)
  double examples_per_sec = 0;
  double seconds = 0;
  // The callback that stopped training after this epoch (EarlyStopping), if one did: the
  // job is complete, and a run of it again trains nothing more.
  std::string stopped_by;
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
  std::optional<double> test_auc;  // with a test set, for a model that measures AUC
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
  // Trained on the GPU path (a job on GPUs whose model it cannot run trains on the CPU).
  bool on_gpus = false;
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

}  // namespace stratum
