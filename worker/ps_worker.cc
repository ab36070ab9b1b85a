#include "ps_worker.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "stratum/job/job_spec.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/ps/ps_client.h"
#include "stratum/ps/sharded_variables.h"
#include "stratum/tensor/tensor_proto.h"
#include "stratum/util/error_kind.h"
#include "stratum/util/metrics.h"
#include "stratum/util/process_info.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/training_job.h"

#if STRATUM_WITH_CUDA
#include "gpu_train_steps.h"
#endif

namespace stratum {

// One job as set up on this worker.
class WorkerJob {
 public:
  uint64_t incarnation = 0;
  int worker_index = 0;
  int num_workers = 1;
  std::unique_ptr<Model> model;
  std::unique_ptr<Loss> loss;
  std::unique_ptr<Strategy> strategy;
  std::unique_ptr<DistributedIterator> batches;
  std::unique_ptr<ShardedVariables> variables;
  std::vector<std::unique_ptr<Workspace>> workspaces;
  PerReplica<std::vector<Tensor>> gradients;
#if STRATUM_WITH_CUDA
  std::unique_ptr<GpuTrainSteps> gpu;  // set when the local replicas train on GPUs
#endif

  bool on_gpu() const {
#if STRATUM_WITH_CUDA
    return gpu != nullptr;
#else
    return false;
#endif
  }
  // Row-sparse tables (VariableSpec::row_sparse) the CPU replicas take as the rows their
  // batch reads: only those rows travel, each way. Empty on GPUs, which take them whole.
  std::vector<int> row_tables;
  // This worker's iterators of per-worker datasets, by PerWorkerValues id.
  struct PerWorkerDataset {
    std::string dataset;  // the registered function that built it
    std::unique_ptr<DistributedIterator> iterator;
  };
  std::map<int64_t, PerWorkerDataset> per_worker;

  // Whether the job brought data for train_step (a job for user closures may not).
  bool has_data() const { return batches != nullptr || on_gpu(); }
  absl::StatusOr<std::vector<Tensor>> TrainSteps(int64_t steps);

