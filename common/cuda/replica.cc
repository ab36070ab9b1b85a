#include "stratum/cuda/replica.h"

#include <cublas_v2.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/graph_executor.h"
#include "stratum/cuda/cublas_library.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/cuda/cuda_device.h"
#include "stratum/util/status_macros.h"

namespace stratum::cuda {
namespace {

constexpr int64_t kAlignFloats = 64;  // 256 bytes
constexpr size_t kCublasWorkspaceBytes = size_t{4} << 20;

absl::StatusOr<DeviceBuffer> Zeroed(CachingAllocator& allocator, size_t bytes) {
  STRATUM_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(allocator, bytes));
  STRATUM_CUDA_RETURN_IF_ERROR(cudaMemset(buffer.data(), 0, bytes));
  return buffer;
}

absl::StatusOr<OptimizerParams> ParamsOf(const Optimizer& optimizer) {
  const nlohmann::json config = optimizer.config();
  if (optimizer.learning_rate_schedule().is_schedule()) {
    return absl::UnimplementedError(
        absl::StrCat("the learning-rate schedule ", optimizer.learning_rate_schedule().name(),
                     " has no GPU update yet (the GPU path takes a constant learning_rate)"));
  }
  const Optimizer::Clipping& clipping = optimizer.clipping();
  if (clipping.norm > 0 || clipping.value > 0 || clipping.global_norm > 0) {
    return absl::UnimplementedError(
        "gradient clipping (clipnorm, clipvalue, global_clipnorm) has no GPU update yet");
  }
  if (optimizer.weight_decay() > 0) {
    return absl::UnimplementedError(
        absl::StrCat("optimizer ", optimizer.name(), "'s weight_decay has no GPU update yet"));
  }
  OptimizerParams p;
  p.learning_rate = optimizer.learning_rate();
  const std::string name = optimizer.name();
  auto number = [&](const char* key, float fallback) {
    return config.contains(key) && config[key].is_number() ? config[key].get<float>() : fallback;
  };
  auto flag = [&](const char* key) {
    return config.contains(key) && config[key].is_boolean() && config[key].get<bool>();
  };
  if (name == "SGD") {
    p.kind = OptimizerParams::Kind::kSgd;
    p.momentum = number("momentum", 0);
    p.nesterov = flag("nesterov");
  } else if (name == "Adam" || name == "AdamW") {  // AdamW here has no weight decay
    p.kind = OptimizerParams::Kind::kAdam;
    p.beta_1 = number("beta_1", 0.9f);
    p.beta_2 = number("beta_2", 0.999f);
    p.epsilon = number("epsilon", 1e-7f);
  } else if (name == "Adagrad") {
    p.kind = OptimizerParams::Kind::kAdagrad;
    p.epsilon = number("epsilon", 1e-7f);
  } else if (name == "RMSprop") {
    p.kind = OptimizerParams::Kind::kRmsProp;
    p.rho = number("rho", 0.9f);
    p.momentum = number("momentum", 0);
    p.epsilon = number("epsilon", 1e-7f);
    p.centered = flag("centered");
  } else {
    return absl::UnimplementedError(
        absl::StrCat("optimizer ", name, " has no GPU update: use SGD, Adam, Adagrad or RMSprop"));
  }
  return p;
}

}  // namespace

ElementType ComputeTypeOf(DtypePolicy policy) {
  switch (policy) {
    case DtypePolicy::kMixedBfloat16:
      return ElementType::kBfloat16;
    case DtypePolicy::kMixedFloat16:
      return ElementType::kFloat16;
    default:
      return ElementType::kFloat32;
  }
}

absl::Status SupportsOnGpu(const Model& model, const Loss& loss, const Optimizer& optimizer) {
  STRATUM_RETURN_IF_ERROR(model.CheckRunsOnGpu());
  if (loss.kind() != Loss::Kind::kSparseCategoricalCrossentropy) {
    return absl::UnimplementedError(absl::StrCat("loss ", loss.name(),
                                                 " has no GPU kernel yet (the GPU path trains with "
                                                 "sparse_categorical_crossentropy)"));
  }
  if (model.output_size() < 1) return absl::UnimplementedError("model has no outputs");
  return ParamsOf(optimizer).status();
}

