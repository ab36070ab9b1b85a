// Cluster resolvers, after tf.distribute.cluster_resolver: they say which cluster this
// process is part of and which task it is. TFConfigClusterResolver reads a TF_CONFIG JSON
// string (main reads the environment variable and passes it in); SimpleClusterResolver
// wraps a ClusterSpec built in code. Resolvers are immutable after creation; const methods
// are thread-safe.
#pragma once

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "stratum/cluster/cluster_spec.h"

namespace stratum {

class ClusterResolver {
 public:
  virtual ~ClusterResolver() = default;

  virtual const ClusterSpec& cluster_spec() const = 0;
  // This process's task; empty type when the resolver was given no task.
  virtual const std::string& task_type() const = 0;
  virtual int task_id() const = 0;
  // "grpc" (plaintext) or "grpc+tls"; empty means "grpc".
  virtual const std::string& rpc_layer() const = 0;

  bool has_task() const { return !task_type().empty(); }
  TaskKey task() const { return {task_type(), task_id()}; }

  // The address of a task with the rpc layer as scheme ("grpc://host:port"). With no
  // arguments: this process's own task, or "" when there is none.
  std::string master() const;
  absl::StatusOr<std::string> master(absl::string_view type, int index) const;

  // GPUs visible to this process (0 when built without CUDA or when there are none).
  int num_accelerators() const;

  bool is_chief() const { return has_task() && IsChief(cluster_spec(), task_type(), task_id()); }
  absl::StatusOr<int> id_in_cluster() const {
    return IdInCluster(cluster_spec(), task_type(), task_id());
  }
  absl::StatusOr<int> worker_count() const { return WorkerCount(cluster_spec(), task_type()); }
};

// Values that take precedence over TF_CONFIG's (from flags such as --task_type).
struct TaskOverrides {
  std::optional<std::string> task_type = std::nullopt;
  std::optional<int> task_index = std::nullopt;
  std::optional<std::string> rpc_layer = std::nullopt;
};

class TFConfigClusterResolver : public ClusterResolver {
 public:
  // Parses and validates `tf_config` (the JSON text of TF_CONFIG) with TensorFlow's rules:
  // keys cluster, task, rpc_layer and environment (accepted and ignored); task type and
  // index checked against the cluster. An empty string gives an empty cluster and no task,
  // as TensorFlow does when TF_CONFIG is unset. Every error is INVALID_ARGUMENT with one
  // sentence that names the field, the value and the fix.
  static absl::StatusOr<TFConfigClusterResolver> Create(absl::string_view tf_config,
                                                        const TaskOverrides& overrides = {});

  const ClusterSpec& cluster_spec() const override { return spec_; }
  const std::string& task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  const std::string& rpc_layer() const override { return rpc_layer_; }
  // The "environment" value ("cloud" when Kubeflow wrote it), for information only.
  const std::string& environment() const { return environment_; }

 private:
  TFConfigClusterResolver() = default;

  ClusterSpec spec_;
  std::string task_type_;
  int task_id_ = 0;
  std::string rpc_layer_;
  std::string environment_;
};

class SimpleClusterResolver : public ClusterResolver {
 public:
  // Validates `spec` and, when `task_type` is not empty, the task.
  static absl::StatusOr<SimpleClusterResolver> Create(ClusterSpec spec, std::string task_type = "",
                                                      int task_id = 0,
                                                      std::string rpc_layer = "grpc");

  const ClusterSpec& cluster_spec() const override { return spec_; }
  const std::string& task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  const std::string& rpc_layer() const override { return rpc_layer_; }

 private:
  SimpleClusterResolver() = default;

  ClusterSpec spec_;
  std::string task_type_;
  int task_id_ = 0;
  std::string rpc_layer_;
};

// The rpc layers Stratum speaks: "grpc" and "grpc+tls".
absl::Status ValidateRpcLayer(absl::string_view rpc_layer, absl::string_view source = "TF_CONFIG");

// Builds the TF_CONFIG JSON text for one task of `spec` (what a launcher hands a child).
std::string MakeTfConfig(const ClusterSpec& spec, const TaskKey& task,
                         absl::string_view rpc_layer = "");

}  // namespace stratum
