// Fit on GPUs: the training set (the worker's shard of it with several workers) lives on
// each GPU (uint8, uploaded once), every epoch's example order is drawn on the host and
// uploaded ahead of the epoch (pinned memory, a copy stream, events), and every step runs
// on the replicas' streams without the host waiting: gather + rescale, forward, loss,
// backward, the cross-device all-reduce of the gradients (several replicas), the optimizer.
// Loss and accuracy are read once per epoch. The variables come back to host tensors for
// checkpoints and the summary, so everything downstream of Fit is unchanged.
//
// Several workers (MultiWorkerMirroredStrategy): the same shards, step counts and lock-step
// as the CPU path; after the local all-reduce each step's flat gradient buffer goes to
// pinned host memory, through the strategy's cross-worker all-reduce (the TCP ring) and
// back to every replica before the optimizer runs on the device. The ring hands every
// worker the same bits, so the variables stay bit-identical across workers. With
// communication NCCL, one NCCL group over every replica of every worker sums the gradients
// on the devices instead (no local all-reduce, no host copy; NCCL's ring and tree also hand
// every rank the same bits), and the host waits, with the deadline, only for the all-reduce
// queued two steps before. Evaluation splits the test set over the workers and sums the
// totals, as the CPU path does.
//
// The order of examples differs from the CPU path's shuffle buffer (a full shuffle per
// epoch, a function of the seed and the epoch), and dropout masks come from a counter-based
// generator on the device: results agree with the CPU path statistically, not bit for bit.
#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "fit_internal.h"
#include "spdlog/spdlog.h"
#include "stratum/cuda/all_reduce.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/cuda/device.h"
#include "stratum/cuda/nccl_group.h"
#include "stratum/cuda/replica.h"
#include "stratum/training/epoch_loop.h"
#include "stratum/training/fit_state.h"
#include "stratum/util/devices.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/collective/nccl_across_workers.h"
#include "stratum/worker/multi_worker_mirrored_strategy.h"

namespace stratum {
namespace fit_internal {

absl::StatusOr<std::pair<Tensor, Tensor>> Materialize(const Dataset& dataset, int64_t examples) {
  auto iterator = dataset.Batch(std::max<int64_t>(examples, 1)).MakeIterator();
  STRATUM_ASSIGN_OR_RETURN(std::optional<Element> all, iterator->GetNext());
  if (!all.has_value() || all->size() < 2) {
    return absl::UnimplementedError("the data set yields no (features, labels) examples");
  }
  return std::make_pair((*all)[0], (*all)[1]);
}

absl::StatusOr<std::pair<Tensor, Tensor>> MaterializeTrainingData(const Dataset& dataset,
                                                                  int64_t examples,
                                                                  const Model& model) {
  STRATUM_ASSIGN_OR_RETURN(auto train, Materialize(dataset, examples));
  if (train.first.dtype() != DType::kUInt8) {
    return absl::UnimplementedError(absl::StrCat(
        "the GPU path keeps uint8 examples on the GPU, and these are ", train.first.DebugString()));
  }
  if (train.first.row_size() != model.input_shape().num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data's examples are ", train.first.DebugString(), " but the model takes ",
        model.input_shape().ToString(), " per example: fix the model's input shape or the data"));
  }
  return train;
}

void DrawOrder(uint64_t seed, int64_t epoch, int64_t n, int64_t length, int32_t* out) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
  std::vector<int32_t> permutation(static_cast<size_t>(n));
  for (int64_t filled = 0; filled < length; filled += n) {
    std::iota(permutation.begin(), permutation.end(), 0);
    std::shuffle(permutation.begin(), permutation.end(), rng);
    std::copy_n(permutation.begin(), std::min(n, length - filled), out + filled);
  }
}

}  // namespace fit_internal

