#include "stratum/coordinator/ps_training.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/worker.pb.h"
#include "ps_job_links.h"
#include "ps_job_setup.h"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/keras_export.h"
#include "stratum/coordinator/checkpoint_manager.h"
#include "stratum/coordinator/cluster_coordinator.h"
#include "stratum/coordinator/ps_watcher.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/net/channel.h"
#include "stratum/net/health.h"
#include "stratum/net/host_port.h"
#include "stratum/ps/placement.h"
#include "stratum/ps/ps_client.h"
#include "stratum/ps/sharded_variables.h"
#include "stratum/strategy/strategy.h"
#include "stratum/training/epoch_loop.h"
#include "stratum/training/evaluate.h"
#include "stratum/training/fit_job.h"
#include "stratum/training/training_status.h"
#include "stratum/util/counted.h"
#include "stratum/util/error_kind.h"
#include "stratum/util/json_text.h"
#include "stratum/util/process_info.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Which process each parameter server is (its TaskService incarnation), asked before
// variables are created or restored on them: a PS that answers later with another
// incarnation restarted and lost them. 0 where a PS did not answer (it then counts as
// restarted).
std::vector<uint64_t> PsIncarnations(const std::vector<std::string>& addresses,
                                     const ChannelOptions& channel, const PsJobLinks& links) {
  std::vector<uint64_t> incarnations;
  for (const std::string& address : addresses) {
    absl::StatusOr<TaskReport> report = links.report(address, absl::Seconds(5), channel);
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

}  // namespace

absl::Status CheckParameterServerJob(const JobSpec& job, const PsTrainingOptions& options) {
  STRATUM_RETURN_IF_ERROR(CheckTrainingJob(job));
  STRATUM_ASSIGN_OR_RETURN(const PartitionerSpec partitioner,
                           PartitionerFromJson(job.strategy.variable_partitioner));
  STRATUM_RETURN_IF_ERROR(PlacementPolicyFromName(options.placement).status());
  STRATUM_ASSIGN_OR_RETURN(const Model model, Model::FromKerasJson(job.model));
  // A dense variable's shard travels whole in one message with every step (its gradient and
  // its value). A row-sparse table's steps move rows, and its shards travel whole (to be
  // exported, saved by ModelCheckpoint or restored by EarlyStopping) in pieces of rows, so
  // they may be of any size.
  const auto limit = static_cast<int64_t>(options.channel.max_message_bytes) - (1 << 20);
  for (const VariableSpec& variable : model.variables()) {
    if (variable.row_sparse) continue;
    for (const ShardSpec& shard : ShardVariable(variable.name, variable.shape, partitioner)) {
      if (shard.bytes <= limit) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "variable \"", variable.name, "\" has a shard of ", shard.bytes,
          " bytes, more than one message carries (", limit,
          "), and a dense variable's shard travels whole with every step: split it in smaller "
          "shards with strategy.variable_partitioner, such as {\"type\": \"max_size\", "
          "\"max_shard_bytes\": 134217728}"));
    }
  }
  if (job.checkpoint.dir.empty()) return absl::OkStatus();
  // A checkpoint of another model is said now, not once the whole cluster is up; one of
  // this model split another way (another number of ps tasks) is restored re-split.
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const VariableSpec& variable : model.variables()) {
    names.push_back(variable.name);
    shapes.push_back(variable.shape);
  }
  return CheckLatestCheckpointHoldsModel(job.checkpoint.dir, names, shapes);
}

namespace {

// The epoch being trained: kept when a stalled PS answers again (nothing is rolled back),
// so that the epoch goes on where it was and reports every step once.
struct EpochProgress {
  int epoch = 0;
  int64_t first_step = 0;
  double start = 0;
  ScheduledSteps scheduled;
  EpochTally carried;  // the epoch's steps before first_step, from its checkpoint
};

// RunParameterServerJob's program: its members are the job's state (the model, the
// variables on the PSs, the checkpoints, the closure queue, the epoch in progress, the
// history), its methods the steps: set up, train the epochs, recover from a PS failure,
// stop at a signal, finish. The epochs are the one epoch loop's (RunEpochs), with this job
// as its StepRunner: a call trains one closure of several steps on some worker, the figures
// come back with the closures and are summed once they are joined, saves go through the
// CheckpointManager (at the cadence, and at an epoch's end only where the cadence falls,
// before its line), and a stop at a signal is this job's own (StopEarly). Run once, from one
// thread; the ClusterCoordinator's threads only call the executors, and through them
// PsWatcher::CheckHold.
class ParameterServerJob : public StepRunner {
 public:
  ParameterServerJob(const JobSpec& job, const std::string& job_json,
                     const std::string& job_base_dir, const ClusterSpec& cluster,
                     const PsTrainingOptions& options, const PsJobLinks& links)
      : job_(job),
        job_json_(job_json),
        job_base_dir_(job_base_dir),
        cluster_(cluster),
        options_(options),
        links_(links),
        start_(Now()),
        num_ps_(cluster.num_tasks(kPs)),
        num_workers_(cluster.num_tasks(kWorker)),
        every_(job.checkpoint.every_steps) {}

  absl::StatusOr<FitSummary> Run();

 private:
  // Set-up, in this order.
  absl::Status BuildModel();
  absl::Status CreateVariables();  // placed over the PSs, claimed, created
  absl::Status RestoreLatestCheckpoint();
  void ConnectWorkers();
  absl::Status LoadData();