 private:
  // The next batch of the local replicas (CPU) and the rows of each row table it reads.
  struct Batch {
    PerReplica<Element> parts;
    std::vector<std::vector<int64_t>> rows;  // per entry of row_tables
  };
  absl::StatusOr<Batch> NextBatch();
  // Per model variable: the rows `batch` reads of a row table, nullptr for the others.
  ShardedVariables::RowSelection Selection(const Batch* batch) const;
  absl::StatusOr<PerReplica<StepStats>> CpuStep(const std::vector<Tensor>& values,
                                                const Batch& batch);
};

namespace {

#if STRATUM_WITH_CUDA
// Every local replica on a GPU: the GPU step, unless it cannot train this job (then the
// CPU's, saying why).
absl::Status SetUpGpu(WorkerJob& job, const JobSpec& spec, const FitData& data, uint64_t seed) {
  const std::vector<std::string>& devices = job.strategy->devices();
  if (!std::all_of(devices.begin(), devices.end(),
                   [](const std::string& d) { return d.rfind("GPU:", 0) == 0; })) {
    return absl::OkStatus();
  }
  GpuTrainStepsOptions options;
  options.devices = devices;
  options.batch_size_per_replica = spec.fit.batch_size_per_replica;
  options.seed = seed;
  absl::StatusOr<std::unique_ptr<GpuTrainSteps>> gpu =
      GpuTrainSteps::Create(*job.model, *job.loss, data, options);
  if (gpu.ok()) {
    job.gpu = *std::move(gpu);
    spdlog::info("the local replicas train on the GPU ({})", absl::StrJoin(devices, ", "));
    return absl::OkStatus();
  }
  if (gpu.status().code() != absl::StatusCode::kUnimplemented) return gpu.status();
  spdlog::info("training on the CPU: {}", std::string(gpu.status().message()));
  return absl::OkStatus();
}
#endif

// A PS worker's own part of the training data, as create_per_worker_dataset gives each
// worker a dataset: its own files when there are at least as many files as workers (AUTO
// or FILE), every num_workers-th example for DATA; with AUTO and fewer files (or data read
// whole, such as IDX) every worker reads all of it, in its own order, as before.
absl::Status ShardForThisWorker(const std::string& policy_name, int num_workers, int index,
                                FitData& data) {
  STRATUM_ASSIGN_OR_RETURN(AutoShardPolicy policy, AutoShardPolicyFromName(policy_name));
  if (num_workers <= 1) return absl::OkStatus();
  absl::StatusOr<Dataset> part =
      AutoShard(data.train, policy == AutoShardPolicy::kAuto ? AutoShardPolicy::kFile : policy,
                num_workers, index);
  // AUTO without a file per worker: every worker reads all of it.
  if (policy == AutoShardPolicy::kOff || (policy == AutoShardPolicy::kAuto && !part.ok())) {
    spdlog::info("every worker reads all of the training data ({})", data.train.DebugString());
    return absl::OkStatus();
  }
  if (policy == AutoShardPolicy::kAuto) policy = AutoShardPolicy::kFile;
  if (!part.ok()) return part.status();
  data.train = *std::move(part);
  STRATUM_ASSIGN_OR_RETURN(const int64_t examples, data.train.Cardinality());
  if (examples >= 0) data.train_examples = examples;
  spdlog::info("this worker reads {} ({}): {} training examples", data.train.DebugString(),
               AutoShardPolicyName(policy), data.train_examples);
  return absl::OkStatus();
}

// The embedding tables that travel by rows (the CPU replicas'), and the log line that says
// which do and why the others do not.
void FindRowTables(WorkerJob& job) {
  std::vector<std::string> by_rows, whole;
  const std::vector<VariableSpec>& specs = job.model->variables();
  for (size_t v = 0; v < specs.size(); ++v) {
    if (specs[v].row_sparse && !job.on_gpu()) {
      job.row_tables.push_back(static_cast<int>(v));
      by_rows.push_back(specs[v].name);
    } else if (specs[v].row_sparse) {
      whole.push_back(specs[v].name);
    }
  }
  if (!by_rows.empty()) {
    spdlog::info(
        "embedding tables {} travel by rows: a step pulls and pushes only the rows its batch "
        "reads",
        absl::StrJoin(by_rows, ", "));
  }
  if (!whole.empty()) {
    spdlog::info("embedding tables {} travel whole: the GPU replicas take whole tables",
                 absl::StrJoin(whole, ", "));
  }
}

// The job's own training data, for train_step: this worker's part, batched for its local
// replicas (on the GPUs when they can train the job).
absl::Status SetUpData(WorkerJob& job, const JobSpec& spec, const proto::SetupJobRequest& request,
                       uint64_t seed) {
  DataSpec data_spec = spec.data;
  data_spec.test = {};  // the coordinator evaluates
  absl::StatusOr<FitData> data = LoadFitData(data_spec, *job.model);
  if (!data.ok()) return data.status();
  STRATUM_RETURN_IF_ERROR(ShardForThisWorker(spec.data.auto_shard_policy, request.num_workers(),
                                             request.worker_index(), *data));
  const int replicas = job.strategy->NumLocalReplicas();
#if STRATUM_WITH_CUDA
  STRATUM_RETURN_IF_ERROR(SetUpGpu(job, spec, *data, seed));
#endif
  if (job.on_gpu()) return absl::OkStatus();
  if (const std::string note = CpuPrecisionNote(job.model->dtype_policy()); !note.empty()) {
    spdlog::info("{}", note);
  }
  const Dataset batches =
      MakeBatches(data->train, *job.model, spec.fit.batch_size_per_replica * replicas,
                  data->rescale, spec.fit.shuffle_buffer, seed, /*repeat=*/true);
  absl::StatusOr<DistributedDataset> distributed = job.strategy->ExperimentalDistributeDataset(
      batches, {.auto_shard_policy = AutoShardPolicy::kOff});
  if (!distributed.ok()) return distributed.status();
  job.batches = distributed->MakeIterator();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WorkerJob>> BuildJob(const proto::SetupJobRequest& request,
                                                    const ChannelOptions& channel,
                                                    const PsTransportFactory& ps_transport) {
  auto job = std::make_unique<WorkerJob>();
  job->incarnation = request.coordinator_incarnation();
  job->worker_index = request.worker_index();
  job->num_workers = std::max(1, request.num_workers());
  absl::StatusOr<JobSpec> spec = ParseJobSpec(request.job_json(), "job from the coordinator",
                                              request.job_base_dir(), {.needs_data = false});
  if (!spec.ok()) return spec.status();
  absl::StatusOr<Model> model = Model::FromKerasJson(spec->model);
  if (!model.ok()) return model.status();
  job->model = std::make_unique<Model>(*std::move(model));
  absl::StatusOr<Loss> loss = Loss::FromKeras(spec->loss);
  if (!loss.ok()) return loss.status();
  job->loss = std::make_unique<Loss>(*std::move(loss));

  // The worker's local replicas: the job's devices, else one per GPU or CPU:0.
  StrategySpec local;
  local.type = "mirrored";
  local.devices = spec->strategy.devices;
  local.cross_device_ops = spec->strategy.cross_device_ops;
  local.logical_gpus_per_gpu = spec->strategy.logical_gpus_per_gpu;
  local.intra_op_parallelism_threads = spec->strategy.intra_op_parallelism_threads;
  absl::StatusOr<std::unique_ptr<Strategy>> strategy = MakeLocalStrategy(local);
  if (!strategy.ok()) return strategy.status();
  job->strategy = *std::move(strategy);

  const int replicas = job->strategy->NumLocalReplicas();
  // Every worker reads its data in its own shuffled order (as TF's PS training does with a
  // repeated, shuffled per-worker dataset).
  const uint64_t seed = spec->fit.seed + 7919 * static_cast<uint64_t>(request.worker_index() + 1);
  if (spec->data.train.given()) STRATUM_RETURN_IF_ERROR(SetUpData(*job, *spec, request, seed));

  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const VariableSpec& variable : job->model->variables()) {
    names.push_back(variable.name);
    shapes.push_back(variable.shape);
  }
  std::vector<ShardSpec> shards;
  for (const proto::VariablePlacement& placement : request.placements()) {
    const auto it = std::find(names.begin(), names.end(), placement.variable());
    if (it == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the coordinator placed variable \"",
                                                     placement.variable(),
                                                     "\", which the model does not have"));
    }
    ShardSpec shard;
    shard.variable = placement.variable();
    shard.name = placement.shard();
    shard.ps_task = placement.ps_task();
    shard.first_row = placement.first_row();
    const Shape& shape = shapes[static_cast<size_t>(it - names.begin())];
    shard.shape = shape.rank() == 0 ? shape : shape.WithFirstDim(placement.rows());
    shards.push_back(std::move(shard));
  }
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int task = 0; task < request.ps_addresses_size(); ++task) {
    PsClientOptions client_options;
    client_options.channel = channel;
    client_options.connect = ps_transport;
    if (request.ps_timeout_ms() > 0)
      client_options.timeout = absl::Milliseconds(request.ps_timeout_ms());
    clients.push_back(std::make_unique<PsClient>(absl::StrCat("ps:", task),
                                                 request.ps_addresses(task), client_options));
  }
  job->variables =
      std::make_unique<ShardedVariables>(names, shapes, std::move(shards), std::move(clients));
  for (int r = 0; r < replicas; ++r) {
    job->workspaces.push_back(job->model->NewWorkspace(seed + static_cast<uint64_t>(r)));
    // Synchronized layers sum over this worker's replicas: a worker's step is its own.
    job->workspaces.back()->SetReplicaSum(ReplicaSumOf(*job->strategy, r));
  }
  job->gradients = PerReplica<std::vector<Tensor>>{
      std::vector<std::vector<Tensor>>(static_cast<size_t>(replicas))};
  FindRowTables(*job);
  return job;
}

}  // namespace

