// stratum-coordinator: the chief of a parameter-server cluster. Serves the health and task
// services, waits (with a deadline) until every task of the cluster answers its health
// check, prints the cluster as a table and exits.
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/coordinator/ps_training.h"
#include "stratum/net/health.h"
#include "stratum/net/task_main.h"
#include "stratum/ps/placement.h"
#include "stratum/training/status_page.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/flags.h"
#include "stratum/util/status_macros.h"

ABSL_FLAG(absl::Duration, cluster_timeout, absl::Minutes(10),
          "How long to wait for every task to answer its health check (pods may start slowly)");
ABSL_FLAG(std::string, job, "",
          "A parameter-server job file to train (e.g. examples/fashion_mnist_ps.json); without "
          "it the coordinator checks the cluster and exits");
ABSL_FLAG(std::string, summary_json, "", "Write the training summary (JSON) to this path");
ABSL_FLAG(std::string, export, "",
          "With --job: export the trained model into this folder in Keras' formats (model.json, "
          "model.weights.h5, model.safetensors) once the job is complete");
ABSL_FLAG(absl::Duration, ps_recovery_timeout, absl::Minutes(5),
          "How long to wait for a parameter server that died to come back before giving up "
          "(its variables are then restored from the last checkpoint); 0 fails at once");
ABSL_FLAG(absl::Duration, worker_recovery_timeout, absl::Minutes(5),
          "How long every worker may be down at once (closures wait for one to come back) "
          "before the job fails naming them");
ABSL_FLAG(absl::Duration, ps_timeout, absl::Seconds(30),
          "How long a worker's push or pull waits for a parameter server before the PS counts "
          "as failed and the job waits for it (see --ps_recovery_timeout)");
ABSL_FLAG(std::string, placement, "balanced_bytes",
          "How variables are placed over the ps tasks: balanced_bytes or round_robin");
ABSL_FLAG(int, closures_per_worker, 1,
          "Closures in flight per worker (TF's default is 1); 2 overlaps a closure's transfer "
          "with the previous one's steps");

namespace stratum {
namespace {

// A parameter-server cluster needs at least one ps and one worker, as in TensorFlow.
absl::Status ValidateParameterServerCluster(const ClusterSpec& spec) {
  for (const char* job : {kWorker, kPs}) {
    if (!spec.HasJob(job)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TF_CONFIG cluster has no \"", job,
          "\" job, but a parameter-server cluster needs at least one ps and one worker: add \"",
          job, "\": [\"host:port\"] to cluster"));
    }
  }
  return absl::OkStatus();
}

// The job and the flags that shape its training, checked before the cluster is waited for
// (which may take minutes): a wrong job is a configuration error at once.
absl::StatusOr<JobSpec> LoadAndCheckJob(const std::string& job_path) {
  STRATUM_ASSIGN_OR_RETURN(JobSpec job, LoadJobSpec(job_path));
  if (job.strategy.type == "multi_worker_mirrored") {
    return absl::InvalidArgumentError(absl::StrCat(
        job_path,
        ": strategy.type is \"multi_worker_mirrored\", whose workers train the job themselves "
        "with no coordinator: run stratum-worker --job ",
        job_path, " as each worker (and as the chief, if any), or stratum-launch --job ",
        job_path));
  }
  if (job.strategy.type != "parameter_server") {
    return absl::InvalidArgumentError(
        absl::StrCat(job_path, ": strategy.type is \"", job.strategy.type,
                     "\", but the coordinator trains parameter_server jobs: set it to "
                     "\"parameter_server\", or train in one process with stratum-train"));
  }
  if (absl::GetFlag(FLAGS_closures_per_worker) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--closures_per_worker is ", absl::GetFlag(FLAGS_closures_per_worker),
                     ", but a worker needs at least 1 closure in flight: pass 1 or more"));
  }
  STRATUM_RETURN_IF_ERROR(
      CheckDurationFlag("--ps_timeout", absl::GetFlag(FLAGS_ps_timeout), absl::Milliseconds(100),
                        "a push or pull needs time to reach a parameter server", "30s"));
  // The job's own errors now, not once the whole cluster has answered (minutes later).
  STRATUM_RETURN_IF_ERROR(
      CheckParameterServerJob(job, PsTrainingOptions{.placement = absl::GetFlag(FLAGS_placement)}));
  if (!absl::GetFlag(FLAGS_summary_json).empty()) {
    STRATUM_RETURN_IF_ERROR(
        CheckWritableFileFolder(absl::GetFlag(FLAGS_summary_json), "--summary_json"));
  }
  if (!absl::GetFlag(FLAGS_export).empty()) {
    STRATUM_RETURN_IF_ERROR(CheckWritableFolder(absl::GetFlag(FLAGS_export), "--export"));
  }
  return job;
}

