#include "stratum/training/training_status.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace stratum {
namespace {

constexpr char kStoppedEarlyPayload[] = "stratum/stopped-early";

}  // namespace

absl::Status StoppedEarly(const FitOptions& options, int64_t iteration, int epoch, int64_t step,
                          int64_t steps_per_epoch) {
  const bool here = options.stop != nullptr && options.stop->HasBeenNotified();
  const std::string where = absl::StrCat("after step ", iteration, " (epoch ", epoch, ", step ",
                                         step, " of ", steps_per_epoch, ")");
  absl::Status status = absl::CancelledError(absl::StrCat(
      "training stopped ", where,
      here ? ": this process was stopped by a signal"
           : " because another worker was stopped by a signal",
      options.checkpoint_dir.empty()
          ? "; the job has no checkpoint.dir, so its progress is lost: set checkpoint.dir to "
            "resume after a stop"
          : absl::StrCat("; the state at step ", iteration, " is saved in ", options.checkpoint_dir,
                         ": run the same job again to resume from it")));
  status.SetPayload(kStoppedEarlyPayload, absl::Cord(where));
  return status;
}

absl::Status TrainingDiverged(const std::string& what, int64_t iteration, int epoch, int64_t step,
                              int64_t steps_per_epoch, const ResumePoint& resume) {
  std::string rerun;
  if (resume.newest_step.has_value()) {
    rerun = absl::StrCat(": it resumes from the checkpoint of step ", *resume.newest_step, " in ",
                         resume.checkpoint_dir,
                         ", written before the divergence (remove the folder to train from "
                         "scratch)");
  } else if (!resume.checkpoint_dir.empty()) {
    rerun = absl::StrCat(": it starts from scratch, as no checkpoint was written in ",
                         resume.checkpoint_dir, " before the divergence");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "training diverged: ", what, " after step ", iteration, " (epoch ", epoch, ", step ", step,
      " of ", steps_per_epoch,
      "), so training stopped there and that state is not saved; lower the optimizer's "
      "learning_rate (or check data.rescale and that the loss suits the model's output), then "
      "run the job again",
      rerun));
}

bool IsStoppedEarly(const absl::Status& status) {
  return absl::IsCancelled(status) && status.GetPayload(kStoppedEarlyPayload).has_value();
}

}  // namespace stratum
