#include "stratum/worker/multi_worker_job.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/collective/tcp_transport.h"
#include "stratum/worker/coordination_client.h"
#include "stratum/worker/multi_worker_mirrored_strategy.h"
#include "stratum/worker/training_job.h"

namespace stratum {
namespace {

std::string HostOf(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return host;
}

absl::StatusOr<FitSummary> Train(const JobSpec& job, const MultiWorkerJobOptions& options,
                                 CoordinationClient& coordination) {
  const std::vector<TaskKey> tasks = MultiWorkerTasks(options.cluster);
  STRATUM_ASSIGN_OR_RETURN(const int rank,
                           IdInCluster(options.cluster, options.task.type, options.task.index));
  STRATUM_ASSIGN_OR_RETURN(const std::string own_address,
                           options.cluster.TaskAddress(options.task.type, options.task.index));

  // Everything that can be refused is checked before any peer is waited for.
  STRATUM_ASSIGN_OR_RETURN(Model model, Model::FromKerasJson(job.model));
  STRATUM_ASSIGN_OR_RETURN(Loss loss, Loss::FromKeras(job.loss));
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                           Optimizer::FromKeras(job.optimizer));
  STRATUM_ASSIGN_OR_RETURN(FitOptions fit, FitOptionsFrom(job));
  fit.progress = options.progress;
  fit.out = options.out;
  CommunicationOptions communication;
  STRATUM_ASSIGN_OR_RETURN(
      communication.implementation,
      CommunicationImplementationFromName(job.strategy.communication.implementation));
  if (communication.implementation == CommunicationImplementation::kNccl) {
    // One NCCL communicator per worker process would need a GPU per worker (NCCL refuses
    // two ranks on one GPU); the GPU path sums across workers in host memory over the ring.
    return absl::UnimplementedError(
        "strategy.communication.implementation NCCL across workers is not implemented: "
        "workers all-reduce through host memory over the TCP ring, also on GPUs; use RING or "
        "AUTO");
  }
  communication.bytes_per_pack = job.strategy.communication.bytes_per_pack;
  communication.timeout = absl::Seconds(job.strategy.communication.timeout_seconds);
  STRATUM_ASSIGN_OR_RETURN(FitData data, LoadFitData(job.data));

  TcpTransportOptions tcp;
  tcp.rank = rank;
  tcp.size = static_cast<int>(tasks.size());
  tcp.host = HostOf(own_address);
  for (const TaskKey& task : tasks) tcp.names.push_back(task.ToString());
  tcp.connect_timeout = options.connect_timeout;
  CoordinationRendezvous rendezvous(coordination);
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport,
                           ConnectTcpTransport(tcp, rendezvous));
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<Collectives> collectives,
                           Collectives::Create(std::move(transport), communication));
  MirroredOptions local;
  local.devices = job.strategy.devices;
  local.cross_device_ops = job.strategy.cross_device_ops;
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<MultiWorkerMirroredStrategy> strategy,
                           MultiWorkerMirroredStrategy::Create(local, std::move(collectives)));
  spdlog::info("{} of {} workers in sync, {} local replica(s), global batch {}", rank + 1,
               tasks.size(), strategy->NumLocalReplicas(),
               fit.batch_size_per_replica * strategy->NumReplicasInSync());
  auto scope = strategy->Scope();
  return Fit(*strategy, model, loss, *optimizer, data, fit);
}

}  // namespace

TaskKey MultiWorkerLeader(const ClusterSpec& cluster) {
  return cluster.num_tasks(kChief) > 0 ? TaskKey{kChief, 0} : TaskKey{kWorker, 0};
}

std::vector<TaskKey> MultiWorkerTasks(const ClusterSpec& cluster) {
  std::vector<TaskKey> tasks;
  if (cluster.num_tasks(kChief) > 0) tasks.push_back({kChief, 0});
  for (int i = 0; i < cluster.num_tasks(kWorker); ++i) tasks.push_back({kWorker, i});
  return tasks;
}

absl::StatusOr<FitSummary> RunMultiWorkerJob(const JobSpec& job,
                                             const MultiWorkerJobOptions& options) {
  const TaskKey leader = MultiWorkerLeader(options.cluster);
  STRATUM_ASSIGN_OR_RETURN(const std::string leader_address,
                           options.cluster.TaskAddress(leader.type, leader.index));
  CoordinationAgentOptions agent_options;
  agent_options.leader_address = leader_address;
  agent_options.leader_name = leader.ToString();
  agent_options.task = options.task;
  agent_options.connect_timeout = options.connect_timeout;
  agent_options.channel = options.channel;
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<CoordinationAgent> agent,
                           CoordinationAgent::Connect(agent_options));
  absl::StatusOr<FitSummary> summary = Train(job, options, *agent);
  if (!summary.ok()) {
    // The others learn of it through their heartbeats and stop instead of waiting.
    (void)agent->ReportError(summary.status());
    return summary;
  }
  // The leader serves the coordination service: nobody leaves before everyone is done.
  STRATUM_RETURN_IF_ERROR(agent->WaitAtBarrier("stratum/end", options.connect_timeout));
  (void)agent->Disconnect();
  return summary;
}

}  // namespace stratum
