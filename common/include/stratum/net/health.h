// Health checks of cluster tasks over grpc.health.v1, and the wait every coordinator does
// before it starts: until each task answers, with a deadline, naming the ones that never
// did. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/channel.h"

namespace stratum {

// What a task said about itself when it answered.
struct TaskReport {
  TaskKey task;
  std::string address;
  bool healthy = false;
  std::string last_error;  // why the last check failed, when !healthy
  // From TaskService.GetTaskStatus (empty when the task is not a Stratum task).
  TaskKey answers_as;  // the task it says it is: `task` unless the cluster spec is wrong
  std::string binary;
  std::string version;
  uint64_t incarnation = 0;
  double uptime_seconds = 0;
  int64_t pid = 0;
};

// One health check of `address`. OK when it reports SERVING; UNAVAILABLE with the reason
// otherwise (refused, not serving, no answer within `timeout`). `channel` carries TLS.
absl::Status CheckHealth(const std::string& address, absl::Duration timeout,
                         const ChannelOptions& channel = {});

// True when `address` ("host:port") refuses a TCP connection, or its host name no longer
// resolves (a deleted pod's): no process listens there, so the one that served it is gone. False
// when a connection is made (a process that is paused or too busy to answer still has its
// connections accepted by the kernel), or when neither happens within `timeout` (its host is down
// or cut off: nothing is known).
bool RefusesConnections(const std::string& address, absl::Duration timeout);

// Asks the TaskService of `address` who it is.
absl::StatusOr<TaskReport> GetTaskReport(const std::string& address, absl::Duration timeout,
                                         const ChannelOptions& channel = {});

struct ClusterWaitOptions {
  absl::Duration timeout = absl::Minutes(10);
  absl::Duration poll_interval = absl::Milliseconds(200);
  // Jobs whose tasks are reported but not waited for (the evaluator is a side-car: a
  // missing one must not hold up training, unlike in TensorFlow, issue #46169).
  std::vector<std::string> optional_jobs = {kEvaluator};
  // Stops the wait early (CANCELLED) when notified, e.g. on SIGTERM.
  const absl::Notification* cancel = nullptr;
  // How to connect (TLS).
  ChannelOptions channel = {};
  // The flag that sets `timeout`, named in the error's fix.
  const char* timeout_flag = "--cluster_timeout";
};

// Polls every task of `spec` in parallel until each required one is healthy. Returns one
// report per task, in spec order. DEADLINE_EXCEEDED names every required task that never
// answered, with its address and the last error.
absl::StatusOr<std::vector<TaskReport>> WaitForClusterHealthy(const ClusterSpec& spec,
                                                              const ClusterWaitOptions& options);

// The reports as an aligned text table (task, address, state, binary, pid, incarnation,
// uptime, version).
std::string FormatClusterTable(const std::vector<TaskReport>& reports);

}  // namespace stratum
