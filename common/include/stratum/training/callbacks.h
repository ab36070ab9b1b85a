// Keras' callbacks of model.fit, as a job's fit.callbacks gives them (CallbackSpec, checked
// and defaulted by ParseJobSpec): EarlyStopping, ReduceLROnPlateau, ModelCheckpoint,
// TerminateOnNaN, CSVLogger and TensorBoard, with Keras 3's semantics (BackupAndRestore is the
// job's checkpoint). The one epoch loop runs them, so they behave alike on every strategy.
//
// Their state is a function of the epochs' logs: a run that resumes from a checkpoint
// replays the epochs before it (OnTrainBegin's history) and goes on as if it had never
// stopped (EarlyStopping's patience, ReduceLROnPlateau's reduced rate), which Keras'
// BackupAndRestore does not do. With several workers every worker runs them and decides
// alike (the logs are sums over every worker); only the chief writes their files.
//
// Not thread-safe: the epoch loop calls them from its thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stratum/job/job_spec.h"
#include "stratum/tensor/tensor.h"
#include "stratum/training/fit_summary.h"

namespace stratum {

// Keras' logs of an epoch: "loss", each of compile.metrics ("accuracy"), their "val_"
// twins when validated, and what callbacks add ("learning_rate").
using Logs = std::map<std::string, double>;

// An epoch's logs, its accuracy under each name of `metrics`, and its AUC as "auc".
Logs LogsOf(const EpochLog& log, const std::vector<std::string>& metrics);

// Whether a compile.metrics name is Keras' AUC ("auc", "AUC"), and whether a job's metrics
// ask for it.
bool IsAucMetric(const std::string& metric);
bool MeasuresAuc(const std::vector<std::string>& metrics);

// What callbacks see and change of the training they watch: the epoch loop's.
class CallbackHost {
 public:
  virtual ~CallbackHost() = default;
  // Whether this process writes the callbacks' files (the chief).
  virtual bool writes_files() const = 0;
  // Where callbacks print (verbose messages).
  virtual FILE* out() const = 0;
  // Whether the steps report their figures as they train (OnTrainBatchEnd is called); else
  // only at an epoch's end (the parameter-server job, the GPU path).
  virtual bool has_step_logs() const = 0;
  // The optimizer's learning rate now (a schedule's value at the current step).
  virtual float learning_rate() const = 0;
  // From the next step on; FAILED_PRECONDITION where the training cannot (a schedule).
  virtual absl::Status SetLearningRate(float rate) = 0;
  // A copy of the trained variables, and setting them all (every replica, every worker).
  virtual absl::StatusOr<std::vector<Tensor>> GetWeights() = 0;
  virtual absl::Status SetWeights(const std::vector<Tensor>& weights) = 0;
  // Writes the model with its trained variables in Keras' formats: the weights file alone at
  // `path` (.weights.h5), or the export folder `path` (keras_export.h).
  virtual absl::Status SaveModel(const std::string& path, bool weights_only) = 0;
};

class Callback {
 public:
  virtual ~Callback() = default;
  // Before this run's first epoch. `history`: the logs of the epochs trained before (epochs
  // 0 to history.size() - 1, a run that resumed), replayed into the callback's state.
  virtual absl::Status OnTrainBegin(const std::vector<Logs>& /*history*/, CallbackHost& /*host*/) {
    return absl::OkStatus();
  }
  // After training step `iteration` (from 0 at the job's start) with the epoch's logs so
  // far; only where CallbackHost::has_step_logs.
  virtual absl::Status OnTrainBatchEnd(int64_t /*iteration*/, const Logs& /*logs*/,
                                       CallbackHost& /*host*/) {
    return absl::OkStatus();
  }
  // After epoch `epoch` (from 0, as Keras counts) is trained and validated: `logs` as the
  // callbacks before this one left them (they may add to it), `figures` its speed.
  virtual absl::Status OnEpochEnd(int /*epoch*/, Logs& /*logs*/, const EpochLog& /*figures*/,
                                  CallbackHost& /*host*/) {
    return absl::OkStatus();
  }
  // After the last epoch this run trains (every epoch, or a stop a callback asked for).
  virtual absl::Status OnTrainEnd(CallbackHost& /*host*/) { return absl::OkStatus(); }
  // Whether the callback asked training to stop after the epoch that just ended.
  virtual bool stop_training() const { return false; }
  virtual std::string name() const = 0;
};

// `text` with its Python format placeholders filled ("ckpt-{epoch:02d}-{val_loss:.2f}"),
// as ModelCheckpoint names its files: `epoch` (from 1) and the logs' values. ParseJobSpec
// checked the placeholders.
std::string FormatPythonStyle(const std::string& text, int epoch, const Logs& logs);

// The callbacks of `specs`, in their order. INVALID_ARGUMENT for a class it does not know
// (ParseJobSpec refuses those first).
absl::StatusOr<std::vector<std::unique_ptr<Callback>>> MakeCallbacks(
    const std::vector<CallbackSpec>& specs);

}  // namespace stratum
