#include "stratum/coordinator/ps_training.h"

#include <grpcpp/client_context.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "proto/worker.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "stratum/coordinator/checkpoint_manager.h"
#include "stratum/coordinator/cluster_coordinator.h"
#include "stratum/coordinator/ps_watcher.h"
#include "stratum/data/idx.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/net/channel.h"
#include "stratum/net/health.h"
#include "stratum/net/host_port.h"
#include "stratum/net/status.h"
#include "stratum/ps/coordinator_lease.h"
#include "stratum/ps/ps_client.h"
#include "stratum/ps/sharded_variables.h"
#include "stratum/tensor/tensor_proto.h"
#include "stratum/training/evaluate.h"
#include "stratum/training/fit_job.h"
#include "stratum/training/training_status.h"
#include "stratum/util/counted.h"
#include "stratum/util/json_text.h"
#include "stratum/util/process_info.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One worker over gRPC: sets the job up on first use and again after the worker restarts.
class GrpcWorkerExecutor : public WorkerExecutor {
 public:
  // `may_set_up_again`: asked before the job is set up on the worker again; an error ends
  // the job instead (this coordinator lost the cluster to another one).
  GrpcWorkerExecutor(std::string task, std::string address, proto::SetupJobRequest setup,
                     absl::Duration timeout, ChannelOptions channel,
                     std::function<absl::Status()> may_set_up_again)
      : task_(std::move(task)),
        address_(std::move(address)),
        setup_(std::move(setup)),
        timeout_(timeout),
        channel_(std::move(channel)),
        may_set_up_again_(std::move(may_set_up_again)),
        stub_(proto::WorkerService::NewStub(MakeChannel(address_, channel_))) {}