namespace {

using fit_internal::DrawOrder;
using fit_internal::Materialize;
using fit_internal::MaterializeTrainingData;

// What one physical GPU holds for the replicas on it.
struct GpuSlot {
  std::unique_ptr<cuda::CachingAllocator> allocator;
  std::unique_ptr<cuda::DeviceDataset> train, test;
  cuda::Stream copies;          // uploads of the next epoch's order
  cuda::DeviceBuffer order[2];  // the epoch's order, double-buffered
  cuda::Event uploaded[2];
};

// The GPU's StepRunner: steps queued on the replicas' streams without the host waiting, the
// figures kept on the device until the epoch ends (or a backup reads them).
class GpuFit : public StepRunner {
 public:
  GpuFit(Strategy& strategy, const Model& model, const Loss& loss, const Optimizer& optimizer,
         const FitData& data, const FitOptions& options)
      : strategy_(strategy),
        model_(model),
        loss_(loss),
        optimizer_(optimizer),
        data_(data),
        options_(options) {}

  // Sets up the devices and the training state, then runs the epoch loop on this runner.
  absl::StatusOr<FitSummary> Run();
  // After a failed Run: leaves without flushing the NCCL group (its peers may be gone).
  void AbandonCollectives() {
    if (nccl_ != nullptr) nccl_->Abandon();
  }

  bool HasStepStats() const override { return false; }
  absl::Status StartEpoch(int epoch, int64_t first_step) override;
  absl::StatusOr<StepResult> Step(int epoch, int64_t step, int64_t iteration) override;
  // Before the host reads anything the steps wrote: the NCCL all-reduces in flight end (or
  // fail) within their deadline, so the host never blocks behind a dead peer.
  absl::Status Sync() override { return nccl_ != nullptr ? nccl_->Wait() : absl::OkStatus(); }
  absl::Status TakeStats(StepStats& into) override;
  absl::StatusOr<int64_t> ExamplesTrained(int64_t first_step, int64_t last_step) override;
  absl::Status GetState(std::vector<Tensor>* variables,
                        std::vector<std::vector<Tensor>>* slots) override {
    return replicas_on_[0]->GetState(variables, slots);
  }
  absl::StatusOr<EpochLog> Evaluate() override;
  // EarlyStopping's restore_best_weights: every replica's variables, its slots as they are.
  absl::Status SetVariables(const std::vector<Tensor>& variables) override;

 private:
  absl::Status Setup();
  absl::Status UploadOrder(int64_t epoch);
  absl::Status EnqueueStep(int64_t step, int64_t epoch);
  absl::Status AllReduceAcrossWorkers();
  absl::Status FormNcclGroup(const MultiWorkerMirroredStrategy& strategy);

  Strategy& strategy_;
  const Model& model_;
  const Loss& loss_;
  const Optimizer& optimizer_;
  const FitData& data_;
  const FitOptions& options_;

