// ParameterServerCluster: the coordinator side of a user's own parameter-server program,
// as ParameterServerStrategy plus ClusterCoordinator are in TensorFlow's custom training
// loop. Create waits for the PSs and workers to answer, claims the PSs for this program,
// places the job's model variables over them (the job's variable_partitioner) and creates
// them; coordinator() then schedules the functions the worker programs registered
// (stratum/worker/worker_functions.h) by name, with the built-in train_step's semantics:
// at least once, a failed worker's closures run elsewhere and it is set up again when it
// is back, every wait bounded.
//
//   auto cluster = ParameterServerCluster::Create(spec, job_json, {});
//   ClusterCoordinator& coordinator = (*cluster)->coordinator();
//   PerWorkerValues iterators = coordinator.CreatePerWorkerDataset("train");
//   for (int step = 0; step < 100; ++step) coordinator.Schedule("step_fn", {iterators});
//   coordinator.Join();
//
// A PS that fails fails the closure that saw it ("a parameter server is unavailable");
// this class does not restore PSs from checkpoints (the built-in job does). Another
// coordinator that takes the PSs over (this one silent past their lease) makes the next
// Schedule or Join fail, saying so.
//
// Thread safety: coordinator() is thread-safe; ReadVariables may be called from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/coordinator/cluster_coordinator.h"
#include "stratum/job/job_spec.h"
#include "stratum/model/model.h"
#include "stratum/net/channel.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

class PsWatcher;
class ShardedVariables;

struct ParameterServerClusterOptions {
  std::string placement = "balanced_bytes";  // or round_robin
  int closures_per_worker = 1;
  int max_queue_size = 128;
  absl::Duration cluster_timeout = absl::Minutes(2);  // for every PS and worker to answer
  absl::Duration rpc_timeout = absl::Minutes(2);      // bounds each closure's RPC
  absl::Duration ps_timeout = absl::Seconds(30);      // a worker's push or pull
  absl::Duration worker_recovery_timeout = absl::Minutes(5);
  const absl::Notification* cancel = nullptr;  // e.g. ShutdownWatcher's: waits end
  ChannelOptions channel = {};                 // TLS
};

class ParameterServerCluster {
 public:
  // `job_json`: a job file's text, with "model", "compile" and "strategy" (its
  // variable_partitioner, devices); "data" may be left out (the workers' datasets then come
  // from their registered functions). Relative paths in it are relative to `job_base_dir`.
  static absl::StatusOr<std::unique_ptr<ParameterServerCluster>> Create(
      const ClusterSpec& cluster, const std::string& job_json,
      ParameterServerClusterOptions options = {}, const std::string& job_base_dir = "");
  // Leaves the workers and tells the PSs this program is done with them.
  ~ParameterServerCluster();

  ClusterCoordinator& coordinator() { return *coordinator_; }
  const JobSpec& job() const { return job_; }
  const Model& model() const { return *model_; }
  // The model's variables as the PSs hold them now, e.g. to evaluate on this side.
  absl::StatusOr<std::vector<Tensor>> ReadVariables();

 private:
  ParameterServerCluster() = default;

  JobSpec job_;
  std::optional<Model> model_;
  // Built in this order, destroyed in reverse: the closures' executors (which ask the
  // watcher) before the watcher, the watcher before the variables.
  std::unique_ptr<ShardedVariables> variables_;
  std::unique_ptr<PsWatcher> ps_watcher_;
  std::unique_ptr<ClusterCoordinator> coordinator_;
};

}  // namespace stratum