absl::StatusOr<WorkerJob::Batch> WorkerJob::NextBatch() {
  absl::StatusOr<std::optional<PerReplica<Element>>> next = batches->GetNext();
  if (!next.ok()) return next.status();
  if (!next->has_value()) return absl::OutOfRangeError("the worker's dataset ended");
  Batch batch{**std::move(next), {}};
  std::vector<const Tensor*> xs;
  for (const Element& part : batch.parts.values()) xs.push_back(&part[0]);
  STRATUM_ASSIGN_OR_RETURN(batch.rows, model->RowsRead(xs, row_tables));
  return batch;
}

ShardedVariables::RowSelection WorkerJob::Selection(const Batch* batch) const {
  if (batch == nullptr || row_tables.empty()) return {};
  ShardedVariables::RowSelection selection(model->variables().size(), nullptr);
  for (size_t t = 0; t < row_tables.size(); ++t) {
    selection[static_cast<size_t>(row_tables[t])] = &batch->rows[t];
  }
  return selection;
}

// One step of the local replicas on the CPU, gradients into gradients[r] (of the rows the
// batch reads, for the row tables).
absl::StatusOr<PerReplica<StepStats>> WorkerJob::CpuStep(const std::vector<Tensor>& values,
                                                         const Batch& batch) {
  const PerReplica<Element>& parts = batch.parts;
  int64_t rows = 0;
  for (const Element& part : parts.values()) rows += part[0].rows();
  for (const std::unique_ptr<Workspace>& workspace : workspaces) {
    STRATUM_RETURN_IF_ERROR(workspace->SetVariableRows(row_tables, batch.rows));
  }
  return strategy->Run<StepStats>([&](ReplicaContext& context) -> absl::StatusOr<StepStats> {
    const int r = context.local_replica_id();
    // A worker's step is one update on the parameter servers: its replicas carry the
    // regularization and the moving statistics' step once between them.
    return model->TrainStep(values, parts[r][0], parts[r][1], *loss,
                            1.0f / static_cast<float>(rows), *workspaces[static_cast<size_t>(r)],
                            gradients[r], 1.0f / static_cast<float>(strategy->NumReplicasInSync()));
  });
}

