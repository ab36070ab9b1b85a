#include "stratum/net/task_main.h"

#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/net/channel.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/logging.h"
#include "stratum/util/process_info.h"

ABSL_FLAG(std::string, task_type, "", "Task type; overrides TF_CONFIG's task.type");
ABSL_FLAG(int, task_index, -1, "Task index; overrides TF_CONFIG's task.index");
ABSL_FLAG(std::string, tf_config, "",
          "TF_CONFIG JSON to use instead of the TF_CONFIG environment variable");
ABSL_FLAG(std::string, listen_address, "",
          "Address the server binds, e.g. 0.0.0.0:2222; default: the task's address in "
          "TF_CONFIG (all interfaces on its port when its host is a DNS name)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error or off");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(3),
          "How long calls in flight may run on after SIGTERM before they are cancelled");

namespace stratum {
namespace {

[[noreturn]] void ExitWithUsageError(const std::string& binary, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", binary.c_str(), message.c_str());
  std::fflush(stderr);
  std::exit(kExitUsage);
}

}  // namespace

int ReportFatal(const std::string& binary, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", binary.c_str(), std::string(status.message()).c_str());
  std::fflush(stderr);
  return ExitCodeFor(status);
}

TaskContext ResolveTaskOrExit(const TaskMainOptions& options) {
  ProcessIncarnation();  // Starts the uptime clock.
  std::string tf_config = absl::GetFlag(FLAGS_tf_config);
  if (tf_config.empty()) {
    const char* env = std::getenv("TF_CONFIG");
    tf_config = env == nullptr ? "" : env;
  }
  TaskOverrides overrides;
  if (!absl::GetFlag(FLAGS_task_type).empty()) overrides.task_type = absl::GetFlag(FLAGS_task_type);
  if (options.forced_type) overrides.task_type = options.forced_type;
  if (absl::GetFlag(FLAGS_task_index) >= 0) overrides.task_index = absl::GetFlag(FLAGS_task_index);

  if (tf_config.empty()) {
    ExitWithUsageError(options.binary,
                       "TF_CONFIG is not set: set it to the cluster and this task, e.g. "
                       "TF_CONFIG='{\"cluster\": {\"worker\": [\"localhost:2222\"], \"ps\": "
                       "[\"localhost:2223\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}' "
                       "(stratum-launch writes it for local clusters)");
  }
  absl::StatusOr<TFConfigClusterResolver> resolver =
      TFConfigClusterResolver::Create(tf_config, overrides);
  if (!resolver.ok()) ExitWithUsageError(options.binary, std::string(resolver.status().message()));
  if (!resolver->has_task()) {
    ExitWithUsageError(options.binary,
                       "TF_CONFIG has no task: add \"task\": {\"type\": \"" +
                           options.task_types.front() +
                           "\", \"index\": 0} or pass --task_type and --task_index");
  }
  const std::string& type = resolver->task_type();
  if (std::find(options.task_types.begin(), options.task_types.end(), type) ==
      options.task_types.end()) {
    ExitWithUsageError(
        options.binary,
        absl::StrCat("TF_CONFIG task.type \"", type, "\" is not a task ", options.binary,
                     " runs: it runs ", absl::StrJoin(options.task_types, " or "),
                     " (chief: stratum-coordinator, worker and evaluator: "
                     "stratum-worker, ps: stratum-ps)"));
  }

  TaskContext context{
      options.binary, *std::move(resolver), {}, "", absl::GetFlag(FLAGS_shutdown_grace)};
  context.task = context.resolver.task();
  context.listen_address = absl::GetFlag(FLAGS_listen_address);
  if (context.listen_address.empty()) {
    absl::StatusOr<std::string> own =
        context.resolver.cluster_spec().TaskAddress(context.task.type, context.task.index);
    if (own.ok()) {
      absl::StatusOr<std::string> listen = ListenAddressFor(*own);
      if (!listen.ok()) ExitWithUsageError(options.binary, std::string(listen.status().message()));
      context.listen_address = *listen;
    }
  }
  if (absl::Status status = InitLogging(context.task.ToString(), absl::GetFlag(FLAGS_log_level));
      !status.ok()) {
    ExitWithUsageError(options.binary, std::string(status.message()));
  }
  return context;
}

absl::StatusOr<std::unique_ptr<TaskServer>> StartTaskServer(
    const TaskContext& context, const std::vector<grpc::Service*>& services) {
  TaskServerOptions options;
  options.task = context.task;
  options.binary = context.binary;
  options.listen_address = context.listen_address;
  return TaskServer::Start(options, services);
}

int ServeUntilShutdown(const TaskContext& context, ShutdownWatcher& shutdown,
                       const std::vector<grpc::Service*>& services) {
  std::unique_ptr<TaskServer> server;
  if (context.listen_address.empty()) {
    spdlog::info("{} {} is not in the cluster and has no --listen_address: serving nothing",
                 context.binary, context.task.ToString());
  } else {
    absl::StatusOr<std::unique_ptr<TaskServer>> started = StartTaskServer(context, services);
    if (!started.ok()) return ReportFatal(context.binary, started.status());
    server = *std::move(started);
    spdlog::info("{} {} serving on {} (incarnation {:016x})", context.binary, StratumVersion(),
                 context.listen_address, ProcessIncarnation());
  }
  shutdown.Wait();
  spdlog::info("signal {} received: shutting down", shutdown.signal_number());
  if (server) server->Shutdown(context.shutdown_grace);
  spdlog::info("stopped");
  return kExitSuccess;
}

}  // namespace stratum
