// stratum-train: trains a job in one process with the Default, OneDevice, Mirrored or
// CentralStorage strategy, the way Keras' model.fit does, and can write a summary JSON.
#include <cstdio>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/keras_export.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/training/fit_job.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/flags.h"
#include "stratum/util/logging.h"
#include "stratum/util/shutdown.h"
#include "stratum/worker/training_job.h"

ABSL_FLAG(std::string, job, "", "The job file (JSON), e.g. examples/fashion_mnist.json");
ABSL_FLAG(std::string, summary_json, "", "Write the training summary (JSON) to this path");
ABSL_FLAG(int, epochs, 0, "Override the job's fit.epochs");
ABSL_FLAG(std::string, export, "",
          "Export the trained model into this folder in Keras' formats: model.json, "
          "model.weights.h5 (keras.models.model_from_json(...).load_weights(...)) and "
          "model.safetensors");
ABSL_FLAG(std::string, progress, "auto",
          "auto (a bar on a terminal), bar, lines or none (no epoch lines; what happens, such "
          "as a resume, is still said)");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error or off: log lines go to stderr, the results to stdout");
ABSL_FLAG(int, logical_gpus_per_gpu, 0,
          "Split each GPU into N logical GPUs (overrides the job's "
          "strategy.logical_gpus_per_gpu; 0: the job's)");

namespace stratum {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "stratum-train: %s\n", std::string(status.message()).c_str());
  return ExitCodeFor(status);
}