  int replicas_ = 1;
  int workers_ = 1;
  int64_t worker_batch_ = 0;  // rows per step on this worker
  int64_t train_rows_ = 0;    // this worker's examples (its shard)
  int64_t steps_per_epoch_ = 0;
  int64_t order_length_ = 0;
  int64_t eval_batch_ = 0;
  bool order_uploaded_ = false;  // the first epoch's order is on its way
  int64_t first_step_ = 0;       // of the epoch in progress, in this run
  int64_t updates_ = 0;          // the optimizer's updates so far (the next step's iteration)
  std::vector<int> physical_;    // per replica
  std::map<int, GpuSlot> gpus_;  // by physical device
  std::vector<std::unique_ptr<cuda::Replica>> replicas_on_;
  std::unique_ptr<cuda::DeviceAllReduce> all_reduce_;
  cuda::PinnedBuffer host_order_[2];
  cuda::PinnedBuffer host_gradients_;  // several workers: the cross-worker all-reduce's buffer
  FitState state_;                     // where training starts, until the loop takes it
  // Communication NCCL: every replica of every worker. Last, so destroyed first: its bounded
  // close comes before anything whose release would wait on the device behind a dead peer.
  std::unique_ptr<cuda::NcclGroup> nccl_;
};

absl::Status GpuFit::Setup() {
  replicas_ = strategy_.NumLocalReplicas();
  workers_ = strategy_.num_workers();
  worker_batch_ = options_.batch_size_per_replica * replicas_;
  for (const std::string& device : strategy_.devices()) {
    const int logical = std::stoi(device.substr(4));
    const int physical = PhysicalGpuOf(logical);
    if (physical >= cuda::PhysicalGpuCount()) {
      return absl::FailedPreconditionError(absl::StrCat("device ", device,
                                                        " is not available: this process sees ",
                                                        cuda::PhysicalGpuCount(), " GPU(s)"));
    }
    physical_.push_back(physical);
  }
  // Several workers: each takes its shard, as the CPU path does.
  Dataset shard = data_.train;
  if (workers_ > 1) {
    STRATUM_ASSIGN_OR_RETURN(shard, AutoShard(data_.train, options_.auto_shard_policy, workers_,
                                              strategy_.worker_index()));
    if (strategy_.worker_index() == 0) {
      spdlog::info("{}", DescribeAutoShard(data_.train, options_.auto_shard_policy, workers_));
    }
  }
  STRATUM_ASSIGN_OR_RETURN(auto train,
                           MaterializeTrainingData(shard, data_.train_examples, model_));
  train_rows_ = train.first.rows();
  const bool fixed_steps = options_.steps_per_epoch > 0;
  if (workers_ == 1) {
    steps_per_epoch_ =
        fixed_steps ? options_.steps_per_epoch : (train_rows_ + worker_batch_ - 1) / worker_batch_;
    order_length_ = fixed_steps ? steps_per_epoch_ * worker_batch_ : train_rows_;
  } else {
    // Lock-step: full batches only, and every worker the step count of the smallest shard.
    STRATUM_ASSIGN_OR_RETURN(const int64_t smallest,
                             SmallestShardExamples(data_.train, options_.auto_shard_policy,
                                                   workers_, data_.train_examples));
    steps_per_epoch_ = fixed_steps ? options_.steps_per_epoch : smallest / worker_batch_;
    order_length_ = steps_per_epoch_ * worker_batch_;
  }
  if (steps_per_epoch_ <= 0 || train_rows_ == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the training data (", data_.train_examples, " examples over ", workers_,
                     " workers) does not fill one step of ", worker_batch_ * workers_,
                     " examples: there is nothing to fit"));
  }
  eval_batch_ = std::max<int64_t>(worker_batch_ * workers_, 256);
  std::optional<std::pair<Tensor, Tensor>> test;
  if (data_.has_test) {
    STRATUM_ASSIGN_OR_RETURN(test, Materialize(data_.test, data_.test_examples));
  }
  for (int physical : std::set<int>(physical_.begin(), physical_.end())) {
    GpuSlot& gpu = gpus_[physical];
    gpu.allocator = std::make_unique<cuda::CachingAllocator>(physical);
    STRATUM_ASSIGN_OR_RETURN(gpu.train, cuda::UploadDataset(*gpu.allocator, train.first,
                                                            train.second, model_.output_size()));
    if (test.has_value() && physical == physical_[0]) {
      STRATUM_ASSIGN_OR_RETURN(gpu.test, cuda::UploadDataset(*gpu.allocator, test->first,
                                                             test->second, model_.output_size()));
    }
    STRATUM_ASSIGN_OR_RETURN(gpu.copies, cuda::Stream::Create(physical));
    for (int b = 0; b < 2; ++b) {
      STRATUM_ASSIGN_OR_RETURN(
          gpu.order[b],
          cuda::DeviceBuffer::Allocate(*gpu.allocator, static_cast<size_t>(order_length_) * 4));
      STRATUM_ASSIGN_OR_RETURN(gpu.uploaded[b], cuda::Event::Create(physical));
    }
  }
  for (int b = 0; b < 2; ++b) {
    STRATUM_ASSIGN_OR_RETURN(host_order_[b],
                             cuda::PinnedBuffer::Allocate(static_cast<size_t>(order_length_) * 4));
  }
  // From here on every worker takes part in collectives: nothing may answer UNIMPLEMENTED
  // (a fallback to the CPU) any more, or the workers would part ways.
  STRATUM_ASSIGN_OR_RETURN(
      state_, StartFitState(strategy_, model_, optimizer_, options_, steps_per_epoch_));
  for (int r = 0; r < replicas_; ++r) {
    cuda::ReplicaOptions replica_options;
    replica_options.device = physical_[static_cast<size_t>(r)];
    replica_options.max_batch = r == 0 ? std::max(options_.batch_size_per_replica, eval_batch_)
                                       : options_.batch_size_per_replica;
    replica_options.seed = options_.seed * 7919 + static_cast<uint64_t>(r);
    replica_options.replica_share = 1.0f / static_cast<float>(replicas_ * workers_);
    STRATUM_ASSIGN_OR_RETURN(
        auto replica,
        cuda::Replica::Create(model_, loss_, optimizer_, *gpus_[replica_options.device].allocator,
                              replica_options));
    // Mirrored variables: every replica starts from the same values.
    STRATUM_RETURN_IF_ERROR(replica->SetState(state_.variables, state_.slots, state_.iteration));
    updates_ = state_.iteration;
    replicas_on_.push_back(std::move(replica));
  }
  const auto* multi_worker = dynamic_cast<const MultiWorkerMirroredStrategy*>(&strategy_);
  if (multi_worker != nullptr &&
      multi_worker->communication().implementation == CommunicationImplementation::kNccl) {
    return FormNcclGroup(*multi_worker);
  }
  if (workers_ > 1) {
    STRATUM_ASSIGN_OR_RETURN(
        host_gradients_, cuda::PinnedBuffer::Allocate(
                             static_cast<size_t>(replicas_on_[0]->flat_size()) * sizeof(float)));
  }
  if (replicas_ > 1) {
    std::vector<cuda::CachingAllocator*> allocators(static_cast<size_t>(cuda::PhysicalGpuCount()));
    for (auto& [physical, gpu] : gpus_)
      allocators[static_cast<size_t>(physical)] = gpu.allocator.get();
    const auto* nccl = dynamic_cast<const NcclAllReduce*>(&strategy_.cross_device_ops());
    STRATUM_ASSIGN_OR_RETURN(
        all_reduce_, cuda::MakeDeviceAllReduce(strategy_.cross_device_ops().name(),
                                               nccl != nullptr ? nccl->num_packs() : 1, physical_,
                                               allocators, replicas_on_[0]->flat_size()));
  }
  return absl::OkStatus();
}

