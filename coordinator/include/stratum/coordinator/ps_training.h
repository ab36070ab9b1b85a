// Parameter-server training on the coordinator (the chief): ParameterServerStrategy's
// program. It places the model's variables over the PS tasks (balanced by bytes unless
// the job says round_robin), creates them, hands every worker the job, schedules
// train_step closures through a ClusterCoordinator (epochs x steps, as Keras' fit does),
// evaluates the test set after each epoch from the PS's current variables, and returns
// the summary. Workers that die are retried around; errors name the task.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/job/job_spec.h"
#include "stratum/net/channel.h"
#include "stratum/training/fit_summary.h"

namespace stratum {

struct PsTrainingOptions {
  std::string placement = "balanced_bytes";  // or round_robin
  int steps_per_closure = 1;
  // Closures in flight per worker; more than one overlaps a closure's transfer with the
  // previous one's steps (the worker runs them one at a time).
  int closures_per_worker = 1;
  absl::Duration rpc_timeout = absl::Minutes(2);
  // How long a worker's push or pull waits for a parameter server before the PS counts as
  // failed (the job then waits for it, see ps_recovery_timeout).
  absl::Duration ps_timeout = absl::Seconds(30);
  // How long to wait for a PS that died to come back (then its variables are restored from
  // the last checkpoint); zero: fail at once. Needs checkpoint.dir.
  absl::Duration ps_recovery_timeout = absl::Minutes(5);
  // How long every worker may be down at once before the job fails (closures wait for a
  // worker to come back until then).
  absl::Duration worker_recovery_timeout = absl::Minutes(5);
  FILE* out = stdout;
  const absl::Notification* cancel = nullptr;  // stop early (SIGTERM)
  ChannelOptions channel = {};                 // how to reach the workers and ps (TLS)
  // Where this coordinator serves (its --listen_address; empty: the chief's TF_CONFIG
  // address). It names itself to the PSs by the chief's TF_CONFIG host with this port, so
  // that a second coordinator given the same TF_CONFIG but serving on another port is not
  // taken for this one restarted.
  std::string listen_address;
  // When set, the trained model is exported there in Keras' formats once the job is
  // complete (ExportKerasModel), its variables pulled from the PSs.
  std::string export_dir;
};

// What RunParameterServerJob would refuse in the job itself (model, loss, optimizer,
// partitioner, placement, the headers of the data files, a checkpoint.dir whose latest
// checkpoint is of another model), checked before the cluster is waited for.
absl::Status CheckParameterServerJob(const JobSpec& job, const PsTrainingOptions& options);

// `job_json` is the job file's text and `job_base_dir` its folder, handed to the workers.
absl::StatusOr<FitSummary> RunParameterServerJob(const JobSpec& job, const std::string& job_json,
                                                 const std::string& job_base_dir,
                                                 const ClusterSpec& cluster,
                                                 const PsTrainingOptions& options);

}  // namespace stratum
