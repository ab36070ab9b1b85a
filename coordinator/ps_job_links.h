// PsJobLinks: how a parameter-server job's coordinator reaches its tasks. A job goes over
// gRPC (GrpcPsJobLinks); a test hands links to PSs and workers in its own process, and so
// drives the job's logic (set-up, the epochs, waiting for a PS that failed and re-seeding
// it, retrying a lost worker's closures) without a socket or a process. Internal to
// coordinator/.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/coordinator/ps_training.h"
#include "stratum/net/channel.h"
#include "stratum/net/health.h"
#include "stratum/ps/ps_transport.h"
#include "worker_connection.h"

namespace stratum {

struct PsJobLinks {
  // The PSs' calls (PsClientOptions::connect).
  PsTransportFactory ps;
  // A worker's calls.
  WorkerConnectionFactory worker;
  // Which process serves at `address` now (GetTaskReport).
  std::function<absl::StatusOr<TaskReport>(const std::string& address, absl::Duration timeout,
                                           const ChannelOptions& channel)>
      report;
  // Waits until every task of `cluster` answers (WaitForClusterHealthy).
  std::function<absl::StatusOr<std::vector<TaskReport>>(const ClusterSpec& cluster,
                                                        const ClusterWaitOptions& options)>
      wait_healthy;
};

// Every link over gRPC.
PsJobLinks GrpcPsJobLinks();

// RunParameterServerJob (ps_training.h) over `links`.
absl::StatusOr<FitSummary> RunParameterServerJob(const JobSpec& job, const std::string& job_json,
                                                 const std::string& job_base_dir,
                                                 const ClusterSpec& cluster,
                                                 const PsTrainingOptions& options,
                                                 const PsJobLinks& links);

}  // namespace stratum