absl::StatusOr<std::vector<Tensor>> WorkerJob::TrainSteps(int64_t steps) {
  std::vector<Tensor> values;
  StepStats sums{};
  std::optional<Batch> batch;  // the CPU replicas' this step
  const auto fetch = [&]() -> absl::Status {
    if (batches == nullptr || batch.has_value()) return absl::OkStatus();
    absl::StatusOr<Batch> next = NextBatch();
    if (!next.ok()) return next.status();
    batch = *std::move(next);
    return absl::OkStatus();
  };
  for (int64_t step = 0; step < steps; ++step) {
    // The rows a pull brings are those the batch reads: with row tables it comes first.
    if (!row_tables.empty()) STRATUM_RETURN_IF_ERROR(fetch());
    // The first step of a closure pulls; later ones use the values each push returns (one
    // round trip per step instead of two: the PS sends back its variables, other workers'
    // updates included, as they are after applying ours, and the rows of the row tables
    // the next batch reads).
    if (step == 0 || values.empty()) {
      absl::StatusOr<std::vector<Tensor>> pulled =
          variables->Pull(Selection(batch ? &*batch : nullptr));
      if (!pulled.ok()) return PsFailure(pulled.status());
      values = *std::move(pulled);
    }
    STRATUM_RETURN_IF_ERROR(fetch());
    std::vector<Tensor>& total = gradients[0];
#if STRATUM_WITH_CUDA
    if (gpu != nullptr) {
      // The sum over the local replicas comes back in `total`; the sums stay on the GPU.
      if (absl::Status status = gpu->Step(values, total); !status.ok()) return status;
    }
#endif
    if (batch.has_value()) {
      absl::StatusOr<PerReplica<StepStats>> stats = CpuStep(values, *batch);
      if (!stats.ok()) return stats.status();
      for (int r = 1; r < gradients.size(); ++r) {
        for (size_t i = 0; i < total.size(); ++i) total[i].Flat() += gradients[r][i].Flat();
      }
      for (const StepStats& s : stats->values()) {
        sums.loss_sum += s.loss_sum;
        sums.correct += s.correct;
        sums.examples += s.examples;
        sums.auc.Merge(s.auc);
      }
    }
    const bool last = step + 1 == steps;
    // With row tables, the next batch comes first: its rows come back with this push.
    std::optional<Batch> next;
    absl::Status fetched_next;
    if (!last && !row_tables.empty() && batches != nullptr) {
      absl::StatusOr<Batch> fetched = NextBatch();
      fetched_next = fetched.status();
      if (fetched.ok()) next = *std::move(fetched);
    }
    const bool pull = !last && fetched_next.ok();
    if (absl::Status status =
            variables->Push(total, pull ? &values : nullptr, Selection(batch ? &*batch : nullptr),
                            Selection(next ? &*next : nullptr));
        !status.ok()) {
      return PsFailure(status);
    }
    if (!fetched_next.ok()) return fetched_next;  // after this step's gradients are in
    batch = std::move(next);
  }
#if STRATUM_WITH_CUDA
  if (gpu != nullptr) {
    absl::StatusOr<StepStats> taken = gpu->TakeMetrics();
    if (!taken.ok()) return taken.status();
    sums = *taken;
  }
#endif
  // The AUC counts, when the model measures them, as a fourth output (float32 counts are
  // exact for any closure's batches).
  const std::vector<double> auc = sums.auc.Values();
  Tensor auc_counts(DType::kFloat32, Shape({static_cast<int64_t>(auc.size())}));
  for (size_t i = 0; i < auc.size(); ++i) auc_counts.data<float>()[i] = static_cast<float>(auc[i]);
  return std::vector<Tensor>{Tensor::Scalar(static_cast<float>(sums.loss_sum)),
                             Tensor::Scalar(static_cast<float>(sums.correct)),
                             Tensor::Scalar(static_cast<float>(sums.examples)),
                             std::move(auc_counts)};
}

