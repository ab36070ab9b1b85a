// Where a Fit starts and how it backs up, on every worker alike: the training state the
// chief restores from the job's checkpoint folder (or a fresh one), broadcast so that every
// worker starts from the same; and the backup every worker runs (only the chief's lands in
// the job's folder). Both are collectives with several workers: every worker calls them at
// the same point of its loop. Functions of their arguments; not thread-safe per folder.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/strategy/strategy.h"
#include "stratum/training/fit_checkpoint.h"
#include "stratum/training/fit_options.h"
#include "stratum/training/training_status.h"

namespace stratum {

// Examples per step over every replica of every worker.
inline int64_t GlobalBatch(const Strategy& strategy, const FitOptions& options) {
  return options.batch_size_per_replica * strategy.NumReplicasInSync();
}

// The training state as the chief has it (restored from its checkpoint, or fresh), the same
// on every worker afterwards: the chief decides and broadcasts. A checkpoint this run
// cannot resume from where it stands is refused (FAILED_PRECONDITION, with the fix): one in
// the middle of an epoch with another global batch or number of workers, or one further
// into its epoch than the run's `steps_per_epoch` allow.
absl::StatusOr<FitState> StartFitState(Strategy& strategy, const Model& model,
                                       const Optimizer& optimizer, const FitOptions& options,
                                       int64_t steps_per_epoch);

// Every worker runs the save path; only the chief's lands in the job's folder. Variables
// that are not finite are never saved: training diverged (TrainingDiverged), and every
// worker, holding the same variables, says so at the same step. A save records its step
// in `resume`.
absl::Status BackupFitState(const Strategy& strategy, const Model& model,
                            const Optimizer& optimizer, const FitOptions& options,
                            int64_t steps_per_epoch, FitState state, ResumePoint& resume);

// Where a run that began at `started` (StartFitState's answer) resumes from, until it saves.
ResumePoint ResumeFrom(const FitOptions& options, const FitState& started);

}  // namespace stratum
