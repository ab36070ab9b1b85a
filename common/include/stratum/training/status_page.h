// The live status page of a training job (--status_port): one small HTML page, no external
// assets, that the coordinator (and worker 0 of a MultiWorkerMirrored job) serves over HTTP
// while it trains. It shows the cluster's tasks (health, incarnation, restarts, uptime),
// the job's progress, and loss and accuracy curves per epoch (inline SVG), and reloads
// itself every 2 s; /status.json has the same as JSON.
//
// StatusBoard is what the page shows of the job: the one epoch loop records the job's
// progress and history in the process's board as it trains. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/channel.h"
#include "stratum/net/http_server.h"
#include "stratum/net/task_main.h"
#include "stratum/training/fit_summary.h"

namespace stratum {

class StatusBoard {
 public:
  static StatusBoard& Global();

  // A run of the job begins (or goes on after a rollback) with these epochs done.
  void StartRun(const std::string& strategy, int epochs, int64_t steps_per_epoch,
                const std::vector<EpochLog>& history);
  // Step `step` of `epoch` (from 1) is done.
  void SetStep(int epoch, int64_t step);
  void EndEpoch(const EpochLog& log);
  // The run ended: `outcome` says how ("complete", or the error).
  void EndRun(const std::string& outcome);

  nlohmann::json ToJson() const;

 private:
  mutable absl::Mutex mutex_;
  std::string strategy_ ABSL_GUARDED_BY(mutex_);
  int epochs_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t steps_per_epoch_ ABSL_GUARDED_BY(mutex_) = 0;
  int epoch_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t step_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<EpochLog> history_ ABSL_GUARDED_BY(mutex_);
  std::string outcome_ ABSL_GUARDED_BY(mutex_);  // empty while training
};

// Serves the page of `StatusBoard::Global()` and of the tasks of `cluster` (asked for
// their status when the page is loaded, 1 s at most) on `address` ("host:port").
absl::StatusOr<std::unique_ptr<HttpServer>> StartStatusPage(const std::string& address,
                                                            const ClusterSpec& cluster,
                                                            const ChannelOptions& channel);

// The status page of the chief of a job, when the task was given --status_port (null
// otherwise), with its URL logged. Errors name the address.
absl::StatusOr<std::unique_ptr<HttpServer>> ServeStatusPageIfAsked(const TaskContext& context,
                                                                   const ClusterSpec& cluster);

// The page's HTML for `status` (StatusBoard's JSON with a "tasks" list added).
std::string StatusPageHtml(const nlohmann::json& status);

}  // namespace stratum