absl::StatusOr<std::unique_ptr<DeviceDataset>> UploadDataset(CachingAllocator& allocator,
                                                             const Tensor& images,
                                                             const Tensor& labels,
                                                             int64_t classes) {
  if (!images.valid() || images.dtype() != DType::kUInt8) {
    return absl::InvalidArgumentError(
        absl::StrCat("the GPU path keeps uint8 examples on the device, but the examples are ",
                     images.valid() ? images.DebugString() : std::string("empty"),
                     ": train on the CPU, or give uint8 data with a rescale"));
  }
  if (!labels.valid() || labels.num_elements() != images.rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the labels are ", labels.valid() ? labels.DebugString() : std::string("empty"), " for ",
        images.rows(), " examples: give one class id per example"));
  }
  const int64_t rows = images.rows();
  std::vector<uint8_t> ids(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    int64_t label = -1;
    switch (labels.dtype()) {
      case DType::kUInt8:
        label = labels.data<uint8_t>()[i];
        break;
      case DType::kInt32:
        label = labels.data<int32_t>()[i];
        break;
      case DType::kInt64:
        label = labels.data<int64_t>()[i];
        break;
      case DType::kFloat32:
        break;
    }
    if (label < 0 || label >= classes || label > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", i, " is ", label, ", outside the ", classes,
                       " classes of the model's output (0..", classes - 1,
                       "): check the labels, or the units of the model's last Dense layer"));
    }
    ids[static_cast<size_t>(i)] = static_cast<uint8_t>(label);
  }
  auto data = std::make_unique<DeviceDataset>();
  data->rows = rows;
  data->row_size = images.row_size();
  const size_t image_bytes = static_cast<size_t>(images.num_elements());
  STRATUM_ASSIGN_OR_RETURN(data->images, DeviceBuffer::Allocate(allocator, image_bytes));
  STRATUM_ASSIGN_OR_RETURN(data->labels, DeviceBuffer::Allocate(allocator, ids.size()));
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(allocator.device()));
  STRATUM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(data->images.data(), images.data<uint8_t>(), image_bytes, cudaMemcpyHostToDevice));
  STRATUM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(data->labels.data(), ids.data(), ids.size(), cudaMemcpyHostToDevice));
  return data;
}

Replica::Replica(const Model& model, const Loss& loss, CachingAllocator& allocator,
                 const ReplicaOptions& options)
    : model_(model), loss_(loss), allocator_(allocator), options_(options), rng_(options.seed) {}

Replica::~Replica() {
  for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph);
  if (cublas_ != nullptr) (*Cublas())->destroy(cublas_);
}

absl::StatusOr<std::unique_ptr<Replica>> Replica::Create(const Model& model, const Loss& loss,
                                                         const Optimizer& optimizer,
                                                         CachingAllocator& allocator,
                                                         const ReplicaOptions& options) {
  STRATUM_RETURN_IF_ERROR(SupportsOnGpu(model, loss, optimizer));
  if (options.device != allocator.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica on GPU:", options.device, " given the allocator of GPU:", allocator.device()));
  }
  std::unique_ptr<Replica> replica(new Replica(model, loss, allocator, options));
  STRATUM_RETURN_IF_ERROR(replica->Init(optimizer));
  return replica;
}

