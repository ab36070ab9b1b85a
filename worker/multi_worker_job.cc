#include "stratum/worker/multi_worker_job.h"

#include <signal.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collective/tcp_transport.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/net/host_port.h"
#include "stratum/net/tls.h"
#include "stratum/training/fit_job.h"
#include "stratum/util/counted.h"
#include "stratum/util/error_kind.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/coordination_client.h"
#include "stratum/worker/mirrored_strategy.h"
#include "stratum/worker/multi_worker_mirrored_strategy.h"
#include "stratum/worker/training_job.h"

namespace stratum {
namespace {

// Logs how this worker reaches each peer: "collective links: TCP to worker:1; Unix socket
// (same host) to worker:2". Whoever reads a slow job's log sees which path it took.
void LogCollectiveLinks(const Transport& transport, const std::vector<std::string>& names,
                        bool tls) {
  std::vector<std::string> tcp, unix_socket;
  for (int r = 0; r < transport.size(); ++r) {
    absl::StatusOr<PeerLink> link = TcpPeerLink(transport, r);
    if (!link.ok()) continue;  // this worker
    (*link == PeerLink::kTcp ? tcp : unix_socket).push_back(names[static_cast<size_t>(r)]);
  }
  std::vector<std::string> parts;
  if (!tcp.empty()) {
    parts.push_back(
        absl::StrCat(tls ? "TCP with mutual TLS to " : "TCP to ", absl::StrJoin(tcp, ", ")));
  }
  if (!unix_socket.empty()) {
    parts.push_back("Unix socket (same host) to " + absl::StrJoin(unix_socket, ", "));
  }
  if (!parts.empty()) spdlog::info("collective links: {}", absl::StrJoin(parts, "; "));
}

// NCCL sums GPU tensors: refused, with the fix, before any peer is waited for when this
// build or this worker's replicas cannot use it.
absl::Status CheckNcclDevices(const std::vector<std::string>& listed) {
  constexpr char kFix[] =
      ", or use strategy.communication.implementation RING or AUTO (they sum across workers in "
      "host memory, also on GPUs)";
#if STRATUM_WITH_CUDA
  STRATUM_ASSIGN_OR_RETURN(const std::vector<std::string> devices, ResolveLocalDevices(listed));
  const bool on_gpus = std::all_of(devices.begin(), devices.end(),
                                   [](const std::string& d) { return d.rfind("GPU:", 0) == 0; });
  if (on_gpus) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "communication implementation NCCL sums GPU tensors, but this worker's replicas are on [",
      absl::StrJoin(devices, ", "), "]: set strategy.devices to GPUs (e.g. [\"GPU:0\"])", kFix));
#else
  (void)listed;
  return absl::FailedPreconditionError(absl::StrCat(
      "communication implementation NCCL needs a build with CUDA and NCCL, and this one has "
      "neither: rebuild where /usr/local/cuda is installed",
      kFix));
#endif
}

// What every worker of a lock-step job must agree on, by the name a user would look for:
// what decides the tensors reduced each step, their order and how many steps run, and the
// cluster. Data file paths, checkpoint.dir and timeouts may differ from host to host.
nlohmann::json LockStepTerms(const JobSpec& job, const ClusterSpec& cluster, size_t replicas,
                             const FitData& data) {
  nlohmann::json cluster_json = cluster.ToJson();
  return {{"model", job.model},
          {"compile.optimizer", job.optimizer},
          {"compile.loss", job.loss},
          {"compile.metrics", job.metrics},
          {"fit.epochs", job.fit.epochs},
          {"fit.steps_per_epoch", job.fit.steps_per_epoch},
          {"fit.batch_size_per_replica", job.fit.batch_size_per_replica},
          {"fit.shuffle_buffer", job.fit.shuffle_buffer},
          {"fit.seed", job.fit.seed},
          {"fit.validate", job.fit.validate},
          {"data.rescale", job.data.rescale},
          {"data.auto_shard_policy", job.data.auto_shard_policy},
          {"data.train (examples)", data.train_examples},
          {"data.test (examples)", data.test_examples},
          {"strategy.devices (replicas)", replicas},
          {"strategy.communication.implementation", job.strategy.communication.implementation},
          {"strategy.communication.bytes_per_pack", job.strategy.communication.bytes_per_pack},
          {"checkpoint.dir (set)", !job.checkpoint.dir.empty()},
          {"checkpoint.every_steps", job.checkpoint.every_steps},
          {"TF_CONFIG cluster.chief", cluster_json.value("chief", nlohmann::json::array())},
          {"TF_CONFIG cluster.worker", cluster_json.value("worker", nlohmann::json::array())}};
}