  // Done with the worker (best effort): another coordinator may set it up at once, not
  // only once this one's claim has run out.
  ~GrpcWorkerExecutor() override {
    {
      absl::MutexLock lock(&setup_mutex_);
      if (generation_ == 0) return;  // never set up: nothing held
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    proto::LeaveRequest request;
    request.set_coordinator_incarnation(setup_.coordinator_incarnation());
    proto::LeaveResponse response;
    (void)stub_->Leave(&context, request, &response);
  }

  std::string name() const override { return absl::StrCat(task_, " at ", address_); }

  absl::StatusOr<ClosureOutputs> Execute(const Closure& closure) override {
    absl::StatusOr<uint64_t> generation = EnsureSetUp();
    if (!generation.ok()) return generation.status();
    proto::RunClosureRequest request;
    request.set_function(closure.function);
    request.set_coordinator_incarnation(setup_.coordinator_incarnation());
    for (const Tensor& arg : closure.args) TensorToProto(arg, request.add_args());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    {
      absl::MutexLock lock(&mutex_);
      if (cancelled_) return absl::CancelledError("the coordinator is shutting down");
      in_flight_.insert(&context);
    }
    proto::RunClosureResponse response;
    absl::Status status = FromGrpcStatus(stub_->RunClosure(&context, request, &response), name());
    {
      absl::MutexLock lock(&mutex_);
      in_flight_.erase(&context);
      if (cancelled_ && !status.ok()) {
        return absl::CancelledError("the coordinator shut down before the closure ended");
      }
    }
    if (!status.ok()) return Classify(status, *generation);
    ClosureOutputs outputs;
    for (const proto::TensorProto& output : response.outputs()) {
      absl::StatusOr<Tensor> tensor = TensorFromProto(output);
      if (!tensor.ok()) return tensor.status();
      outputs.push_back(*std::move(tensor));
    }
    return outputs;
  }

  void Cancel() override {
    absl::MutexLock lock(&mutex_);
    cancelled_ = true;
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  }

  absl::Status WaitUntilAvailable(const std::atomic<bool>& stop) override {
    bool said = false;
    while (!stop) {
      if (CheckHealth(address_, absl::Seconds(1), channel_).ok()) {
        spdlog::info("{} answers again; it will be set up anew", name());
        return absl::OkStatus();
      }
      if (!said) spdlog::warn("{} is down; its closures run on the other workers", name());
      said = true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return absl::CancelledError("stopping");
  }

 private:
  // Sets the job up on the worker unless it is set up already, and returns the set-up's
  // generation. With several closures in flight, one thread sets up and the others wait.
  absl::StatusOr<uint64_t> EnsureSetUp() {
    absl::MutexLock lock(&setup_mutex_);
    if (set_up_) return generation_;
    // A worker that lost its job may have been set up by another coordinator since.
    if (generation_ > 0) STRATUM_RETURN_IF_ERROR(may_set_up_again_());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    proto::SetupJobResponse response;
    absl::Status status = FromGrpcStatus(stub_->SetupJob(&context, setup_, &response), name());
    if (!status.ok()) return Classify(status, generation_, /*locked=*/true);
    set_up_ = true;
    return ++generation_;
  }

  // A worker that restarted lost its job ("not set up"), one that is unreachable is down:
  // both mean "run the closure elsewhere" and "set it up again", unless another closure has
  // set it up since `generation`; anything else is the job's own error. One that another
  // coordinator holds ends this one's job.
  absl::Status Classify(const absl::Status& status, uint64_t generation, bool locked = false) {
    if (absl::IsFailedPrecondition(status) &&
        absl::StrContains(status.message(), kHeldByAnotherCoordinator)) {
      return absl::FailedPreconditionError(
          absl::StrCat(status.message(), "; this coordinator stops and leaves the job to it"));
    }
    const bool lost =
        (absl::IsFailedPrecondition(status) && absl::StrContains(status.message(), "not set up"));
    const bool down = absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
                      absl::IsCancelled(status);
    if (!lost && !down) return status;
    {
      std::optional<absl::MutexLock> lock;
      if (!locked) lock.emplace(&setup_mutex_);
      if (generation_ == generation) set_up_ = false;
    }
    return lost ? absl::AbortedError(status.message()) : absl::UnavailableError(status.message());
  }

  std::string task_;
  std::string address_;
  proto::SetupJobRequest setup_;
  absl::Duration timeout_;
  ChannelOptions channel_;
  std::function<absl::Status()> may_set_up_again_;
  std::unique_ptr<proto::WorkerService::Stub> stub_;
  absl::Mutex setup_mutex_;
  bool set_up_ ABSL_GUARDED_BY(setup_mutex_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(setup_mutex_) = 0;  // counts set-ups
  absl::Mutex mutex_;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mutex_);
};

// This coordinator as the parameter servers name it when they refuse another one.
std::string CoordinatorDescription(const ClusterSpec& cluster) {
  absl::StatusOr<std::string> address = cluster.TaskAddress(kChief, 0);
  return absl::StrCat("the coordinator chief:0", address.ok() ? " at " + *address : "", ", pid ",
                      getpid(), " on ", HostName());
}

// Which process each parameter server is (its TaskService incarnation), asked before
// variables are created or restored on them: a PS that answers later with another
// incarnation restarted and lost them. 0 where a PS did not answer (it then counts as
// restarted).
std::vector<uint64_t> PsIncarnations(const std::vector<std::string>& addresses,
                                     const ChannelOptions& channel) {
  std::vector<uint64_t> incarnations;
  for (const std::string& address : addresses) {
    absl::StatusOr<TaskReport> report = GetTaskReport(address, absl::Seconds(5), channel);
    incarnations.push_back(report.ok() ? report->incarnation : 0);
  }
  return incarnations;
}

// The closures an epoch scheduled, with the steps each trains.
using ScheduledSteps = std::vector<std::pair<std::shared_ptr<RemoteValue>, int64_t>>;

// An epoch's training figures so far: sums over its finished steps.
struct EpochTally {
  int64_t steps = 0;
  double loss_sum = 0;
  double correct = 0;
  double examples = 0;
};

nlohmann::json TallyJson(const EpochTally& tally) {
  return {{"steps", tally.steps},
          {"loss_sum", tally.loss_sum},
          {"correct", tally.correct},
          {"examples", tally.examples}};
}

EpochTally TallyFromJson(const nlohmann::json& json) {
  return {.steps = json.value("steps", int64_t{0}),
          .loss_sum = JsonNumberOr(json, "loss_sum", 0),
          .correct = JsonNumberOr(json, "correct", 0),
          .examples = JsonNumberOr(json, "examples", 0)};
}

// `carried` plus the finished closures of `scheduled`.
absl::StatusOr<EpochTally> Tally(const EpochTally& carried, const ScheduledSteps& scheduled) {
  EpochTally tally = carried;
  for (const auto& [result, steps] : scheduled) {
    if (result->status() != RemoteValueStatus::kReady) continue;
    absl::StatusOr<ClosureOutputs> outputs = result->Fetch();
    if (!outputs.ok()) return outputs.status();
    tally.steps += steps;
    tally.loss_sum += *(*outputs)[0].data<float>();
    tally.correct += *(*outputs)[1].data<float>();
    tally.examples += *(*outputs)[2].data<float>();
  }
  return tally;
}

// The steps of `scheduled` whose closures finished.
int64_t FinishedSteps(const ScheduledSteps& scheduled) {
  int64_t finished = 0;
  for (const auto& [value, steps] : scheduled) {
    if (value->status() == RemoteValueStatus::kReady) finished += steps;
  }
  return finished;
}

// The chief's TF_CONFIG host (what others reach it by) with the port it serves on.
std::string AdvertisedAddress(const ClusterSpec& cluster, const std::string& listen_address) {
  const std::string address = cluster.TaskAddress(kChief, 0).value_or("");
  const std::string port = SplitHostPort(listen_address).port;
  if (address.empty() || port.empty()) return address;
  return WithPort(address, port);
}

}  // namespace

absl::Status CheckParameterServerJob(const JobSpec& job, const PsTrainingOptions& options) {
  STRATUM_RETURN_IF_ERROR(CheckTrainingJob(job));
  STRATUM_RETURN_IF_ERROR(PartitionerFromJson(job.strategy.variable_partitioner).status());
  STRATUM_RETURN_IF_ERROR(PlacementPolicyFromName(options.placement).status());
  if (job.checkpoint.dir.empty()) return absl::OkStatus();
  // A checkpoint of another model is said now, not once the whole cluster is up; one of
  // this model split another way (another number of ps tasks) is restored re-split.
  STRATUM_ASSIGN_OR_RETURN(const Model model, Model::FromKerasJson(job.model));
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const VariableSpec& variable : model.variables()) {
    names.push_back(variable.name);
    shapes.push_back(variable.shape);
  }
  return CheckLatestCheckpointHoldsModel(job.checkpoint.dir, names, shapes);
}