  // One pass of RunEpochs over the remaining epochs, from where the job stands (in the
  // middle of an epoch after a PS failure); a PS failure ends it early
  // (RecoverFromPsFailure).
  absl::StatusOr<FitSummary> TrainEpochs();

  // StepRunner, for RunEpochs.
  bool HasStepStats() const override { return false; }
  // Begins `epoch`, or goes on with it when it is the epoch in progress (after a PS
  // failure that rolled nothing back, or a save at its end that failed).
  absl::Status StartEpoch(int epoch, int64_t first_step) override;
  absl::StatusOr<StepResult> Step(int epoch, int64_t step, int64_t iteration) override {
    return Steps(epoch, step, iteration, 1);
  }
  int64_t StepsPerCall() const override { return steps_per_closure_; }
  // Schedules one closure of `count` steps, once a stop at a signal and the PSs are seen to.
  absl::StatusOr<StepResult> Steps(int epoch, int64_t step, int64_t iteration,
                                   int64_t count) override;
  std::optional<double> EpochStart() const override { return progress_.start; }
  // Joins the closures scheduled; a stop at a signal met there is StopEarly's.
  absl::Status Sync() override;
  // The epoch's figures from its checkpoint and its finished closures, not taken before.
  absl::Status TakeStats(StepStats& into) override;
  // The examples the epoch's closures trained in this process (since progress_.start).
  absl::StatusOr<int64_t> ExamplesTrained(int64_t first_step, int64_t last_step) override;
  // The summary holds no variables: they stay on the PSs.
  absl::Status GetState(std::vector<Tensor>* /*variables*/,
                        std::vector<std::vector<Tensor>>* /*slots*/) override {
    return absl::OkStatus();
  }
  // ReduceLROnPlateau: the PSs apply the updates, so they take the rate.
  absl::Status SetLearningRate(float rate) override {
    return PsFailure(variables_->SetLearningRate(rate));
  }
  // EarlyStopping's restore_best_weights: the PSs take the variables back, slots as they are.
  absl::Status SetVariables(const std::vector<Tensor>& variables) override {
    return PsFailure(variables_->Assign(variables));
  }
  // What callbacks save (ModelCheckpoint): the variables pulled from the PSs now.
  absl::StatusOr<std::vector<Tensor>> CurrentVariables() override { return variables_->Pull(); }
  // Validation marks a PS failure for recovery; the final test (every epoch reported) ends
  // the job with its error as it is.
  absl::StatusOr<EpochLog> Evaluate() override;
  BackupPolicy Backups() const override {
    return {.by_runner = true, .every_epoch_end = false, .before_epoch_line = true};
  }
  std::optional<ResumePoint> ResumeFrom() const override;
  absl::Status BackUp(const FitState& state) override;
  // Records the epoch (history, speed) and says on how many workers it trained, and whether
  // it was trained again after a rollback.
  EpochLineNotes EpochEnded(const EpochLog& log) override;

  // Better than TensorFlow: a parameter server that comes back is re-seeded from the last
  // checkpoint and training goes on, without restarting the job. Another PS failing while
  // they are re-seeded is waited for the same way. OK once training can go on; else the
  // error that ends the job.
  absl::Status RecoverFromPsFailure(absl::Status failure);
  // Whether a PS failure can be waited for at all (a timeout, a checkpoint to re-seed from).
  absl::Status CheckPsFailureIsRecoverable(const absl::Status& failure) const;
  absl::StatusOr<std::vector<TaskReport>> WaitForParameterServers(const absl::Status& failure);
  bool EveryPsKeptItsState(const std::vector<TaskReport>& back) const;
  // The PSs, each the same process as before, have their variables: the epoch goes on.
  void GoOnWithNothingRolledBack();
  // Claims the PSs again, creates the variables and restores the latest checkpoint: the step
  // it holds (nullopt: none was written yet).
  absl::StatusOr<std::optional<int64_t>> ReseedParameterServers();
  void RolledBackTo(const std::optional<int64_t>& restored);

  // SIGTERM: the closures running finish, the queued ones are dropped, and the state after
  // the steps that finished is saved, so that the job started again resumes there.
  absl::Status StopEarly();
  // Whether `status` is the cancellation of a stop at a signal.
  bool Stopped(const absl::Status& status) const;
  // A parameter server that got SIGTERM waits for a checkpoint: the steps so far, saved
  // now, are what its restart rolls back to.
  absl::Status SaveForStoppingPs(const std::string& ps);

  // The epochs (`history`, EpochLogJson's) and the current epoch's figures so far, saved
  // with each checkpoint so that a resume (or a rollback after a PS failure) reports every
  // epoch whole.
  nlohmann::json ProgressJson(const nlohmann::json& history) const;
  // The epochs reported so far, as FitState holds them.
  nlohmann::json HistoryJson() const;
  // After a restore to `step`: the epochs before it, and the figures of the one it is in.
  void ResumeProgress(int64_t step, const nlohmann::json& saved);
  // Where a run of the job again goes on from: the latest checkpoint, if there is one.
  ResumePoint SavedAt() const;
  // Keras' TerminateOnNaN, checked where it costs nothing: at each epoch's end and before
  // each save. The variables need no check: every PS refuses a gradient that is not finite.
  absl::Status CheckFinite(int64_t step, double loss_sum) const;
  // A save writes what the PSs hold: never once they are another coordinator's. `history`:
  // the epochs it records (HistoryJson() but at an epoch's end, which it includes).
  absl::Status Save(int64_t step, const nlohmann::json& history);
  // The test set's loss and accuracy of the variables the PSs hold now.
  absl::StatusOr<EpochLog> EvaluateTest();
  // Per model variable, the optimizer its PS applies: the job's, or the non-trainable
  // variables' update (moving statistics).
  std::vector<nlohmann::json> UpdateRules() const {
    std::vector<nlohmann::json> rules;
    for (const VariableSpec& spec : model_->variables()) {
      rules.push_back(UpdateJsonFor(spec, job_.optimizer));
    }
    return rules;
  }
  // The last save, and the summary with `trained`'s test figures, once every epoch is
  // trained.
  absl::StatusOr<FitSummary> Finish(const FitSummary& trained);

