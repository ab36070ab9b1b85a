// stratum-worker: a worker task of a Stratum cluster (or, with --evaluator, the
// evaluator side-car). Serves the health and task services on its TF_CONFIG address until
// SIGTERM/SIGINT.
#include "absl/flags/flag.h"
#include "spdlog/spdlog.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/task_main.h"
#include "stratum/util/flags.h"
#include "stratum/worker/evaluator.h"
#include "stratum/worker/worker_service.h"

ABSL_FLAG(bool, evaluator, false, "Run as the evaluator task (TF_CONFIG task type \"evaluator\")");
ABSL_FLAG(std::string, job, "",
          "With --evaluator: the job whose checkpoints to evaluate as they appear");
ABSL_FLAG(absl::Duration, eval_interval, absl::Seconds(2),
          "With --evaluator: how often to look for a new checkpoint");

int main(int argc, char** argv) {
  stratum::ShutdownWatcher shutdown;
  stratum::ParseFlagsOrExit(argc, argv,
                            "stratum-worker: a worker (or, with --evaluator, the evaluator) of a "
                            "Stratum cluster.\nReads TF_CONFIG (task type \"worker\" or "
                            "\"evaluator\") and serves on the task's address until SIGTERM.\n"
                            "Exit codes: 0 stopped cleanly, 1 failure, 2 configuration or usage "
                            "error.");
  stratum::TaskMainOptions options{.binary = "stratum-worker",
                                   .task_types = {stratum::kWorker, stratum::kEvaluator}};
  if (absl::GetFlag(FLAGS_evaluator)) options.forced_type = stratum::kEvaluator;
  const stratum::TaskContext context = stratum::ResolveTaskOrExit(options);
  if (context.task.type == stratum::kEvaluator && !absl::GetFlag(FLAGS_job).empty()) {
    absl::StatusOr<stratum::JobSpec> job = stratum::LoadJobSpec(absl::GetFlag(FLAGS_job));
    if (!job.ok()) return stratum::ReportFatal(context.binary, job.status());
    std::unique_ptr<stratum::TaskServer> server;  // health probes keep working
    if (!context.listen_address.empty()) {
      auto started = stratum::StartTaskServer(context);
      if (!started.ok()) return stratum::ReportFatal(context.binary, started.status());
      server = *std::move(started);
    }
    absl::Status status = stratum::RunEvaluator(*job, shutdown, absl::GetFlag(FLAGS_eval_interval));
    if (server) server->Shutdown(context.shutdown_grace);
    if (!status.ok()) return stratum::ReportFatal(context.binary, status);
    spdlog::info("stopped");
    return 0;
  }
  stratum::WorkerService service;
  return stratum::ServeUntilShutdown(context, shutdown, {&service});
}