absl::Status Replica::Init(const Optimizer& optimizer) {
  STRATUM_ASSIGN_OR_RETURN(optimizer_, ParamsOf(optimizer));
  num_slots_ = static_cast<int>(optimizer.SlotNames().size());
  const nlohmann::json config = optimizer.config();
  if (optimizer.name() == "Adagrad" && config.contains("initial_accumulator_value")) {
    fresh_slot_value_ = config["initial_accumulator_value"].get<float>();
  }
  const int device = options_.device;
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  STRATUM_ASSIGN_OR_RETURN(stream_, Stream::Create(device));
  STRATUM_ASSIGN_OR_RETURN(const CublasLibrary* cublas, Cublas());
  STRATUM_CUBLAS_RETURN_IF_ERROR(cublas->create(&cublas_));
  STRATUM_CUBLAS_RETURN_IF_ERROR(cublas->set_stream(cublas_, stream_.get()));
  // A workspace of its own keeps cuBLAS from allocating while a graph is captured.
  STRATUM_ASSIGN_OR_RETURN(cublas_workspace_,
                           DeviceBuffer::Allocate(allocator_, kCublasWorkspaceBytes));
  STRATUM_CUBLAS_RETURN_IF_ERROR(
      cublas->set_workspace(cublas_, cublas_workspace_.data(), kCublasWorkspaceBytes));

  // The trainable variables first: the optimizer updates one range, and the non-trainable
  // ones after it take their change as it is.
  const std::vector<VariableSpec>& specs = model_.variables();
  offsets_.assign(specs.size(), 0);
  for (bool trainable : {true, false}) {
    for (size_t v = 0; v < specs.size(); ++v) {
      if (specs[v].trainable != trainable) continue;
      offsets_[v] = flat_size_;
      const int64_t n = specs[v].shape.num_elements();
      flat_size_ += (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    }
    if (trainable) trainable_size_ = flat_size_;
  }
  const size_t flat_bytes = static_cast<size_t>(std::max<int64_t>(flat_size_, 1)) * sizeof(float);
  STRATUM_ASSIGN_OR_RETURN(params_, Zeroed(allocator_, flat_bytes));
  STRATUM_ASSIGN_OR_RETURN(gradients_, Zeroed(allocator_, flat_bytes));
  for (int s = 0; s < num_slots_; ++s) {
    STRATUM_ASSIGN_OR_RETURN(DeviceBuffer slot, Zeroed(allocator_, flat_bytes));
    slots_.push_back(std::move(slot));
  }
  const int64_t batch = std::max<int64_t>(options_.max_batch, 1);
  const size_t row_bytes = static_cast<size_t>(batch) * sizeof(float);
  STRATUM_ASSIGN_OR_RETURN(
      x_, DeviceBuffer::Allocate(
              allocator_, row_bytes * static_cast<size_t>(model_.input_shape().num_elements())));
  STRATUM_ASSIGN_OR_RETURN(labels_,
                           DeviceBuffer::Allocate(allocator_, static_cast<size_t>(batch) * 4));
  STRATUM_ASSIGN_OR_RETURN(counters_, Zeroed(allocator_, sizeof(StepCounters)));
  compute_ = ComputeTypeOf(model_.dtype_policy());
  if (scales_loss()) {
    STRATUM_ASSIGN_OR_RETURN(loss_scale_, Zeroed(allocator_, sizeof(LossScaleState)));
    const LossScaleState initial{options_.initial_loss_scale, 0, 0};
    STRATUM_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(loss_scale_.data(), &initial, sizeof(initial), cudaMemcpyHostToDevice));
  }
  STRATUM_ASSIGN_OR_RETURN(sums_, Zeroed(allocator_, 2 * sizeof(MetricSums)));
  return InitGraph(batch);
}