int Train(const TaskContext& context, const std::string& job_path, const JobSpec& job,
          ShutdownWatcher& shutdown) {
  std::ifstream file(job_path);
  std::stringstream text;
  text << file.rdbuf();
  const size_t slash = job_path.rfind('/');
  const std::string base_dir = slash == std::string::npos ? "." : job_path.substr(0, slash);
  PsTrainingOptions options;
  options.placement = absl::GetFlag(FLAGS_placement);
  options.ps_recovery_timeout = absl::GetFlag(FLAGS_ps_recovery_timeout);
  options.worker_recovery_timeout = absl::GetFlag(FLAGS_worker_recovery_timeout);
  options.ps_timeout = absl::GetFlag(FLAGS_ps_timeout);
  options.closures_per_worker = absl::GetFlag(FLAGS_closures_per_worker);
  options.cancel = &shutdown.notification();
  options.channel = context.channel_options();
  options.listen_address = context.listen_address;
  options.export_dir = absl::GetFlag(FLAGS_export);
  absl::StatusOr<FitSummary> summary =
      RunParameterServerJob(job, text.str(), base_dir, context.resolver.cluster_spec(), options);
  if (!summary.ok()) {
    // The job's configuration (a bad model, data file or checkpoint folder; training that
    // diverged) exits 2; anything that happened while training, such as a parameter server
    // that died, is a failure (1).
    const int code = ReportFatal(context.binary, summary.status());
    if (absl::IsCancelled(summary.status()) && shutdown.signal_number() != 0) {
      return 128 + shutdown.signal_number();  // stopped (the state saved, when it could be)
    }
    return code;
  }
  std::printf("%s\n", summary->ResultLine().c_str());
  std::fflush(stdout);
  const std::string summary_path = absl::GetFlag(FLAGS_summary_json);
  if (!summary_path.empty()) {
    if (absl::Status status = WriteFileAtomically(summary_path, summary->ToJson().dump(2) + "\n");
        !status.ok()) {
      return ReportFatal(context.binary, status);
    }
  }
  return kExitSuccess;
}

int Run(const TaskContext& context, ShutdownWatcher& shutdown) {
  const ClusterSpec& spec = context.resolver.cluster_spec();
  if (absl::Status status = ValidateParameterServerCluster(spec); !status.ok()) {
    return ReportFatal(context.binary, status);
  }
  if (absl::Status status =
          CheckDurationFlag("--cluster_timeout", absl::GetFlag(FLAGS_cluster_timeout),
                            absl::Seconds(1), "the tasks need time to answer", "10m");
      !status.ok()) {
    return ReportFatal(context.binary, status);
  }
  const std::string job_path = absl::GetFlag(FLAGS_job);
  std::optional<JobSpec> job;
  if (!job_path.empty()) {
    absl::StatusOr<JobSpec> checked = LoadAndCheckJob(job_path);
    if (!checked.ok()) return ReportFatal(context.binary, checked.status());
    job = *std::move(checked);
  }
  std::optional<CheckpointFolderLock> checkpoint_lock;  // the coordinator writes the manifests
  if (job.has_value() && !job->checkpoint.dir.empty()) {
    absl::StatusOr<CheckpointFolderLock> lock = LockCheckpointFolder(job->checkpoint.dir);
    if (!lock.ok()) return ReportFatal(context.binary, lock.status());
    checkpoint_lock = *std::move(lock);
  }
  absl::StatusOr<std::unique_ptr<TaskServer>> server = StartTaskServer(context);
  if (!server.ok()) return ReportFatal(context.binary, server.status());
  absl::StatusOr<std::unique_ptr<HttpServer>> status_page = ServeStatusPageIfAsked(context, spec);
  if (!status_page.ok()) return ReportFatal(context.binary, status_page.status());
  spdlog::info("serving on {}; waiting up to {} for {} tasks to answer", context.listen_address,
               absl::FormatDuration(absl::GetFlag(FLAGS_cluster_timeout)), spec.AllTasks().size());

  ClusterWaitOptions wait;
  wait.timeout = absl::GetFlag(FLAGS_cluster_timeout);
  wait.cancel = &shutdown.notification();
  wait.channel = context.channel_options();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<TaskReport>> reports = WaitForClusterHealthy(spec, wait);
  if (!reports.ok()) return ReportFatal(context.binary, reports.status());

  std::printf("%s", FormatClusterTable(*reports).c_str());
  std::fflush(stdout);
  spdlog::info("cluster healthy: {} tasks answered in {}", reports->size(),
               absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))));
  if (!job.has_value()) return kExitSuccess;
  return Train(context, job_path, *job, shutdown);
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ShutdownWatcher shutdown;
  stratum::ParseFlagsOrExit(
      argc, argv,
      "stratum-coordinator: the chief of a Stratum parameter-server cluster.\n"
      "Reads TF_CONFIG (task type \"chief\"), waits until every task answers its health "
      "check (--cluster_timeout) and prints the cluster; then trains the parameter-server job "
      "--job=FILE (e.g. examples/fashion_mnist_ps.json) on the workers and parameter servers, "
      "or without --job exits.\nExit codes: 0 success, 1 "
      "failure (e.g. tasks that never answered), 2 configuration or usage error, 128+N "
      "stopped by signal N while training (the state saved into checkpoint.dir).");
  const stratum::TaskContext context = stratum::ResolveTaskOrExit(
      {.binary = "stratum-coordinator", .task_types = {stratum::kChief}});
  return stratum::Run(context, shutdown);
}
