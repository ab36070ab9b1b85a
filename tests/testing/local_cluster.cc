#include "stratum/testing/local_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "stratum/cluster/cluster_resolver.h"
#include "stratum/launch/task_processes.h"
#include "stratum/net/health.h"
#include "stratum/util/status_macros.h"

namespace stratum::testing {
namespace {

bool Contains(const std::vector<TaskKey>& tasks, const TaskKey& task) {
  return std::find(tasks.begin(), tasks.end(), task) != tasks.end();
}

// Moves task i of `plan` to host i: its address, every TF_CONFIG, its command line.
absl::Status PlaceOnHosts(const NetworkHosts& hosts, LaunchPlan& plan) {
  if (hosts.size() < static_cast<int>(plan.tasks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(plan.tasks.size(), " tasks need as many hosts; ", hosts.size(), " were made"));
  }
  ClusterSpec spec;
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    PlannedTask& task = plan.tasks[i];
    task.address = absl::StrCat(hosts.Ip(static_cast<int>(i)), ":2222");
    spec.SetTask(task.task.type, task.task.index, task.address);
  }
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    PlannedTask& task = plan.tasks[i];
    task.tf_config = MakeTfConfig(spec, task.task, "");
    task.argv = hosts.OnHost(static_cast<int>(i), task.argv);
  }
  plan.spec = std::move(spec);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  LaunchOptions launch;
  launch.num_workers = options.num_workers;
  launch.num_ps = options.num_ps;
  launch.chief = options.chief;
  launch.evaluator = options.evaluator;
  launch.host = options.host;
  launch.bin_dir = options.bin_dir.empty() ? STRATUM_BIN_DIR : options.bin_dir;
  launch.all_args = options.all_args;
  launch.args_by_type = options.args_by_type;
  STRATUM_ASSIGN_OR_RETURN(LaunchPlan plan, PlanLocalCluster(launch));
  if (options.hosts != nullptr) STRATUM_RETURN_IF_ERROR(PlaceOnHosts(*options.hosts, plan));
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(options, std::move(plan)));

  std::vector<TaskKey> servers;
  for (const PlannedTask& task : cluster->plan_.tasks) {
    if (Contains(options.not_started, task.task)) continue;
    STRATUM_RETURN_IF_ERROR(cluster->StartTask(task));
    if (task.task.type != kChief) servers.push_back(task.task);
  }
  STRATUM_RETURN_IF_ERROR(cluster->WaitForTasks(servers, options.healthy_timeout));
  return cluster;
}

LocalCluster::~LocalCluster() { Stop(); }

absl::StatusOr<const PlannedTask*> LocalCluster::Find(const TaskKey& task) const {
  for (const PlannedTask& planned : plan_.tasks) {
    if (planned.task == task) return &planned;
  }
  return absl::NotFoundError(absl::StrCat("the local cluster has no task ", task.ToString()));
}

