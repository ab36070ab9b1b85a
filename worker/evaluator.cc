#include "stratum/worker/evaluator.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/checkpoint_reader.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/fit.h"
#include "stratum/worker/training_job.h"

namespace stratum {
namespace {

// The results an earlier run of the side-car wrote (evaluation.json's "history"); empty
// when there is none. One that cannot be read as a report (damaged, or a folder in its
// place) is kept aside as evaluation.json.damaged, with a warning, rather than overwritten.
absl::StatusOr<nlohmann::json> EarlierEvaluations(const std::string& path) {
  absl::StatusOr<nlohmann::json> report = ReadJsonObjectFile(path);
  if (absl::IsNotFound(report.status())) return nlohmann::json::array();
  auto is_result = [](const nlohmann::json& entry) {
    return entry.is_object() && entry.contains("step") && entry["step"].is_number_integer();
  };
  if (report.ok() && report->contains("history") && (*report)["history"].is_array()) {
    nlohmann::json history = nlohmann::json::array();
    for (const nlohmann::json& entry : (*report)["history"]) {
      if (is_result(entry)) history.push_back(entry);
    }
    return history;
  }
  if (report.ok() && is_result(*report)) {  // written before the history was kept
    return nlohmann::json::array({*report});
  }
  const std::string problem = report.ok() ? absl::StrCat(path, " is no evaluation report")
                                          : std::string(report.status().message());
  const std::string aside = path + ".damaged";
  if (std::rename(path.c_str(), aside.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(problem, ", and it cannot be moved to ",
                                                      aside, " (", std::strerror(errno),
                                                      "): move it out of the way, as the evaluator "
                                                      "writes its results there"));
  }
  spdlog::warn("{}: kept as {}; the results start anew", problem, aside);
  return nlohmann::json::array();
}

}  // namespace

absl::Status RunEvaluator(const JobSpec& job, const ShutdownWatcher& shutdown,
                          absl::Duration poll_interval, bool once,
                          const std::function<void()>& after_pass) {
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
  absl::StatusOr<FitData> data = LoadFitData(job.data, *model);
  if (!data.ok()) return data.status();
  if (!data->has_test) {
    return absl::InvalidArgumentError("the evaluator needs data.test in the job: add it");
  }
  DefaultStrategy strategy;
  std::optional<int64_t> evaluated;
  // The latest checkpoint when it was found damaged: it reads so at every poll, so it is
  // reported once and skipped until a newer one is written (the job's next save, or its
  // restart, which sets it aside).
  std::optional<int64_t> damaged;
  std::string last_warning;
  auto skip_damaged = [&](int64_t step, const std::string& folder, const std::string& why) {
    damaged = step;
    last_warning.clear();
    spdlog::warn(
        "checkpoint {} is damaged ({}), so it is skipped: the evaluator waits for a newer "
        "checkpoint",
        folder, why);
  };
  // A problem that lasts (a corrupt "checkpoint" file) is logged once, not at every poll.
  auto warn_once = [&](const std::string& warning) {
    if (warning != last_warning) spdlog::warn("{}", warning);
    last_warning = warning;
  };
  // Every evaluation, oldest first, kept across restarts of the side-car: evaluation.json
  // holds the latest at its top level and them all in "history".
  const std::string report_path = job.checkpoint.dir + "/evaluation.json";
  absl::StatusOr<nlohmann::json> earlier = EarlierEvaluations(report_path);
  if (!earlier.ok()) return earlier.status();
  nlohmann::json history = *std::move(earlier);
  spdlog::info("evaluator watching {}", job.checkpoint.dir);
  // One pass over the latest checkpoint: evaluated when it is new.
  auto evaluate_latest = [&]() -> absl::Status {
    absl::StatusOr<std::optional<int64_t>> latest = LatestCheckpointStep(job.checkpoint.dir);
    if (!latest.ok()) {
      warn_once(std::string(latest.status().message()));
      return absl::OkStatus();
    }
    if (!latest->has_value() || *latest == evaluated || *latest == damaged) {
      return absl::OkStatus();
    }
    absl::StatusOr<CheckpointVariables> checkpoint = ReadLatestCheckpoint(job.checkpoint.dir);
    if (!checkpoint.ok()) {
      const absl::Status& error = checkpoint.status();
      // The latest checkpoint is complete (its manifest is written before the "checkpoint"
      // file names it), and only a newer one makes the job delete it: one that is corrupt
      // or lacks a file while it is still the latest is damaged.
      const absl::StatusOr<std::optional<int64_t>> still = LatestCheckpointStep(job.checkpoint.dir);
      if ((absl::IsDataLoss(error) || absl::IsNotFound(error)) && still.ok() && *still == *latest) {
        skip_damaged(**latest, CheckpointFolder(job.checkpoint.dir, **latest),
                     std::string(error.message()));
        return absl::OkStatus();
      }
      warn_once(absl::StrCat("cannot read the latest checkpoint yet: ", error.message()));
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
      // Training never saves such values (it stops as diverged first).
      if (!AllFinite(it->second)) {
        skip_damaged(checkpoint->step, checkpoint->folder,
                     absl::StrCat("it holds NaN or infinity in ", spec.name));
        return absl::OkStatus();
      }
      variables.push_back(it->second);
    }
    absl::StatusOr<EpochLog> result =
        EvaluateDataset(strategy, *model, *loss, variables, data->test, data->rescale, 1024);
    if (!result.ok()) return result.status();
    evaluated = checkpoint->step;
    last_warning.clear();
    const nlohmann::json latest_result = {{"step", checkpoint->step},
                                          {"val_loss", result->val_loss},
                                          {"val_accuracy", result->val_accuracy}};
    // A job resumed from an earlier checkpoint writes its steps again: their new results
    // replace the old.
    nlohmann::json kept = nlohmann::json::array();
    for (const nlohmann::json& earlier : history) {
      if (earlier.value("step", int64_t{0}) < checkpoint->step) kept.push_back(earlier);
    }
    history = std::move(kept);
    history.push_back(latest_result);
    nlohmann::json report = latest_result;
    report["history"] = history;
    if (absl::Status status = WriteFileAtomically(report_path, report.dump(2) + "\n");
        !status.ok()) {
      spdlog::warn("{}", std::string(status.message()));
    }
    // Said once the report holds it: whoever reads evaluation.json on this line finds it.
    spdlog::info("evaluated the checkpoint at step {}: val_loss {:.4f} - val_accuracy {:.4f}",
                 checkpoint->step, result->val_loss, result->val_accuracy);
    return absl::OkStatus();
  };
  // Stopped (the job is over, or the side-car is evicted): one last pass first, so that the
  // final checkpoint, often written just before the stop, is evaluated too.
  bool stopping = false;
  while (!stopping) {
    stopping = once || shutdown.WaitFor(poll_interval);
    STRATUM_RETURN_IF_ERROR(evaluate_latest());
    if (after_pass) after_pass();
  }
  return absl::OkStatus();
}

}  // namespace stratum
