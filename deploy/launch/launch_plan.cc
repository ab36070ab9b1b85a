#include "stratum/launch/launch_plan.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/cluster/cluster_resolver.h"
#include "stratum/net/free_port.h"
#include "stratum/net/host_port.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// Quotes `text` for a POSIX shell.
std::string ShellQuote(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
                                              "WXYZ0123456789-_./=:,@") == std::string::npos) {
    return text;
  }
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

}  // namespace

std::string BinaryFor(const std::string& task_type, bool chief_is_worker) {
  if (task_type == kChief) return chief_is_worker ? "stratum-worker" : "stratum-coordinator";
  if (task_type == kPs) return "stratum-ps";
  return "stratum-worker";
}

constexpr int kMaxTasksPerType = 256;

absl::StatusOr<LaunchPlan> PlanLocalCluster(const LaunchOptions& options) {
  for (const auto& [flag, count] :
       {std::pair{"--workers", options.num_workers}, std::pair{"--ps", options.num_ps}}) {
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " is ", count, ", which must not be negative: pass 0 or more"));
    }
    // Each task is a process with its own port: far more than one machine runs.
    if (count > kMaxTasksPerType) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " is ", count, ", more than the ", kMaxTasksPerType,
                       " tasks of a type that stratum-launch starts on one machine: pass "
                       "fewer, or start the tasks on several machines (--dry-run prints their "
                       "command lines)"));
    }
  }
  if (options.num_workers == 0 && !options.chief) {
    return absl::InvalidArgumentError(
        "a cluster needs a chief or at least one worker: pass --workers 1 (or more) or --chief");
  }
  if (options.num_ps > 0 && options.num_workers == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ps ", options.num_ps,
                     " with --workers 0: a parameter-server cluster needs at least one worker"));
  }
  LaunchPlan plan;
  std::vector<TaskKey> order;
  for (int i = 0; i < options.num_ps; ++i) order.push_back({kPs, i});
  for (int i = 0; i < options.num_workers; ++i) order.push_back({kWorker, i});
  if (options.evaluator) order.push_back({kEvaluator, 0});
  if (options.chief) order.push_back({kChief, 0});
  // A gRPC port per task, then (with metrics) an HTTP port per task, then the status page's.
  STRATUM_ASSIGN_OR_RETURN(std::vector<int> ports,
                           PickFreePorts(static_cast<int>(order.size() * (options.metrics ? 2 : 1) +
                                                          (options.status_page ? 1 : 0)),
                                         options.host));
  for (size_t i = 0; i < order.size(); ++i) {
    plan.spec.SetTask(order[i].type, order[i].index,
                      JoinHostPort(options.host, absl::StrCat(ports[i])));
  }
  plan.main_task = options.chief ? TaskKey{kChief, 0} : TaskKey{kWorker, 0};
  plan.workers_train = options.chief_is_worker;

  const std::string bin_dir = options.bin_dir.empty() ? "." : options.bin_dir;
  for (size_t t = 0; t < order.size(); ++t) {
    const TaskKey& task = order[t];
    PlannedTask planned;
    planned.task = task;
    planned.address = *plan.spec.TaskAddress(task.type, task.index);
    planned.tf_config = MakeTfConfig(plan.spec, task, options.rpc_layer);
    planned.env = options.env;
    planned.argv.push_back(
        absl::StrCat(bin_dir, "/", BinaryFor(task.type, options.chief_is_worker)));
    if (task.type == kEvaluator) planned.argv.push_back("--evaluator");
    if (options.metrics) {
      const int port = ports[order.size() + t];
      planned.metrics_address = JoinHostPort(options.host, absl::StrCat(port));
      planned.argv.push_back(absl::StrCat("--metrics_port=", port));
    }
    if (options.status_page && task == plan.main_task) {
      plan.status_address = JoinHostPort(options.host, absl::StrCat(ports.back()));
      planned.argv.push_back(absl::StrCat("--status_port=", ports.back()));
    }
    for (const std::string& arg : options.all_args) planned.argv.push_back(arg);
    for (const auto& [type, args] : options.args_by_type) {
      if (type != task.type) continue;
      for (const std::string& arg : args) planned.argv.push_back(arg);
    }
    plan.tasks.push_back(std::move(planned));
  }
  return plan;
}

std::string FormatDryRun(const LaunchPlan& plan) {
  std::string text;
  for (const PlannedTask& task : plan.tasks) {
    std::vector<std::string> words;
    for (const std::string& arg : task.argv) words.push_back(ShellQuote(arg));
    std::string env;
    for (const auto& [name, value] : task.env)
      absl::StrAppend(&env, name, "=", ShellQuote(value), " ");
    absl::StrAppend(&text, "# ", task.task.ToString(), " on ", task.address, "\n", env,
                    "TF_CONFIG=", ShellQuote(task.tf_config), " ", absl::StrJoin(words, " "), "\n");
  }
  return text;
}

}  // namespace stratum