absl::Status GpuFit::FormNcclGroup(const MultiWorkerMirroredStrategy& strategy) {
  if (strategy.rendezvous() == nullptr) {
    return absl::FailedPreconditionError(
        "communication implementation NCCL forms its group through the coordination service, "
        "and this MultiWorkerMirroredStrategy was created without a rendezvous: pass one to "
        "MultiWorkerMirroredStrategy::Create");
  }
  NcclAcrossWorkersOptions nccl;
  nccl.worker = strategy.worker_index();
  nccl.worker_names = strategy.WorkerNames();
  nccl.devices = physical_;
  nccl.timeout = strategy.communication().timeout;
  nccl.key_prefix = absl::StrCat("collective/nccl/", strategy.NextGroupGeneration());
  STRATUM_ASSIGN_OR_RETURN(nccl_, FormNcclAcrossWorkers(nccl, *strategy.rendezvous()));
  return absl::OkStatus();
}

// Draws epoch `epoch`'s order into pinned memory and queues its upload to every GPU on the
// copy streams, to overlap the steps queued before it.
absl::Status GpuFit::UploadOrder(int64_t epoch) {
  const int b = static_cast<int>(epoch % 2);
  int32_t* host = host_order_[b].as<int32_t>();
  // The pinned buffer may still feed the upload queued two epochs ago.
  for (auto& [physical, gpu] : gpus_) STRATUM_RETURN_IF_ERROR(gpu.copies.Synchronize());
  DrawOrder(options_.seed, epoch, train_rows_, order_length_, host);
  for (auto& [physical, gpu] : gpus_) {
    STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(physical));
    STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(gpu.order[b].data(), host,
                                                 static_cast<size_t>(order_length_) * 4,
                                                 cudaMemcpyHostToDevice, gpu.copies.get()));
    STRATUM_RETURN_IF_ERROR(gpu.uploaded[b].Record(gpu.copies));
  }
  return absl::OkStatus();
}