  const JobSpec& job_;
  const std::string& job_json_;
  const std::string& job_base_dir_;
  const ClusterSpec& cluster_;
  const PsTrainingOptions& options_;
  const PsJobLinks& links_;
  const double start_;
  const int num_ps_;
  const int num_workers_;
  const int64_t every_;  // checkpoint.every_steps

  // Declared in the order they are built: destroyed in reverse, the closure queue (whose
  // executors ask ps_watcher_) before the watcher, the watcher before the variables.
  std::optional<Model> model_;
  std::optional<Loss> loss_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<ShardSpec> shards_;
  std::vector<std::string> ps_addresses_;
  PsClientOptions ps_client_options_;
  std::optional<ShardedVariables> variables_;
  // Which process each PS is that holds the variables (see PsIncarnations).
  std::vector<uint64_t> holding_incarnations_;
  std::optional<PsWatcher> ps_watcher_;
  std::optional<CheckpointManager> checkpoints_;
  int64_t global_step_ = 0;
  std::optional<ClusterCoordinator> coordinator_;
  FitData data_;
  std::optional<GivenTableRows> test_rows_;  // the tables' rows the test set reads
  int replicas_per_worker_ = 1;
  int64_t steps_per_epoch_ = 0;
  int64_t steps_per_closure_ = 1;
  FitOptions fit_options_;  // RunEpochs': the job's, its lines always printed