// The graph's executor on this replica's device, with its buffers for `batch` examples.
absl::Status Replica::InitGraph(int64_t batch) {
  STRATUM_ASSIGN_OR_RETURN(device_, CudaDevice::Create({.device = options_.device,
                                                        .stream = stream_.get(),
                                                        .cublas = cublas_,
                                                        .counters = counters_.as<StepCounters>(),
                                                        .allocator = &allocator_,
                                                        .allow_tf32 = options_.allow_tf32,
                                                        .compute = compute_}));
  // Float32 in mixed precision: the variables and their gradients, the layers' scratch, ids;
  // the rest in the compute type.
  device_->AddBuffer(params_.data(), params_.size(), ElementType::kFloat32);
  device_->AddBuffer(gradients_.data(), gradients_.size(), ElementType::kFloat32);
  device_->AddBuffer(x_.data(), x_.size(), model_.takes_ids() ? ElementType::kFloat32 : compute_);
  executor_ = std::make_unique<GraphExecutor>(model_.graph(), *device_);
  const GraphBufferSizes::Floats floats = BufferSizes(model_.graph()).ForBatch(batch);
  // The buffers several inputs are split into keep their ids as float32 id words too.
  const Model::Impl& graph = model_.graph();
  std::vector<bool> ids(graph.tensors.size(), false);
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    ids[static_cast<size_t>(graph.inputs[i])] = graph.input_takes_ids[i];
  }
  auto allocate = [&](const std::vector<int64_t>& sizes, ElementType type,
                      const std::vector<bool>* float32) -> absl::StatusOr<std::vector<float*>> {
    std::vector<float*> pointers;
    for (size_t t = 0; t < sizes.size(); ++t) {
      const int64_t size = sizes[t];
      if (size == 0) {
        pointers.push_back(nullptr);
        continue;
      }
      const size_t bytes = static_cast<size_t>(size) * sizeof(float);
      STRATUM_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(allocator_, bytes));
      device_->AddBuffer(buffer.data(), bytes,
                         float32 != nullptr && (*float32)[t] ? ElementType::kFloat32 : type);
      pointers.push_back(buffer.as<float>());
      graph_buffers_.push_back(std::move(buffer));
    }
    return pointers;
  };
  GraphBuffers buffers;
  STRATUM_ASSIGN_OR_RETURN(buffers.values, allocate(floats.values, compute_, &ids));
  STRATUM_ASSIGN_OR_RETURN(buffers.grads, allocate(floats.grads, compute_, nullptr));
  STRATUM_ASSIGN_OR_RETURN(buffers.scratch,
                           allocate(floats.scratch, ElementType::kFloat32, nullptr));
  executor_->Bind(std::move(buffers));
  for (size_t v = 0; v < offsets_.size(); ++v) {
    variable_pointers_.push_back(Variable(static_cast<int>(v)));
    gradient_pointers_.push_back(Gradient(static_cast<int>(v)));
  }
  return absl::OkStatus();
}