int Run(const ShutdownWatcher& shutdown) {
  StopDeadline deadline(shutdown, absl::Seconds(30));  // a signal before training exits at once
  if (absl::Status logging = InitLogging("stratum-train", absl::GetFlag(FLAGS_log_level));
      !logging.ok()) {
    return Fail(logging);
  }
  const std::string job_path = absl::GetFlag(FLAGS_job);
  if (job_path.empty()) {
    return Fail(absl::InvalidArgumentError(
        "no job given: pass --job=FILE, e.g. --job=examples/fashion_mnist.json"));
  }
  absl::StatusOr<JobSpec> job = LoadJobSpec(job_path);
  if (!job.ok()) return Fail(job.status());
  if (absl::GetFlag(FLAGS_epochs) < 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--epochs ", absl::GetFlag(FLAGS_epochs),
                     " is negative: pass 1 or more, or 0 (the default) for the job's fit.epochs")));
  }
  if (absl::GetFlag(FLAGS_epochs) > 0) job->fit.epochs = absl::GetFlag(FLAGS_epochs);

  absl::StatusOr<Model> model = Model::FromKerasJson(job->model);
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<Loss> loss = Loss::FromKeras(job->loss);
  if (!loss.ok()) return Fail(loss.status());
  if (absl::Status fits = model->CheckLoss(*loss); !fits.ok()) return Fail(fits);
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::FromKeras(job->optimizer);
  if (!optimizer.ok()) return Fail(optimizer.status());
  if (absl::GetFlag(FLAGS_logical_gpus_per_gpu) < 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--logical_gpus_per_gpu is ", absl::GetFlag(FLAGS_logical_gpus_per_gpu),
        ", which must not be negative: pass 1 or more to split each GPU, or 0 for the job's")));
  }
  if (absl::GetFlag(FLAGS_logical_gpus_per_gpu) > 0) {
    job->strategy.logical_gpus_per_gpu = absl::GetFlag(FLAGS_logical_gpus_per_gpu);
  }
  absl::StatusOr<std::unique_ptr<Strategy>> strategy = MakeLocalStrategy(job->strategy);
  if (!strategy.ok()) return Fail(strategy.status());
  // Before a byte of data or a variable is allocated.
  const int replicas = (*strategy)->NumLocalReplicas();
  if (absl::Status fits = CheckMemoryFits(*model, **optimizer, job->fit.batch_size_per_replica,
                                          replicas, (*strategy)->CreateVariables({}).num_copies());
      !fits.ok()) {
    return Fail(fits);
  }
  // The headers first: a labels file of the wrong shape is named before any data is read.
  if (absl::Status headers = CheckDataHeaders(job->data, *model, *loss); !headers.ok()) {
    return Fail(headers);
  }
  absl::StatusOr<FitData> data = LoadFitData(job->data, *model);
  if (!data.ok()) return Fail(data.status());

  absl::StatusOr<FitOptions> fit_options = FitOptionsFrom(*job);
  if (!fit_options.ok()) return Fail(fit_options.status());
  // Where the job writes, checked before it trains.
  const std::string summary_path = absl::GetFlag(FLAGS_summary_json);
  if (!summary_path.empty()) {
    if (absl::Status s = CheckWritableFileFolder(summary_path, "--summary_json"); !s.ok()) {
      return Fail(s);
    }
  }
  const std::string export_dir = absl::GetFlag(FLAGS_export);
  if (!export_dir.empty()) {
    if (absl::Status s = CheckWritableFolder(export_dir, "--export"); !s.ok()) return Fail(s);
  }
  std::optional<CheckpointFolderLock> checkpoint_lock;
  if (!job->checkpoint.dir.empty()) {
    absl::StatusOr<CheckpointFolderLock> lock = LockCheckpointFolder(job->checkpoint.dir);
    if (!lock.ok()) return Fail(lock.status());
    checkpoint_lock = *std::move(lock);
  }
  FitOptions options = *fit_options;
  const std::string progress = absl::GetFlag(FLAGS_progress);
  if (progress == "bar") options.progress = ProgressStyle::kBar;
  if (progress == "lines") options.progress = ProgressStyle::kLines;
  if (progress == "none") options.progress = ProgressStyle::kNone;
  if (progress != "auto" && progress != "bar" && progress != "lines" && progress != "none") {
    return Fail(absl::InvalidArgumentError("--progress \"" + progress +
                                           "\" is not a style: use auto, bar, lines or none"));
  }

  const std::string devices = absl::StrJoin((*strategy)->devices(), ", ");
  std::printf(
      "%s\n%s on %d replica(s) (%s), global batch %lld, %lld training examples\n",
      model->Summary().c_str(), (*strategy)->name().c_str(), (*strategy)->NumReplicasInSync(),
      devices.c_str(),
      static_cast<long long>(options.batch_size_per_replica * (*strategy)->NumReplicasInSync()),
      static_cast<long long>(data->train_examples));
  std::fflush(stdout);
  auto scope = (*strategy)->Scope();
  // SIGTERM or SIGINT while training: the state after the current step is saved into
  // checkpoint.dir (when the job has one) and training stops.
  deadline.Begin();
  options.stop = &shutdown.notification();
  absl::StatusOr<FitSummary> summary = Fit(**strategy, *model, *loss, **optimizer, *data, options);
  deadline.End();
  if (!summary.ok()) {
    const int code = Fail(summary.status());
    return IsStoppedEarly(summary.status()) ? 128 + shutdown.signal_number() : code;
  }
  std::printf("%s\n", summary->ResultLine().c_str());
  if (!export_dir.empty()) {
    if (absl::Status exported =
            ExportKerasModel(job->model, *model, summary->variables, export_dir);
        !exported.ok()) {
      return Fail(exported);
    }
    std::printf("exported the model into %s: model.json, model.weights.h5, model.safetensors\n",
                export_dir.c_str());
  }
  if (absl::Status deleted = DeleteBackupOfCompleteJob(job->checkpoint, stdout); !deleted.ok()) {
    return Fail(deleted);
  }
  if (!summary_path.empty()) {
    if (absl::Status status = WriteFileAtomically(summary_path, summary->ToJson().dump(2) + "\n");
        !status.ok()) {
      return Fail(status);
    }
  }
  return kExitSuccess;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ShutdownWatcher shutdown;  // before any other thread
  stratum::ParseFlagsOrExit(
      argc, argv,
      "stratum-train: trains a job in one process, like Keras' fit.\n"
      "  stratum-train --job=examples/fashion_mnist.json "
      "[--summary-json=PATH] [--epochs=N]\nExit codes: 0 success, 1 "
      "failure, 2 configuration error (a bad job file, missing data), 128+N stopped by "
      "signal N (after saving the state into the job's checkpoint.dir).");
  return stratum::Run(shutdown);
}
