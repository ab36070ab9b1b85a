// What every parameter-server job's coordinator does the same way before closures run,
// the built-in training job (ps_training.cc) and a user's program (ParameterServerCluster):
// name itself to the PSs, shard and place the model's variables, and make each worker's
// executor with the set-up it hands that worker. Internal to coordinator/.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/coordinator/cluster_coordinator.h"
#include "stratum/model/model.h"
#include "stratum/net/channel.h"
#include "stratum/ps/placement.h"
#include "stratum/ps/ps_client.h"
#include "worker_connection.h"

namespace stratum {

// This coordinator as the parameter servers name it when they refuse another one.
std::string CoordinatorDescription(const ClusterSpec& cluster);

// The chief's TF_CONFIG host (what others reach it by) with the port it serves on.
std::string AdvertisedAddress(const ClusterSpec& cluster, const std::string& listen_address);

// The model's variables split by `partitioner` (the job's strategy.variable_partitioner)
// and placed over `num_ps` PSs by `placement` ("balanced_bytes" or "round_robin").
absl::StatusOr<std::vector<ShardSpec>> PlaceModelVariables(const Model& model,
                                                           const nlohmann::json& partitioner,
                                                           const std::string& placement,
                                                           int num_ps);

// What each worker is handed, besides its index.
struct WorkerSetup {
  std::string job_json;
  std::string job_base_dir;
  std::vector<std::string> ps_addresses;
  std::vector<ShardSpec> shards;
  PsClientOptions ps_client;  // the coordinator's, named to the workers
  absl::Duration ps_timeout = absl::Seconds(30);
  absl::Duration rpc_timeout = absl::Minutes(2);
  ChannelOptions channel;
};

// One executor per worker of `cluster`; `may_set_up_again` as RemoteWorkerExecutor takes it.
// `connect` makes each worker's connection (unset: gRPC).
std::vector<std::unique_ptr<WorkerExecutor>> MakeWorkerExecutors(
    const ClusterSpec& cluster, const WorkerSetup& setup,
    const std::function<absl::Status()>& may_set_up_again,
    const WorkerConnectionFactory& connect = nullptr);

}  // namespace stratum