absl::Status Replica::SetState(const std::vector<Tensor>& variables,
                               const std::vector<std::vector<Tensor>>& slots, int64_t iteration) {
  const std::vector<VariableSpec>& specs = model_.variables();
  if (variables.size() != specs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("variables has ", variables.size(),
                                                   " tensors, but the model has ", specs.size()));
  }
  if (!slots.empty() && slots.size() != specs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("slots has ", slots.size(),
                                                   " variables' state, but the model has ",
                                                   specs.size(), " variables"));
  }
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  STRATUM_RETURN_IF_ERROR(stream_.Synchronize());
  for (size_t v = 0; v < specs.size(); ++v) {
    if (variables[v].dtype() != DType::kFloat32 || variables[v].shape() != specs[v].shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", v, " (\"", specs[v].name, "\") is ", variables[v].DebugString(),
                       ", but the model expects float32", specs[v].shape.ToString()));
    }
    const size_t bytes = static_cast<size_t>(variables[v].num_elements()) * sizeof(float);
    STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        Variable(static_cast<int>(v)), variables[v].data<float>(), bytes, cudaMemcpyHostToDevice));
    // Fresh slots come from the optimizer's own NewSlots (Adagrad's initial value). A
    // non-trainable variable keeps none (NonTrainableUpdate).
    for (int s = 0; s < num_slots_ && specs[v].trainable; ++s) {
      Tensor slot;
      if (slots.empty()) {
        Tensor fresh(DType::kFloat32, specs[v].shape);
        fresh.Flat().setConstant(fresh_slot_value_);
        slot = fresh;
      } else if (static_cast<size_t>(s) < slots[v].size()) {
        slot = slots[v][static_cast<size_t>(s)];
      }
      if (slot.shape() != specs[v].shape) {
        return absl::InvalidArgumentError(absl::StrCat("slot ", s, " of variable \"", specs[v].name,
                                                       "\" is ", slot.DebugString()));
      }
      STRATUM_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(slots_[static_cast<size_t>(s)].as<float>() + offsets_[v], slot.data<float>(),
                     bytes, cudaMemcpyHostToDevice));
    }
  }
  StepCounters counters{0, iteration};
  STRATUM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(counters_.data(), &counters, sizeof(counters), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status Replica::GetState(std::vector<Tensor>* variables,
                               std::vector<std::vector<Tensor>>* slots) const {
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  STRATUM_RETURN_IF_ERROR(stream_.Synchronize());
  const std::vector<VariableSpec>& specs = model_.variables();
  variables->clear();
  if (slots != nullptr) slots->clear();
  for (size_t v = 0; v < specs.size(); ++v) {
    Tensor value(DType::kFloat32, specs[v].shape);
    const size_t bytes = static_cast<size_t>(value.num_elements()) * sizeof(float);
    STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpy(value.data<float>(), Variable(static_cast<int>(v)),
                                            bytes, cudaMemcpyDeviceToHost));
    variables->push_back(std::move(value));
    if (slots == nullptr) continue;
    std::vector<Tensor> held;
    for (int s = 0; s < num_slots_ && specs[v].trainable; ++s) {
      Tensor slot(DType::kFloat32, specs[v].shape);
      STRATUM_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(slot.data<float>(), slots_[static_cast<size_t>(s)].as<float>() + offsets_[v],
                     bytes, cudaMemcpyDeviceToHost));
      held.push_back(std::move(slot));
    }
    slots->push_back(std::move(held));
  }
  return absl::OkStatus();
}

absl::Status Replica::GetGradients(std::vector<Tensor>* gradients) const {
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  STRATUM_RETURN_IF_ERROR(stream_.Synchronize());
  gradients->clear();
  const std::vector<VariableSpec>& specs = model_.variables();
  for (size_t v = 0; v < specs.size(); ++v) {
    Tensor value(DType::kFloat32, specs[v].shape);
    STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        value.data<float>(), Gradient(static_cast<int>(v)),
        static_cast<size_t>(value.num_elements()) * sizeof(float), cudaMemcpyDeviceToHost));
    gradients->push_back(std::move(value));
  }
  return absl::OkStatus();
}

absl::Status Replica::Forward(int rows, bool training) {
  executor_->Forward(x_.as<float>(), rows, training, variable_pointers_, rng_);
  return device_->TakeStatus();
}

absl::Status Replica::EnqueueLoss(int rows, bool training, int fused, float scale, MetricSums* sums,
                                  StepCounters* counters) {
  const int classes = static_cast<int>(model_.output_size());
  const Ptr grad = device_->Typed(training ? executor_->StartGradients(fused) : nullptr);
  const auto* loss_scale = training ? loss_scale_.as<LossScaleState>() : nullptr;
  // The kernel reads, and with a bias would write, its values: never with these arguments.
  if (fused >= 0) {
    return SparseCrossEntropy(
        CrossEntropyInput::kFusedSoftmax,
        device_->Typed(const_cast<float*>(executor_->Logits(fused, rows, training))), nullptr,
        nullptr, labels_.as<int32_t>(), rows, classes, scale, grad, sums, counters, stream_.get(),
        loss_scale);
  }
  return SparseCrossEntropy(
      loss_.from_logits() ? CrossEntropyInput::kFromLogits : CrossEntropyInput::kProbabilities,
      device_->Typed(const_cast<float*>(executor_->Output())), nullptr, nullptr,
      labels_.as<int32_t>(), rows, classes, scale, grad, sums, counters, stream_.get(), loss_scale);
}