absl::Status GpuFit::EnqueueStep(int64_t step, int64_t epoch) {
  const int b = static_cast<int>(epoch % 2);
  // The step's rows, split over the replicas (a last partial batch: the first replicas
  // take one more row than the others).
  const int64_t rows_total = options_.steps_per_epoch > 0
                                 ? worker_batch_
                                 : std::min(worker_batch_, order_length_ - step * worker_batch_);
  // The loss is the mean over the examples of every worker's step.
  const float loss_scale = 1.0f / static_cast<float>(rows_total * workers_);
  const bool alone = replicas_ == 1 && workers_ == 1 && nccl_ == nullptr;
  int64_t offset = 0;
  for (int r = 0; r < replicas_; ++r) {
    const int64_t rows = rows_total / replicas_ + (r < rows_total % replicas_ ? 1 : 0);
    GpuSlot& gpu = gpus_[physical_[static_cast<size_t>(r)]];
    cuda::StepInput input;
    input.data = gpu.train.get();
    input.order = gpu.order[b].as<int32_t>();
    input.stride = worker_batch_;
    input.offset = offset;
    input.rows = static_cast<int>(rows);
    input.rescale = static_cast<float>(data_.rescale);
    STRATUM_RETURN_IF_ERROR(replicas_on_[static_cast<size_t>(r)]->EnqueueTrainStep(
        input, loss_scale, /*update=*/alone));
    offset += rows;
  }
  if (alone) return absl::OkStatus();
  std::vector<cuda::ReplicaBuffer> buffers;
  for (const auto& replica : replicas_on_)
    buffers.push_back({replica->gradients(), &replica->stream()});
  const int64_t count = replicas_on_[0]->flat_size();
  if (nccl_ != nullptr) {
    STRATUM_RETURN_IF_ERROR(nccl_->AllReduce(buffers, count));  // every replica of the job
  } else {
    if (replicas_ > 1) STRATUM_RETURN_IF_ERROR(all_reduce_->AllReduce(buffers, count));
    if (workers_ > 1) STRATUM_RETURN_IF_ERROR(AllReduceAcrossWorkers());
  }
  for (const auto& replica : replicas_on_) STRATUM_RETURN_IF_ERROR(replica->EnqueueUpdate());
  return absl::OkStatus();
}

// The local sum (in every replica's gradients) -> pinned host memory -> summed over the
// workers -> every replica's gradients. Waits for the step on the host: the collectives
// work on host memory.
absl::Status GpuFit::AllReduceAcrossWorkers() {
  cuda::Replica& first = *replicas_on_[0];
  const int64_t count = first.flat_size();
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(first.device()));
  STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_gradients_.data(), first.gradients(), bytes,
                                               cudaMemcpyDeviceToHost, first.stream().get()));
  // Every stream, not only the first: the uploads of the last step's sum read host_gradients_.
  for (const auto& replica : replicas_on_) STRATUM_RETURN_IF_ERROR(replica->stream().Synchronize());
  std::vector<Tensor> values = {Tensor::FromBuffer(
      DType::kFloat32, Shape({count}), std::shared_ptr<void>(host_gradients_.data(), [](void*) {}),
      host_gradients_.data())};
  STRATUM_RETURN_IF_ERROR(strategy_.AllReduceAcrossWorkers(ReduceOp::kSum, values));
  // The collectives reduce in place; a result elsewhere (pageable) is copied all the same.
  const float* sum = values[0].data<float>();
  for (const auto& replica : replicas_on_) {
    STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(replica->device()));
    STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(replica->gradients(), sum, bytes,
                                                 cudaMemcpyHostToDevice, replica->stream().get()));
  }
  if (sum != host_gradients_.data()) {
    for (const auto& replica : replicas_on_)
      STRATUM_RETURN_IF_ERROR(replica->stream().Synchronize());
  }
  return absl::OkStatus();
}

