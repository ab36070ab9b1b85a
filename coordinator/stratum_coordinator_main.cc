// stratum-coordinator: the chief of a parameter-server cluster. Serves the health and task
// services, waits (with a deadline) until every task of the cluster answers its health
// check, prints the cluster as a table and exits.
#include <cstdio>

#include <spdlog/spdlog.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/health.h"
#include "stratum/net/task_main.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/flags.h"

ABSL_FLAG(absl::Duration, cluster_timeout, absl::Minutes(10),
          "How long to wait for every task to answer its health check (pods may start slowly)");

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

int Run(const TaskContext& context, ShutdownWatcher& shutdown) {
  const ClusterSpec& spec = context.resolver.cluster_spec();
  if (absl::Status status = ValidateParameterServerCluster(spec); !status.ok()) {
    return ReportFatal(context.binary, status);
  }
  absl::StatusOr<std::unique_ptr<TaskServer>> server = StartTaskServer(context);
  if (!server.ok()) return ReportFatal(context.binary, server.status());
  spdlog::info("serving on {}; waiting up to {} for {} tasks to answer", context.listen_address,
               absl::FormatDuration(absl::GetFlag(FLAGS_cluster_timeout)), spec.AllTasks().size());

  ClusterWaitOptions wait;
  wait.timeout = absl::GetFlag(FLAGS_cluster_timeout);
  wait.cancel = &shutdown.notification();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<TaskReport>> reports = WaitForClusterHealthy(spec, wait);
  (*server)->Shutdown(context.shutdown_grace);
  if (!reports.ok()) return ReportFatal(context.binary, reports.status());

  std::printf("%s", FormatClusterTable(*reports).c_str());
  std::fflush(stdout);
  spdlog::info("cluster healthy: {} tasks answered in {}", reports->size(),
               absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))));
  return kExitSuccess;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ShutdownWatcher shutdown;
  stratum::ParseFlagsOrExit(
      argc, argv,
      "stratum-coordinator: the chief of a Stratum parameter-server cluster.\n"
      "Reads TF_CONFIG (task type \"chief\"), waits until every task answers its health "
      "check (--cluster_timeout), prints the cluster and exits.\nExit codes: 0 success, 1 "
      "failure (e.g. tasks that never answered), 2 configuration or usage error.");
  const stratum::TaskContext context = stratum::ResolveTaskOrExit(
      {.binary = "stratum-coordinator", .task_types = {stratum::kChief}});
  return stratum::Run(context, shutdown);
}
