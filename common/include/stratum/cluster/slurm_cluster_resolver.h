// SlurmClusterResolver and UnionClusterResolver, after tf.distribute.cluster_resolver's.
//
// Slurm: an `srun` step starts one process per task and tells each, in its environment,
// its rank (SLURM_PROCID), the step's nodes (SLURM_STEP_NODELIST, a hostlist with bracket
// ranges such as "node[01-03,7],gpu5"), how many tasks run on each (SLURM_STEP_TASKS_PER_NODE,
// "2(x3),1") and its GPUs (SLURM_STEP_GPUS, else CUDA_VISIBLE_DEVICES). The tasks are
// numbered as Slurm's default block distribution numbers them: the step's nodes in order,
// the tasks of a node on ports port_base, port_base + 1, ... with gpus_per_task of the
// node's GPUs each; then, as TensorFlow's resolver does, dealt to the jobs sorted by name
// (chief, evaluator, ps, worker): rank r is the r-th. (TensorFlow also sorts the nodes by
// name, which puts node10 before node9 and gives ranks the wrong address; Stratum keeps
// Slurm's order, and checks SLURMD_NODENAME against it.) Without jobs, every task is a
// worker. This rank's GPUs, from the step's ids, are what CUDA_VISIBLE_DEVICES should be
// set to (cuda_visible_devices()).
//
// Union: the jobs of several resolvers in one cluster; this task, and the rpc layer, from
// the first resolver that has one. A job two resolvers both define is an error.
//
// Resolvers are immutable; const methods are thread-safe.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stratum/cluster/cluster_resolver.h"

namespace stratum {

// "n[1-2],m5,o[3-4,6,08-10]" -> n1 n2 m5 o3 o4 o6 o08 o09 o10 (order kept, zero padding
// kept). INVALID_ARGUMENT for an unbalanced bracket or a bad range.
absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(absl::string_view hostlist);
// "2(x3),1" -> 2 2 2 1.
absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(absl::string_view tasks_per_node);

struct SlurmClusterOptions {
  // Tasks per job ("ps" -> 2, "worker" -> 4); empty: every task of the step is a worker.
  std::map<std::string, int> jobs;
  int port_base = 8888;
  std::optional<int> gpus_per_node;  // default: the step's GPUs
  std::optional<int> gpus_per_task;  // default: gpus_per_node / the most tasks of a node
  std::string rpc_layer = "grpc";
};

class SlurmClusterResolver : public ClusterResolver {
 public:
  // Reads the Slurm variables through `getenv` (the process's environment by default).
  // INVALID_ARGUMENT, one sentence naming the variable or option and the fix, when one is
  // missing or malformed, when the jobs want more tasks than the step has, or more GPUs
  // per node than there are.
  static absl::StatusOr<SlurmClusterResolver> Create(
      const SlurmClusterOptions& options,
      const std::function<std::optional<std::string>(const char*)>& getenv = nullptr);

  const ClusterSpec& cluster_spec() const override { return spec_; }
  const std::string& task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  const std::string& rpc_layer() const override { return rpc_layer_; }
  // This rank's GPUs, "0,1"; empty without GPUs.
  const std::string& cuda_visible_devices() const { return cuda_visible_devices_; }

 private:
  SlurmClusterResolver() = default;

  ClusterSpec spec_;
  std::string task_type_;
  int task_id_ = 0;
  std::string rpc_layer_;
  std::string cuda_visible_devices_;
};

class UnionClusterResolver : public ClusterResolver {
 public:
  static absl::StatusOr<UnionClusterResolver> Create(
      const std::vector<const ClusterResolver*>& resolvers);

  const ClusterSpec& cluster_spec() const override { return spec_; }
  const std::string& task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  const std::string& rpc_layer() const override { return rpc_layer_; }

 private:
  UnionClusterResolver() = default;

  ClusterSpec spec_;
  std::string task_type_;
  int task_id_ = 0;
  std::string rpc_layer_;
};

}  // namespace stratum
