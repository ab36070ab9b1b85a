#include "stratum/cluster/kubernetes_cluster_resolver.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

std::string ServiceName(const KubernetesClusterOptions& options, absl::string_view type) {
  return absl::StrCat(options.name_prefix, "-", type);
}

bool IsOrdinal(absl::string_view text) {
  if (text.empty() || text.size() > 6) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// "stratum-worker-1" -> worker:1 when "stratum-worker" is a role's service.
absl::StatusOr<TaskKey> TaskOfPod(const KubernetesClusterOptions& options) {
  std::vector<std::string> services;
  for (const auto& [type, replicas] : options.replicas) {
    if (replicas <= 0) continue;
    const std::string service = ServiceName(options, type);
    services.push_back(absl::StrCat(service, "-<i>"));
    const std::string prefix = service + "-";
    if (options.pod_name.rfind(prefix, 0) != 0) continue;
    const std::string ordinal = options.pod_name.substr(prefix.size());
    if (!IsOrdinal(ordinal)) continue;
    int index = 0;
    (void)absl::SimpleAtoi(ordinal, &index);
    if (index >= replicas) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pod ", options.pod_name, " is ", type, " ", index, ", but the cluster has ", replicas,
          " ", type, " replicas (0..", replicas - 1, "): set the replica count (STRATUM_K8S_",
          absl::AsciiStrToUpper(type), "_REPLICAS or --k8s_", type,
          "_replicas) to the StatefulSet's replicas; the manifests' kustomization copies it"));
    }
    return TaskKey{type, index};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "pod name \"", options.pod_name, "\" is not a pod of this cluster (",
      services.empty() ? "no role has replicas" : absl::StrJoin(services, ", "),
      "): name the StatefulSets \"", options.name_prefix,
      "-<type>\" after their Services, or set --k8s_name_prefix (STRATUM_K8S_NAME_PREFIX) "
      "to their prefix"));
}

}  // namespace

std::string KubernetesTaskAddress(const KubernetesClusterOptions& options, absl::string_view type,
                                  int index) {
  const std::string service = ServiceName(options, type);
  std::string host = absl::StrCat(service, "-", index, ".", service);
  if (!options.pod_namespace.empty()) absl::StrAppend(&host, ".", options.pod_namespace, ".svc");
  return absl::StrCat(host, ":", options.port);
}

absl::StatusOr<KubernetesClusterResolver> KubernetesClusterResolver::Create(
    const KubernetesClusterOptions& options) {
  constexpr absl::string_view kSource = "Kubernetes";
  if (options.port < 1 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Kubernetes port ", options.port,
        " is not a port: set --k8s_port (STRATUM_K8S_PORT) to the containers' port, e.g. 2222"));
  }
  KubernetesClusterResolver resolver;
  for (const auto& [type, replicas] : options.replicas) {
    if (!IsValidTaskType(type)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the Kubernetes cluster has replicas of \"", type,
                       "\", which is not a task type: use chief, worker, ps or evaluator"));
    }
    for (int index = 0; index < replicas; ++index) {
      resolver.spec_.SetTask(type, index, KubernetesTaskAddress(options, type, index));
    }
  }
  if (resolver.spec_.empty()) {
    return absl::InvalidArgumentError(
        "the Kubernetes cluster has no replicas: set STRATUM_K8S_WORKER_REPLICAS, "
        "STRATUM_K8S_PS_REPLICAS and STRATUM_K8S_CHIEF_REPLICAS (or --k8s_<type>_replicas)");
  }
  STRATUM_RETURN_IF_ERROR(ValidateClusterSpec(resolver.spec_, kSource));
  STRATUM_RETURN_IF_ERROR(ValidateRpcLayer(options.rpc_layer, kSource));
  STRATUM_ASSIGN_OR_RETURN(TaskKey task, TaskOfPod(options));
  resolver.task_type_ = task.type;
  resolver.task_id_ = task.index;
  resolver.rpc_layer_ = options.rpc_layer;
  return resolver;
}

std::string KubernetesClusterResolver::ToTfConfig() const {
  return MakeTfConfig(spec_, task(), rpc_layer_);
}

}  // namespace stratum