// Workers started with different job files (or TF_CONFIG clusters) would train on in
// lock-step and silently diverge (each applies its own optimizer to the summed gradients),
// or fail an epoch later with a size mismatch. Each worker compares its terms with the
// leader's before any collective: FAILED_PRECONDITION naming every term that differs.
absl::Status CheckSameJobAsLeader(const nlohmann::json& terms, const std::vector<TaskKey>& tasks,
                                  int rank, absl::Duration timeout, Rendezvous& rendezvous) {
  constexpr char kKey[] = "job/lock_step_terms";
  if (rank == 0) return rendezvous.Set(kKey, terms.dump());
  STRATUM_ASSIGN_OR_RETURN(const std::string leader_dump, rendezvous.Get(kKey, timeout));
  const nlohmann::json leader = nlohmann::json::parse(leader_dump, nullptr, false);
  std::vector<std::string> differences;
  for (const auto& [term, mine] : terms.items()) {
    const nlohmann::json theirs = leader.is_object() ? leader.value(term, nlohmann::json()) : "?";
    if (theirs == mine) continue;
    const std::string a = mine.dump(), b = theirs.dump();
    differences.push_back(a.size() + b.size() <= 120
                              ? absl::StrCat(term, " (", a, " here, ", b, " on the leader)")
                              : term);
  }
  if (differences.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this worker's job differs from the leader's (", tasks[0].ToString(), ") in ",
      absl::StrJoin(differences, ", "),
      ": every worker of a multi_worker_mirrored job must run the same job file and the same "
      "TF_CONFIG cluster; start them all with the same ones"));
}

// While it lives, a signal that ends this process during start-up (before training, when
// no step can be agreed on to stop at) is reported to the coordination service first: the
// others stop within moments, naming this task, instead of at the heartbeat timeout.
class StartUpStopReport {
 public:
  StartUpStopReport(const MultiWorkerJobOptions& options, CoordinationClient& coordination)
      : set_(options.set_before_startup_exit) {
    if (!set_) return;
    set_([&coordination](int signal) {
      const char* name = signal == SIGTERM ? " (SIGTERM)" : signal == SIGINT ? " (SIGINT)" : "";
      (void)coordination.ReportError(absl::AbortedError(absl::StrCat(
          "stopped by signal ", signal, name,
          " during start-up, before training began; start the job again when every worker "
          "can run")));
    });
  }
  ~StartUpStopReport() {
    if (set_) set_(nullptr);
  }
  StartUpStopReport(const StartUpStopReport&) = delete;
  StartUpStopReport& operator=(const StartUpStopReport&) = delete;

 private:
  const std::function<void(std::function<void(int)>)> set_;
};

// Reports this worker's failure to the coordination service (unless it already knows of
// one: the first failure is the cluster error) and returns the error to print.
absl::Status FailJob(CoordinationClient& coordination, const absl::Status& error) {
  if (coordination.cluster_error().ok()) (void)coordination.ReportError(error);
  return AsSeenByThisWorker(coordination.cluster_error(), coordination.task().ToString(), error);
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
  fit.stop = options.stop;
  CommunicationOptions communication;
  STRATUM_ASSIGN_OR_RETURN(
      communication.implementation,
      CommunicationImplementationFromName(job.strategy.communication.implementation));
  communication.bytes_per_pack = job.strategy.communication.bytes_per_pack;
  communication.timeout = absl::Seconds(job.strategy.communication.timeout_seconds);
  STRATUM_ASSIGN_OR_RETURN(FitData data, LoadFitData(job.data, model));
  std::optional<CheckpointFolderLock> checkpoint_lock;
  if (rank == 0 && !fit.checkpoint_dir.empty()) {  // the chief writes the checkpoints
    STRATUM_ASSIGN_OR_RETURN(checkpoint_lock, LockCheckpointFolder(fit.checkpoint_dir));
  }

  TcpTransportOptions tcp;
  tcp.rank = rank;
  tcp.size = static_cast<int>(tasks.size());
  tcp.host = HostOf(own_address);
  for (const TaskKey& task : tasks) tcp.names.push_back(task.ToString());
  tcp.connect_timeout = options.connect_timeout;
  tcp.abort_check = [&coordination] { return coordination.cluster_error(); };
  // A TLS cluster's gradients cross the network under its TLS too.
  if (options.channel.tls) {
    STRATUM_ASSIGN_OR_RETURN(tcp.tls, TlsContext::Create(*options.channel.tls));
  }
  CoordinationRendezvous rendezvous(coordination);
  STRATUM_ASSIGN_OR_RETURN(const std::vector<std::string> devices,
                           ResolveLocalDevices(job.strategy.devices));
  STRATUM_RETURN_IF_ERROR(
      CheckSameJobAsLeader(LockStepTerms(job, options.cluster, devices.size(), data), tasks, rank,
                           options.connect_timeout, rendezvous));
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport,
                           ConnectTcpTransport(tcp, rendezvous));
  LogCollectiveLinks(*transport, tcp.names, tcp.tls != nullptr);
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<Collectives> collectives,
                           Collectives::Create(std::move(transport), communication));
  MirroredOptions local;
  local.devices = job.strategy.devices;
  local.cross_device_ops = job.strategy.cross_device_ops;
  STRATUM_ASSIGN_OR_RETURN(
      std::unique_ptr<MultiWorkerMirroredStrategy> strategy,
      MultiWorkerMirroredStrategy::Create(local, std::move(collectives), &rendezvous));
  spdlog::info("rank {} of {} in sync, {} local replica(s), global batch {}", rank,
               Counted(static_cast<int64_t>(tasks.size()), "worker", "workers"),
               strategy->NumLocalReplicas(),
               fit.batch_size_per_replica * strategy->NumReplicasInSync());
  auto scope = strategy->Scope();
  if (options.training_started) options.training_started();
  absl::StatusOr<FitSummary> summary = Fit(*strategy, model, loss, *optimizer, data, fit);
  // Reported before the connections close: the peers that see them close learn why. A stop
  // is not a failure: every worker stopped at the same step.
  if (!summary.ok() && !IsStoppedEarly(summary.status())) {
    return FailJob(coordination, summary.status());
  }
  if (summary.ok() && rank == 0) {
    STRATUM_RETURN_IF_ERROR(DeleteBackupOfCompleteJob(job.checkpoint, fit.out));
  }
  return summary;
}

}  // namespace

