#include "ps_job_setup.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "proto/worker.pb.h"
#include "remote_worker_executor.h"
#include "stratum/net/host_port.h"
#include "stratum/util/process_info.h"
#include "stratum/util/status_macros.h"

namespace stratum {

std::string CoordinatorDescription(const ClusterSpec& cluster) {
  absl::StatusOr<std::string> address = cluster.TaskAddress(kChief, 0);
  return absl::StrCat("the coordinator chief:0", address.ok() ? " at " + *address : "", ", pid ",
                      getpid(), " on ", HostName());
}

std::string AdvertisedAddress(const ClusterSpec& cluster, const std::string& listen_address) {
  const std::string address = cluster.TaskAddress(kChief, 0).value_or("");
  const std::string port = SplitHostPort(listen_address).port;
  if (address.empty() || port.empty()) return address;
  return WithPort(address, port);
}

absl::StatusOr<std::vector<ShardSpec>> PlaceModelVariables(const Model& model,
                                                           const nlohmann::json& partitioner,
                                                           const std::string& placement,
                                                           int num_ps) {
  STRATUM_ASSIGN_OR_RETURN(const PartitionerSpec parts, PartitionerFromJson(partitioner));
  STRATUM_ASSIGN_OR_RETURN(const PlacementPolicy policy, PlacementPolicyFromName(placement));
  std::vector<ShardSpec> shards;
  for (const VariableSpec& variable : model.variables()) {
    for (ShardSpec& shard : ShardVariable(variable.name, variable.shape, parts)) {
      shards.push_back(std::move(shard));
    }
  }
  STRATUM_RETURN_IF_ERROR(PlaceShards(shards, num_ps, policy));
  return shards;
}

std::vector<std::unique_ptr<WorkerExecutor>> MakeWorkerExecutors(
    const ClusterSpec& cluster, const WorkerSetup& setup,
    const std::function<absl::Status()>& may_set_up_again, const WorkerConnectionFactory& connect) {
  std::vector<std::unique_ptr<WorkerExecutor>> executors;
  const std::vector<int> workers = cluster.task_indices(kWorker);
  for (int index : workers) {
    proto::SetupJobRequest request;
    request.set_job_json(setup.job_json);
    request.set_job_base_dir(setup.job_base_dir);
    request.set_coordinator_incarnation(ProcessIncarnation());
    *request.mutable_coordinator() = ThisCoordinator(setup.ps_client);
    // The workers' own secret: the one the PSs check stays with this process.
    request.mutable_coordinator()->set_secret(ProcessWorkerSecret());
    request.set_ps_timeout_ms(absl::ToInt64Milliseconds(setup.ps_timeout));
    for (const std::string& address : setup.ps_addresses) request.add_ps_addresses(address);
    for (const ShardSpec& shard : setup.shards) {
      proto::VariablePlacement* placement = request.add_placements();
      placement->set_variable(shard.variable);
      placement->set_shard(shard.name);
      placement->set_ps_task(shard.ps_task);
      placement->set_first_row(shard.first_row);
      placement->set_rows(shard.shape.rank() == 0 ? 1 : shard.shape.dim(0));
    }
    request.set_num_workers(static_cast<int>(workers.size()));
    request.set_worker_index(index);
    const std::string task = absl::StrCat("worker:", index);
    const std::string address = *cluster.TaskAddress(kWorker, index);
    const std::string peer = absl::StrCat(task, " at ", address);
    executors.push_back(std::make_unique<RemoteWorkerExecutor>(
        task, address, std::move(request), setup.rpc_timeout,
        connect ? connect(peer, address, setup.channel)
                : std::make_unique<GrpcWorkerConnection>(peer, address, setup.channel),
        may_set_up_again));
  }
  return executors;
}

}  // namespace stratum