absl::Status Replica::Backward(int rows, int fused) {
  executor_->Backward(rows, true, fused, gradient_pointers_, options_.replica_share);
  return device_->TakeStatus();
}

absl::Status Replica::LaunchTrainStep(const StepInput& input, float loss_scale, bool update) {
  cudaStream_t stream = stream_.get();
  auto* counters = counters_.as<StepCounters>();
  auto* sums = sums_.as<MetricSums>();
  if (input.rows == 0) {
    // A partial batch left this replica nothing: zero gradients, counters still advance.
    STRATUM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        gradients_.data(), 0, static_cast<size_t>(flat_size_) * sizeof(float), stream));
    STRATUM_RETURN_IF_ERROR(SparseCrossEntropy(CrossEntropyInput::kFromLogits, nullptr, nullptr,
                                               nullptr, nullptr, 0, 1, 0, nullptr, nullptr,
                                               counters, stream));
  } else {
    STRATUM_RETURN_IF_ERROR(GatherRescale(
        input.data->images.as<uint8_t>(), input.data->labels.as<uint8_t>(), input.data->row_size,
        input.order, counters, input.stride, input.offset, input.rows, input.rescale,
        model_.takes_ids(), device_->Typed(x_.as<float>()), labels_.as<int32_t>(), stream));
    // The GPU loss kernels take a softmax's logits; a sigmoid's probabilities are clipped.
    const int fused = model_.graph().LogitsOutputNode(true, ActivationKind::kSoftmax);
    STRATUM_RETURN_IF_ERROR(Forward(input.rows, true));
    STRATUM_RETURN_IF_ERROR(EnqueueLoss(input.rows, true, fused, loss_scale, sums, counters));
    STRATUM_RETURN_IF_ERROR(Backward(input.rows, fused));
  }
  if (update) STRATUM_RETURN_IF_ERROR(LaunchUpdate());
  return absl::OkStatus();
}

absl::Status Replica::EnqueueTrainStep(const StepInput& input, float loss_scale, bool update) {
  if (input.rows > options_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step of ", input.rows, " rows on a replica made for ", options_.max_batch));
  }
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  if (!options_.use_graphs || input.rows == 0) return LaunchTrainStep(input, loss_scale, update);
  const GraphKey key{input.data, input.order,   input.stride, input.offset,
                     input.rows, input.rescale, loss_scale,   update};
  auto found = graphs_.find(key);
  if (found == graphs_.end()) {
    STRATUM_ASSIGN_OR_RETURN(cudaGraphExec_t exec, CaptureTrainStep(input, loss_scale, update));
    found = graphs_.emplace(key, exec).first;
  }
  STRATUM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(found->second, stream_.get()));
  return absl::OkStatus();
}

