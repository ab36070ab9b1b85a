// LaunchPlan: a whole Stratum cluster laid out on one machine — every task's port (free
// loopback ports), TF_CONFIG and command line. stratum-launch runs a plan; the
// LocalCluster test fixture runs one too; --dry-run prints one for copying to real
// machines. Plain data; no side effects beyond picking ports.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/cluster/cluster_spec.h"

namespace stratum {

struct LaunchOptions {
  int num_workers = 2;
  int num_ps = 2;
  bool chief = false;
  bool evaluator = false;
  std::string host = "127.0.0.1";
  // Folder holding stratum-coordinator, stratum-worker and stratum-ps.
  std::string bin_dir;
  // Flags added to the command line of the tasks of one type ("chief", "worker", ...),
  // and of all tasks.
  std::vector<std::string> all_args;
  std::vector<std::pair<std::string, std::vector<std::string>>> args_by_type;
  std::string rpc_layer;  // written into TF_CONFIG when set
  // MultiWorkerMirrored: the chief trains like a worker (stratum-worker), it does not
  // coordinate a PS job (stratum-coordinator).
  bool chief_is_worker = false;
  // Set in every task's environment (TLS files).
  std::vector<std::pair<std::string, std::string>> env;
  // Every task serves Prometheus' /metrics on a free port of its own (--metrics_port).
  bool metrics = false;
  // The main task (the job's chief) serves the live status page on a free port
  // (--status_port).
  bool status_page = false;
};

struct PlannedTask {
  TaskKey task;
  std::string address;
  std::vector<std::string> argv;
  std::string tf_config;
  std::vector<std::pair<std::string, std::string>> env;  // besides TF_CONFIG
  std::string metrics_address;  // "host:port" of its /metrics, with LaunchOptions::metrics
};

struct LaunchPlan {
  ClusterSpec spec;
  // Servers first (ps, workers, evaluator), the chief last.
  std::vector<PlannedTask> tasks;
  // The task whose exit ends the cluster: the chief, else worker:0.
  TaskKey main_task;
  // MultiWorkerMirrored: every worker trains and exits when the job is done.
  bool workers_train = false;
  // "host:port" of the main task's status page, with LaunchOptions::status_page.
  std::string status_address;
};

// The binary that runs a task type: chief -> stratum-coordinator (stratum-worker when
// `chief_is_worker`), worker and evaluator -> stratum-worker, ps -> stratum-ps.
std::string BinaryFor(const std::string& task_type, bool chief_is_worker = false);

// Picks a free port for every task and builds each one's TF_CONFIG and command line.
// INVALID_ARGUMENT for counts that make no cluster.
absl::StatusOr<LaunchPlan> PlanLocalCluster(const LaunchOptions& options);

// One shell line per task, `TF_CONFIG='...' /path/stratum-worker ...`, under a comment
// naming the task.
std::string FormatDryRun(const LaunchPlan& plan);

}  // namespace stratum
