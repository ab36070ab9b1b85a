#include "stratum/net/task_main.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "stratum/cluster/kubernetes_cluster_resolver.h"
#include "stratum/cluster/slurm_cluster_resolver.h"
#include "stratum/net/channel.h"
#include "stratum/net/host_port.h"
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
ABSL_FLAG(bool, print_tf_config, false,
          "Print the TF_CONFIG this task resolves (from TF_CONFIG or the Kubernetes pod "
          "settings) as one line of JSON and exit");
ABSL_FLAG(int, health_port, -1,
          "Also serve the gRPC health service alone, plaintext, on this port (for Kubernetes "
          "probes, which cannot speak TLS); 0: no (default: $STRATUM_HEALTH_PORT, else 0)");

ABSL_FLAG(int, metrics_port, -1,
          "Serve Prometheus' /metrics over HTTP on this port (the host the task listens on); "
          "0: no (default: $STRATUM_METRICS_PORT, else 0)");

ABSL_FLAG(int, status_port, -1,
          "The chief of a job (the coordinator, worker 0 of a MultiWorkerMirrored job) serves "
          "a live status page over HTTP on this port; 0: no (default: $STRATUM_STATUS_PORT, "
          "else 0)");

// Mutual TLS. Each defaults to the environment variable it names.
ABSL_FLAG(std::string, tls_cert, "",
          "This task's TLS certificate (PEM); with --tls_key and --tls_ca turns on mutual TLS "
          "(default: $STRATUM_TLS_CERT)");
ABSL_FLAG(std::string, tls_key, "", "The TLS certificate's private key (PEM) ($STRATUM_TLS_KEY)");
ABSL_FLAG(std::string, tls_ca, "",
          "The CA that signs every task's certificate (PEM): only its certificates are trusted "
          "($STRATUM_TLS_CA)");
ABSL_FLAG(std::string, tls_server_name, "",
          "Check servers' certificates for this name instead of the host they are dialled at, "
          "so one certificate serves the whole cluster ($STRATUM_TLS_SERVER_NAME)");

ABSL_FLAG(std::string, cluster_resolver, "auto",
          "Where this task learns its cluster: tf_config (TF_CONFIG or --tf_config), "
          "kubernetes (the pod settings below), slurm (the srun step's SLURM_* variables, "
          "as TensorFlow's SlurmClusterResolver), or auto: TF_CONFIG, else the pod settings, "
          "else a Slurm step");
ABSL_FLAG(std::string, slurm_jobs, "",
          "Slurm: tasks per job, e.g. ps:2,worker:4 (dealt out in the jobs' name order, as "
          "TensorFlow does); default: every task of the step is a worker");
ABSL_FLAG(int, slurm_port_base, 8888,
          "Slurm: the port of a node's first task; its others take the next ports");

// The Kubernetes cluster resolver, used when there is no TF_CONFIG. Each defaults to the
// environment variable it names, which the manifests in deploy/k8s set.
ABSL_FLAG(std::string, k8s_pod_name, "",
          "This pod's name, <prefix>-<type>-<ordinal> (e.g. stratum-worker-1): builds TF_CONFIG "
          "from it and the replica counts when TF_CONFIG is not set ($STRATUM_POD_NAME)");
ABSL_FLAG(std::string, k8s_namespace, "",
          "The pods' namespace, for addresses <pod>.<service>.<namespace>.svc "
          "($STRATUM_POD_NAMESPACE)");
ABSL_FLAG(std::string, k8s_name_prefix, "",
          "Prefix of the Services and StatefulSets, <prefix>-<type> (default: "
          "$STRATUM_K8S_NAME_PREFIX, else stratum)");
ABSL_FLAG(int, k8s_port, -1,
          "The port every task serves on (default: $STRATUM_K8S_PORT, else 2222)");
ABSL_FLAG(int, k8s_chief_replicas, -1,
          "Replicas of the chief, 0 or 1 ($STRATUM_K8S_CHIEF_REPLICAS)");