absl::Status LocalCluster::StartTask(const PlannedTask& task) {
  TaskProcessOptions process;
  process.forward_fd = options_.forward_output ? STDERR_FILENO : -1;
  process.capture_output = true;
  for (const auto& [key, env] : options_.env_by_task) {
    if (key == task.task) process.env.insert(process.env.end(), env.begin(), env.end());
  }
  PlannedTask wrapped = task;
  for (const auto& [key, words] : options_.wrapper_by_task) {
    if (key == task.task) wrapped.argv.insert(wrapped.argv.begin(), words.begin(), words.end());
  }
  STRATUM_ASSIGN_OR_RETURN(processes_[task.task], stratum::StartTask(wrapped, process));
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitForTasks(const std::vector<TaskKey>& tasks, absl::Duration timeout) {
  if (options_.hosts != nullptr) return absl::OkStatus();  // not reachable from here
  ClusterSpec running;
  for (const TaskKey& task : tasks) running.SetTask(task.type, task.index, Address(task));
  if (running.empty()) return absl::OkStatus();
  ClusterWaitOptions wait;
  wait.timeout = timeout;
  wait.optional_jobs.clear();
  if (options_.channel != nullptr) wait.channel = *options_.channel;
  // A task that exits while it is waited for (it refused its configuration) ends the wait
  // at once, not at the timeout.
  absl::Notification one_exited, waited;
  wait.cancel = &one_exited;
  std::thread watcher([&] {
    while (!waited.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
      for (const TaskKey& task : tasks) {
        auto process = processes_.find(task);
        if (process != processes_.end() && process->second->Poll().has_value()) {
          one_exited.Notify();
          return;
        }
      }
    }
  });
  absl::StatusOr<std::vector<TaskReport>> reports = WaitForClusterHealthy(running, wait);
  waited.Notify();
  watcher.join();
  if (reports.ok()) return absl::OkStatus();
  // A short job can run to its end before the health check sees it: tasks that all end
  // with success (within a few seconds of the first) did not fail to start.
  if (one_exited.HasBeenNotified() && AllEndWithSuccess(tasks, absl::Seconds(5))) {
    return absl::OkStatus();
  }
  // Say which processes died, which is usually why they never answered.
  std::string exits;
  for (const TaskKey& task : tasks) {
    auto process = processes_.find(task);
    if (process == processes_.end()) continue;
    if (std::optional<ExitInfo> exit = process->second->Poll()) {
      absl::StrAppend(&exits, "; ", task.ToString(), " ", exit->ToString(), ", output:\n",
                      process->second->output());
    }
  }
  if (one_exited.HasBeenNotified()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a task exited before the cluster was healthy", exits));
  }
  return absl::Status(reports.status().code(), absl::StrCat(reports.status().message(), exits));
}

bool LocalCluster::AllEndWithSuccess(const std::vector<TaskKey>& tasks, absl::Duration within) {
  const absl::Time deadline = absl::Now() + within;
  for (const TaskKey& task : tasks) {
    auto process = processes_.find(task);
    if (process == processes_.end()) return false;
    std::optional<ExitInfo> exit = process->second->Poll();
    while (!exit.has_value() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      exit = process->second->Poll();
    }
    if (!exit.has_value() || !exit->success()) return false;
  }
  return true;
}

std::string LocalCluster::Address(const TaskKey& task) const {
  absl::StatusOr<const PlannedTask*> planned = Find(task);
  return planned.ok() ? (*planned)->address : "";
}

std::string LocalCluster::TfConfig(const TaskKey& task) const {
  absl::StatusOr<const PlannedTask*> planned = Find(task);
  return planned.ok() ? (*planned)->tf_config : "";
}

absl::Status LocalCluster::WaitHealthy(absl::Duration timeout) {
  std::vector<TaskKey> servers;
  for (auto& [task, process] : processes_) {
    if (task.type != kChief && !process->Poll().has_value()) servers.push_back(task);
  }
  return WaitForTasks(servers, timeout);
}

absl::Status LocalCluster::Kill(const TaskKey& task) {
  STRATUM_RETURN_IF_ERROR(Signal(task, SIGKILL));
  return WaitForExit(task, absl::Seconds(10)).status();
}

absl::Status LocalCluster::Signal(const TaskKey& task, int signal) {
  auto process = processes_.find(task);
  if (process == processes_.end()) {
    return absl::NotFoundError(absl::StrCat(task.ToString(), " was never started"));
  }
  process->second->Signal(signal);
  return absl::OkStatus();
}

absl::Status LocalCluster::Restart(const TaskKey& task) {
  STRATUM_ASSIGN_OR_RETURN(const PlannedTask* planned, Find(task));
  if (auto process = processes_.find(task); process != processes_.end()) {
    process->second->Stop(options_.stop_grace);
    processes_.erase(process);
  }
  STRATUM_RETURN_IF_ERROR(StartTask(*planned));
  if (task.type == kChief) return absl::OkStatus();
  return WaitForTasks({task}, options_.healthy_timeout);
}

absl::StatusOr<ExitInfo> LocalCluster::WaitForExit(const TaskKey& task, absl::Duration timeout) {
  auto process = processes_.find(task);
  if (process == processes_.end()) {
    return absl::NotFoundError(absl::StrCat(task.ToString(), " was never started"));
  }
  return process->second->Wait(timeout);
}

int LocalCluster::Pid(const TaskKey& task) {
  auto process = processes_.find(task);
  if (process == processes_.end() || process->second->Poll().has_value()) return 0;
  return process->second->pid();
}

std::string LocalCluster::Output(const TaskKey& task) const {
  auto process = processes_.find(task);
  return process == processes_.end() ? "" : process->second->output();
}

bool LocalCluster::WaitForOutput(const TaskKey& task, const std::string& text,
                                 absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Output(task).find(text) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

std::string LocalCluster::FindInOutput(const TaskKey& task, const std::string& pattern) const {
  const std::string output = Output(task);
  std::smatch match;
  return std::regex_search(output, match, std::regex(pattern)) ? match.str(0) : "";
}

absl::Status LocalCluster::OutputsAgree(const std::vector<TaskKey>& tasks,
                                        const std::string& pattern) const {
  std::string first;
  for (const TaskKey& task : tasks) {
    const std::string found = FindInOutput(task, pattern);
    if (found.empty() || (!first.empty() && found != first)) {
      return absl::FailedPreconditionError(absl::StrCat(
          task.ToString(), found.empty() ? " printed nothing matching " : " printed \"",
          found.empty() ? pattern : absl::StrCat(found, "\", not \"", first, "\""),
          "; its output:\n", Output(task)));
    }
    first = found;
  }
  return absl::OkStatus();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name, "_", getpid());
}

void RemoveFolder(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

void LocalCluster::Stop() {
  std::vector<Subprocess*> all;
  for (auto& [task, process] : processes_) all.push_back(process.get());
  StopAll(all, options_.stop_grace);
}

}  // namespace stratum::testing
