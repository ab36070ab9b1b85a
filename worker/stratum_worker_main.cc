// stratum-worker: a worker task of a Stratum cluster. Three ways to run:
//   stratum-worker                      a PS job's worker: serves closures until SIGTERM;
//   stratum-worker --job=JOB.json       a MultiWorkerMirrored job's worker (or chief): trains
//                                       the job in lock-step with the others, then exits;
//   stratum-worker --evaluator --job=J  the evaluator side-car of a PS job.
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/keras_export.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/task_main.h"
#include "stratum/training/status_page.h"
#include "stratum/util/flags.h"
#include "stratum/worker/coordination_grpc_service.h"
#include "stratum/worker/coordination_service.h"
#include "stratum/worker/evaluator.h"
#include "stratum/worker/multi_worker_job.h"
#include "stratum/worker/worker_service.h"

ABSL_FLAG(bool, evaluator, false, "Run as the evaluator task (TF_CONFIG task type \"evaluator\")");
ABSL_FLAG(std::string, job, "",
          "A multi_worker_mirrored job to train as this worker; with --evaluator: the job whose "
          "checkpoints to evaluate as they appear");
ABSL_FLAG(std::string, summary_json, "",
          "MultiWorkerMirrored: the chief writes the training summary (JSON) to this path");
ABSL_FLAG(std::string, export, "",
          "MultiWorkerMirrored: the chief exports the trained model into this folder in Keras' "
          "formats (model.json, model.weights.h5, model.safetensors) once the job is complete");
ABSL_FLAG(absl::Duration, cluster_timeout, absl::Minutes(2),
          "MultiWorkerMirrored: how long to wait for the leader and every peer to join");
ABSL_FLAG(absl::Duration, stop_timeout, absl::Seconds(25),
          "MultiWorkerMirrored: after SIGTERM, how long the workers get to stop at a step they "
          "agree on and save the job's state there before this one exits anyway (under the "
          "30 s Kubernetes and stratum-launch give before SIGKILL)");
ABSL_FLAG(absl::Duration, eval_interval, absl::Seconds(2),
          "With --evaluator: how often to look for a new checkpoint");
ABSL_FLAG(bool, eval_once, false,
          "With --evaluator: evaluate the latest checkpoint once (as a side-car stopped does) "
          "and exit, without serving");

