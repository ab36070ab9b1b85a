// The GPU path's kernels, each behind a host function that launches it on a stream and
// returns the launch's error (naming the kernel). Pointers are device pointers unless
// said otherwise; matrices are row-major. The arithmetic follows the CPU Model
// (the CPU device, common/device/cpu_device.cc, and loss.cc) and the Keras optimizers
// (common/model/optimizer.cc); results agree with them within float rounding, not bit for bit.
//
// Counters that drive a step captured in a CUDA graph live in device memory (StepCounters),
// so that replaying the graph advances them without the host: the gather kernel reads the
// step, the loss kernel advances it, the optimizers read the iteration.
//
// This header is plain C++ (no CUDA syntax): host code of the library includes it.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "stratum/device/device.h"

namespace stratum::cuda {

#ifdef __CUDACC__
#define STRATUM_HOST_DEVICE __host__ __device__
#else
#define STRATUM_HOST_DEVICE
#endif

// The element types of tensor data on a GPU: float32, or the half-precision compute types of
// Keras' mixed precision policies (mixed_bfloat16, mixed_float16).
enum class ElementType : uint8_t { kFloat32 = 0, kBfloat16 = 1, kFloat16 = 2 };
STRATUM_HOST_DEVICE constexpr int64_t SizeOf(ElementType dtype) {
  return dtype == ElementType::kFloat32 ? 4 : 2;
}
const char* ElementTypeName(ElementType dtype);

#ifdef __CUDACC__
struct ElementRef;
#endif

// A device pointer to tensor data and its element type. Kernels read any type as float and
// round what they store to the type, so one kernel serves float32 and mixed precision; sums
// and other intermediate values stay float. A float* converts to a float32 Ptr.
struct Ptr {
  void* p = nullptr;
  ElementType dtype = ElementType::kFloat32;
  Ptr() = default;
  STRATUM_HOST_DEVICE Ptr(std::nullptr_t) {}   // NOLINT: implicit
  STRATUM_HOST_DEVICE Ptr(float* f) : p(f) {}  // NOLINT: implicit
  STRATUM_HOST_DEVICE Ptr(void* data, ElementType type) : p(data), dtype(type) {}
  STRATUM_HOST_DEVICE Ptr operator+(int64_t i) const {
    return Ptr(static_cast<char*>(p) + i * SizeOf(dtype), dtype);
  }
  STRATUM_HOST_DEVICE bool operator==(std::nullptr_t) const { return p == nullptr; }
  STRATUM_HOST_DEVICE bool operator!=(std::nullptr_t) const { return p != nullptr; }
#ifdef __CUDACC__
  __device__ ElementRef operator[](int64_t i) const;
#endif
};

// The same, read only.
struct CPtr {
  const void* p = nullptr;
  ElementType dtype = ElementType::kFloat32;
  CPtr() = default;
  STRATUM_HOST_DEVICE CPtr(std::nullptr_t) {}                  // NOLINT: implicit
  STRATUM_HOST_DEVICE CPtr(const float* f) : p(f) {}           // NOLINT: implicit
  STRATUM_HOST_DEVICE CPtr(Ptr m) : p(m.p), dtype(m.dtype) {}  // NOLINT: implicit
  STRATUM_HOST_DEVICE CPtr(const void* data, ElementType type) : p(data), dtype(type) {}
  STRATUM_HOST_DEVICE CPtr operator+(int64_t i) const {
    return CPtr(static_cast<const char*>(p) + i * SizeOf(dtype), dtype);
  }
  STRATUM_HOST_DEVICE bool operator==(std::nullptr_t) const { return p == nullptr; }
  STRATUM_HOST_DEVICE bool operator!=(std::nullptr_t) const { return p != nullptr; }
#ifdef __CUDACC__
  __device__ float operator[](int64_t i) const;
#endif
};

enum class Act : int { kLinear = 0, kRelu = 1, kSigmoid = 2, kTanh = 3, kSoftmax = 4 };

// Device-resident counters of one replica.
struct StepCounters {
  int64_t step;       // steps taken in this epoch (indexes the epoch's example order)
  int64_t iteration;  // optimizer updates applied so far
};

struct LossScaleState;

// Device-resident metric sums of one replica (StepStats on the device).
struct MetricSums {
  double loss_sum;
  unsigned long long correct;
  unsigned long long examples;
};

// x[r, :] = images[i, :] * scale and labels_out[r] = labels[i] for r < rows, where
// i = order[counters->step * stride + offset + r] when `order` is set (a training step),
// or i = offset + r without it (evaluation). `labels`/`labels_out` may be null. With `ids`
// (a model that takes only ids), x[r, :] = the id words (IdWord) of images[i, :], unscaled.
absl::Status GatherRescale(const uint8_t* images, const uint8_t* labels, int64_t row_size,
                           const int32_t* order, const StepCounters* counters, int64_t stride,
                           int64_t offset, int rows, float scale, bool ids, Ptr x,
                           int32_t* labels_out, cudaStream_t stream);

// out = act(out + bias), row by row (bias may be null). Softmax: logits = out + bias is
// kept in `logits` (must be set) and out = softmax(logits).
absl::Status BiasActivation(Act act, Ptr out, CPtr bias, int64_t rows, int64_t cols, Ptr logits,
                            cudaStream_t stream);

// g = g * act'(from out), in place; softmax rows: g = out * (g - sum(g * out)).
absl::Status ActivationBackward(Act act, CPtr out, Ptr g, int64_t rows, int64_t cols,
                                cudaStream_t stream);

// ActivationBackward (elementwise activations only) fused with the column sums of the
// result into `column_sums` [cols] (the bias gradient; added to it with `accumulate`);
// column_sums may be null.
absl::Status ActivationBackwardColumnSum(Act act, CPtr out, Ptr g, int64_t rows, int64_t cols,
                                         Ptr column_sums, cudaStream_t stream,
                                         bool accumulate = false);

// How the sparse cross-entropy reads the model's output.
enum class CrossEntropyInput : int {
  kFusedSoftmax = 0,  // `values` are the logits of a softmax output layer (bias not added
                      // yet when `bias` is set); the softmax is written to `probs` if set
  kFromLogits = 1,    // `values` are logits (from_logits=True)
  kProbabilities = 2  // `values` are probabilities, clipped to [1e-7, 1 - 1e-7]
};

// Sparse categorical cross-entropy and accuracy of `rows` examples with `classes` outputs:
// adds the loss sum, the correct count and the examples to `sums`, and writes
// grad = scale * d(loss sum)/d(values) when `grad` is set (times loss_scale->scale when set). When
// `counters` is set, advances counters->step and counters->iteration by one (the step's last read
// of them precedes).
absl::Status SparseCrossEntropy(CrossEntropyInput input, Ptr values, CPtr bias, Ptr probs,
                                const int32_t* labels, int64_t rows, int classes, float scale,
                                Ptr grad, MetricSums* sums, StepCounters* counters,
                                cudaStream_t stream, const LossScaleState* loss_scale = nullptr);

// Inverted dropout: mask = (uniform(seed, counters->iteration, i) >= rate) / (1 - rate),
// out = in * mask. A new mask every iteration, the same for one seed and iteration.
absl::Status DropoutForward(CPtr in, Ptr out, Ptr mask, int64_t n, float rate, uint64_t seed,
                            const StepCounters* counters, cudaStream_t stream);
// g *= mask.
absl::Status Multiply(Ptr g, CPtr mask, int64_t n, cudaStream_t stream);

// dst += src (n floats); dst *= factor.
absl::Status AddInto(Ptr dst, CPtr src, int64_t n, cudaStream_t stream);
absl::Status Scale(Ptr dst, float factor, int64_t n, cudaStream_t stream);

// out = alpha * x, or out += alpha * x with `accumulate` (n floats).
absl::Status Axpby(float alpha, CPtr x, Ptr out, int64_t n, bool accumulate, cudaStream_t stream);
// out = x * y elementwise, or out += x * y with `accumulate`.
absl::Status MultiplyInto(CPtr x, CPtr y, Ptr out, int64_t n, bool accumulate, cudaStream_t stream);
// out[r * out_stride + c] (+)= x[r * x_stride + c] for r < rows, c < width.
absl::Status AddBlocks(CPtr x, int64_t x_stride, Ptr out, int64_t out_stride, int64_t rows,
                       int64_t width, cudaStream_t stream, bool accumulate = true);

// Dynamic loss scaling (Keras 3's LossScaleOptimizer, for mixed_float16), on the device: the
// loss's gradient is multiplied by `scale`; an update divides the summed gradients by it and,
// when any is not finite, skips (the optimizer's iterations do not advance), halves the scale
// and starts counting again; after `growth_steps` finite updates in a row the scale doubles.
struct LossScaleState {
  float scale;
  int32_t finite_steps;  // finite updates since the scale last changed
  int32_t not_finite;    // set by the last UnscaleGradients
};
// g[0, scaled) *= 1 / state->scale (the trainable variables' gradients; the non-trainable
// ones after them are changes the loss did not scale); sets state->not_finite when any of
// g[0, n) is inf or NaN.
absl::Status UnscaleGradients(float* g, int64_t scaled, int64_t n, LossScaleState* state,
                              cudaStream_t stream);
// After an update: the scale's halving or growth, the skipped update's iteration given back.
absl::Status UpdateLossScale(LossScaleState* state, int growth_steps, StepCounters* counters,
                             cudaStream_t stream);

// Keras optimizer updates of `n` variables at once (a flat buffer), with the update count
// read from counters->iteration (already advanced for this step: the step number, 1-based).
struct OptimizerParams {
  enum class Kind : int { kSgd = 0, kAdam = 1, kAdagrad = 2, kRmsProp = 3 } kind = Kind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0;  // SGD, RMSprop
  bool nesterov = false;
  float beta_1 = 0.9f, beta_2 = 0.999f;  // Adam
  float epsilon = 1e-7f;                 // Adam, Adagrad, RMSprop
  float rho = 0.9f;                      // RMSprop
  bool centered = false;
};
// slots: the optimizer's state buffers in Optimizer::SlotNames() order (null past them).
// Variables [n, total) are non-trainable: they take their gradient slot's change as it is
// (var -= grad). With `skip` set and skip->not_finite, nothing changes.
absl::Status ApplyOptimizer(const OptimizerParams& params, float* variables, const float* gradients,
                            float* slot0, float* slot1, float* slot2, int64_t n, int64_t total,
                            const StepCounters* counters, const LossScaleState* skip,
                            cudaStream_t stream);

// ---- Convolutional layers (channels-last batches; the geometry of stratum::Window2D) ----

// Max pooling: out = the largest in-bounds value of each window (padding never wins).
absl::Status MaxPool2D(const Window2D& w, int64_t batch, CPtr x, Ptr out, cudaStream_t stream);
// grad_x (+)= grad_out routed to the first maximum of each window (row-major window order),
// computed per input position over the windows that hold it: no atomics, deterministic.
absl::Status MaxPool2DBackward(const Window2D& w, int64_t batch, CPtr x, CPtr grad_out, Ptr grad_x,
                               bool accumulate, cudaStream_t stream);
// Average pooling over each window's in-bounds positions, and its gradient (+=) shared
// evenly over them.
absl::Status AvgPool2D(const Window2D& w, int64_t batch, CPtr x, Ptr out, cudaStream_t stream);
absl::Status AvgPool2DBackward(const Window2D& w, int64_t batch, CPtr grad_out, Ptr grad_x,
                               bool accumulate, cudaStream_t stream);

// Column sums of a tall row-major matrix [rows, cols] (a convolution's bias gradient,
// batch normalization's statistics), in two passes: row chunks into `partial` (device
// scratch of `partial_floats`), then the chunks in order, so the result is deterministic.
enum class ColumnTerm : int {
  kValue = 0,             // out[c] (+)= sum of a
  kSquaredDeviation = 1,  // out[c] = sum of (a - mean)^2
  kGradSums = 2           // out[c] = sum of a (dy), out[cols + c] = sum of a * (b - mean)
};
struct ColumnSumArgs {
  ColumnTerm term = ColumnTerm::kValue;
  CPtr a = nullptr;
  CPtr b = nullptr;     // kGradSums: x
  CPtr mean = nullptr;  // kSquaredDeviation, kGradSums
  int64_t rows = 0, cols = 0;
  Ptr out = nullptr;
  bool accumulate = false;  // kValue only
  // kGradSums, when set: grad_gamma = out[cols + c] / sqrt(variance + epsilon), grad_beta =
  // out[c].
  CPtr variance = nullptr;
  float epsilon = 0;
  Ptr grad_gamma = nullptr;
  Ptr grad_beta = nullptr;
};
absl::Status ColumnSums(const ColumnSumArgs& args, float* partial, int64_t partial_floats,
                        cudaStream_t stream);

// y = gamma * (x - mean) / sqrt(variance + epsilon) + beta per column (gamma, beta may be
// null), as CpuDevice's BatchNorm.
absl::Status BatchNorm(CPtr x, int64_t rows, int64_t width, CPtr mean, CPtr variance, float epsilon,
                       CPtr gamma, CPtr beta, Ptr y, cudaStream_t stream);
// dx (+)= the gradient of BatchNorm, as CpuDevice's BatchNormBackward (sums null: inference).
absl::Status BatchNormBackward(CPtr dy, CPtr x, int64_t rows, int64_t width, CPtr mean,
                               CPtr variance, float epsilon, CPtr gamma, CPtr sums, int64_t count,
                               Ptr dx, bool accumulate, cudaStream_t stream);

// A convolution kernel between Keras' layout [kh, kw, in_c, out_c] (HWIO) and cuDNN's
// channels-last filter layout [out_c, kh, kw, in_c] (OHWI); `positions` = kh * kw.
absl::Status KernelToOhwi(CPtr hwio, int64_t positions, int64_t in_c, int64_t out_c, Ptr ohwi,
                          cudaStream_t stream);
absl::Status KernelToHwio(CPtr ohwi, int64_t positions, int64_t in_c, int64_t out_c, Ptr hwio,
                          cudaStream_t stream);

// out[n, y, x, c] = in[n, y - top, x - left, c] where that lies inside in [batch, in_h, in_w,
// channels], else 0; out is [batch, out_h, out_w, channels]. Positive offsets pad, negative
// ones crop (a convolution's asymmetric padding, which cuDNN does not take).
absl::Status ShiftCopy2D(CPtr in, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                         int64_t top, int64_t left, Ptr out, int64_t out_h, int64_t out_w,
                         cudaStream_t stream);

// ---- Embeddings ----

// Device::EmbeddingLookup.
absl::Status EmbeddingLookup(CPtr ids, int64_t count, CPtr table, int64_t rows, int64_t width,
                             Ptr out, cudaStream_t stream);
// Device::EmbeddingPositions: a binary search per id.
absl::Status EmbeddingPositions(CPtr ids, int64_t count, const int64_t* rows, int64_t num_rows,
                                Ptr positions, cudaStream_t stream);
// The device scratch EmbeddingGrad needs for `count` ids into a table of `rows`.
size_t EmbeddingGradScratchBytes(int64_t count, int64_t rows);
// Device::EmbeddingGrad, deterministic: the (row, position) pairs sorted by row (a radix
// sort), their runs found (a run-length encoding and a scan), then each run summed by one
// block in a fixed order (the CPU's within float rounding), so a row most ids name is summed
// in parallel.
absl::Status EmbeddingGrad(CPtr ids, int64_t count, CPtr grad_out, int64_t rows, int64_t width,
                           Ptr grad_table, void* scratch, size_t scratch_bytes,
                           cudaStream_t stream);
// Device::AverageSteps and AverageStepsGrad.
absl::Status AverageSteps(CPtr x, int64_t batch, int64_t steps, int64_t width, Ptr out,
                          cudaStream_t stream);
absl::Status AverageStepsGrad(CPtr grad_out, int64_t batch, int64_t steps, int64_t width,
                              Ptr grad_x, bool accumulate, cudaStream_t stream);

}  // namespace stratum::cuda
