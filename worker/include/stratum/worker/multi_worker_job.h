// A MultiWorkerMirrored job as one of its workers runs it (what `stratum-worker --job`
// does when the job's strategy is multi_worker_mirrored): join the coordination service on
// the leader (chief:0, else worker:0), connect the collectives' TCP mesh through its
// key-value store, broadcast or restore the variables from the chief, Fit in lock-step,
// and leave together at a final barrier. A failure anywhere is reported to the service, so
// the other workers stop at once with an error naming this task instead of waiting.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/job/job_spec.h"
#include "stratum/net/channel.h"
#include "stratum/worker/collective/transport.h"
#include "stratum/worker/coordination_client.h"
#include "stratum/worker/fit.h"

namespace stratum {

struct MultiWorkerJobOptions {
  ClusterSpec cluster;
  TaskKey task;  // chief:0 or worker:i
  ChannelOptions channel;
  // How long to wait for the leader and for every peer to connect.
  absl::Duration connect_timeout = absl::Minutes(2);
  ProgressStyle progress = ProgressStyle::kLines;
  FILE* out = stdout;
  // FitOptions::stop: notified (SIGTERM), every worker stops after the same step and the
  // job's state is saved there; RunMultiWorkerJob then returns an IsStoppedEarly error.
  const absl::Notification* stop = nullptr;
  // Called when training starts, after the start-up waits, when set.
  std::function<void()> training_started;
  // When set, called once this task has joined the job with what to call, with the
  // signal, when a signal before training is about to end the process at once
  // (StopDeadline::SetBeforeExit), and with nullptr before that becomes invalid. It tells
  // the coordination service, so that the others stop within moments naming this task.
  std::function<void(std::function<void(int signal)>)> set_before_startup_exit;
};

// The collectives find each other through the coordination service's key-value store.
class CoordinationRendezvous : public Rendezvous {
 public:
  explicit CoordinationRendezvous(CoordinationClient& client) : client_(client) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return client_.SetKeyValue(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return client_.GetKeyValue(key, timeout);
  }
  absl::Status cluster_error() const override { return client_.cluster_error(); }

 private:
  CoordinationClient& client_;
};

// The leader of the job: chief:0 when the cluster has a chief, else the first worker
// (worker:0, unless the worker job is sparse).
TaskKey MultiWorkerLeader(const ClusterSpec& cluster);

// The tasks that train in lock-step: chief:0 (if any), then every worker, in rank order.
std::vector<TaskKey> MultiWorkerTasks(const ClusterSpec& cluster);

// What worker `self` reports when its training failed with `error`, given the job's first
// failure `first` (the cluster error, "worker:2 failed: <cause>"; OK when none is known).
// Its own error when it failed first, or when its error says what the cause says (every
// worker finds a bad job alike); else the first failure leads and this one follows:
// "worker:2 failed: X; worker:0 stopped as a result: Y". A peer that fails exits and closes
// its connections, so its neighbours see "worker:3 closed the connection" although
// worker:2 died.
absl::Status AsSeenByThisWorker(const absl::Status& first, const std::string& self,
                                const absl::Status& error);

// Trains `job` as `options.task`. The leader's process must serve the coordination
// service on its TaskServer (see stratum_worker_main.cc) before calling this.
absl::StatusOr<FitSummary> RunMultiWorkerJob(const JobSpec& job,
                                             const MultiWorkerJobOptions& options);

}  // namespace stratum
