// ClusterSpec: the jobs of a cluster and the "host:port" of every task, as TF_CONFIG's
// `cluster` describes them, in the dense form {"worker": ["a:1", "b:2"]} or the sparse
// form {"worker": {"1": "b:2"}} that Kubeflow writes for dynamic workers.
//
// Also TensorFlow's rules about who is who: the chief is chief:0, else worker:0; ids in
// the cluster; worker counts. A ClusterSpec is a value type; const methods are
// thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace stratum {

inline constexpr char kChief[] = "chief";
inline constexpr char kWorker[] = "worker";
inline constexpr char kPs[] = "ps";
inline constexpr char kEvaluator[] = "evaluator";

// The task types TensorFlow's distribution strategies accept, in display order.
const std::vector<std::string>& ValidTaskTypes();
bool IsValidTaskType(absl::string_view type);

// One task of a cluster: "worker:1".
struct TaskKey {
  std::string type;
  int index = 0;

  std::string ToString() const;
  friend bool operator==(const TaskKey&, const TaskKey&) = default;
  friend auto operator<=>(const TaskKey&, const TaskKey&) = default;
};

// Checks "host:port": a non-empty host (a name, an IPv4 address or a bracketed IPv6
// address) and a port from 1 to 65535. The error says what is wrong, without naming
// the field (the caller adds that).
absl::Status ValidateAddress(absl::string_view address);

class ClusterSpec {
 public:
  // Task index -> "host:port". Indices are dense (0..n-1) unless built from a sparse form.
  using Job = std::map<int, std::string>;

  ClusterSpec() = default;

  // Parses the value of TF_CONFIG's `cluster` and validates it with ValidateClusterSpec.
  // `source` names where it came from in errors ("TF_CONFIG").
  static absl::StatusOr<ClusterSpec> FromJson(const nlohmann::json& cluster,
                                              absl::string_view source = "TF_CONFIG");

  // Adds or replaces one task. No validation: call ValidateClusterSpec afterwards.
  void SetTask(const std::string& type, int index, std::string address);

  bool empty() const { return jobs_.empty(); }
  bool HasJob(absl::string_view type) const;
  bool HasTask(absl::string_view type, int index) const;
  // Jobs in display order (chief, worker, ps, evaluator, then any other).
  std::vector<std::string> job_names() const;
  int num_tasks(absl::string_view type) const;
  std::vector<int> task_indices(absl::string_view type) const;
  // The address of a task; NOT_FOUND naming the task when it is not in the spec.
  absl::StatusOr<std::string> TaskAddress(absl::string_view type, int index) const;
  // Every task, jobs in display order, indices ascending.
  std::vector<TaskKey> AllTasks() const;
  const std::map<std::string, Job, std::less<>>& jobs() const { return jobs_; }

  // The dense form for jobs whose indices are 0..n-1, the sparse form for the others.
  nlohmann::json ToJson() const;

  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;

 private:
  std::map<std::string, Job, std::less<>> jobs_;
};

// TensorFlow's rules for a cluster: not empty; only chief, worker, ps and evaluator
// jobs; at most one chief and one evaluator; no empty job; valid and distinct addresses.
// Each error is one sentence naming `source`, the field, the value and the fix.
absl::Status ValidateClusterSpec(const ClusterSpec& spec, absl::string_view source = "TF_CONFIG");

// Checks that `type:index` is a task of `spec` (an evaluator may be absent from the
// cluster, as in TensorFlow).
absl::Status ValidateTask(const ClusterSpec& spec, absl::string_view type, int index,
                          absl::string_view source = "TF_CONFIG");

// The chief: chief:0 when the cluster has a chief job, else worker:0. NOT_FOUND when the
// cluster has neither.
absl::StatusOr<TaskKey> ChiefTask(const ClusterSpec& spec);
bool IsChief(const ClusterSpec& spec, absl::string_view type, int index);

// TensorFlow's id_in_cluster: chief 0; workers after it (from 1 when there is a chief) in
// index order, numbered without the gaps a sparse worker job has; an evaluator its own
// index. A ps has no id (INVALID_ARGUMENT).
absl::StatusOr<int> IdInCluster(const ClusterSpec& spec, absl::string_view type, int index);

// TensorFlow's worker_count: chief plus workers, or the evaluators for an evaluator.
absl::StatusOr<int> WorkerCount(const ClusterSpec& spec, absl::string_view type);

}  // namespace stratum