ABSL_FLAG(int, k8s_worker_replicas, -1, "Replicas of the workers ($STRATUM_K8S_WORKER_REPLICAS)");
ABSL_FLAG(int, k8s_ps_replicas, -1, "Replicas of the ps tasks ($STRATUM_K8S_PS_REPLICAS)");
ABSL_FLAG(int, k8s_evaluator_replicas, -1,
          "Replicas of the evaluator, 0 or 1 ($STRATUM_K8S_EVALUATOR_REPLICAS)");

namespace stratum {
namespace {

[[noreturn]] void ExitWithUsageError(const std::string& binary, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", binary.c_str(), message.c_str());
  std::fflush(stderr);
  std::exit(kExitUsage);
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

std::string FlagOrEnv(const absl::Flag<std::string>& flag, const char* env) {
  std::string value = absl::GetFlag(flag);
  return value.empty() ? Env(env) : value;
}

// An int flag whose unset value is -1, else the environment variable, else `fallback`.
absl::StatusOr<int> IntFlagOrEnv(const absl::Flag<int>& flag, const char* flag_name,
                                 const char* env, int fallback) {
  if (const int value = absl::GetFlag(flag); value >= 0) return value;
  const std::string text = Env(env);
  if (text.empty()) return fallback;
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(env, " is \"", text,
                                                   "\", not a non-negative integer: set it (or --",
                                                   flag_name, ") to a number such as 2"));
  }
  return value;
}

// The Kubernetes pod settings, when a pod name is given.
absl::StatusOr<std::optional<KubernetesClusterOptions>> KubernetesOptionsFromFlags() {
  KubernetesClusterOptions options;
  options.pod_name = FlagOrEnv(FLAGS_k8s_pod_name, "STRATUM_POD_NAME");
  if (options.pod_name.empty()) return std::nullopt;
  options.pod_namespace = FlagOrEnv(FLAGS_k8s_namespace, "STRATUM_POD_NAMESPACE");
  options.name_prefix = FlagOrEnv(FLAGS_k8s_name_prefix, "STRATUM_K8S_NAME_PREFIX");
  if (options.name_prefix.empty()) options.name_prefix = "stratum";
  absl::StatusOr<int> port = IntFlagOrEnv(FLAGS_k8s_port, "k8s_port", "STRATUM_K8S_PORT", 2222);
  if (!port.ok()) return port.status();
  options.port = *port;
  const struct {
    const char* type;
    const absl::Flag<int>& flag;
  } roles[] = {{kChief, FLAGS_k8s_chief_replicas},
               {kWorker, FLAGS_k8s_worker_replicas},
               {kPs, FLAGS_k8s_ps_replicas},
               {kEvaluator, FLAGS_k8s_evaluator_replicas}};
  for (const auto& role : roles) {
    const std::string flag_name = absl::StrCat("k8s_", role.type, "_replicas");
    const std::string env =
        absl::StrCat("STRATUM_K8S_", absl::AsciiStrToUpper(role.type), "_REPLICAS");
    absl::StatusOr<int> replicas = IntFlagOrEnv(role.flag, flag_name.c_str(), env.c_str(), 0);
    if (!replicas.ok()) return replicas.status();
    if (*replicas > 0) options.replicas[role.type] = *replicas;
  }
  if (options.replicas.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pod ", options.pod_name,
        " has no replica counts to build its cluster from: set STRATUM_K8S_WORKER_REPLICAS, "
        "STRATUM_K8S_PS_REPLICAS and STRATUM_K8S_CHIEF_REPLICAS (or --k8s_worker_replicas, ...), "
        "or set TF_CONFIG"));
  }
  return options;
}