absl::StatusOr<FitSummary> RunParameterServerJob(const JobSpec& job, const std::string& job_json,
                                                 const std::string& job_base_dir,
                                                 const ClusterSpec& cluster,
                                                 const PsTrainingOptions& options) {
  const double start = Now();
  absl::StatusOr<Model> model = Model::FromKerasJson(job.model);
  if (!model.ok()) return model.status();
  absl::StatusOr<Loss> loss = Loss::FromKeras(job.loss);
  if (!loss.ok()) return loss.status();
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::FromKeras(job.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  absl::StatusOr<PartitionerSpec> partitioner =
      PartitionerFromJson(job.strategy.variable_partitioner);
  if (!partitioner.ok()) return partitioner.status();
  absl::StatusOr<PlacementPolicy> policy = PlacementPolicyFromName(options.placement);
  if (!policy.ok()) return policy.status();

  // Place and create the variables.
  const int num_ps = cluster.num_tasks(kPs);
  const int num_workers = cluster.num_tasks(kWorker);
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<ShardSpec> shards;
  for (const VariableSpec& variable : model->variables()) {
    names.push_back(variable.name);
    shapes.push_back(variable.shape);
    for (ShardSpec& shard : ShardVariable(variable.name, variable.shape, *partitioner)) {
      shards.push_back(std::move(shard));
    }
  }
  if (absl::Status status = PlaceShards(shards, num_ps, *policy); !status.ok()) return status;
  std::vector<std::string> ps_addresses;
  std::vector<std::unique_ptr<PsClient>> clients;
  const PsClientOptions ps_client_options{
      .timeout = options.rpc_timeout,
      .channel = options.channel,
      .coordinator = CoordinatorDescription(cluster),
      .coordinator_address = AdvertisedAddress(cluster, options.listen_address)};
  for (int task = 0; task < num_ps; ++task) {
    ps_addresses.push_back(*cluster.TaskAddress(kPs, task));
    clients.push_back(std::make_unique<PsClient>(absl::StrCat("ps:", task), ps_addresses.back(),
                                                 ps_client_options));
  }
  ShardedVariables variables(names, shapes, shards, std::move(clients));
  std::vector<uint64_t> holding_incarnations = PsIncarnations(ps_addresses, options.channel);
  // One coordinator at a time: the PSs are claimed before anything is created on them.
  PsWatcher ps_watcher(variables, {.saves_checkpoints = !job.checkpoint.dir.empty()});
  STRATUM_RETURN_IF_ERROR(ps_watcher.Claim());
  if (absl::Status status = variables.Create(model->InitialVariables(job.fit.seed), job.optimizer);
      !status.ok()) {
    return status;
  }
  for (const ShardSpec& shard : shards) {
    spdlog::info("variable {} ({} bytes) on ps:{}", shard.name, shard.bytes, shard.ps_task);
  }
  // Resume from the latest checkpoint, step counter included.
  std::optional<CheckpointManager> checkpoints;
  int64_t global_step = 0;
  if (!job.checkpoint.dir.empty()) {
    checkpoints.emplace(job.checkpoint.dir, job.checkpoint.max_to_keep, variables);
    absl::StatusOr<std::optional<int64_t>> restored = checkpoints->RestoreLatest();
    if (!restored.ok()) return restored.status();
    if (restored->has_value()) {
      global_step = **restored;
      std::fprintf(options.out, "resumed from the checkpoint at step %lld in %s\n",
                   static_cast<long long>(global_step), job.checkpoint.dir.c_str());
      std::fflush(options.out);
    }
  }

  // The workers.
  std::vector<std::unique_ptr<WorkerExecutor>> executors;
  for (int index : cluster.task_indices(kWorker)) {
    proto::SetupJobRequest setup;
    setup.set_job_json(job_json);
    setup.set_job_base_dir(job_base_dir);
    setup.set_coordinator_incarnation(ProcessIncarnation());
    *setup.mutable_coordinator() = ThisCoordinator(ps_client_options);
    setup.set_ps_timeout_ms(absl::ToInt64Milliseconds(options.ps_timeout));
    for (const std::string& address : ps_addresses) setup.add_ps_addresses(address);
    for (const ShardSpec& shard : shards) {
      proto::VariablePlacement* placement = setup.add_placements();
      placement->set_variable(shard.variable);
      placement->set_shard(shard.name);
      placement->set_ps_task(shard.ps_task);
      placement->set_first_row(shard.first_row);
      placement->set_rows(shard.shape.rank() == 0 ? 1 : shard.shape.dim(0));
    }
    setup.set_num_workers(num_workers);
    setup.set_worker_index(index);
    executors.push_back(std::make_unique<GrpcWorkerExecutor>(
        absl::StrCat("worker:", index), *cluster.TaskAddress(kWorker, index), std::move(setup),
        options.rpc_timeout, options.channel, [&ps_watcher] { return ps_watcher.CheckHold(); }));
  }
  ClusterCoordinatorOptions coordinator_options;
  coordinator_options.closures_per_worker = std::max(1, options.closures_per_worker);
  coordinator_options.cancel = options.cancel;
  coordinator_options.worker_recovery_timeout = options.worker_recovery_timeout;
  ClusterCoordinator coordinator(std::move(executors), coordinator_options);

  // Test data, evaluated here after each epoch.
  DataSpec data_spec = job.data;
  absl::StatusOr<FitData> data = LoadFitData(data_spec, *model);
  if (!data.ok()) return data.status();
  const int replicas_per_worker = std::max<int>(1, static_cast<int>(job.strategy.devices.size()));
  const int64_t worker_batch = job.fit.batch_size_per_replica * replicas_per_worker;
  const int64_t steps_per_epoch = job.fit.steps_per_epoch > 0
                                      ? job.fit.steps_per_epoch
                                      : (data->train_examples + worker_batch - 1) / worker_batch;
  const int64_t steps_per_closure = std::max<int64_t>(
      1, std::max<int64_t>(options.steps_per_closure, job.fit.steps_per_execution));

  FitSummary summary;
  summary.strategy = "ParameterServerStrategy";
  summary.num_replicas_in_sync = replicas_per_worker;
  summary.num_workers = num_workers;
  summary.num_ps = num_ps;
  summary.resumed_from_step = global_step;
  DefaultStrategy evaluation;
  double train_seconds = 0;
  int64_t train_examples = 0;
  const int64_t every = job.checkpoint.every_steps;
  int64_t saved_step = global_step;  // of the latest checkpoint (or the start)
  // The epoch being trained: kept when a stalled PS answers again (nothing is rolled back),
  // so that the epoch goes on where it was and reports every step once.
  struct EpochProgress {
    int epoch = 0;
    int64_t first_step = 0;
    double start = 0;
    ScheduledSteps scheduled;
    EpochTally carried;  // the epoch's steps before first_step, from its checkpoint
  } progress;
  int logged_epochs = static_cast<int>(global_step / steps_per_epoch);
  // The epochs and the current epoch's figures so far, saved with each checkpoint so that
  // a resume (or a rollback after a PS failure) reports every epoch whole.
  auto progress_json = [&]() -> nlohmann::json {
    nlohmann::json history = nlohmann::json::array();
    for (const EpochLog& log : summary.history) history.push_back(EpochLogJson(log));
    nlohmann::json saved = {{"history", history}};
    absl::StatusOr<EpochTally> tally = Tally(progress.carried, progress.scheduled);
    if (progress.epoch > 0 && tally.ok()) {
      saved["epoch"] = progress.epoch;
      saved["epoch_tally"] = TallyJson(*tally);
    }
    return saved;
  };
  // After a restore to `step`: the epochs before it, and the figures of the one it is in.
  auto resume_progress = [&](int64_t step, const nlohmann::json& saved) {
    logged_epochs = static_cast<int>(step / steps_per_epoch);
    summary.history.clear();
    progress = {logged_epochs + 1, step, Now(), {}, {}};
    if (!saved.is_object()) return;  // no checkpoint, or one written before the progress
    try {
      for (const nlohmann::json& log : saved.value("history", nlohmann::json::array())) {
        EpochLog read = EpochLogFromJson(log);
        if (read.epoch <= logged_epochs) summary.history.push_back(read);
      }
      // A stop right at an epoch's end saved the whole epoch's figures before its line:
      // that epoch ends again (with no steps left) and is reported then.
      const int saved_epoch = saved.value("epoch", 0);
      if (saved_epoch == logged_epochs && logged_epochs > 0 &&
          (summary.history.empty() || summary.history.back().epoch < saved_epoch)) {
        logged_epochs = saved_epoch - 1;
        progress.epoch = saved_epoch;
      }
      if (saved_epoch == progress.epoch) {
        progress.carried = TallyFromJson(saved.value("epoch_tally", nlohmann::json::object()));
      }
    } catch (const nlohmann::json::exception& error) {  // the manifest's checksum passed
      spdlog::warn(
          "the checkpoint's record of the epochs is unreadable ({}): the summary "
          "covers the epochs trained from now on",
          error.what());
      summary.history.clear();
      progress.carried = {};
    }
  };
  if (checkpoints && global_step > 0)
    resume_progress(global_step, checkpoints->restored_progress());
  // Keras' TerminateOnNaN, checked where it costs nothing: at each epoch's end and before
  // each save. The variables need no check: every PS refuses a gradient that is not finite.
  // Where a run of the job again goes on from: the latest checkpoint, if there is one.
  auto resume_point = [&] {
    ResumePoint resume{.checkpoint_dir = job.checkpoint.dir};
    if (checkpoints && saved_step > 0) resume.newest_step = saved_step;
    return resume;
  };
  auto check_finite = [&](int64_t step, double loss_sum) -> absl::Status {
    if (std::isfinite(loss_sum)) return absl::OkStatus();
    const int epoch = progress.epoch;
    return TrainingDiverged("the loss is not finite", step, epoch,
                            step - (epoch - 1) * steps_per_epoch, steps_per_epoch, resume_point());
  };
  // A save writes what the PSs hold: never once they are another coordinator's.
  auto save = [&](int64_t step) -> absl::Status {
    STRATUM_RETURN_IF_ERROR(ps_watcher.CheckHold());
    const absl::StatusOr<EpochTally> tally = Tally(progress.carried, progress.scheduled);
    STRATUM_RETURN_IF_ERROR(check_finite(step, tally.ok() ? tally->loss_sum : 0));
    STRATUM_RETURN_IF_ERROR(checkpoints->Save(step, progress_json()));
    // A PS that got a signal goes once told that a save begun after it is committed,
    // whichever save.
    ps_watcher.Committed(checkpoints->committed_save_ids(), checkpoints->stopping_in_last_save());
    for (const std::string& ps : checkpoints->stopping_in_last_save()) {
      std::fprintf(options.out,
                   "%s is stopping (it got a signal): saved the state at step %lld in %s, which "
                   "training goes on from once it is back\n",
                   ps.c_str(), static_cast<long long>(step), job.checkpoint.dir.c_str());
    }
    std::fflush(options.out);
    return absl::OkStatus();
  };
  // The test set's loss and accuracy of the variables the PSs hold now.
  auto evaluate_test = [&]() -> absl::StatusOr<EpochLog> {
    absl::StatusOr<std::vector<Tensor>> current = variables.Pull();
    if (!current.ok()) return current.status();
    return EvaluateDataset(evaluation, *model, *loss, *current, data->test, data->rescale, 1024);
  };
  int printed_epochs = 0;       // the highest epoch whose line this process printed
  int epochs_trained_here = 0;  // epochs this process ended (and reported)
  // SIGTERM: the closures running finish, the queued ones are dropped, and the state after
  // the steps that finished is saved, so that the job started again resumes there.
  auto stop_early = [&]() -> absl::Status {
    // A step takes milliseconds; a closure still running after this is on a stuck worker.
    const absl::Status drained = coordinator.Drain(absl::Seconds(10));
    const int epoch = progress.epoch;
    const int64_t finished = progress.first_step + FinishedSteps(progress.scheduled);
    const std::string where =
        absl::StrCat("training stopped after step ", finished, " (epoch ", epoch, ", step ",
                     finished - (epoch - 1) * steps_per_epoch, " of ", steps_per_epoch,
                     "): this process was stopped by a signal");
    if (!checkpoints) {
      return absl::CancelledError(absl::StrCat(
          where,
          "; the job has no checkpoint.dir, so its progress is lost: set checkpoint.dir "
          "to resume after a stop"));
    }
    if (finished == 0) {
      return absl::CancelledError(
          absl::StrCat(where,
                       "; nothing was trained yet, so nothing is saved: run the same job again to "
                       "start it"));
    }
    absl::Status saved = drained;
    if (saved.ok() && finished != saved_step) saved = save(finished);
    if (!saved.ok()) {
      return absl::CancelledError(absl::StrCat(where, "; the state there could not be saved (",
                                               saved.message(), "): the job resumes from step ",
                                               saved_step, " in ", job.checkpoint.dir));
    }
    return absl::CancelledError(absl::StrCat(where, "; the state at step ", finished,
                                             " is saved in ", job.checkpoint.dir,
                                             ": run the same job again to resume from it"));
  };
  auto stopped = [&](const absl::Status& status) {
    return absl::IsCancelled(status) && options.cancel != nullptr &&
           options.cancel->HasBeenNotified();
  };
  // A parameter server that got SIGTERM waits for a checkpoint: the steps so far, saved
  // now, are what its restart rolls back to.
  auto save_for_stopping_ps = [&](const std::string& ps) -> absl::Status {
    if (!checkpoints) {
      std::fprintf(options.out,
                   "%s is stopping (it got a signal) and the job has no checkpoint.dir: the "
                   "training state on it is lost when it goes\n",
                   ps.c_str());
      std::fflush(options.out);
      return absl::OkStatus();
    }
    // Saved even when the latest checkpoint is at this step: the PS waits for a new one
    // (the same bytes again).
    STRATUM_RETURN_IF_ERROR(coordinator.Join());
    STRATUM_RETURN_IF_ERROR(PsFailure(save(global_step)));  // says so for `ps`
    saved_step = global_step;
    return absl::OkStatus();
  };
  // One pass over the remaining epochs; a PS failure ends it early (recovered below).
  auto train_epochs = [&]() -> absl::Status {
    for (int epoch = logged_epochs + 1; epoch <= job.fit.epochs; ++epoch) {
      const int64_t epoch_end = static_cast<int64_t>(epoch) * steps_per_epoch;
      if (progress.epoch != epoch) progress = {epoch, global_step, Now(), {}, {}};
      while (global_step < epoch_end) {
        if (options.cancel != nullptr && options.cancel->HasBeenNotified()) {
          return stop_early();
        }
        STRATUM_RETURN_IF_ERROR(ps_watcher.Lost());
        if (const std::string ps = ps_watcher.TakeStopping(); !ps.empty()) {
          if (absl::Status saved = save_for_stopping_ps(ps); !saved.ok()) {
            // Still waiting for a committed save: the next chance (after a PS failure is
            // recovered, say) saves for them again.
            ps_watcher.SaveFailed(ps);
            return stopped(saved) ? stop_early() : saved;
          }
        }
        int64_t steps = std::min<int64_t>(steps_per_closure, epoch_end - global_step);
        if (checkpoints && every > 0) steps = std::min(steps, every - global_step % every);
        absl::StatusOr<std::shared_ptr<RemoteValue>> value =
            coordinator.Schedule("train_step", {Tensor::Scalar(static_cast<float>(steps))});
        if (stopped(value.status())) return stop_early();
        if (!value.ok()) return value.status();
        progress.scheduled.emplace_back(*std::move(value), steps);
        global_step += steps;
        // A save at the epoch's end comes after its line, so that the line is in it.
        if (checkpoints && every > 0 && global_step % every == 0 && global_step != epoch_end) {
          absl::Status joined = coordinator.Join();
          if (stopped(joined)) return stop_early();
          if (!joined.ok()) return joined;
          STRATUM_RETURN_IF_ERROR(PsFailure(save(global_step)));
          saved_step = global_step;
        }
      }
      absl::Status joined = coordinator.Join();
      if (stopped(joined)) return stop_early();
      if (!joined.ok()) return joined;
      absl::StatusOr<EpochTally> tally = Tally(progress.carried, progress.scheduled);
      if (!tally.ok()) return tally.status();
      // The figures cover the whole epoch (with its steps before a resume); the speed only
      // this process's.
      const double trained = tally->examples - progress.carried.examples;
      EpochLog log;
      log.epoch = epoch;
      log.steps = tally->steps;
      log.seconds = Now() - progress.start;
      log.loss = tally->loss_sum / std::max(tally->examples, 1.0);
      log.accuracy = tally->correct / std::max(tally->examples, 1.0);
      if (!std::isfinite(log.loss)) {
        return TrainingDiverged(absl::StrCat("the epoch's loss is ", log.loss), global_step, epoch,
                                steps_per_epoch, steps_per_epoch, resume_point());
      }
      log.examples_per_sec = trained / std::max(log.seconds, 1e-9);
      train_seconds += log.seconds;
      train_examples += static_cast<int64_t>(trained);
      if (data->has_test && job.fit.validate) {
        absl::StatusOr<EpochLog> val = evaluate_test();
        if (!val.ok()) return PsFailure(val.status());
        log.val_loss = val->val_loss;
        log.val_accuracy = val->val_accuracy;
        log.validated = true;
      }
      summary.history.push_back(log);
      logged_epochs = epoch;
      // Saved (with its line in the record) before its line is printed: an epoch reported
      // done is in the checkpoint. A save that fails leaves the epoch to end again.
      if (checkpoints && (every <= 0 || epoch_end % every == 0)) {
        if (absl::Status saved = PsFailure(save(global_step)); !saved.ok()) {
          summary.history.pop_back();
          logged_epochs = epoch - 1;
          return saved;
        }
        saved_step = global_step;
      }
      ++epochs_trained_here;
      // An epoch printed before a rollback is trained again from the checkpoint; its line
      // says so (its figures cover the whole epoch all the same).
      const std::string again = epoch <= printed_epochs
                                    ? absl::StrCat(" (trained again from step ",
                                                   progress.first_step, " after the rollback)")
                                    : "";
      printed_epochs = std::max(printed_epochs, epoch);
      const std::string validated = log.validated
                                        ? absl::StrFormat(" - val_loss %.4f - val_accuracy %.4f",
                                                          log.val_loss, log.val_accuracy)
                                        : "";
      std::fprintf(options.out,
                   "Epoch %d/%d%s - %lld steps on %s - loss %.4f - accuracy %.4f%s - "
                   "%.0f examples/s - %.2fs\n",
                   epoch, job.fit.epochs, again.c_str(), static_cast<long long>(log.steps),
                   Counted(num_workers, "worker", "workers").c_str(), log.loss, log.accuracy,
                   validated.c_str(), log.examples_per_sec, log.seconds);
      std::fflush(options.out);
    }
    return absl::OkStatus();
  };
  // Better than TensorFlow: a parameter server that comes back is re-seeded from the last
  // checkpoint and training goes on, without restarting the job. Another PS failing while
  // they are re-seeded is waited for the same way.
  absl::Status failure = train_epochs();
  while (!failure.ok()) {
    const bool ps_failed =
        absl::StrContains(failure.message(), "a parameter server is unavailable");
    if (!ps_failed) return failure;
    // A lost PS ends the job as a failure (UNAVAILABLE, exit 1: a restart may succeed), not
    // as the job's configuration (FAILED_PRECONDITION, as PsFailure marks it for workers).
    if (options.ps_recovery_timeout <= absl::ZeroDuration()) {
      return absl::UnavailableError(failure.message());
    }
    if (!checkpoints) {
      return absl::UnavailableError(
          absl::StrCat(failure.message(),
                       "; the job has no checkpoint.dir to re-seed a parameter server from, so "
                       "training does not wait for it: set checkpoint.dir, and a parameter "
                       "server that comes back is re-seeded from the last checkpoint while "
                       "training waits"));
    }
    std::fprintf(options.out, "%s; waiting up to %s for it to come back\n",
                 std::string(failure.message()).c_str(),
                 absl::FormatDuration(options.ps_recovery_timeout).c_str());
    std::fflush(options.out);
    ClusterSpec ps_only;
    for (int task = 0; task < num_ps; ++task)
      ps_only.SetTask(kPs, task, ps_addresses[static_cast<size_t>(task)]);
    ClusterWaitOptions wait;
    wait.timeout = options.ps_recovery_timeout;
    wait.cancel = options.cancel;
    wait.channel = options.channel;
    wait.timeout_flag = "--ps_recovery_timeout";
    absl::StatusOr<std::vector<TaskReport>> back = WaitForClusterHealthy(ps_only, wait);
    if (!back.ok()) {
      if (options.cancel != nullptr && options.cancel->HasBeenNotified()) {
        return absl::CancelledError(absl::StrCat(
            "stopped by a signal while waiting for the parameter servers: ", failure.message()));
      }
      return absl::UnavailableError(
          absl::StrCat(failure.message(), "; it did not come back: ", back.status().message()));
    }
    // Every PS still the process that holds the variables (it stalled, or the network did):
    // nothing was lost, so nothing is rolled back. The closures that failed are trained
    // again once their stragglers are done.
    bool every_ps_kept_its_state = true;
    for (int task = 0; task < num_ps; ++task) {
      const uint64_t now = (*back)[static_cast<size_t>(task)].incarnation;
      if (now == 0 || now != holding_incarnations[static_cast<size_t>(task)]) {
        every_ps_kept_its_state = false;
      }
    }
    // A variable missing on a PS that never restarted was never there: training again
    // would meet it again.
    if (every_ps_kept_its_state && absl::StrContains(failure.message(), kPsLostItsVariables)) {
      return absl::FailedPreconditionError(absl::StrCat(
          failure.message(),
          "; yet every parameter server is the process this coordinator "
          "created the variables on, so something else placed them otherwise: is another "
          "coordinator training a different job on these parameter servers? Give each job "
          "parameter servers of its own"));
    }
    if (every_ps_kept_its_state &&
        coordinator.Join(options.ps_timeout + absl::Seconds(10)).code() !=
            absl::StatusCode::kDeadlineExceeded) {
      std::erase_if(progress.scheduled, [](const auto& closure) {
        return closure.first->status() != RemoteValueStatus::kReady;
      });
      global_step = progress.first_step + FinishedSteps(progress.scheduled);
      std::fprintf(options.out,
                   "the parameter servers answer again, each the same process as before (none "
                   "restarted): their variables are intact, so training goes on from step %lld "
                   "with nothing rolled back\n",
                   static_cast<long long>(global_step));
      std::fflush(options.out);
      failure = train_epochs();
      continue;
    }
    holding_incarnations = PsIncarnations(ps_addresses, options.channel);
    absl::Status reseeded = ps_watcher.Claim();
    if (reseeded.ok()) {
      reseeded = variables.Create(model->InitialVariables(job.fit.seed), job.optimizer);
    }
    absl::StatusOr<std::optional<int64_t>> restored = std::nullopt;
    if (reseeded.ok()) {
      restored = checkpoints->RestoreLatest();
      reseeded = restored.status();
    }
    if (!reseeded.ok()) {
      // A parameter server that fails again (or another one) is waited for again.
      if (!absl::IsUnavailable(reseeded) && !absl::IsDeadlineExceeded(reseeded)) return reseeded;
      failure = absl::UnavailableError(
          absl::StrCat("a parameter server is unavailable while the others are re-seeded: ",
                       reseeded.message()));
      continue;
    }
    global_step = restored->value_or(0);
    saved_step = global_step;
    // The steps after the checkpoint are trained again: their epochs are reported once, anew.
    resume_progress(global_step, checkpoints->restored_progress());
    if (restored->has_value()) {
      std::fprintf(options.out,
                   "the parameter servers are back: restored the checkpoint at step %lld and "
                   "training goes on\n",
                   static_cast<long long>(global_step));
    } else {
      std::fprintf(options.out,
                   "the parameter servers are back, but no checkpoint was written yet: training "
                   "starts again from step 0\n");
    }
    std::fflush(options.out);
    failure = train_epochs();
  }
  if (epochs_trained_here == 0 && data->has_test) {
    // The checkpoint already completes the job: report the model it holds.
    std::fprintf(options.out,
                 "the checkpoint at step %lld already completes this job's %d epochs: evaluating "
                 "it (remove %s to train from scratch)\n",
                 static_cast<long long>(global_step), job.fit.epochs, job.checkpoint.dir.c_str());
  } else if (checkpoints && global_step != saved_step) {
    if (absl::Status status = save(global_step); !status.ok()) return status;
  }
  if (data->has_test) {  // the model as trained: the last epoch's validation, if it ran
    summary.tested = true;
    if (epochs_trained_here > 0 && summary.history.back().validated) {
      summary.test_loss = summary.history.back().val_loss;
      summary.test_accuracy = summary.history.back().val_accuracy;
    } else {
      absl::StatusOr<EpochLog> test = evaluate_test();
      if (!test.ok()) return test.status();
      summary.test_loss = test->val_loss;
      summary.test_accuracy = test->val_accuracy;
    }
  }
  summary.steps = global_step;  // the job's step counter, across restarts
  summary.examples_per_sec = static_cast<double>(train_examples) / std::max(train_seconds, 1e-9);
  summary.wall_s = Now() - start;
  if (coordinator.retried_closures() > 0) {
    spdlog::info("{} retried on other workers after a worker failed",
                 Counted(coordinator.retried_closures(), "closure was", "closures were"));
  }
  return summary;
}

}  // namespace stratum
