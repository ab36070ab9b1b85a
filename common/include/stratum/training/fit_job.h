// What a job file gives every training binary (stratum-train, stratum-worker, the
// coordinator): its data read into FitData, Fit's options, and the checks of the job itself
// that run before a process waits for its peers. Plain functions; they read files.
#pragma once

#include <cstdio>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stratum/job/job_spec.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/training/fit_options.h"

namespace stratum {

// Reads the job's IDX files into unbatched (image, label) datasets. Class ids outside the
// model's outputs are refused naming the field, the file and the example.
absl::StatusOr<FitData> LoadFitData(const DataSpec& spec, const Model& model);

// Fit's options from the job: fit (its callbacks too), the data's auto_shard_policy, and
// checkpoint (backup and restore). INVALID_ARGUMENT for an unknown auto_shard_policy or a
// callback the job's optimizer rules out (ReduceLROnPlateau with a schedule);
// UNIMPLEMENTED for one its strategy cannot serve.
absl::StatusOr<FitOptions> FitOptionsFrom(const JobSpec& job);

// The headers of the job's data files, read without their data, against the model and the
// loss: there, readable, IDX; images with as many values per example as the model's input;
// labels the loss takes (one class id per example for the sparse loss, float32 rows of the
// model's outputs for the others); as many labels as images. Errors name the job field
// (data.test.labels) and its file. LoadFitData still finds a truncated or corrupt data part.
absl::Status CheckDataHeaders(const DataSpec& data, const Model& model, const Loss& loss);

// Whether training `model` with `optimizer` fits in this process's memory: its estimate
// is, per copy of the variables, the values, their gradients and the optimizer's slots, and
// per replica a workspace of `batch_per_replica` examples; what is available is the
// kernel's MemAvailable, or this process's cgroup limit when that is lower.
// INVALID_ARGUMENT (a configuration error, exit 2) with both figures and the fix when it
// does not fit: a model refused before training, instead of std::bad_alloc after the data
// is read.
absl::Status CheckMemoryFits(const Model& model, const Optimizer& optimizer,
                             int64_t batch_per_replica, int replicas, int copies);

// BackupAndRestore's delete_checkpoint (CheckpointSpec::delete_at_end): the job is complete,
// so its backups go (DeleteCheckpoints), said on `out`. Nothing otherwise.
absl::Status DeleteBackupOfCompleteJob(const CheckpointSpec& checkpoint, FILE* out);

// What training the job would refuse in the job itself, checked quickly, before a process
// waits for its peers (which may take minutes): the model, the loss and whether it fits the
// model's output (Model::CheckLoss), the optimizer, the fit options, and CheckDataHeaders.
absl::Status CheckTrainingJob(const JobSpec& job);

}  // namespace stratum
