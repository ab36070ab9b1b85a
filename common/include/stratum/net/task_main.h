// What the main of every long-running Stratum binary (stratum-ps, stratum-worker,
// stratum-coordinator) does the same way: read TF_CONFIG and the shared flags into a
// TaskContext, set up logging with the task's name, serve the TaskServer, and stop
// cleanly on SIGTERM/SIGINT.
//
// Shared flags: --task_type, --task_index (override TF_CONFIG's task), --tf_config (used
// instead of the TF_CONFIG environment variable), --listen_address (override where the
// server binds), --log_level, --shutdown_grace, --print_tf_config; mutual TLS (--tls_cert,
// --tls_key, --tls_ca, --tls_server_name), --health_port, --metrics_port and --status_port; and the
// Kubernetes cluster resolver's pod settings (--k8s_pod_name, --k8s_namespace,
// --k8s_<type>_replicas, ...), used when there is no TF_CONFIG. Each of the last three groups
// defaults to an environment variable (STRATUM_TLS_CERT, STRATUM_POD_NAME, ...; --help names them),
// read here and nowhere else.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "stratum/cluster/cluster_resolver.h"
#include "stratum/net/channel.h"
#include "stratum/net/task_server.h"
#include "stratum/util/shutdown.h"

namespace stratum {

struct TaskMainOptions {
  std::string binary;                   // "stratum-worker"
  std::vector<std::string> task_types;  // types this binary may run as
  std::optional<std::string> forced_type =
      std::nullopt;  // e.g. "evaluator" for stratum-worker --evaluator
};

struct TaskContext {
  std::string binary;
  TFConfigClusterResolver resolver;
  TaskKey task;
  // Empty for an evaluator outside the cluster given no --listen_address: it serves nothing.
  std::string listen_address;
  absl::Duration shutdown_grace;
  // How this task's clients connect (TLS when the cluster speaks it).
  ChannelOptions channel = {};
  // Where the plaintext health-only server listens (--health_port); empty: none.
  std::string health_listen_address = "";
  // Where the HTTP server of Prometheus' /metrics listens (--metrics_port); empty: none.
  std::string metrics_listen_address = "";
  // Where the live status page listens (--status_port; the chief of a job serves it);
  // empty: none.
  std::string status_listen_address = "";

  // Options for every channel this task opens to the others: pass them to MakeChannel,
  // CheckHealth, ClusterWaitOptions and the clients built on them.
  const ChannelOptions& channel_options() const { return channel; }
};

// The TLS files of --tls_cert, --tls_key, --tls_ca and --tls_server_name, each else from its
// STRATUM_TLS_* variable (what ResolveTaskOrExit loads; also for tools that dial a cluster).
TlsFiles TlsFilesFromFlags();

// Resolves this process's task from TF_CONFIG (the environment variable, read here,
// or --tf_config) or, without one, from the Kubernetes pod settings, and the shared
// flags; decides TLS (rpc_layer "grpc+tls" or certificate files) and loads the
// certificates; then sets up logging. Call after ParseFlagsOrExit. On a configuration
// error prints "<binary>: <one sentence>" to stderr and exits with kExitUsage; with
// --print_tf_config prints the resolved TF_CONFIG and exits with kExitSuccess.
TaskContext ResolveTaskOrExit(const TaskMainOptions& options);

// Starts the TaskServer of `context` (with `services`). Errors name the address.
absl::StatusOr<std::unique_ptr<TaskServer>> StartTaskServer(
    const TaskContext& context, const std::vector<grpc::Service*>& services = {});

// Serves until SIGTERM/SIGINT, then runs `serve_on` (still serving: work that must finish
// before the task goes, e.g. a PS waiting for its coordinator's save), then shuts down
// within the grace period. Returns the exit code for main.
int ServeUntilShutdown(const TaskContext& context, ShutdownWatcher& shutdown,
                       const std::vector<grpc::Service*>& services = {},
                       const std::function<void()>& serve_on = {});

// Prints "<binary>: <message>" to stderr and returns the exit code for `status`.
int ReportFatal(const std::string& binary, const absl::Status& status);

}  // namespace stratum
