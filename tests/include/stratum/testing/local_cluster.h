// stratum::testing::LocalCluster: a cluster of the real Stratum binaries on free loopback
// ports, for GoogleTest tests of multi-process behaviour — what TensorFlow's
// create_in_process_cluster and multi_process_runner give Python users.
//
//   auto cluster = LocalCluster::Start({.num_workers = 2, .num_ps = 1});
//   ASSERT_TRUE(cluster.ok()) << cluster.status();
//   std::string tf_config = (*cluster)->TfConfig({"worker", 0});
//   ASSERT_OK((*cluster)->Kill({"worker", 1}));     // SIGKILL
//   ASSERT_OK((*cluster)->Restart({"worker", 1}));  // same address, new incarnation
//
// Start() returns once every started server task answers its health check (the chief,
// a program that exits when done, is started but not waited for: WaitForExit it), or
// once they have all ended with success (a job so short it ended before it was seen). The
// destructor stops every process (TERM, then KILL) whatever happened, so a failing test
// leaves nothing behind. Each task's output is captured (Output()) and, by default,
// forwarded to stderr prefixed with its name. Not thread-safe: use from the test thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/launch/launch_plan.h"
#include "stratum/net/channel.h"
#include "stratum/testing/network_hosts.h"
#include "stratum/util/subprocess.h"

namespace stratum::testing {

struct LocalClusterOptions {
  int num_workers = 1;
  int num_ps = 0;
  bool chief = false;
  bool evaluator = false;
  // Tasks planned into the cluster (they have an address and appear in every TF_CONFIG)
  // but not started, e.g. to test a task that never comes up, or to run it yourself.
  std::vector<TaskKey> not_started;
  // Extra flags for every task, and for the tasks of one type.
  std::vector<std::string> all_args;
  std::vector<std::pair<std::string, std::vector<std::string>>> args_by_type;
  // Environment variables set for one task, on top of this process's own.
  std::vector<std::pair<TaskKey, std::vector<std::pair<std::string, std::string>>>> env_by_task;
  // Words put before one task's command line, which must end by running it (as `env` or
  // `unshare --mount sh -c '...; exec "$0" "$@"'` do), at every start and restart: e.g. a
  // mount namespace in which that task alone cannot see some files.
  std::vector<std::pair<TaskKey, std::vector<std::string>>> wrapper_by_task;
  // The host of every task's address: "::" makes servers listen on every address of this
  // machine, IPv4 and IPv6, so a test can call one task from two network addresses
  // (127.0.0.1 and ::1).
  std::string host = "127.0.0.1";
  // Where the binaries are; default: the build's bin folder.
  std::string bin_dir;
  absl::Duration healthy_timeout = absl::Seconds(30);
  absl::Duration stop_grace = absl::Seconds(5);
  // Forward each task's output to stderr as "[worker:1] ...".
  bool forward_output = true;
  // How the health checks connect (must outlive the cluster); null: plaintext. A cluster
  // whose tasks serve mutual TLS (their certificates in all_args) is checked with the same
  // certificates.
  const ChannelOptions* channel = nullptr;
  // Runs each task on a simulated host of its own (in plan order: ps, workers, evaluator,
  // chief; needs that many), at port 2222 of the host's address. The test's process is
  // not on that network, so nothing is health-checked: Start and Restart return once the
  // processes run, and the tasks wait for each other (give them --cluster_timeout).
  const NetworkHosts* hosts = nullptr;
};

// The figures a training binary prints at its end ("test accuracy A, test loss L").
inline constexpr char kTestFigures[] = "test accuracy [0-9.]+, test loss [0-9.]+";

// A path under the test's temporary folder, unique to this process: "<tmp>/<name>_<pid>".
std::string TempPath(const std::string& name);

// Removes a test's folder and what it holds, if it is there. Never throws: a task that is
// still running (a chief that trains and saves) may write into it meanwhile.
void RemoveFolder(const std::string& path);

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const ClusterSpec& spec() const { return plan_.spec; }
  std::string Address(const TaskKey& task) const;
  // The TF_CONFIG JSON text the task was (or would be) started with.
  std::string TfConfig(const TaskKey& task) const;

  // Waits until every running server task answers its health check.
  absl::Status WaitHealthy(absl::Duration timeout);
  // SIGKILLs the task and reaps it.
  absl::Status Kill(const TaskKey& task);
  // Sends `signal` to the task.
  absl::Status Signal(const TaskKey& task, int signal);
  // Starts the task again (or for the first time, for a not_started one) on its address
  // and waits until it answers (servers) or it is running (the chief).
  absl::Status Restart(const TaskKey& task);
  // Waits for the task to exit.
  absl::StatusOr<ExitInfo> WaitForExit(const TaskKey& task, absl::Duration timeout);
  // The task's pid, or 0 when it is not running.
  int Pid(const TaskKey& task);
  // Everything the task's current process has printed.
  std::string Output(const TaskKey& task) const;
  // Waits until the task's output contains `text`; false when `timeout` passes first.
  bool WaitForOutput(const TaskKey& task, const std::string& text, absl::Duration timeout) const;
  // The first match of the regular expression `pattern` in the task's output; "" if none.
  std::string FindInOutput(const TaskKey& task, const std::string& pattern) const;
  // OK when `pattern` matches in every task's output and the first matches are all equal;
  // otherwise names the task that lacks it or differs, with its output.
  absl::Status OutputsAgree(const std::vector<TaskKey>& tasks, const std::string& pattern) const;
  // Stops every task (TERM, then KILL after stop_grace).
  void Stop();

 private:
  LocalCluster(LocalClusterOptions options, LaunchPlan plan)
      : options_(std::move(options)), plan_(std::move(plan)) {}
  absl::StatusOr<const PlannedTask*> Find(const TaskKey& task) const;
  absl::Status StartTask(const PlannedTask& task);
  absl::Status WaitForTasks(const std::vector<TaskKey>& tasks, absl::Duration timeout);
  // Whether every one of `tasks` exits with success, waiting up to `within` for them.
  bool AllEndWithSuccess(const std::vector<TaskKey>& tasks, absl::Duration within);

  const LocalClusterOptions options_;
  const LaunchPlan plan_;
  std::map<TaskKey, std::unique_ptr<Subprocess>> processes_;
};

}  // namespace stratum::testing