namespace stratum {
namespace {

// Trains a MultiWorkerMirrored job as this task; returns main's exit code.
// On the leader, the process that serves the coordination service, a report of a start-up
// stop (`before_exit`) is served to the others a moment before the process exits: they
// learn the leader was stopped, not only that it is gone.
std::function<void(int)> LeaderServesTheReport(std::function<void(int)> before_exit,
                                               CoordinationService* service) {
  if (!before_exit || service == nullptr) return before_exit;
  return [before_exit = std::move(before_exit), service](int signal) {
    before_exit(signal);
    (void)service->AwaitEveryTaskTold(absl::Seconds(2));
    absl::SleepFor(absl::Milliseconds(100));  // the answers just given leave the process
  };
}

int RunMultiWorker(const JobSpec& job, const TaskContext& context, ShutdownWatcher& shutdown) {
  const ClusterSpec& cluster = context.resolver.cluster_spec();
  if (absl::Status status =
          CheckDurationFlag("--cluster_timeout", absl::GetFlag(FLAGS_cluster_timeout),
                            absl::Seconds(1), "the workers need time to meet", "2m");
      !status.ok()) {
    return ReportFatal(context.binary, status);
  }
  // A signal during start-up exits at once (telling the others, once this task has joined
  // the job); during training, every worker stops after a step they agree on and the
  // job's state is saved there.
  StopDeadline deadline(shutdown, absl::GetFlag(FLAGS_stop_timeout));
  std::unique_ptr<CoordinationService> coordination;
  std::unique_ptr<GrpcCoordinationService> coordination_grpc;
  std::vector<grpc::Service*> services;
  if (context.task == MultiWorkerLeader(cluster)) {
    coordination = std::make_unique<CoordinationService>(CoordinationServiceOptions{
        .tasks = MultiWorkerTasks(cluster), .leader = MultiWorkerLeader(cluster)});
    coordination_grpc = std::make_unique<GrpcCoordinationService>(*coordination);
    services.push_back(coordination_grpc.get());
  }
  const std::string summary_path = absl::GetFlag(FLAGS_summary_json);
  const bool writes_summary =
      !summary_path.empty() && context.task == MultiWorkerTasks(cluster).front();
  if (writes_summary) {
    if (absl::Status status = CheckWritableFileFolder(summary_path, "--summary_json");
        !status.ok()) {
      return ReportFatal(context.binary, status);
    }
  }
  const std::string export_dir = absl::GetFlag(FLAGS_export);
  const bool exports = !export_dir.empty() && context.task == MultiWorkerTasks(cluster).front();
  if (exports) {
    if (absl::Status status = CheckWritableFolder(export_dir, "--export"); !status.ok()) {
      return ReportFatal(context.binary, status);
    }
  }
  absl::StatusOr<std::unique_ptr<TaskServer>> server = StartTaskServer(context, services);
  if (!server.ok()) return ReportFatal(context.binary, server.status());
  // The job's chief (its first worker) serves the status page.
  absl::StatusOr<std::unique_ptr<HttpServer>> status_page =
      context.task == MultiWorkerTasks(cluster).front()
          ? ServeStatusPageIfAsked(context, cluster)
          : absl::StatusOr<std::unique_ptr<HttpServer>>(nullptr);
  if (!status_page.ok()) return ReportFatal(context.binary, status_page.status());
  MultiWorkerJobOptions options{.cluster = cluster,
                                .task = context.task,
                                .channel = context.channel_options(),
                                .connect_timeout = absl::GetFlag(FLAGS_cluster_timeout),
                                .stop = &shutdown.notification(),
                                .training_started = [&deadline] { deadline.Begin(); },
                                .set_before_startup_exit =
                                    [&](std::function<void(int)> before_exit) {
                                      deadline.SetBeforeExit(LeaderServesTheReport(
                                          std::move(before_exit), coordination.get()));
                                    }};
  absl::StatusOr<FitSummary> summary = RunMultiWorkerJob(job, options);
  // The others learn the job's first failure from the answers to their own reports: the
  // leader serves them a moment longer (a task that died is not waited for past this).
  if (coordination && !summary.ok()) (void)coordination->AwaitEveryTaskTold(absl::Seconds(2));
  if (coordination_grpc) coordination_grpc->Shutdown();
  (*server)->Shutdown(context.shutdown_grace);
  deadline.End();
  if (!summary.ok()) {
    const int code = ReportFatal(context.binary, summary.status());
    const int signal = shutdown.signal_number();
    return IsStoppedEarly(summary.status()) && signal != 0 ? 128 + signal : code;
  }
  std::printf("%s\n", summary->ResultLine().c_str());
  std::fflush(stdout);
  if (writes_summary) {
    if (absl::Status written = WriteFileAtomically(summary_path, summary->ToJson().dump(2) + "\n");
        !written.ok()) {
      return ReportFatal(context.binary, written);
    }
  }
  if (exports) {
    absl::StatusOr<Model> model = Model::FromKerasJson(job.model);
    absl::Status exported =
        model.ok() ? ExportKerasModel(job.model, *model, summary->variables, export_dir)
                   : model.status();
    if (!exported.ok()) return ReportFatal(context.binary, exported);
    std::printf("exported the model into %s: model.json, model.weights.h5, model.safetensors\n",
                export_dir.c_str());
  }
  spdlog::info("done");
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ShutdownWatcher shutdown;
  stratum::ParseFlagsOrExit(argc, argv,
                            "stratum-worker: a worker (or, with --evaluator, the evaluator) of a "
                            "Stratum cluster.\nReads TF_CONFIG (task type \"worker\" or "
                            "\"evaluator\") and serves on the task's address until SIGTERM.\n"
                            "Exit codes: 0 stopped cleanly, 1 failure, 2 configuration or usage "
                            "error, 128+N stopped by signal N (a training worker saves the "
                            "job's state first).");
  stratum::TaskMainOptions options{.binary = "stratum-worker",
                                   .task_types = {stratum::kWorker, stratum::kEvaluator}};
  if (absl::GetFlag(FLAGS_evaluator)) options.forced_type = stratum::kEvaluator;
  if (!absl::GetFlag(FLAGS_evaluator) && !absl::GetFlag(FLAGS_job).empty()) {
    options.task_types = {stratum::kChief, stratum::kWorker};
    // The task first: --print_tf_config answers without the job (a pod's job file may not
    // exist where its TF_CONFIG is checked).
    const stratum::TaskContext context = stratum::ResolveTaskOrExit(options);
    absl::StatusOr<stratum::JobSpec> job = stratum::LoadJobSpec(absl::GetFlag(FLAGS_job));
    if (!job.ok()) return stratum::ReportFatal(options.binary, job.status());
    if (job->strategy.type != "multi_worker_mirrored") {
      return stratum::ReportFatal(
          options.binary,
          absl::InvalidArgumentError(absl::StrCat(
              "stratum-worker --job trains multi_worker_mirrored jobs, and this one is \"",
              job->strategy.type,
              "\": start a parameter_server job with stratum-launch --job (its coordinator "
              "drives the workers), a single-process one with stratum-train")));
    }
    return stratum::RunMultiWorker(*job, context, shutdown);
  }
  const stratum::TaskContext context = stratum::ResolveTaskOrExit(options);
  if (context.task.type == stratum::kEvaluator && !absl::GetFlag(FLAGS_job).empty()) {
    if (absl::Status status = stratum::CheckDurationFlag(
            "--eval_interval", absl::GetFlag(FLAGS_eval_interval), absl::Milliseconds(100),
            "the evaluator would look for new checkpoints without pause", "2s");
        !status.ok()) {
      return stratum::ReportFatal(context.binary, status);
    }
    absl::StatusOr<stratum::JobSpec> job = stratum::LoadJobSpec(absl::GetFlag(FLAGS_job));
    if (!job.ok()) return stratum::ReportFatal(context.binary, job.status());
    const bool once = absl::GetFlag(FLAGS_eval_once);
    std::unique_ptr<stratum::TaskServer> server;  // health probes keep working
    if (!context.listen_address.empty() && !once) {
      auto started = stratum::StartTaskServer(context);
      if (!started.ok()) return stratum::ReportFatal(context.binary, started.status());
      server = *std::move(started);
    }
    absl::Status status =
        stratum::RunEvaluator(*job, shutdown, absl::GetFlag(FLAGS_eval_interval), once);
    if (server) server->Shutdown(context.shutdown_grace);
    if (!status.ok()) return stratum::ReportFatal(context.binary, status);
    spdlog::info("stopped");
    return 0;
  }
  if (context.task.type == stratum::kEvaluator) {
    // Nothing to evaluate: it answers health checks (a cluster started without a job), and
    // is never sent a worker's closures.
    spdlog::info("no --job to evaluate: serving health checks only");
    return stratum::ServeUntilShutdown(context, shutdown, {});
  }
  stratum::WorkerService service(context.channel_options());
  return stratum::ServeUntilShutdown(context, shutdown, {&service});
}