// What a registered function sees of the job.
class JobContext final : public WorkerContext {
 public:
  explicit JobContext(WorkerJob& job) : job_(job) {}
  const Model& model() const override { return *job_.model; }
  const Loss& loss() const override { return *job_.loss; }
  Strategy& strategy() override { return *job_.strategy; }
  Workspace& workspace(int replica) override {
    return *job_.workspaces.at(static_cast<size_t>(replica));
  }
  int worker_index() const override { return job_.worker_index; }
  int num_workers() const override { return job_.num_workers; }
  absl::StatusOr<std::vector<Tensor>> PullVariables() override {
    absl::StatusOr<std::vector<Tensor>> pulled = job_.variables->Pull();
    if (!pulled.ok()) return PsFailure(pulled.status());
    return pulled;
  }
  absl::Status PushGradients(const std::vector<Tensor>& gradients) override {
    absl::Status pushed = job_.variables->Push(gradients);
    return pushed.ok() ? pushed : PsFailure(pushed);
  }

 private:
  WorkerJob& job_;
};

namespace {

// train_step's argument: the steps to run (one float32 scalar; none: 1).
absl::StatusOr<int64_t> StepsArgument(const proto::RunClosureRequest& request) {
  if (request.args_size() == 0) return 1;
  const proto::ClosureArgument& arg = request.args(0);
  if (arg.has_tensor()) {
    absl::StatusOr<Tensor> steps = TensorFromProto(arg.tensor());
    if (!steps.ok()) return steps.status();
    if (steps->dtype() == DType::kFloat32 && steps->num_elements() == 1) {
      return std::max<int64_t>(1, static_cast<int64_t>(*steps->data<float>()));
    }
  }
  return absl::InvalidArgumentError("train_step takes one float32 scalar: the steps");
}

// A function's error as the coordinator must take it: codes that say "the worker failed"
// (and make the closure run elsewhere) are the function's own error here.
absl::Status AsClosureError(const std::string& function, const absl::Status& status) {
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
      absl::IsCancelled(status) || absl::IsAborted(status)) {
    return Rewrapped(
        status, absl::StatusCode::kUnknown,
        absl::StrCat("function \"", function, "\" failed (",
                     absl::StatusCodeToString(status.code()), "): ", status.message()));
  }
  return status;
}

}  // namespace