absl::Status AsSeenByThisWorker(const absl::Status& first, const std::string& self,
                                const absl::Status& error) {
  // The first failure as the coordination service reports it: the task that failed, and
  // that task's own error (its cause).
  if (!IsErrorKind(first, ErrorKind::kTaskFailed)) return error;
  const std::string task = ErrorTaskOf(first);
  // This worker's error is the first failure (its own, or learnt from the service), or the
  // same error the first task met (every worker checks the job alike): said once.
  const bool same = task == self ||
                    (IsErrorKind(error, ErrorKind::kTaskFailed) && ErrorTaskOf(error) == task) ||
                    (error.code() == first.code() && error.message() == ErrorCauseOf(first));
  if (same) return error;
  return Rewrapped(
      first, absl::StrCat(first.message(), "; ", self, " stopped as a result: ", error.message()));
}

TaskKey MultiWorkerLeader(const ClusterSpec& cluster) {
  const std::vector<TaskKey> tasks = MultiWorkerTasks(cluster);
  return tasks.empty() ? TaskKey{kWorker, 0} : tasks.front();
}

std::vector<TaskKey> MultiWorkerTasks(const ClusterSpec& cluster) {
  std::vector<TaskKey> tasks;
  if (cluster.num_tasks(kChief) > 0) tasks.push_back({kChief, 0});
  for (int index : cluster.task_indices(kWorker)) tasks.push_back({kWorker, index});
  return tasks;
}

absl::StatusOr<FitSummary> RunMultiWorkerJob(const JobSpec& job,
                                             const MultiWorkerJobOptions& options) {
  // Refused before the leader is waited for.
  STRATUM_RETURN_IF_ERROR(CheckTrainingJob(job));
  ConfigureLocalDevices(job.strategy);
  STRATUM_ASSIGN_OR_RETURN(
      const CommunicationImplementation implementation,
      CommunicationImplementationFromName(job.strategy.communication.implementation));
  if (implementation == CommunicationImplementation::kNccl) {
    STRATUM_RETURN_IF_ERROR(CheckNcclDevices(job.strategy.devices));
  }
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
  spdlog::info("joined the job: registered with the coordination service on {} at {}",
               leader.ToString(), leader_address);
  const StartUpStopReport stop_report(options, *agent);
  absl::StatusOr<FitSummary> summary = Train(job, options, *agent);
  // The others learn of it through their heartbeats and stop instead of waiting.
  if (!summary.ok() && !IsStoppedEarly(summary.status())) {
    absl::Status failed = FailJob(*agent, summary.status());
    // Told: the leader, which serves the others the failure until they have left, need not
    // wait for this task any longer.
    (void)agent->Disconnect(absl::Seconds(1));
    return failed;
  }
  // The leader serves the coordination service: nobody leaves before everyone is done.
  STRATUM_RETURN_IF_ERROR(agent->WaitAtBarrier("stratum/end", options.connect_timeout));
  (void)agent->Disconnect();
  return summary;
}

}  // namespace stratum