// Whether this task speaks TLS: rpc_layer "grpc+tls" needs the certificates, certificates
// with rpc_layer "grpc" (plaintext, said explicitly) are a contradiction, and certificates
// with no rpc_layer (as Kubeflow writes TF_CONFIG) turn TLS on.
absl::StatusOr<bool> UsesTls(const std::string& rpc_layer, const TlsFiles& files) {
  constexpr char kHow[] =
      "pass --tls_cert, --tls_key and --tls_ca (or set STRATUM_TLS_CERT, STRATUM_TLS_KEY and "
      "STRATUM_TLS_CA) to the PEM files of this task's certificate, its key and the cluster's "
      "CA";
  if (files.empty()) {
    if (rpc_layer != "grpc+tls") return false;
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG rpc_layer is \"grpc+tls\", but no TLS certificate is set: ", kHow));
  }
  if (rpc_layer == "grpc") {
    return absl::InvalidArgumentError(
        "TF_CONFIG rpc_layer is \"grpc\" (plaintext), but TLS certificates are set: set "
        "rpc_layer to \"grpc+tls\" (or leave it out), or unset --tls_cert, --tls_key and "
        "--tls_ca (STRATUM_TLS_CERT, STRATUM_TLS_KEY, STRATUM_TLS_CA)");
  }
  std::vector<std::string> missing;
  if (files.cert_file.empty()) missing.push_back("--tls_cert (STRATUM_TLS_CERT)");
  if (files.key_file.empty()) missing.push_back("--tls_key (STRATUM_TLS_KEY)");
  if (files.ca_file.empty()) missing.push_back("--tls_ca (STRATUM_TLS_CA)");
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TLS needs a certificate, its key and the CA together, but ",
        absl::StrJoin(missing, " and "), missing.size() == 1 ? " is" : " are", " not set: ", kHow));
  }
  return true;
}

struct TfConfigSource {
  std::string text;
  std::string pod;  // the Kubernetes pod settings' pod name, when given
  bool from_kubernetes = false;
};