PsWorker::PsWorker(ChannelOptions channel, absl::Duration lease, WorkerFunctions functions,
                   PsTransportFactory ps_transport)
    : channel_(std::move(channel)),
      ps_transport_(std::move(ps_transport)),
      functions_(std::move(functions)),
      lease_(lease, {.held = "this worker",
                     .why = "two coordinators would take turns setting it up for their own "
                            "jobs, each undoing the other's; stop that one first, or give this "
                            "job workers of its own"}) {}
PsWorker::~PsWorker() = default;

absl::StatusOr<proto::SetupJobResponse> PsWorker::SetupJob(const proto::SetupJobRequest& request,
                                                           absl::string_view peer) {
  // Claimed before the job is built (the data loaded): a refused coordinator costs nothing.
  // A holder gone quiet (it died, and this is its successor elsewhere) is waited out.
  CoordinatorClaimant claimant = ClaimantOf(request.coordinator());
  claimant.incarnation = request.coordinator_incarnation();
  claimant.peer = std::string(peer);
  STRATUM_RETURN_IF_ERROR(lease_.Claim(claimant, lease_.lease() + absl::Seconds(1)));
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<WorkerJob> job,
                           BuildJob(request, channel_, ps_transport_));
  proto::SetupJobResponse response;
  absl::MutexLock lock(&mutex_);
  response.set_num_replicas(job->strategy->NumReplicasInSync());
  response.set_worker_incarnation(ProcessIncarnation());
  job_ = std::move(job);
  spdlog::info("job set up by coordinator incarnation {:016x}: {} local replica(s), {} PS tasks",
               request.coordinator_incarnation(), response.num_replicas(),
               request.ps_addresses_size());
  return response;
}

absl::StatusOr<ClosureArguments> PsWorker::Arguments(const proto::RunClosureRequest& request) {
  std::vector<ClosureArguments::Value> values;
  for (const proto::ClosureArgument& arg : request.args()) {
    if (arg.has_tensor()) {
      STRATUM_ASSIGN_OR_RETURN(Tensor tensor, TensorFromProto(arg.tensor()));
      values.emplace_back(std::move(tensor));
      continue;
    }
    if (!arg.has_per_worker()) {
      return absl::InvalidArgumentError(absl::StrCat("an argument of \"", request.function(),
                                                     "\" is neither a tensor nor per-worker "
                                                     "values"));
    }
    const proto::PerWorkerArgument& per_worker = arg.per_worker();
    auto it = job_->per_worker.find(per_worker.id());
    if (it != job_->per_worker.end() && it->second.dataset != per_worker.dataset()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "per-worker values ", per_worker.id(), " are this worker's iterator over dataset \"",
          it->second.dataset, "\", not over \"", per_worker.dataset(), "\""));
    }
    if (it == job_->per_worker.end()) {
      // Built once per job set-up: a restarted worker, set up anew, builds it again.
      const DatasetFunction* build = functions_.FindDataset(per_worker.dataset());
      if (build == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            "dataset function \"", per_worker.dataset(),
            "\" is not registered on this worker (it has ", functions_.DatasetNames(),
            "): register it with WorkerFunctions::RegisterDataset in the worker program"));
      }
      InputContext input{.num_input_pipelines = job_->num_workers,
                         .input_pipeline_id = job_->worker_index,
                         .num_replicas_in_sync = job_->strategy->NumLocalReplicas()};
      absl::StatusOr<Dataset> dataset = (*build)(input);
      if (!dataset.ok()) {
        return absl::Status(dataset.status().code(),
                            absl::StrCat("dataset function \"", per_worker.dataset(),
                                         "\": ", dataset.status().message()));
      }
      STRATUM_ASSIGN_OR_RETURN(DistributedDataset distributed,
                               job_->strategy->ExperimentalDistributeDataset(
                                   *dataset, {.auto_shard_policy = AutoShardPolicy::kOff}));
      spdlog::info("built per-worker dataset \"{}\" (values {}): {}", per_worker.dataset(),
                   per_worker.id(), dataset->DebugString());
      it = job_->per_worker
               .emplace(per_worker.id(), WorkerJob::PerWorkerDataset{per_worker.dataset(),
                                                                     distributed.MakeIterator()})
               .first;
    }
    values.emplace_back(it->second.iterator.get());
  }
  return ClosureArguments(request.function(), std::move(values));
}