absl::StatusOr<cudaGraphExec_t> Replica::CaptureTrainStep(const StepInput& input, float loss_scale,
                                                          bool update) {
  // A capture that meets a convolution for the first time is a plan: it is discarded, the
  // convolutions' algorithms are timed outside it, and the step is captured again with the
  // random stream it started from (the dropout seeds drawn while capturing).
  const RandomStream rng_before = rng_;
  cudaGraph_t graph = nullptr;
  for (int attempt = 0;; ++attempt) {
    STRATUM_CUDA_RETURN_IF_ERROR(
        cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
    const absl::Status launched = LaunchTrainStep(input, loss_scale, update);
    const cudaError_t ended = cudaStreamEndCapture(stream_.get(), &graph);
    if (launched.ok() && ended == cudaSuccess && device_->has_pending()) {
      cudaGraphDestroy(graph);
      graph = nullptr;
      if (attempt > 0) {
        return absl::InternalError(
            "a convolution or an embedding gradient's scratch was still unplanned after its "
            "planning capture");
      }
      rng_ = rng_before;
      STRATUM_RETURN_IF_ERROR(device_->PreparePending());
      continue;
    }
    if (!launched.ok() || ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      STRATUM_RETURN_IF_ERROR(launched);
      STRATUM_CUDA_RETURN_IF_ERROR(ended);
    }
    break;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  STRATUM_CUDA_RETURN_IF_ERROR(instantiated);
  return exec;
}

absl::Status Replica::EnqueueUpdate() {
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  return LaunchUpdate();
}

absl::Status Replica::LaunchUpdate() {
  float* slot[3] = {nullptr, nullptr, nullptr};
  for (int s = 0; s < num_slots_ && s < 3; ++s)
    slot[s] = slots_[static_cast<size_t>(s)].as<float>();
  // RMSprop's slots are velocity, then momentum and average_gradient when they exist.
  if (optimizer_.kind == OptimizerParams::Kind::kRmsProp && optimizer_.centered &&
      optimizer_.momentum == 0) {
    slot[2] = slot[1];
    slot[1] = nullptr;
  }
  auto* loss_scale = loss_scale_.as<LossScaleState>();
  if (loss_scale != nullptr) {
    STRATUM_RETURN_IF_ERROR(UnscaleGradients(gradients_.as<float>(), trainable_size_, flat_size_,
                                             loss_scale, stream_.get()));
  }
  // The non-trainable variables take their change as it is (NonTrainableUpdate).
  STRATUM_RETURN_IF_ERROR(ApplyOptimizer(optimizer_, params_.as<float>(), gradients_.as<float>(),
                                         slot[0], slot[1], slot[2], trainable_size_, flat_size_,
                                         counters_.as<StepCounters>(), loss_scale, stream_.get()));
  if (loss_scale == nullptr) return absl::OkStatus();
  return UpdateLossScale(loss_scale, options_.loss_scale_growth_steps, counters_.as<StepCounters>(),
                         stream_.get());
}

absl::Status Replica::EnqueueEvaluate(const DeviceDataset& data, int64_t first, int rows,
                                      float rescale) {
  if (rows > options_.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an evaluation batch of ", rows, " rows on a replica made for ", options_.max_batch));
  }
  if (rows <= 0) return absl::OkStatus();
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  STRATUM_RETURN_IF_ERROR(GatherRescale(data.images.as<uint8_t>(), data.labels.as<uint8_t>(),
                                        data.row_size, nullptr, nullptr, 0, first, rows, rescale,
                                        model_.takes_ids(), device_->Typed(x_.as<float>()),
                                        labels_.as<int32_t>(), stream_.get()));
  const int fused = model_.graph().LogitsOutputNode(false, ActivationKind::kSoftmax);
  STRATUM_RETURN_IF_ERROR(Forward(rows, false));
  return EnqueueLoss(rows, false, fused, 1.0f, sums_.as<MetricSums>() + 1, nullptr);
}

absl::StatusOr<float> Replica::LossScale() const {
  if (!scales_loss()) return 1.0f;
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  STRATUM_RETURN_IF_ERROR(stream_.Synchronize());
  LossScaleState state{};
  STRATUM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&state, loss_scale_.data(), sizeof(state), cudaMemcpyDeviceToHost));
  return state.scale;
}

absl::Status Replica::ResetStep(int64_t step) {
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  // From pageable memory: the copy completes (staged) before the call returns.
  STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&counters_.as<StepCounters>()->step, &step,
                                               sizeof(int64_t), cudaMemcpyHostToDevice,
                                               stream_.get()));
  return absl::OkStatus();
}

absl::StatusOr<StepStats> Replica::TakeMetrics(bool evaluation) {
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  MetricSums* device_sums = sums_.as<MetricSums>() + (evaluation ? 1 : 0);
  MetricSums sums{};
  STRATUM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sums, device_sums, sizeof(sums), cudaMemcpyDeviceToHost, stream_.get()));
  STRATUM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device_sums, 0, sizeof(sums), stream_.get()));
  STRATUM_RETURN_IF_ERROR(stream_.Synchronize());
  return StepStats{sums.loss_sum, static_cast<int64_t>(sums.correct),
                   static_cast<int64_t>(sums.examples)};
}

}  // namespace stratum::cuda
