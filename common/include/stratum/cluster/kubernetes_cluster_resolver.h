// KubernetesClusterResolver: the cluster and this task as a pod of Stratum's plain
// Kubernetes manifests sees them, with no TF_CONFIG written by anyone. Each role runs as a
// StatefulSet behind a headless Service of the same name, "<prefix>-<type>" (stratum-ps,
// stratum-worker; the coordinator's Job pod takes the hostname stratum-chief-0 under the
// Service stratum-chief), so task <type>:<i> is the pod "<prefix>-<type>-<i>" and its
// address is "<prefix>-<type>-<i>.<prefix>-<type>.<namespace>.svc:<port>". Given the
// pod's name and the replica count of every role, the resolver works out the whole
// cluster and this task; scaling a role is changing one number.
//
// Unlike TensorFlow's KubernetesClusterResolver it asks no API server: main reads the
// pod's name and namespace (the downward API puts them in the environment) and the
// replica counts (a ConfigMap) once, from flags or the environment, into
// KubernetesClusterOptions. Resolvers are immutable; const methods are thread-safe.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stratum/cluster/cluster_resolver.h"

namespace stratum {

struct KubernetesClusterOptions {
  std::string pod_name;       // "stratum-worker-1": the StatefulSet's pod (metadata.name)
  std::string pod_namespace;  // "default"; empty: addresses without ".<namespace>.svc"
  std::string name_prefix = "stratum";
  int port = 2222;
  // Replicas per task type ("worker" -> 2); a type absent or with 0 replicas is no job.
  std::map<std::string, int, std::less<>> replicas;
  std::string rpc_layer;  // "", "grpc" or "grpc+tls"
};

class KubernetesClusterResolver : public ClusterResolver {
 public:
  // Builds the cluster and finds this pod's task. INVALID_ARGUMENT, one sentence naming
  // the value and the fix, when the pod's name is not "<prefix>-<type>-<ordinal>" of a
  // role with replicas, the ordinal is not below that role's replicas, or the cluster is
  // not valid (e.g. two chiefs).
  static absl::StatusOr<KubernetesClusterResolver> Create(const KubernetesClusterOptions& options);

  const ClusterSpec& cluster_spec() const override { return spec_; }
  const std::string& task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  const std::string& rpc_layer() const override { return rpc_layer_; }

  // The TF_CONFIG this pod would be given (what --print_tf_config prints).
  std::string ToTfConfig() const;

 private:
  KubernetesClusterResolver() = default;

  ClusterSpec spec_;
  std::string task_type_;
  int task_id_ = 0;
  std::string rpc_layer_;
};

// The address of task `index` of `type` in the plain manifests' naming (see above).
std::string KubernetesTaskAddress(const KubernetesClusterOptions& options, absl::string_view type,
                                  int index);

}  // namespace stratum