// TF_CONFIG from --tf_config or the environment; without one, built from the Kubernetes
// pod settings (with rpc_layer grpc+tls when `tls`). Empty when there is neither.
// The cluster of a Slurm step, as TF_CONFIG text; CUDA_VISIBLE_DEVICES set to this rank's
// GPUs (as TensorFlow's resolver does with auto_set_gpu), before any CUDA call.
std::string SlurmTfConfigOrExit(const std::string& binary, bool tls) {
  SlurmClusterOptions options;
  options.port_base = absl::GetFlag(FLAGS_slurm_port_base);
  options.rpc_layer = tls ? "grpc+tls" : "grpc";
  for (absl::string_view job :
       absl::StrSplit(absl::GetFlag(FLAGS_slurm_jobs), ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(job, ':');
    int count = 0;
    if (parts.size() != 2 || !IsValidTaskType(parts[0]) || !absl::SimpleAtoi(parts[1], &count) ||
        count < 1) {
      ExitWithUsageError(binary, absl::StrCat("--slurm_jobs has \"", job,
                                              "\": give type:count pairs of chief, worker, ps "
                                              "and evaluator, e.g. ps:2,worker:4"));
    }
    options.jobs[std::string(parts[0])] = count;
  }
  if (options.port_base < 1 || options.port_base > 65535) {
    ExitWithUsageError(binary, absl::StrCat("--slurm_port_base ", options.port_base,
                                            " is not a port: use 1 to 65535"));
  }
  absl::StatusOr<SlurmClusterResolver> resolved = SlurmClusterResolver::Create(options);
  if (!resolved.ok()) ExitWithUsageError(binary, std::string(resolved.status().message()));
  if (!resolved->cuda_visible_devices().empty()) {
    setenv("CUDA_VISIBLE_DEVICES", resolved->cuda_visible_devices().c_str(), 1);
  }
  return MakeTfConfig(resolved->cluster_spec(), resolved->task(), resolved->rpc_layer());
}

TfConfigSource ReadTfConfigOrExit(const std::string& binary, bool tls) {
  const std::string choice = absl::GetFlag(FLAGS_cluster_resolver);
  if (choice != "auto" && choice != "tf_config" && choice != "kubernetes" && choice != "slurm") {
    ExitWithUsageError(binary, absl::StrCat("--cluster_resolver \"", choice,
                                            "\" is not one: use auto, tf_config, kubernetes or "
                                            "slurm"));
  }
  TfConfigSource source;
  if (choice == "slurm") {
    source.text = SlurmTfConfigOrExit(binary, tls);
    return source;
  }
  if (choice != "kubernetes") {
    source.text = absl::GetFlag(FLAGS_tf_config);
    if (source.text.empty()) source.text = Env("TF_CONFIG");
  }
  if (!source.text.empty() || choice == "tf_config") {
    source.pod = FlagOrEnv(FLAGS_k8s_pod_name, "STRATUM_POD_NAME");
    return source;
  }
  absl::StatusOr<std::optional<KubernetesClusterOptions>> pod = KubernetesOptionsFromFlags();
  if (!pod.ok()) ExitWithUsageError(binary, std::string(pod.status().message()));
  if (!pod->has_value()) {
    // auto: a task of a Slurm step resolves from the step.
    if (choice == "auto" && !Env("SLURM_PROCID").empty() && !Env("SLURM_STEP_NODELIST").empty()) {
      source.text = SlurmTfConfigOrExit(binary, tls);
    } else if (choice == "kubernetes") {
      ExitWithUsageError(binary,
                         "--cluster_resolver kubernetes, but no pod name is given: set "
                         "STRATUM_POD_NAME (or --k8s_pod_name) and the replica counts, as "
                         "deploy/k8s does");
    }
    return source;
  }
  if (tls) (*pod)->rpc_layer = "grpc+tls";
  absl::StatusOr<KubernetesClusterResolver> resolved = KubernetesClusterResolver::Create(**pod);
  if (!resolved.ok()) ExitWithUsageError(binary, std::string(resolved.status().message()));
  source.text = resolved->ToTfConfig();
  source.pod = (*pod)->pod_name;
  source.from_kubernetes = true;
  return source;
}

// Where a second server of the task listens (the plaintext health service, the HTTP
// metrics, the status page): the port of `flag` (named `name`, defaulting to $`variable`)
// on the host of `listen_address`; empty for none.
std::string SideListenAddressOrExit(const std::string& binary, const std::string& listen_address,
                                    const absl::Flag<int>& flag, const char* name,
                                    const char* variable) {
  absl::StatusOr<int> port = IntFlagOrEnv(flag, name, variable, 0);
  if (!port.ok()) ExitWithUsageError(binary, std::string(port.status().message()));
  if (*port > 65535) {
    ExitWithUsageError(binary, absl::StrCat("--", name, " ", *port,
                                            " is not a port: use 1 to 65535, or 0 for none"));
  }
  if (*port == 0 || listen_address.empty()) return "";
  return WithPort(listen_address, absl::StrCat(*port));
}

}  // namespace

TlsFiles TlsFilesFromFlags() {
  TlsFiles files;
  files.cert_file = FlagOrEnv(FLAGS_tls_cert, "STRATUM_TLS_CERT");
  files.key_file = FlagOrEnv(FLAGS_tls_key, "STRATUM_TLS_KEY");
  files.ca_file = FlagOrEnv(FLAGS_tls_ca, "STRATUM_TLS_CA");
  files.server_name = FlagOrEnv(FLAGS_tls_server_name, "STRATUM_TLS_SERVER_NAME");
  return files;
}

int ReportFatal(const std::string& binary, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", binary.c_str(), std::string(status.message()).c_str());
  std::fflush(stderr);
  return ExitCodeFor(status);
}

