#include "gpu_train_steps.h"

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "fit_internal.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/cuda/device.h"
#include "stratum/cuda/replica.h"
#include "stratum/model/optimizer.h"
#include "stratum/util/devices.h"
#include "stratum/util/status_macros.h"

namespace stratum {

struct GpuTrainSteps::Impl {
  // What one physical GPU holds for the replicas on it.
  struct Gpu {
    std::unique_ptr<cuda::CachingAllocator> allocator;
    std::unique_ptr<cuda::DeviceDataset> train;
    cuda::DeviceBuffer order;  // the current epoch's example order
  };

  Model model;
  Loss loss;
  std::unique_ptr<Optimizer> unused_optimizer;  // the replicas need one; the PS applies
  GpuTrainStepsOptions options;
  double rescale = 1;
  int64_t rows = 0;  // the worker's examples
  int64_t worker_batch = 0;
  int64_t steps_per_epoch = 0;
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  std::vector<int> physical;  // per replica
  std::map<int, Gpu> gpus;    // by physical device
  std::vector<std::unique_ptr<cuda::Replica>> replicas;
  cuda::PinnedBuffer host_order;
  cuda::PinnedBuffer host_variables;               // flat, as the replicas lay them out
  std::vector<cuda::PinnedBuffer> host_gradients;  // per replica, flat

  Impl(const Model& m, const Loss& l) : model(m), loss(l) {}
  absl::Status Setup(const FitData& data);
  absl::Status NextEpoch();
  size_t flat_bytes() const {
    return static_cast<size_t>(replicas[0]->flat_size()) * sizeof(float);
  }
};

absl::Status GpuTrainSteps::Impl::Setup(const FitData& data) {
  STRATUM_ASSIGN_OR_RETURN(unused_optimizer, Optimizer::FromKeras("sgd"));
  STRATUM_RETURN_IF_ERROR(cuda::SupportsOnGpu(model, loss, *unused_optimizer));
  for (const std::string& device : options.devices) {
    if (device.rfind("GPU:", 0) != 0) {
      return absl::UnimplementedError(absl::StrCat("replica on ", device, ", not a GPU"));
    }
    const int logical = std::stoi(device.substr(4));
    const int gpu = PhysicalGpuOf(logical);
    if (gpu >= cuda::PhysicalGpuCount()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", device, " is not available: this worker sees ", cuda::PhysicalGpuCount(),
          " GPU(s); list the job's strategy.devices this worker has"));
    }
    physical.push_back(gpu);
  }
  STRATUM_ASSIGN_OR_RETURN(
      auto train, fit_internal::MaterializeTrainingData(data.train, data.train_examples, model));
  rescale = data.rescale;
  rows = train.first.rows();
  worker_batch = options.batch_size_per_replica * static_cast<int64_t>(physical.size());
  steps_per_epoch = worker_batch > 0 ? rows / worker_batch : 0;
  if (steps_per_epoch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("the training data (", rows,
                                                   " examples) does not fill one step of ",
                                                   worker_batch, " examples"));
  }
  const size_t order_bytes = static_cast<size_t>(steps_per_epoch * worker_batch) * sizeof(int32_t);
  for (int device : std::set<int>(physical.begin(), physical.end())) {
    Gpu& gpu = gpus[device];
    gpu.allocator = std::make_unique<cuda::CachingAllocator>(device);
    STRATUM_ASSIGN_OR_RETURN(gpu.train, cuda::UploadDataset(*gpu.allocator, train.first,
                                                            train.second, model.output_size()));
    STRATUM_ASSIGN_OR_RETURN(gpu.order, cuda::DeviceBuffer::Allocate(*gpu.allocator, order_bytes));
  }
  STRATUM_ASSIGN_OR_RETURN(host_order, cuda::PinnedBuffer::Allocate(order_bytes));
  for (size_t r = 0; r < physical.size(); ++r) {
    cuda::ReplicaOptions replica_options;
    replica_options.device = physical[r];
    replica_options.max_batch = options.batch_size_per_replica;
    replica_options.seed = options.seed + r;
    // The worker's replicas' changes add up to one (the PS applies each worker's push).
    replica_options.replica_share = 1.0f / static_cast<float>(physical.size());
    STRATUM_ASSIGN_OR_RETURN(auto replica,
                             cuda::Replica::Create(model, loss, *unused_optimizer,
                                                   *gpus[physical[r]].allocator, replica_options));
    replicas.push_back(std::move(replica));
  }
  STRATUM_ASSIGN_OR_RETURN(host_variables, cuda::PinnedBuffer::Allocate(flat_bytes()));
  // The alignment gaps between variables travel too: keep them defined.
  std::memset(host_variables.data(), 0, flat_bytes());
  for (size_t r = 0; r < replicas.size(); ++r) {
    STRATUM_ASSIGN_OR_RETURN(cuda::PinnedBuffer gradients,
                             cuda::PinnedBuffer::Allocate(flat_bytes()));
    host_gradients.push_back(std::move(gradients));
  }
  return absl::OkStatus();
}

