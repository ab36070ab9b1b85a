#include "stratum/coordinator/parameter_server_cluster.h"

#include "absl/strings/str_cat.h"
#include "ps_job_setup.h"
#include "spdlog/spdlog.h"
#include "stratum/coordinator/ps_watcher.h"
#include "stratum/model/optimizer.h"
#include "stratum/net/health.h"
#include "stratum/ps/sharded_variables.h"
#include "stratum/util/status_macros.h"

namespace stratum {

absl::StatusOr<std::unique_ptr<ParameterServerCluster>> ParameterServerCluster::Create(
    const ClusterSpec& cluster, const std::string& job_json, ParameterServerClusterOptions options,
    const std::string& job_base_dir) {
  std::unique_ptr<ParameterServerCluster> self(new ParameterServerCluster());
  STRATUM_ASSIGN_OR_RETURN(self->job_,
                           ParseJobSpec(job_json, "the job", job_base_dir, {.needs_data = false}));
  const JobSpec& job = self->job_;
  STRATUM_ASSIGN_OR_RETURN(Model model, Model::FromKerasJson(job.model));
  self->model_.emplace(std::move(model));
  STRATUM_RETURN_IF_ERROR(Optimizer::FromKeras(job.optimizer).status());
  STRATUM_RETURN_IF_ERROR(Loss::FromKeras(job.loss).status());
  const int num_ps = cluster.num_tasks(kPs);
  if (num_ps == 0 || cluster.num_tasks(kWorker) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a parameter-server cluster needs at least one ps and one worker task, and this one "
        "has ",
        num_ps, " ps and ", cluster.num_tasks(kWorker),
        " worker tasks: list them in TF_CONFIG's cluster"));
  }
  STRATUM_ASSIGN_OR_RETURN(std::vector<ShardSpec> shards,
                           PlaceModelVariables(*self->model_, job.strategy.variable_partitioner,
                                               options.placement, num_ps));

  // Every PS and worker answers first (this program serves nothing itself).
  ClusterSpec servers;
  for (const char* type : {kPs, kWorker}) {
    for (int index : cluster.task_indices(type)) {
      servers.SetTask(type, index, *cluster.TaskAddress(type, index));
    }
  }
  ClusterWaitOptions wait;
  wait.timeout = options.cluster_timeout;
  wait.cancel = options.cancel;
  wait.channel = options.channel;
  STRATUM_RETURN_IF_ERROR(WaitForClusterHealthy(servers, wait).status());

  PsClientOptions ps_client{.timeout = options.rpc_timeout,
                            .channel = options.channel,
                            .coordinator = CoordinatorDescription(cluster),
                            .coordinator_address = AdvertisedAddress(cluster, ""),
                            .checkpoint_dir = job.checkpoint.dir};
  std::vector<std::string> names, ps_addresses;
  std::vector<Shape> shapes;
  for (const VariableSpec& variable : self->model_->variables()) {
    names.push_back(variable.name);
    shapes.push_back(variable.shape);
  }
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int task = 0; task < num_ps; ++task) {
    ps_addresses.push_back(*cluster.TaskAddress(kPs, task));
    clients.push_back(
        std::make_unique<PsClient>(absl::StrCat("ps:", task), ps_addresses.back(), ps_client));
  }
  self->variables_ = std::make_unique<ShardedVariables>(names, shapes, shards, std::move(clients));
  // One coordinator at a time: the PSs are claimed before anything is created on them.
  self->ps_watcher_ = std::make_unique<PsWatcher>(*self->variables_, PsWatcherOptions{});
  STRATUM_RETURN_IF_ERROR(self->ps_watcher_->Claim());
  std::vector<nlohmann::json> rules;
  for (const VariableSpec& spec : self->model_->variables()) {
    rules.push_back(UpdateJsonFor(spec, job.optimizer));
  }
  STRATUM_RETURN_IF_ERROR(
      self->variables_->Create(self->model_->InitialFills(job.fit.seed), rules));
  for (const ShardSpec& shard : shards) {
    spdlog::info("variable {} ({} bytes) on ps:{}", shard.name, shard.bytes, shard.ps_task);
  }

  WorkerSetup setup{.job_json = job_json,
                    .job_base_dir = job_base_dir,
                    .ps_addresses = ps_addresses,
                    .shards = shards,
                    .ps_client = ps_client,
                    .ps_timeout = options.ps_timeout,
                    .rpc_timeout = options.rpc_timeout,
                    .channel = options.channel};
  PsWatcher* watcher = self->ps_watcher_.get();
  ClusterCoordinatorOptions coordinator_options;
  coordinator_options.max_queue_size = options.max_queue_size;
  coordinator_options.closures_per_worker = std::max(1, options.closures_per_worker);
  coordinator_options.cancel = options.cancel;
  coordinator_options.worker_recovery_timeout = options.worker_recovery_timeout;
  // Another coordinator that took the PSs over ends this program's closures.
  coordinator_options.check_hold = [watcher] { return watcher->Lost(); };
  self->coordinator_ = std::make_unique<ClusterCoordinator>(
      MakeWorkerExecutors(cluster, setup, [watcher] { return watcher->CheckHold(); }),
      coordinator_options);
  return self;
}

ParameterServerCluster::~ParameterServerCluster() {
  coordinator_.reset();  // leaves the workers first
  ps_watcher_.reset();
  variables_.reset();
}

absl::StatusOr<std::vector<Tensor>> ParameterServerCluster::ReadVariables() {
  STRATUM_RETURN_IF_ERROR(ps_watcher_->Lost());
  absl::StatusOr<std::vector<Tensor>> pulled = variables_->Pull();
  if (!pulled.ok()) return PsFailure(pulled.status());
  return pulled;
}

}  // namespace stratum
