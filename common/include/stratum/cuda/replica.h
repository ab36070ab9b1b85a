// Replica: one replica of a model trained on one GPU (or one logical GPU): the variables,
// the optimizer's slots, the gradients and the activations live in device memory; a step
// runs the model's graph with the same GraphExecutor as the CPU Model's TrainStep
// (common/model/graph_executor.h), on a CudaDevice (cuBLAS and the kernels of kernels.h),
// then the loss kernel and the Keras optimizer update, all queued on the replica's stream
// with no host synchronization. Loss and accuracy accumulate on the device (MetricSums) and are
// read when the caller asks (TakeMetrics), once per epoch or progress update.
//
// A training step with a batch size seen before replays a CUDA graph captured the first
// time, so a step costs one launch on the host however many kernels it holds.
//
// DeviceDataset: a data set of uint8 examples (and labels) resident on one device, uploaded
// once; steps gather their rows from it (through an epoch's example order, also on the
// device) and rescale them to float32 on the device.
//
// Thread safety: a Replica is used by one thread at a time. Ownership: the caller owns the
// allocator, which must outlive the replicas and data sets made with it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/cuda/device.h"
#include "stratum/cuda/kernels.h"
#include "stratum/device/device.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/tensor/tensor.h"

struct cublasContext;
struct CUgraphExec_st;

namespace stratum {
class GraphExecutor;
}  // namespace stratum

namespace stratum::cuda {

class CudaDevice;

struct DeviceDataset {
  DeviceBuffer images;  // uint8 [rows, row_size]
  DeviceBuffer labels;  // uint8 [rows]
  int64_t rows = 0;
  int64_t row_size = 0;
};

// Uploads uint8 images [N, ...] and uint8/int32/int64 class ids [N] (each below `classes`)
// to the allocator's device. INVALID_ARGUMENT naming the first bad label or dtype.
absl::StatusOr<std::unique_ptr<DeviceDataset>> UploadDataset(CachingAllocator& allocator,
                                                             const Tensor& images,
                                                             const Tensor& labels, int64_t classes);

// Whether the GPU path trains this model with this loss and optimizer; else why not
// (UNIMPLEMENTED naming what is missing: the caller then trains on the CPU).
absl::Status SupportsOnGpu(const Model& model, const Loss& loss, const Optimizer& optimizer);

struct ReplicaOptions {
  int device = 0;          // physical device
  int64_t max_batch = 64;  // rows per step (training or evaluation) the buffers hold
  uint64_t seed = 1;       // dropout masks
  bool use_graphs = true;  // capture training steps in CUDA graphs
  // This replica's share of a step's non-trainable updates (BatchNormalization's moving
  // statistics): 1 / the replicas whose gradients are summed.
  float replica_share = 1.0f;
  bool allow_tf32 = true;  // cuDNN convolutions in TF32 (TensorFlow's and PyTorch's default)
  // mixed_float16's dynamic loss scaling (Keras 3's LossScaleOptimizer defaults).
  float initial_loss_scale = 32768.0f;
  int loss_scale_growth_steps = 2000;
};

// The compute type of a model's dtype policy on a GPU.
ElementType ComputeTypeOf(DtypePolicy policy);

// Where a step's rows come from: rows [offset, offset + rows) of step counters.step of the
// epoch's `order` (a training step), with `stride` rows per step.
struct StepInput {
  const DeviceDataset* data = nullptr;
  const int32_t* order = nullptr;  // device int32, the epoch's example order
  int64_t stride = 0;
  int64_t offset = 0;
  int rows = 0;
  float rescale = 1.0f;
};

class Replica {
 public:
  static absl::StatusOr<std::unique_ptr<Replica>> Create(const Model& model, const Loss& loss,
                                                         const Optimizer& optimizer,
                                                         CachingAllocator& allocator,
                                                         const ReplicaOptions& options);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // Uploads the variables and the slots (empty: the optimizer's fresh slots) and sets the
  // number of updates applied so far. Synchronous.
  absl::Status SetState(const std::vector<Tensor>& variables,
                        const std::vector<std::vector<Tensor>>& slots, int64_t iteration);
  // Downloads them (the host tensors are allocated). Synchronous.
  absl::Status GetState(std::vector<Tensor>* variables,
                        std::vector<std::vector<Tensor>>* slots) const;
  // The gradients of the last step as host tensors (tests). Synchronous.
  absl::Status GetGradients(std::vector<Tensor>* gradients) const;