TaskContext ResolveTaskOrExit(const TaskMainOptions& options) {
  ProcessIncarnation();  // Starts the uptime clock.
  // A server holds a descriptor per connection: the soft limit (often 1024) is raised to
  // the hard one, as servers do, so that a burst of connections does not starve it.
  if (struct rlimit files{};
      getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  TaskOverrides overrides;
  if (!absl::GetFlag(FLAGS_task_type).empty()) overrides.task_type = absl::GetFlag(FLAGS_task_type);
  if (options.forced_type) overrides.task_type = options.forced_type;
  if (absl::GetFlag(FLAGS_task_index) >= 0) overrides.task_index = absl::GetFlag(FLAGS_task_index);
  if (absl::GetFlag(FLAGS_task_index) < -1) {
    ExitWithUsageError(options.binary,
                       absl::StrCat("--task_index is ", absl::GetFlag(FLAGS_task_index),
                                    ": give a task index of 0 or more, or leave it out to use "
                                    "TF_CONFIG's task.index"));
  }
  const TlsFiles tls_files = TlsFilesFromFlags();

  const TfConfigSource source = ReadTfConfigOrExit(options.binary, !tls_files.empty());
  const std::string& tf_config = source.text;
  if (tf_config.empty()) {
    ExitWithUsageError(options.binary,
                       "TF_CONFIG is not set: set it to the cluster and this task, e.g. "
                       "TF_CONFIG='{\"cluster\": {\"worker\": [\"localhost:2222\"], \"ps\": "
                       "[\"localhost:2223\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}' "
                       "(stratum-launch writes it for local clusters; in Kubernetes, set "
                       "STRATUM_POD_NAME and the replica counts, as deploy/k8s does)");
  }
  absl::StatusOr<TFConfigClusterResolver> resolver =
      TFConfigClusterResolver::Create(tf_config, overrides);
  if (!resolver.ok()) ExitWithUsageError(options.binary, std::string(resolver.status().message()));
  // A type forced by a flag (stratum-worker --evaluator) names the task TF_CONFIG describes;
  // it does not turn another task into it.
  if (options.forced_type && absl::GetFlag(FLAGS_task_type).empty()) {
    absl::StatusOr<TFConfigClusterResolver> as_given = TFConfigClusterResolver::Create(tf_config);
    if (as_given.ok() && as_given->has_task() && as_given->task_type() != *options.forced_type) {
      ExitWithUsageError(
          options.binary,
          absl::StrCat("this run is the ", *options.forced_type, " task, but TF_CONFIG's task is ",
                       as_given->task().ToString(), ": set TF_CONFIG's task.type to \"",
                       *options.forced_type, "\" (or run ", as_given->task().ToString(),
                       " without the flag that makes it the ", *options.forced_type, ")"));
    }
  }
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
                     " (chief: stratum-coordinator, worker: stratum-worker, evaluator: "
                     "stratum-worker --evaluator, ps: stratum-ps)",
                     type == kEvaluator && options.binary == "stratum-worker"
                         ? ": pass --evaluator to run the evaluator"
                         : ""));
  }
  absl::StatusOr<bool> tls = UsesTls(resolver->rpc_layer(), tls_files);
  if (!tls.ok()) ExitWithUsageError(options.binary, std::string(tls.status().message()));
  if (absl::GetFlag(FLAGS_print_tf_config)) {
    std::printf("%s\n", MakeTfConfig(resolver->cluster_spec(), resolver->task(),
                                     *tls ? "grpc+tls" : resolver->rpc_layer())
                            .c_str());
    std::fflush(stdout);
    std::exit(kExitSuccess);
  }

  TaskContext context{.binary = options.binary,
                      .resolver = *std::move(resolver),
                      .shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace)};
  context.task = context.resolver.task();
  if (*tls) {
    absl::StatusOr<TlsCredentials> credentials = LoadTlsCredentials(tls_files);
    if (!credentials.ok()) {
      ExitWithUsageError(options.binary, std::string(credentials.status().message()));
    }
    context.channel.tls = *std::move(credentials);
  }
  context.listen_address = absl::GetFlag(FLAGS_listen_address);
  if (!context.listen_address.empty()) {
    const std::string& listen = context.listen_address;
    const HostPort split = SplitHostPort(listen);
    int port = 0;
    if (split.host.empty() || !absl::SimpleAtoi(split.port, &port) || port < 0 || port > 65535) {
      ExitWithUsageError(options.binary,
                         absl::StrCat("--listen_address \"", listen,
                                      "\" is not host:port: write e.g. 0.0.0.0:2222 (all "
                                      "interfaces) or 127.0.0.1:2222"));
    }
  }
  if (context.listen_address.empty()) {
    absl::StatusOr<std::string> own =
        context.resolver.cluster_spec().TaskAddress(context.task.type, context.task.index);
    if (own.ok()) {
      absl::StatusOr<std::string> listen = ListenAddressFor(*own);
      if (!listen.ok()) ExitWithUsageError(options.binary, std::string(listen.status().message()));
      context.listen_address = *listen;
    }
  }
  context.health_listen_address =
      SideListenAddressOrExit(options.binary, context.listen_address, FLAGS_health_port,
                              "health_port", "STRATUM_HEALTH_PORT");
  context.metrics_listen_address =
      SideListenAddressOrExit(options.binary, context.listen_address, FLAGS_metrics_port,
                              "metrics_port", "STRATUM_METRICS_PORT");
  context.status_listen_address =
      SideListenAddressOrExit(options.binary, context.listen_address, FLAGS_status_port,
                              "status_port", "STRATUM_STATUS_PORT");
  if (absl::Status status = InitLogging(context.task.ToString(), absl::GetFlag(FLAGS_log_level));
      !status.ok()) {
    ExitWithUsageError(options.binary, std::string(status.message()));
  }
  if (!source.pod.empty()) {
    if (source.from_kubernetes) {
      spdlog::info("TF_CONFIG built from pod {}: {}", source.pod, tf_config);
    } else {
      spdlog::info("TF_CONFIG is set, so it is used, not the Kubernetes pod settings of {}",
                   source.pod);
    }
  }
  return context;
}

