#include "stratum/worker/evaluator.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_reader.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/fit.h"
#include "stratum/worker/training_job.h"

namespace stratum {

absl::Status RunEvaluator(const JobSpec& job, const ShutdownWatcher& shutdown,
                          absl::Duration poll_interval) {
  if (job.checkpoint.dir.empty()) {
    return absl::InvalidArgumentError(
        "the evaluator reads checkpoints, but the job has no checkpoint.dir: add one");
  }
  absl::StatusOr<Model> model = Model::FromKerasJson(job.model);
  if (!model.ok()) return model.status();
  absl::StatusOr<Loss> loss = Loss::FromKeras(job.loss);
  if (!loss.ok()) return loss.status();
  if (absl::Status fits = model->CheckLoss(*loss); !fits.ok()) return fits;
  if (absl::Status headers = CheckDataHeaders(job.data, *model, *loss); !headers.ok()) {
    return headers;
  }
  absl::StatusOr<FitData> data = LoadFitData(job.data);
  if (!data.ok()) return data.status();
  if (!data->has_test) {
    return absl::InvalidArgumentError("the evaluator needs data.test in the job: add it");
  }
  DefaultStrategy strategy;
  std::optional<int64_t> evaluated;
  spdlog::info("evaluator watching {}", job.checkpoint.dir);
  // One pass over the latest checkpoint: evaluated when it is new.
  auto evaluate_latest = [&]() -> absl::Status {
    absl::StatusOr<std::optional<int64_t>> latest = LatestCheckpointStep(job.checkpoint.dir);
    if (!latest.ok()) {
      spdlog::warn("{}", std::string(latest.status().message()));
      return absl::OkStatus();
    }
    if (!latest->has_value() || *latest == evaluated) return absl::OkStatus();
    absl::StatusOr<CheckpointVariables> checkpoint = ReadLatestCheckpoint(job.checkpoint.dir);
    if (!checkpoint.ok()) {
      spdlog::warn("cannot read the latest checkpoint yet: {}",
                   std::string(checkpoint.status().message()));
      return absl::OkStatus();
    }
    std::vector<Tensor> variables;
    for (const VariableSpec& spec : model->variables()) {
      auto it = checkpoint->variables.find(spec.name);
      if (it == checkpoint->variables.end() || !(it->second.shape() == spec.shape)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", checkpoint->folder, " does not hold variable \"", spec.name,
            "\" of shape ", spec.shape.ToString(), ": it was written for another model"));
      }
      variables.push_back(it->second);
    }
    absl::StatusOr<EpochLog> result =
        EvaluateDataset(strategy, *model, *loss, variables, data->test, data->rescale, 1024);
    if (!result.ok()) return result.status();
    evaluated = checkpoint->step;
    spdlog::info("evaluated the checkpoint at step {}: val_loss {:.4f} - val_accuracy {:.4f}",
                 checkpoint->step, result->val_loss, result->val_accuracy);
    const nlohmann::json report = {{"step", checkpoint->step},
                                   {"val_loss", result->val_loss},
                                   {"val_accuracy", result->val_accuracy}};
    if (absl::Status status =
            WriteFileAtomically(job.checkpoint.dir + "/evaluation.json", report.dump(2) + "\n");
        !status.ok()) {
      spdlog::warn("{}", std::string(status.message()));
    }
    return absl::OkStatus();
  };
  // Stopped (the job is over, or the side-car is evicted): one last pass first, so that the
  // final checkpoint, often written just before the stop, is evaluated too.
  bool stopping = false;
  while (!stopping) {
    stopping = shutdown.WaitFor(poll_interval);
    STRATUM_RETURN_IF_ERROR(evaluate_latest());
  }
  return absl::OkStatus();
}

}  // namespace stratum
