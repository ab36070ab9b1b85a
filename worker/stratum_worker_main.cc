// stratum-worker: a worker task of a Stratum cluster (or, with --evaluator, the
// evaluator side-car). Serves the health and task services on its TF_CONFIG address until
// SIGTERM/SIGINT.
#include "absl/flags/flag.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/task_main.h"
#include "stratum/util/flags.h"
#include "stratum/worker/worker_service.h"

ABSL_FLAG(bool, evaluator, false, "Run as the evaluator task (TF_CONFIG task type \"evaluator\")");

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
  stratum::WorkerService service;
  return stratum::ServeUntilShutdown(context, shutdown, {&service});
}