absl::StatusOr<std::unique_ptr<TaskServer>> StartTaskServer(
    const TaskContext& context, const std::vector<grpc::Service*>& services) {
  TaskServerOptions options;
  options.task = context.task;
  options.binary = context.binary;
  options.listen_address = context.listen_address;
  options.tls = context.channel.tls;
  options.health_listen_address = context.health_listen_address;
  options.metrics_listen_address = context.metrics_listen_address;
  return TaskServer::Start(options, services);
}

int ServeUntilShutdown(const TaskContext& context, ShutdownWatcher& shutdown,
                       const std::vector<grpc::Service*>& services,
                       const std::function<void()>& serve_on) {
  std::unique_ptr<TaskServer> server;
  if (context.listen_address.empty()) {
    spdlog::info("{} {} is not in the cluster and has no --listen_address: serving nothing",
                 context.binary, context.task.ToString());
  } else {
    absl::StatusOr<std::unique_ptr<TaskServer>> started = StartTaskServer(context, services);
    if (!started.ok()) return ReportFatal(context.binary, started.status());
    server = *std::move(started);
    spdlog::info(
        "{} {} serving on {}{} (incarnation {:016x}){}{}", context.binary, StratumVersion(),
        context.listen_address, context.channel.tls ? " with mutual TLS" : "", ProcessIncarnation(),
        context.health_listen_address.empty()
            ? ""
            : absl::StrCat("; health checks also on ", context.health_listen_address),
        context.metrics_listen_address.empty()
            ? ""
            : absl::StrCat("; metrics on http://", context.metrics_listen_address, "/metrics"));
  }
  shutdown.Wait();
  spdlog::info("signal {} received: shutting down", shutdown.signal_number());
  if (serve_on) serve_on();
  if (server) server->Shutdown(context.shutdown_grace);
  spdlog::info("stopped");
  return kExitSuccess;
}

}  // namespace stratum