  FitSummary summary_;
  DefaultStrategy evaluation_;
  double train_seconds_ = 0;
  int64_t train_examples_ = 0;
  int64_t saved_step_ = 0;  // of the latest checkpoint (or the start)
  EpochProgress progress_;
  // What TakeStats took of progress_ since StartEpoch: its carried figures, and closures.
  bool carried_taken_ = false;
  size_t closures_taken_ = 0;
  int64_t trained_this_epoch_ = 0;  // ExamplesTrained's answer, for EpochEnded
  int logged_epochs_ = 0;
  int printed_epochs_ = 0;       // the highest epoch whose line this process printed
  int epochs_trained_here_ = 0;  // epochs this process ended (and reported)
};

absl::StatusOr<FitSummary> ParameterServerJob::Run() {
  STRATUM_RETURN_IF_ERROR(BuildModel());
  STRATUM_RETURN_IF_ERROR(CreateVariables());
  STRATUM_RETURN_IF_ERROR(RestoreLatestCheckpoint());
  ConnectWorkers();
  STRATUM_RETURN_IF_ERROR(LoadData());
  if (logged_epochs_ >= job_.fit.epochs && data_.has_test) {
    // The checkpoint already completes the job: report the model it holds.
    std::fprintf(options_.out,
                 "the checkpoint at step %lld already completes this job's %d epochs: evaluating "
                 "it (remove %s to train from scratch)\n",
                 static_cast<long long>(global_step_), job_.fit.epochs,
                 job_.checkpoint.dir.c_str());
  }
  absl::StatusOr<FitSummary> trained = TrainEpochs();
  while (!trained.ok()) {
    const absl::Status& failure = trained.status();
    const bool ps_failed = IsErrorKind(failure, ErrorKind::kPsUnavailable) ||
                           IsErrorKind(failure, ErrorKind::kPsLostItsVariables);
    // Once every epoch is reported, only the test is left: its failure ends the job.
    if (!ps_failed || logged_epochs_ >= job_.fit.epochs) return failure;
    STRATUM_RETURN_IF_ERROR(RecoverFromPsFailure(failure));
    trained = TrainEpochs();
  }
  return Finish(*trained);
}

absl::Status ParameterServerJob::BuildModel() {
  absl::StatusOr<Model> model = Model::FromKerasJson(job_.model);
  if (!model.ok()) return model.status();
  model_.emplace(*std::move(model));
  absl::StatusOr<Loss> loss = Loss::FromKeras(job_.loss);
  if (!loss.ok()) return loss.status();
  loss_.emplace(*std::move(loss));
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::FromKeras(job_.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  optimizer_ = *std::move(optimizer);
  return absl::OkStatus();
}

absl::Status ParameterServerJob::CreateVariables() {
  STRATUM_ASSIGN_OR_RETURN(shards_, PlaceModelVariables(*model_, job_.strategy.variable_partitioner,
                                                        options_.placement, num_ps_));
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const VariableSpec& variable : model_->variables()) {
    names.push_back(variable.name);
    shapes.push_back(variable.shape);
  }
  std::vector<std::unique_ptr<PsClient>> clients;
  ps_client_options_ = {.timeout = options_.rpc_timeout,
                        .channel = options_.channel,
                        .coordinator = CoordinatorDescription(cluster_),
                        .coordinator_address = AdvertisedAddress(cluster_, options_.listen_address),
                        .checkpoint_dir = job_.checkpoint.dir,
                        .connect = links_.ps};
  for (int task = 0; task < num_ps_; ++task) {
    ps_addresses_.push_back(*cluster_.TaskAddress(kPs, task));
    clients.push_back(std::make_unique<PsClient>(absl::StrCat("ps:", task), ps_addresses_.back(),
                                                 ps_client_options_));
  }
  variables_.emplace(names, shapes, shards_, std::move(clients));
  holding_incarnations_ = PsIncarnations(ps_addresses_, options_.channel, links_);
  // One coordinator at a time: the PSs are claimed before anything is created on them.
  ps_watcher_.emplace(*variables_,
                      PsWatcherOptions{.saves_checkpoints = !job_.checkpoint.dir.empty()});
  STRATUM_RETURN_IF_ERROR(ps_watcher_->Claim());
  if (absl::Status status = variables_->Create(model_->InitialFills(job_.fit.seed), UpdateRules());
      !status.ok()) {
    return status;
  }
  for (const ShardSpec& shard : shards_) {
    spdlog::info("variable {} ({} bytes) on ps:{}", shard.name, shard.bytes, shard.ps_task);
  }
  return absl::OkStatus();
}

// Resume from the latest checkpoint, step counter included.
absl::Status ParameterServerJob::RestoreLatestCheckpoint() {
  if (job_.checkpoint.dir.empty()) return absl::OkStatus();
  checkpoints_.emplace(job_.checkpoint.dir, job_.checkpoint.max_to_keep, *variables_);
  absl::StatusOr<std::optional<int64_t>> restored = checkpoints_->RestoreLatest();
  if (!restored.ok()) return restored.status();
  if (restored->has_value()) {
    global_step_ = **restored;
    std::fprintf(options_.out, "resumed from the checkpoint at step %lld in %s\n",
                 static_cast<long long>(global_step_), job_.checkpoint.dir.c_str());
    std::fflush(options_.out);
  }
  return absl::OkStatus();
}

void ParameterServerJob::ConnectWorkers() {
  WorkerSetup setup{.job_json = job_json_,
                    .job_base_dir = job_base_dir_,
                    .ps_addresses = ps_addresses_,
                    .shards = shards_,
                    .ps_client = ps_client_options_,
                    .ps_timeout = options_.ps_timeout,
                    .rpc_timeout = options_.rpc_timeout,
                    .channel = options_.channel};
  PsWatcher* ps_watcher = &*ps_watcher_;
  std::vector<std::unique_ptr<WorkerExecutor>> executors = MakeWorkerExecutors(
      cluster_, setup, [ps_watcher] { return ps_watcher->CheckHold(); }, links_.worker);
  ClusterCoordinatorOptions coordinator_options;
  coordinator_options.closures_per_worker = std::max(1, options_.closures_per_worker);
  coordinator_options.cancel = options_.cancel;
  coordinator_options.worker_recovery_timeout = options_.worker_recovery_timeout;
  coordinator_.emplace(std::move(executors), coordinator_options);
}

// The test data, evaluated here after each epoch, and the epochs' shape.
absl::Status ParameterServerJob::LoadData() {
  DataSpec data_spec = job_.data;
  absl::StatusOr<FitData> data = LoadFitData(data_spec, *model_);
  if (!data.ok()) return data.status();
  data_ = *std::move(data);
  replicas_per_worker_ = std::max<int>(1, static_cast<int>(job_.strategy.devices.size()));
  const int64_t worker_batch = job_.fit.batch_size_per_replica * replicas_per_worker_;
  steps_per_epoch_ = job_.fit.steps_per_epoch > 0
                         ? job_.fit.steps_per_epoch
                         : (data_.train_examples + worker_batch - 1) / worker_batch;
  steps_per_closure_ = std::max<int64_t>(
      1, std::max<int64_t>(options_.steps_per_closure, job_.fit.steps_per_execution));

  summary_.strategy = "ParameterServerStrategy";
  summary_.num_replicas_in_sync = replicas_per_worker_;
  summary_.num_workers = num_workers_;
  summary_.num_ps = num_ps_;
  summary_.resumed_from_step = global_step_;
  saved_step_ = global_step_;
  logged_epochs_ = static_cast<int>(global_step_ / steps_per_epoch_);
  fit_options_.epochs = job_.fit.epochs;
  fit_options_.validate = job_.fit.validate;
  fit_options_.progress = ProgressStyle::kLines;
  fit_options_.out = options_.out;
  fit_options_.checkpoint_dir = job_.checkpoint.dir;
  fit_options_.checkpoint_every_steps = every_;
  fit_options_.callbacks = job_.fit.callbacks;
  fit_options_.metrics = job_.metrics;
  fit_options_.model_json = job_.model;
  if (checkpoints_ && global_step_ > 0) {
    ResumeProgress(global_step_, checkpoints_->restored_progress());
  }
  return absl::OkStatus();
}

nlohmann::json ParameterServerJob::HistoryJson() const {
  nlohmann::json history = nlohmann::json::array();
  for (const EpochLog& log : summary_.history) history.push_back(EpochLogJson(log));
  return history;
}

nlohmann::json ParameterServerJob::ProgressJson(const nlohmann::json& history) const {
  nlohmann::json saved = {{"history", history}};
  absl::StatusOr<EpochTally> tally = Tally(progress_.carried, progress_.scheduled);
  if (progress_.epoch > 0 && tally.ok()) {
    saved["epoch"] = progress_.epoch;
    saved["epoch_tally"] = TallyJson(*tally);
  }
  return saved;
}

void ParameterServerJob::ResumeProgress(int64_t step, const nlohmann::json& saved) {
  logged_epochs_ = static_cast<int>(step / steps_per_epoch_);
  summary_.history.clear();
  progress_ = {logged_epochs_ + 1, step, Now(), {}, {}};
  if (!saved.is_object()) return;  // no checkpoint, or one written before the progress
  try {
    for (const nlohmann::json& log : saved.value("history", nlohmann::json::array())) {
      EpochLog read = EpochLogFromJson(log);
      if (read.epoch <= logged_epochs_) summary_.history.push_back(read);
    }
    // A stop right at an epoch's end saved the whole epoch's figures before its line:
    // that epoch ends again (with no steps left) and is reported then.
    const int saved_epoch = saved.value("epoch", 0);
    if (saved_epoch == logged_epochs_ && logged_epochs_ > 0 &&
        (summary_.history.empty() || summary_.history.back().epoch < saved_epoch)) {
      logged_epochs_ = saved_epoch - 1;
      progress_.epoch = saved_epoch;
    }
    if (saved_epoch == progress_.epoch) {
      progress_.carried = TallyFromJson(saved.value("epoch_tally", nlohmann::json::object()));
    }
  } catch (const nlohmann::json::exception& error) {  // the manifest's checksum passed
    spdlog::warn(
        "the checkpoint's record of the epochs is unreadable ({}): the summary "
        "covers the epochs trained from now on",
        error.what());
    summary_.history.clear();
    progress_.carried = {};
  }
}

ResumePoint ParameterServerJob::SavedAt() const {
  ResumePoint resume{.checkpoint_dir = job_.checkpoint.dir};
  if (checkpoints_ && saved_step_ > 0) resume.newest_step = saved_step_;
  return resume;
}

absl::Status ParameterServerJob::CheckFinite(int64_t step, double loss_sum) const {
  if (std::isfinite(loss_sum)) return absl::OkStatus();
  const int epoch = progress_.epoch;
  return TrainingDiverged("the loss is not finite", step, epoch,
                          step - (epoch - 1) * steps_per_epoch_, steps_per_epoch_, SavedAt());
}

absl::Status ParameterServerJob::Save(int64_t step, const nlohmann::json& history) {
  STRATUM_RETURN_IF_ERROR(ps_watcher_->CheckHold());
  const absl::StatusOr<EpochTally> tally = Tally(progress_.carried, progress_.scheduled);
  STRATUM_RETURN_IF_ERROR(CheckFinite(step, tally.ok() ? tally->loss_sum : 0));
  STRATUM_RETURN_IF_ERROR(checkpoints_->Save(step, ProgressJson(history)));
  // A PS that got a signal goes once told that a save begun after it is committed,
  // whichever save.
  ps_watcher_->Committed(checkpoints_->committed_save_ids(), checkpoints_->stopping_in_last_save());
  for (const std::string& ps : checkpoints_->stopping_in_last_save()) {
    std::fprintf(options_.out,
                 "%s is stopping (it got a signal): saved the state at step %lld in %s, which "
                 "training goes on from once it is back\n",
                 ps.c_str(), static_cast<long long>(step), job_.checkpoint.dir.c_str());
  }
  std::fflush(options_.out);
  return absl::OkStatus();
}

absl::StatusOr<EpochLog> ParameterServerJob::EvaluateTest() {
  constexpr int64_t kBatch = 1024;
  // An embedding table is pulled by the rows the test set reads (found once), never whole.
  if (!test_rows_) {
    GivenTableRows tables;
    for (size_t v = 0; v < model_->variables().size(); ++v) {
      if (model_->variables()[v].row_sparse) tables.variables.push_back(static_cast<int>(v));
    }
    if (!tables.variables.empty()) {
      STRATUM_ASSIGN_OR_RETURN(tables.rows, RowsReadByDataset(*model_, tables.variables, data_.test,
                                                              data_.rescale, kBatch));
    }
    test_rows_ = std::move(tables);
  }
  const GivenTableRows& tables = *test_rows_;
  if (tables.variables.empty()) {
    STRATUM_ASSIGN_OR_RETURN(const std::vector<Tensor> current, variables_->Pull());
    return EvaluateDataset(evaluation_, *model_, *loss_, current, data_.test, data_.rescale,
                           kBatch);
  }
  ShardedVariables::RowSelection selection(model_->variables().size(), nullptr);
  for (size_t t = 0; t < tables.variables.size(); ++t) {
    selection[static_cast<size_t>(tables.variables[t])] = &tables.rows[t];
  }
  STRATUM_ASSIGN_OR_RETURN(const std::vector<Tensor> current, variables_->Pull(selection));
  return EvaluateDataset(evaluation_, *model_, *loss_, current, data_.test, data_.rescale, kBatch,
                         &tables);
}

absl::Status ParameterServerJob::StopEarly() {
  // A step takes milliseconds; a closure still running after this is on a stuck worker.
  const absl::Status drained = coordinator_->Drain(absl::Seconds(10));
  const int epoch = progress_.epoch;
  const int64_t finished = progress_.first_step + FinishedSteps(progress_.scheduled);
  const std::string where =
      absl::StrCat("training stopped after step ", finished, " (epoch ", epoch, ", step ",
                   finished - (epoch - 1) * steps_per_epoch_, " of ", steps_per_epoch_,
                   "): this process was stopped by a signal");
  if (!checkpoints_) {
    return absl::CancelledError(
        absl::StrCat(where,
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
  if (saved.ok() && finished != saved_step_) saved = Save(finished, HistoryJson());
  if (!saved.ok()) {
    return absl::CancelledError(absl::StrCat(where, "; the state there could not be saved (",
                                             saved.message(), "): the job resumes from step ",
                                             saved_step_, " in ", job_.checkpoint.dir));
  }
  return absl::CancelledError(absl::StrCat(where, "; the state at step ", finished, " is saved in ",
                                           job_.checkpoint.dir,
                                           ": run the same job again to resume from it"));
}

bool ParameterServerJob::Stopped(const absl::Status& status) const {
  return absl::IsCancelled(status) && options_.cancel != nullptr &&
         options_.cancel->HasBeenNotified();
}

absl::Status ParameterServerJob::SaveForStoppingPs(const std::string& ps) {
  if (!checkpoints_) {
    std::fprintf(options_.out,
                 "%s is stopping (it got a signal) and the job has no checkpoint.dir: the "
                 "training state on it is lost when it goes\n",
                 ps.c_str());
    std::fflush(options_.out);
    return absl::OkStatus();
  }
  // Saved even when the latest checkpoint is at this step: the PS waits for a new one
  // (the same bytes again).
  STRATUM_RETURN_IF_ERROR(coordinator_->Join());
  STRATUM_RETURN_IF_ERROR(PsFailure(Save(global_step_, HistoryJson())));  // says so for `ps`
  saved_step_ = global_step_;
  return absl::OkStatus();
}

absl::StatusOr<FitSummary> ParameterServerJob::TrainEpochs() {
  FitState state;
  state.epoch = logged_epochs_;
  state.step_in_epoch = global_step_ - logged_epochs_ * steps_per_epoch_;
  state.iteration = global_step_;
  state.history = HistoryJson();
  const EpochLoopSpec spec{.steps_per_epoch = steps_per_epoch_,
                           .has_test = data_.has_test,
                           .start = start_,
                           .say_resumed = false,
                           .strategy_name = "ParameterServerStrategy"};
  return RunEpochs(evaluation_, *model_, *optimizer_, fit_options_, spec, std::move(state), *this);
}

absl::Status ParameterServerJob::StartEpoch(int epoch, int64_t /*first_step*/) {
  if (progress_.epoch != epoch) progress_ = {epoch, global_step_, Now(), {}, {}};
  carried_taken_ = false;
  closures_taken_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<StepRunner::StepResult> ParameterServerJob::Steps(int /*epoch*/, int64_t /*step*/,
                                                                 int64_t /*iteration*/,
                                                                 int64_t count) {
  if (options_.cancel != nullptr && options_.cancel->HasBeenNotified()) return StopEarly();
  STRATUM_RETURN_IF_ERROR(ps_watcher_->Lost());
  if (const std::string ps = ps_watcher_->TakeStopping(); !ps.empty()) {
    if (absl::Status saved = SaveForStoppingPs(ps); !saved.ok()) {
      // Still waiting for a committed save: the next chance (after a PS failure is
      // recovered, say) saves for them again.
      ps_watcher_->SaveFailed(ps);
      return Stopped(saved) ? StopEarly() : saved;
    }
  }
  absl::StatusOr<std::shared_ptr<RemoteValue>> value =
      coordinator_->Schedule("train_step", {Tensor::Scalar(static_cast<float>(count))});
  if (Stopped(value.status())) return StopEarly();
  if (!value.ok()) return value.status();
  progress_.scheduled.emplace_back(*std::move(value), count);
  global_step_ += count;
  return StepResult{.steps = count};
}

absl::Status ParameterServerJob::Sync() {
  absl::Status joined = coordinator_->Join();
  if (Stopped(joined)) return StopEarly();
  return joined;
}

absl::Status ParameterServerJob::TakeStats(StepStats& into) {
  // Added one closure at a time, in the order they were scheduled, as Tally adds them.
  if (!carried_taken_) {
    into.loss_sum += progress_.carried.loss_sum;
    into.correct += std::llround(progress_.carried.correct);
    into.examples += std::llround(progress_.carried.examples);
    carried_taken_ = true;
  }
  for (; closures_taken_ < progress_.scheduled.size(); ++closures_taken_) {
    const std::shared_ptr<RemoteValue>& result = progress_.scheduled[closures_taken_].first;
    if (result->status() != RemoteValueStatus::kReady) continue;
    absl::StatusOr<ClosureOutputs> outputs = result->Fetch();
    if (!outputs.ok()) return outputs.status();
    into.loss_sum += *(*outputs)[0].data<float>();
    into.correct += std::llround(*(*outputs)[1].data<float>());
    into.examples += std::llround(*(*outputs)[2].data<float>());
    if (outputs->size() > 3 && (*outputs)[3].num_elements() == 2 * AucCounts::kBuckets) {
      const float* counts = (*outputs)[3].data<float>();
      const std::vector<double> values(counts, counts + 2 * AucCounts::kBuckets);
      into.auc.Merge(AucCounts::FromValues(values.data(), static_cast<int64_t>(values.size())));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterServerJob::ExamplesTrained(int64_t /*first_step*/,
                                                            int64_t /*last_step*/) {
  // The figures cover the whole epoch (with its steps before a resume); the speed only
  // this process's.
  STRATUM_ASSIGN_OR_RETURN(const EpochTally tally, Tally(progress_.carried, progress_.scheduled));
  trained_this_epoch_ = static_cast<int64_t>(tally.examples - progress_.carried.examples);
  return trained_this_epoch_;
}

absl::StatusOr<EpochLog> ParameterServerJob::Evaluate() {
  absl::StatusOr<EpochLog> evaluated = EvaluateTest();
  if (evaluated.ok() || logged_epochs_ >= job_.fit.epochs) return evaluated;
  return PsFailure(evaluated.status());
}

std::optional<ResumePoint> ParameterServerJob::ResumeFrom() const { return SavedAt(); }

absl::Status ParameterServerJob::BackUp(const FitState& state) {
  STRATUM_RETURN_IF_ERROR(PsFailure(Save(global_step_, state.history)));
  saved_step_ = global_step_;
  return absl::OkStatus();
}

StepRunner::EpochLineNotes ParameterServerJob::EpochEnded(const EpochLog& log) {
  train_seconds_ += log.seconds;
  train_examples_ += trained_this_epoch_;
  summary_.history.push_back(log);
  logged_epochs_ = log.epoch;
  ++epochs_trained_here_;
  EpochLineNotes notes;
  // An epoch printed before a rollback is trained again from the checkpoint; its line
  // says so (its figures cover the whole epoch all the same).
  if (log.epoch <= printed_epochs_) {
    notes.after_epoch =
        absl::StrCat(" (trained again from step ", progress_.first_step, " after the rollback)");
  }
  printed_epochs_ = std::max(printed_epochs_, log.epoch);
  notes.after_steps = absl::StrCat(" on ", Counted(num_workers_, "worker", "workers"));
  return notes;
}

absl::Status ParameterServerJob::RecoverFromPsFailure(absl::Status failure) {
  while (true) {
    STRATUM_RETURN_IF_ERROR(CheckPsFailureIsRecoverable(failure));
    std::fprintf(options_.out, "%s; waiting up to %s for it to come back\n",
                 std::string(failure.message()).c_str(),
                 absl::FormatDuration(options_.ps_recovery_timeout).c_str());
    std::fflush(options_.out);
    STRATUM_ASSIGN_OR_RETURN(const std::vector<TaskReport> back, WaitForParameterServers(failure));
    // Every PS still the process that holds the variables (it stalled, or the network did):
    // nothing was lost, so nothing is rolled back. The closures that failed are trained
    // again once their stragglers are done.
    const bool every_ps_kept_its_state = EveryPsKeptItsState(back);
    // A variable missing on a PS that never restarted was never there: training again
    // would meet it again.
    if (every_ps_kept_its_state && IsErrorKind(failure, ErrorKind::kPsLostItsVariables)) {
      return absl::FailedPreconditionError(absl::StrCat(
          failure.message(),
          "; yet every parameter server is the process this coordinator "
          "created the variables on, so something else placed them otherwise: is another "
          "coordinator training a different job on these parameter servers? Give each job "
          "parameter servers of its own"));
    }
    if (every_ps_kept_its_state &&
        coordinator_->Join(options_.ps_timeout + absl::Seconds(10)).code() !=
            absl::StatusCode::kDeadlineExceeded) {
      GoOnWithNothingRolledBack();
      return absl::OkStatus();
    }
    absl::StatusOr<std::optional<int64_t>> restored = ReseedParameterServers();
    if (!restored.ok()) {
      // A parameter server that fails again (or another one) is waited for again.
      const absl::Status& reseeded = restored.status();
      if (!absl::IsUnavailable(reseeded) && !absl::IsDeadlineExceeded(reseeded)) return reseeded;
      failure = absl::UnavailableError(
          absl::StrCat("a parameter server is unavailable while the others are re-seeded: ",
                       reseeded.message()));
      continue;
    }
    RolledBackTo(*restored);
    return absl::OkStatus();
  }
}

absl::Status ParameterServerJob::CheckPsFailureIsRecoverable(const absl::Status& failure) const {
  // A lost PS ends the job as a failure (UNAVAILABLE, exit 1: a restart may succeed), not
  // as the job's configuration (FAILED_PRECONDITION, as PsFailure marks it for workers).
  if (options_.ps_recovery_timeout <= absl::ZeroDuration()) {
    return absl::UnavailableError(failure.message());
  }
  if (!checkpoints_) {
    return absl::UnavailableError(
        absl::StrCat(failure.message(),
                     "; the job has no checkpoint.dir to re-seed a parameter server from, so "
                     "training does not wait for it: set checkpoint.dir, and a parameter "
                     "server that comes back is re-seeded from the last checkpoint while "
                     "training waits"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TaskReport>> ParameterServerJob::WaitForParameterServers(
    const absl::Status& failure) {
  ClusterSpec ps_only;
  for (int task = 0; task < num_ps_; ++task)
    ps_only.SetTask(kPs, task, ps_addresses_[static_cast<size_t>(task)]);
  ClusterWaitOptions wait;
  wait.timeout = options_.ps_recovery_timeout;
  wait.cancel = options_.cancel;
  wait.channel = options_.channel;
  wait.timeout_flag = "--ps_recovery_timeout";
  absl::StatusOr<std::vector<TaskReport>> back = links_.wait_healthy(ps_only, wait);
  if (back.ok()) return back;
  if (options_.cancel != nullptr && options_.cancel->HasBeenNotified()) {
    return absl::CancelledError(absl::StrCat(
        "stopped by a signal while waiting for the parameter servers: ", failure.message()));
  }
  return absl::UnavailableError(
      absl::StrCat(failure.message(), "; it did not come back: ", back.status().message()));
}

bool ParameterServerJob::EveryPsKeptItsState(const std::vector<TaskReport>& back) const {
  bool every_ps_kept_its_state = true;
  for (int task = 0; task < num_ps_; ++task) {
    const uint64_t now = back[static_cast<size_t>(task)].incarnation;
    if (now == 0 || now != holding_incarnations_[static_cast<size_t>(task)]) {
      every_ps_kept_its_state = false;
    }
  }
  return every_ps_kept_its_state;
}

void ParameterServerJob::GoOnWithNothingRolledBack() {
  std::erase_if(progress_.scheduled, [](const auto& closure) {
    return closure.first->status() != RemoteValueStatus::kReady;
  });
  global_step_ = progress_.first_step + FinishedSteps(progress_.scheduled);
  std::fprintf(options_.out,
               "the parameter servers answer again, each the same process as before (none "
               "restarted): their variables are intact, so training goes on from step %lld "
               "with nothing rolled back\n",
               static_cast<long long>(global_step_));
  std::fflush(options_.out);
}

absl::StatusOr<std::optional<int64_t>> ParameterServerJob::ReseedParameterServers() {
  holding_incarnations_ = PsIncarnations(ps_addresses_, options_.channel, links_);
  STRATUM_RETURN_IF_ERROR(ps_watcher_->Claim());
  STRATUM_RETURN_IF_ERROR(variables_->Create(model_->InitialFills(job_.fit.seed), UpdateRules()));
  return checkpoints_->RestoreLatest();
}

void ParameterServerJob::RolledBackTo(const std::optional<int64_t>& restored) {
  global_step_ = restored.value_or(0);
  saved_step_ = global_step_;
  // The steps after the checkpoint are trained again: their epochs are reported once, anew.
  ResumeProgress(global_step_, checkpoints_->restored_progress());
  if (restored.has_value()) {
    std::fprintf(options_.out,
                 "the parameter servers are back: restored the checkpoint at step %lld and "
                 "training goes on\n",
                 static_cast<long long>(global_step_));
  } else {
    std::fprintf(options_.out,
                 "the parameter servers are back, but no checkpoint was written yet: training "
                 "starts again from step 0\n");
  }
  std::fflush(options_.out);
}

absl::StatusOr<FitSummary> ParameterServerJob::Finish(const FitSummary& trained) {
  const bool already_complete = epochs_trained_here_ == 0 && data_.has_test;
  if (!already_complete && checkpoints_ && global_step_ != saved_step_) {
    if (absl::Status status = Save(global_step_, HistoryJson()); !status.ok()) return status;
  }
  if (!options_.export_dir.empty()) {
    absl::StatusOr<std::vector<Tensor>> trained_variables = variables_->Pull();
    if (!trained_variables.ok()) return trained_variables.status();
    STRATUM_RETURN_IF_ERROR(
        ExportKerasModel(job_.model, *model_, *trained_variables, options_.export_dir));
    std::fprintf(options_.out,
                 "exported the model into %s: model.json, model.weights.h5, model.safetensors\n",
                 options_.export_dir.c_str());
  }
  if (checkpoints_) {
    STRATUM_RETURN_IF_ERROR(DeleteBackupOfCompleteJob(job_.checkpoint, options_.out));
  }
  // The model as trained: the last epoch's validation, if it ran, else evaluated.
  summary_.tested = trained.tested;
  summary_.test_loss = trained.test_loss;
  summary_.test_accuracy = trained.test_accuracy;
  summary_.test_auc = trained.test_auc;
  summary_.steps = global_step_;  // the job's step counter, across restarts
  summary_.examples_per_sec = static_cast<double>(train_examples_) / std::max(train_seconds_, 1e-9);
  summary_.wall_s = Now() - start_;
  if (coordinator_->retried_closures() > 0) {
    spdlog::info("{} retried on other workers after a worker failed",
                 Counted(coordinator_->retried_closures(), "closure was", "closures were"));
  }
  return summary_;
}

}  // namespace

PsJobLinks GrpcPsJobLinks() {
  return {
      .ps = GrpcPsTransport,
      .worker = [](const std::string& peer, const std::string& address,
                   const ChannelOptions& channel) -> std::unique_ptr<WorkerConnection> {
        return std::make_unique<GrpcWorkerConnection>(peer, address, channel);
      },
      .report =
          [](const std::string& address, absl::Duration timeout, const ChannelOptions& channel) {
            return GetTaskReport(address, timeout, channel);
          },
      .wait_healthy = WaitForClusterHealthy};
}

absl::StatusOr<FitSummary> RunParameterServerJob(const JobSpec& job, const std::string& job_json,
                                                 const std::string& job_base_dir,
                                                 const ClusterSpec& cluster,
                                                 const PsTrainingOptions& options,
                                                 const PsJobLinks& links) {
  ParameterServerJob parameter_server_job(job, job_json, job_base_dir, cluster, options, links);
  return parameter_server_job.Run();
}

absl::StatusOr<FitSummary> RunParameterServerJob(const JobSpec& job, const std::string& job_json,
                                                 const std::string& job_base_dir,
                                                 const ClusterSpec& cluster,
                                                 const PsTrainingOptions& options) {
  return RunParameterServerJob(job, job_json, job_base_dir, cluster, options, GrpcPsJobLinks());
}

}  // namespace stratum
