// The two ways a training loop ends early that its callers act on, as typed errors: a stop
// at a signal that every worker agreed on (StoppedEarly; IsStoppedEarly recognises it by its
// payload, never by its words), and divergence (TrainingDiverged, Keras' TerminateOnNaN,
// FAILED_PRECONDITION so that launchers do not restart the job). Plain functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "stratum/training/fit_options.h"

namespace stratum {

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

// The error Fit returns when it stops early (FitOptions::stop) after step `iteration` (step
// `step` of `steps_per_epoch` in epoch `epoch`): CANCELLED, saying whether this process or
// another worker got the signal and where the state is saved; IsStoppedEarly is true for it.
absl::Status StoppedEarly(const FitOptions& options, int64_t iteration, int epoch, int64_t step,
                          int64_t steps_per_epoch);

// Whether `status` is Fit's answer to FitOptions::stop: training stopped early, at a step
// every worker agreed on, with the state saved when the job has a checkpoint folder.
bool IsStoppedEarly(const absl::Status& status);

}  // namespace stratum