absl::StatusOr<proto::RunClosureResponse> PsWorker::RunClosure(
    const proto::RunClosureRequest& request) {
  STRATUM_RETURN_IF_ERROR(
      lease_.Heartbeat({request.coordinator_incarnation(), request.coordinator_secret()}));
  absl::MutexLock lock(&mutex_);
  if (job_ == nullptr || job_->incarnation != request.coordinator_incarnation()) {
    return WithErrorKind(absl::FailedPreconditionError(
                             "not set up: this worker has no job from this coordinator (it may "
                             "have restarted); send SetupJob first"),
                         ErrorKind::kNotSetUp);
  }
  absl::StatusOr<std::vector<Tensor>> outputs;
  if (request.function() == "train_step") {
    if (!job_->has_data()) {
      return absl::InvalidArgumentError(
          "train_step trains on the job's data.train, and this job has none: give the job "
          "\"data\", or schedule a function the worker program registered");
    }
    STRATUM_ASSIGN_OR_RETURN(const int64_t steps, StepsArgument(request));
    static Histogram& step_seconds = MetricsRegistry::Global().GetHistogram(
        "stratum_training_step_seconds", "Time of one training step on this worker's replicas.",
        SecondsBuckets());
    static Counter& steps_run = MetricsRegistry::Global().GetCounter(
        "stratum_worker_closure_steps_total", "Training steps this worker ran for coordinators.");
    const absl::Time began = absl::Now();
    outputs = job_->TrainSteps(steps);
    if (!outputs.ok()) return outputs.status();
    step_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - began) / static_cast<double>(steps));
    steps_run.Add(static_cast<double>(steps));
  } else {
    const WorkerFunction* function = functions_.Find(request.function());
    if (function == nullptr) {
      const std::string names = functions_.Names();
      return absl::NotFoundError(absl::StrCat(
          "function \"", request.function(), "\" is not registered on this worker (it has ",
          names == "none" ? "only the built-in train_step"
                          : absl::StrCat(names, ", and the built-in train_step"),
          "): register it with WorkerFunctions::Register in the worker program, or schedule "
          "one it has"));
    }
    // A dataset function's error is the closure's own too, not a failed worker.
    absl::StatusOr<ClosureArguments> arguments = Arguments(request);
    if (!arguments.ok()) return AsClosureError(request.function(), arguments.status());
    JobContext context(*job_);
    outputs = (*function)(context, *arguments);
    if (!outputs.ok()) return AsClosureError(request.function(), outputs.status());
  }
  proto::RunClosureResponse response;
  for (const Tensor& output : *outputs) TensorToProto(output, response.add_outputs());
  return response;
}

proto::LeaveResponse PsWorker::Leave(const proto::LeaveRequest& request) {
  proto::LeaveResponse response;
  if (!lease_.Release({request.coordinator_incarnation(), request.coordinator_secret()})) {
    return response;
  }
  response.set_left(true);
  std::unique_ptr<WorkerJob> done;  // freed outside the lock
  {
    absl::MutexLock lock(&mutex_);
    if (job_ != nullptr && job_->incarnation == request.coordinator_incarnation()) {
      done = std::move(job_);
    }
  }
  spdlog::info("coordinator incarnation {:016x} is done with this worker: its job is dropped",
               request.coordinator_incarnation());
  return response;
}

}  // namespace stratum