// Draws the next epoch's order and uploads it; the replicas restart at its first step.
absl::Status GpuTrainSteps::Impl::NextEpoch() {
  for (const auto& replica : replicas) STRATUM_RETURN_IF_ERROR(replica->stream().Synchronize());
  const int64_t length = steps_per_epoch * worker_batch;
  fit_internal::DrawOrder(options.seed, epoch, rows, length, host_order.as<int32_t>());
  for (auto& [device, gpu] : gpus) {
    STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpy(gpu.order.data(), host_order.data(),
                                            static_cast<size_t>(length) * sizeof(int32_t),
                                            cudaMemcpyHostToDevice));
  }
  for (const auto& replica : replicas) STRATUM_RETURN_IF_ERROR(replica->ResetStep(0));
  ++epoch;
  step_in_epoch = 0;
  return absl::OkStatus();
}

GpuTrainSteps::GpuTrainSteps(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuTrainSteps::~GpuTrainSteps() = default;

absl::StatusOr<std::unique_ptr<GpuTrainSteps>> GpuTrainSteps::Create(
    const Model& model, const Loss& loss, const FitData& data,
    const GpuTrainStepsOptions& options) {
  if (model.dtype_policy() == DtypePolicy::kMixedFloat16) {
    return absl::UnimplementedError(
        "mixed_float16's loss scaling has no parameter-server GPU path yet (a worker would push "
        "scaled gradients): use mixed_bfloat16, which needs no loss scaling");
  }
  auto impl = std::make_unique<Impl>(model, loss);
  impl->options = options;
  STRATUM_RETURN_IF_ERROR(impl->Setup(data));
  return std::unique_ptr<GpuTrainSteps>(new GpuTrainSteps(std::move(impl)));
}

absl::Status GpuTrainSteps::Step(const std::vector<Tensor>& variables,
                                 std::vector<Tensor>& gradients) {
  Impl& impl = *impl_;
  const std::vector<VariableSpec>& specs = impl.model.variables();
  if (variables.size() != specs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the parameter servers sent ", variables.size(),
                                                   " variables, but the model has ", specs.size()));
  }
  if (impl.epoch == 0 || impl.step_in_epoch == impl.steps_per_epoch) {
    STRATUM_RETURN_IF_ERROR(impl.NextEpoch());
  }
  // The previous step's copies are done (its gradients were waited for): refill.
  float* flat = impl.host_variables.as<float>();
  for (size_t v = 0; v < specs.size(); ++v) {
    if (variables[v].dtype() != DType::kFloat32 || variables[v].shape() != specs[v].shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", v, " (\"", specs[v].name, "\") is ", variables[v].DebugString(),
                       ", but the model expects float32", specs[v].shape.ToString()));
    }
    std::memcpy(flat + impl.replicas[0]->offset(static_cast<int>(v)), variables[v].data<float>(),
                variables[v].byte_size());
  }
  const size_t bytes = impl.flat_bytes();
  const float loss_scale = 1.0f / static_cast<float>(impl.worker_batch);
  for (size_t r = 0; r < impl.replicas.size(); ++r) {
    cuda::Replica& replica = *impl.replicas[r];
    Impl::Gpu& gpu = impl.gpus[replica.device()];
    STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(replica.device()));
    STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(replica.variables(), flat, bytes,
                                                 cudaMemcpyHostToDevice, replica.stream().get()));
    cuda::StepInput input;
    input.data = gpu.train.get();
    input.order = gpu.order.as<int32_t>();
    input.stride = impl.worker_batch;
    input.offset = static_cast<int64_t>(r) * impl.options.batch_size_per_replica;
    input.rows = static_cast<int>(impl.options.batch_size_per_replica);
    input.rescale = static_cast<float>(impl.rescale);
    STRATUM_RETURN_IF_ERROR(replica.EnqueueTrainStep(input, loss_scale, /*update=*/false));
    STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(impl.host_gradients[r].data(), replica.gradients(),
                                                 bytes, cudaMemcpyDeviceToHost,
                                                 replica.stream().get()));
  }
  ++impl.step_in_epoch;
  for (const auto& replica : impl.replicas)
    STRATUM_RETURN_IF_ERROR(replica->stream().Synchronize());
  if (gradients.size() != specs.size()) {
    gradients.clear();
    for (const VariableSpec& spec : specs) gradients.emplace_back(DType::kFloat32, spec.shape);
  }
  for (size_t v = 0; v < specs.size(); ++v) {
    const int64_t offset = impl.replicas[0]->offset(static_cast<int>(v));
    const int64_t count = gradients[v].num_elements();
    float* total = gradients[v].data<float>();
    std::memcpy(total, impl.host_gradients[0].as<float>() + offset,
                static_cast<size_t>(count) * sizeof(float));
    for (size_t r = 1; r < impl.replicas.size(); ++r) {
      const float* part = impl.host_gradients[r].as<float>() + offset;
      for (int64_t i = 0; i < count; ++i) total[i] += part[i];
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> GpuTrainSteps::TakeMetrics() {
  StepStats total{};
  for (const auto& replica : impl_->replicas) {
    STRATUM_ASSIGN_OR_RETURN(StepStats stats, replica->TakeMetrics(/*evaluation=*/false));
    Accumulate(total, stats);
  }
  return total;
}

}  // namespace stratum