absl::StatusOr<EpochLog> GpuFit::Evaluate() {
  cuda::Replica& replica = *replicas_on_[0];
  const cuda::DeviceDataset& test = *gpus_[physical_[0]].test;
  // Several workers: each evaluates its part of the test set; the totals are summed.
  const int64_t begin = test.rows * strategy_.worker_index() / workers_;
  const int64_t end = test.rows * (strategy_.worker_index() + 1) / workers_;
  for (int64_t first = begin; first < end; first += eval_batch_) {
    const int rows = static_cast<int>(std::min(eval_batch_, end - first));
    STRATUM_RETURN_IF_ERROR(
        replica.EnqueueEvaluate(test, first, rows, static_cast<float>(data_.rescale)));
  }
  STRATUM_ASSIGN_OR_RETURN(StepStats total, replica.TakeMetrics(/*evaluation=*/true));
  STRATUM_RETURN_IF_ERROR(SumOverWorkers(strategy_, total));
  return ValidationLog(total);
}

absl::Status GpuFit::StartEpoch(int epoch, int64_t first_step) {
  const int64_t index = epoch - 1;
  if (!order_uploaded_) {
    STRATUM_RETURN_IF_ERROR(UploadOrder(index));
    order_uploaded_ = true;
  }
  first_step_ = first_step;
  for (int r = 0; r < replicas_; ++r) {
    cuda::Replica& replica = *replicas_on_[static_cast<size_t>(r)];
    STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(replica.device()));
    STRATUM_RETURN_IF_ERROR(gpus_[replica.device()].uploaded[index % 2].WaitOn(replica.stream()));
    STRATUM_RETURN_IF_ERROR(replica.ResetStep(first_step));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepRunner::StepResult> GpuFit::Step(int epoch, int64_t step, int64_t iteration) {
  STRATUM_RETURN_IF_ERROR(EnqueueStep(step, epoch - 1));
  updates_ = iteration + 1;
  // The next epoch's order travels while this one's steps run.
  if (step == first_step_ && epoch < options_.epochs) STRATUM_RETURN_IF_ERROR(UploadOrder(epoch));
  return StepResult{};
}

absl::Status GpuFit::TakeStats(StepStats& into) {
  for (auto& replica : replicas_on_) {
    STRATUM_ASSIGN_OR_RETURN(StepStats stats, replica->TakeMetrics(false));
    Accumulate(into, stats);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GpuFit::ExamplesTrained(int64_t first_step, int64_t last_step) {
  // Every worker trains as many full batches as this one.
  return (std::min(last_step * worker_batch_, order_length_) -
          std::min(first_step * worker_batch_, order_length_)) *
         workers_;
}

absl::StatusOr<FitSummary> GpuFit::Run() {
  const double fit_start = EpochLoopNow();
  STRATUM_RETURN_IF_ERROR(Setup());
  const EpochLoopSpec spec{.steps_per_epoch = steps_per_epoch_,
                           .has_test = data_.has_test,
                           .start = fit_start,
                           .worker_names = fit_internal::WorkerNames(strategy_)};
  return RunEpochs(strategy_, model_, optimizer_, options_, spec, std::move(state_), *this);
}

absl::Status GpuFit::SetVariables(const std::vector<Tensor>& variables) {
  STRATUM_RETURN_IF_ERROR(Sync());
  std::vector<Tensor> held;
  std::vector<std::vector<Tensor>> slots;
  STRATUM_RETURN_IF_ERROR(replicas_on_[0]->GetState(&held, &slots));
  for (const std::unique_ptr<cuda::Replica>& replica : replicas_on_) {
    STRATUM_RETURN_IF_ERROR(replica->SetState(variables, slots, updates_));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FitSummary> FitOnGpus(Strategy& strategy, const Model& model, const Loss& loss,
                                     const Optimizer& optimizer, const FitData& data,
                                     const FitOptions& options) {
  STRATUM_RETURN_IF_ERROR(cuda::SupportsOnGpu(model, loss, optimizer));
  for (const CallbackSpec& callback : options.callbacks) {
    if (callback.class_name == "ReduceLROnPlateau") {
      return absl::UnimplementedError(
          "ReduceLROnPlateau changes the learning rate, which the GPU path fixes when it sets "
          "up its steps");
    }
  }
  GpuFit fit(strategy, model, loss, optimizer, data, options);
  absl::StatusOr<FitSummary> summary = fit.Run();
  if (!summary.ok()) fit.AbandonCollectives();
  return summary;
}

}  // namespace stratum