  // Queues the forward and backward pass of one training step: gradients of
  // loss_scale * (sum of per-example losses) into gradients(); advances the step and
  // iteration counters. With `update`, also applies the optimizer.
  //
  // Mixed precision (the model's dtype policy): the layers compute in bfloat16 or float16 from
  // the float32 variables, and the gradients, the update and the variables stay float32. With
  // mixed_float16 the gradients are those of the dynamically scaled loss until the update
  // (EnqueueUpdate) unscales them, skipping the update when one is not finite.
  absl::Status EnqueueTrainStep(const StepInput& input, float loss_scale, bool update);
  // Queues the optimizer update from gradients() (after an all-reduce).
  absl::Status EnqueueUpdate();
  // Queues an evaluation (inference mode) of rows [first, first + rows) of `data`.
  absl::Status EnqueueEvaluate(const DeviceDataset& data, int64_t first, int rows, float rescale);
  // Sets the step counter (0 at the start of an epoch), on the stream.
  absl::Status ResetStep(int64_t step = 0);
  // Waits for the stream, then returns and zeroes the training (or evaluation) sums.
  absl::StatusOr<StepStats> TakeMetrics(bool evaluation);

  // The flat gradient buffer (every variable, 256-byte aligned) and its length in floats.
  float* gradients() const { return gradients_.as<float>(); }
  // The flat variable buffer, laid out as gradients(): variable i starts at offset(i), the
  // trainable variables first (the optimizer's range), then the non-trainable ones.
  // Writers queue on stream() (a parameter server's values uploaded before a step).
  float* variables() const { return params_.as<float>(); }
  int64_t offset(int index) const { return offsets_[static_cast<size_t>(index)]; }
  int64_t flat_size() const { return flat_size_; }
  // The compute type, and whether gradients() hold a dynamically scaled loss's (mixed_float16).
  ElementType compute() const { return compute_; }
  bool scales_loss() const { return compute_ == ElementType::kFloat16; }
  // The current dynamic loss scale (1 without loss scaling). Synchronous.
  absl::StatusOr<float> LossScale() const;
  const Stream& stream() const { return stream_; }
  int device() const { return options_.device; }

 private:
  Replica(const Model& model, const Loss& loss, CachingAllocator& allocator,
          const ReplicaOptions& options);
  absl::Status Init(const Optimizer& optimizer);
  absl::Status InitGraph(int64_t batch);
  absl::Status Forward(int rows, bool training);
  absl::Status Backward(int rows, int fused);
  absl::Status EnqueueLoss(int rows, bool training, int fused, float scale, MetricSums* sums,
                           StepCounters* counters);
  absl::Status LaunchUpdate();
  absl::Status LaunchTrainStep(const StepInput& input, float loss_scale, bool update);
  // Captures LaunchTrainStep in a graph, planning its convolutions first where needed.
  absl::StatusOr<CUgraphExec_st*> CaptureTrainStep(const StepInput& input, float loss_scale,
                                                   bool update);
  float* Variable(int index) const { return params_.as<float>() + offsets_[index]; }
  float* Gradient(int index) const { return gradients_.as<float>() + offsets_[index]; }

  Model model_;
  Loss loss_;
  CachingAllocator& allocator_;
  ReplicaOptions options_;
  OptimizerParams optimizer_;
  int num_slots_ = 0;
  float fresh_slot_value_ = 0;  // what the optimizer's NewSlots fills slots with

  Stream stream_;
  cublasContext* cublas_ = nullptr;
  DeviceBuffer cublas_workspace_;
  std::vector<int64_t> offsets_;  // per variable, in floats
  int64_t flat_size_ = 0;
  int64_t trainable_size_ = 0;  // floats of the trainable variables, which come first
  DeviceBuffer params_, gradients_;
  std::vector<DeviceBuffer> slots_;
  DeviceBuffer x_, labels_;
  DeviceBuffer counters_;  // StepCounters
  ElementType compute_ = ElementType::kFloat32;
  DeviceBuffer loss_scale_;  // LossScaleState, with mixed_float16
  DeviceBuffer sums_;        // MetricSums[2]: training, evaluation
  std::unique_ptr<CudaDevice> device_;
  std::unique_ptr<GraphExecutor> executor_;
  std::vector<DeviceBuffer> graph_buffers_;      // the executor's activations, gradients, scratch
  std::vector<const float*> variable_pointers_;  // per model variable, into params_
  std::vector<float*> gradient_pointers_;        // per model variable, into gradients_
  RandomStream rng_;                             // seeds of the dropout masks

  using GraphKey = std::tuple<const void*, const void*, int64_t, int64_t, int, float, float, bool>;
  std::map<GraphKey, CUgraphExec_st*> graphs_;
};

}  // namespace stratum::cuda
