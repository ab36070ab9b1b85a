// The GPU path's kernels (see stratum/cuda/kernels.h). One .cu file keeps nvcc's share of
// the build small.
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cub/cub.cuh>

#include "absl/strings/str_cat.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/cuda/kernels.h"

namespace stratum::cuda {

// A stored element of a Ptr, read as float and written rounded to its type.
struct ElementRef {
  void* p;
  ElementType dtype;
  __device__ __forceinline__ operator float() const {  // NOLINT: implicit
    return CPtr(p, dtype)[0];
  }
  __device__ __forceinline__ ElementRef& operator=(float v) {
    switch (dtype) {
      case ElementType::kBfloat16:
        *static_cast<__nv_bfloat16*>(p) = __float2bfloat16(v);
        break;
      case ElementType::kFloat16:
        *static_cast<__half*>(p) = __float2half(v);
        break;
      default:
        *static_cast<float*>(p) = v;
    }
    return *this;
  }
  __device__ __forceinline__ ElementRef& operator=(const ElementRef& other) {
    return *this = static_cast<float>(other);
  }
  __device__ __forceinline__ ElementRef& operator+=(float v) {
    return *this = static_cast<float>(*this) + v;
  }
  __device__ __forceinline__ ElementRef& operator-=(float v) {
    return *this = static_cast<float>(*this) - v;
  }
  __device__ __forceinline__ ElementRef& operator*=(float v) {
    return *this = static_cast<float>(*this) * v;
  }
  __device__ __forceinline__ ElementRef& operator/=(float v) {
    return *this = static_cast<float>(*this) / v;
  }
};

__device__ __forceinline__ ElementRef Ptr::operator[](int64_t i) const {
  return ElementRef{static_cast<char*>(p) + i * SizeOf(dtype), dtype};
}

__device__ __forceinline__ float CPtr::operator[](int64_t i) const {
  switch (dtype) {
    case ElementType::kBfloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case ElementType::kFloat16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Elements i and i + 1 of p, i even and p aligned to two elements (PairAligned): one load or
// store for both, which half-precision data needs to use the memory's bandwidth.
__device__ __forceinline__ float2 LoadPair(CPtr p, int64_t i) {
  switch (p.dtype) {
    case ElementType::kBfloat16:
      return __bfloat1622float2(static_cast<const __nv_bfloat162*>(p.p)[i / 2]);
    case ElementType::kFloat16:
      return __half22float2(static_cast<const __half2*>(p.p)[i / 2]);
    default:
      return static_cast<const float2*>(p.p)[i / 2];
  }
}

__device__ __forceinline__ void StorePair(Ptr p, int64_t i, float2 v) {
  switch (p.dtype) {
    case ElementType::kBfloat16:
      static_cast<__nv_bfloat162*>(p.p)[i / 2] = __floats2bfloat162_rn(v.x, v.y);
      break;
    case ElementType::kFloat16:
      static_cast<__half2*>(p.p)[i / 2] = __floats2half2_rn(v.x, v.y);
      break;
    default:
      static_cast<float2*>(p.p)[i / 2] = v;
  }
}

const char* ElementTypeName(ElementType dtype) {
  switch (dtype) {
    case ElementType::kBfloat16:
      return "bfloat16";
    case ElementType::kFloat16:
      return "float16";
    default:
      return "float32";
  }
}

namespace {

constexpr int kThreads = 256;
constexpr float kClipEpsilon = 1e-7f;  // Keras' backend.epsilon()

// Whether p (null included) may be read and written two elements at a time.
bool PairAligned(CPtr p) {
  return reinterpret_cast<uintptr_t>(p.p) % static_cast<uintptr_t>(2 * SizeOf(p.dtype)) == 0;
}

int Blocks(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

__device__ float Activate(Act act, float z) {
  switch (act) {
    case Act::kRelu:
      return z > 0.0f ? z : 0.0f;
    case Act::kSigmoid:
      return 1.0f / (1.0f + expf(-z));
    case Act::kTanh:
      return tanhf(z);
    default:
      return z;
  }
}

__device__ float Derivative(Act act, float out, float g) {
  switch (act) {
    case Act::kRelu:
      return out > 0.0f ? g : 0.0f;
    case Act::kSigmoid:
      return g * (out * (1.0f - out));
    case Act::kTanh:
      return g * (1.0f - out * out);
    default:
      return g;
  }
}

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The first index of the largest value over the warp (argmax's tie rule).
__device__ void WarpArgMax(float& value, int& index) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
    if (other > value || (other == value && other_index < index)) {
      value = other;
      index = other_index;
    }
  }
}

__global__ void GatherKernel(const uint8_t* images, const uint8_t* labels, int64_t row_size,
                             const int32_t* order, const StepCounters* counters, int64_t stride,
                             int64_t offset, float scale, bool ids, Ptr x, int32_t* labels_out) {
  const int64_t r = blockIdx.x;
  int64_t index = offset + r;
  if (order != nullptr) index = order[(counters != nullptr ? counters->step * stride : 0) + index];
  const uint8_t* src = images + index * row_size;
  Ptr dst = x + r * row_size;
  if (ids) {  // id words (IdWord), in a float32 buffer
    for (int64_t j = threadIdx.x; j < row_size; j += blockDim.x) {
      static_cast<float*>(dst.p)[j] = __int_as_float(src[j]);
    }
  } else if ((row_size & 3) == 0 && dst.dtype == ElementType::kFloat32) {
    const auto* src4 = reinterpret_cast<const uchar4*>(src);
    auto* dst4 = static_cast<float4*>(dst.p);
    for (int64_t j = threadIdx.x; j < row_size / 4; j += blockDim.x) {
      const uchar4 v = src4[j];
      dst4[j] = make_float4(static_cast<float>(v.x) * scale, static_cast<float>(v.y) * scale,
                            static_cast<float>(v.z) * scale, static_cast<float>(v.w) * scale);
    }
  } else {
    for (int64_t j = threadIdx.x; j < row_size; j += blockDim.x) {
      dst[j] = static_cast<float>(src[j]) * scale;
    }
  }
  if (labels_out != nullptr && threadIdx.x == 0) labels_out[r] = labels[index];
}

__global__ void BiasActivationKernel(Act act, Ptr out, CPtr bias, int64_t n, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float z = out[i];
    if (bias != nullptr) z += bias[i % cols];
    out[i] = Activate(act, z);
  }
}

// BiasActivationKernel two elements a thread (n and cols even, pointers PairAligned).
__global__ void BiasActivationPairsKernel(Act act, Ptr out, CPtr bias, int64_t n, int64_t cols) {
  for (int64_t i = 2 * (blockIdx.x * int64_t{blockDim.x} + threadIdx.x); i < n;
       i += 2 * int64_t{gridDim.x} * blockDim.x) {
    float2 z = LoadPair(out, i);
    if (bias != nullptr) {
      // 32-bit arithmetic where it suffices: a 64-bit remainder costs tens of instructions.
      const int64_t c =
          n < (int64_t{1} << 31) ? static_cast<int32_t>(i) % static_cast<int32_t>(cols) : i % cols;
      const float2 b = LoadPair(bias, c);
      z.x += b.x;
      z.y += b.y;
    }
    StorePair(out, i, make_float2(Activate(act, z.x), Activate(act, z.y)));
  }
}

// One warp per row.
__global__ void BiasSoftmaxKernel(Ptr out, CPtr bias, Ptr logits, int64_t rows, int64_t cols) {
  const int64_t row = blockIdx.x * int64_t{blockDim.y} + threadIdx.y;
  if (row >= rows) return;
  const int lane = threadIdx.x;
  Ptr z = logits + row * cols;
  Ptr o = out + row * cols;
  float max = -INFINITY;
  for (int64_t c = lane; c < cols; c += 32) {
    const float v = o[c] + (bias != nullptr ? bias[c] : 0.0f);
    z[c] = v;
    max = fmaxf(max, v);
  }
  max = WarpMax(max);
  float sum = 0;
  for (int64_t c = lane; c < cols; c += 32) {
    const float e = expf(z[c] - max);
    o[c] = e;
    sum += e;
  }
  sum = WarpSum(sum);
  for (int64_t c = lane; c < cols; c += 32) o[c] /= sum;
}

__global__ void ActivationBackwardKernel(Act act, CPtr out, Ptr g, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    g[i] = Derivative(act, out[i], g[i]);
  }
}

// ActivationBackwardKernel two elements a thread.
__global__ void ActivationBackwardPairsKernel(Act act, CPtr out, Ptr g, int64_t n) {
  for (int64_t i = 2 * (blockIdx.x * int64_t{blockDim.x} + threadIdx.x); i < n;
       i += 2 * int64_t{gridDim.x} * blockDim.x) {
    const float2 y = LoadPair(out, i), d = LoadPair(g, i);
    StorePair(g, i, make_float2(Derivative(act, y.x, d.x), Derivative(act, y.y, d.y)));
  }
}

__global__ void SoftmaxBackwardKernel(CPtr out, Ptr g, int64_t rows, int64_t cols) {
  const int64_t row = blockIdx.x * int64_t{blockDim.y} + threadIdx.y;
  if (row >= rows) return;
  CPtr y = out + row * cols;
  Ptr d = g + row * cols;
  float dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += 32) dot += d[c] * y[c];
  dot = WarpSum(dot);
  for (int64_t c = threadIdx.x; c < cols; c += 32) d[c] = y[c] * (d[c] - dot);
}

constexpr int kColumnTile = 32;
constexpr int kRowLanes = 16;

// Block (32, 16): 32 columns, 16 row lanes; the lanes' partial sums add in a fixed order,
// so the result is deterministic.
__global__ void BackwardColumnSumKernel(Act act, CPtr out, Ptr g, int64_t rows, int64_t cols,
                                        Ptr column_sums, bool accumulate) {
  __shared__ float partial[kRowLanes][kColumnTile + 1];
  const int64_t c = blockIdx.x * int64_t{kColumnTile} + threadIdx.x;
  float sum = 0;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) {
      const int64_t i = r * cols + c;
      float v = g[i];
      if (act != Act::kLinear) {
        v = Derivative(act, out[i], v);
        g[i] = v;
      }
      sum += v;
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols && column_sums != nullptr) {
    float total = 0;
    for (int lane = 0; lane < kRowLanes; ++lane) total += partial[lane][threadIdx.x];
    column_sums[c] = accumulate ? column_sums[c] + total : total;
  }
}

constexpr int kRowsPerBlock = 8;  // warps per block in the row kernels

__global__ void SparseCrossEntropyKernel(CrossEntropyInput input, Ptr values, CPtr bias, Ptr probs,
                                         const int32_t* labels, int64_t rows, int classes,
                                         float scale, Ptr grad, MetricSums* sums,
                                         StepCounters* counters, const LossScaleState* loss_scale) {
  if (loss_scale != nullptr) scale *= loss_scale->scale;
  __shared__ double block_loss[kRowsPerBlock];
  __shared__ unsigned int block_correct[kRowsPerBlock];
  const int lane = threadIdx.x;
  const int warp = threadIdx.y;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + warp;
  double loss = 0;
  unsigned int correct = 0;
  if (row < rows) {
    Ptr v = values + row * classes;
    Ptr g = grad != nullptr ? grad + row * classes : nullptr;
    const int label = labels[row];
    if (input == CrossEntropyInput::kProbabilities) {
      float sum = 0, best = -INFINITY;
      int best_index = 0;
      for (int c = lane; c < classes; c += 32) {
        const float p = v[c];
        sum += fminf(fmaxf(p, kClipEpsilon), 1.0f - kClipEpsilon);
        if (p > best) {
          best = p;
          best_index = c;
        }
      }
      sum = WarpSum(sum);
      WarpArgMax(best, best_index);
      const float q_label = fminf(fmaxf(v[label], kClipEpsilon), 1.0f - kClipEpsilon);
      loss = log(static_cast<double>(sum)) - log(static_cast<double>(q_label));
      correct = best_index == label;
      if (g != nullptr) {
        for (int c = lane; c < classes; c += 32) {
          const float p = v[c];
          const bool inside = p >= kClipEpsilon && p <= 1.0f - kClipEpsilon;
          const float d = 1.0f / sum - (c == label ? 1.0f / q_label : 0.0f);
          g[c] = inside ? scale * d : 0.0f;
        }
      }
    } else {
      // Logits z: log-sum-exp minus z[label]; gradient softmax(z) - onehot.
      const bool fused = input == CrossEntropyInput::kFusedSoftmax;
      float max = -INFINITY;
      for (int c = lane; c < classes; c += 32) {
        float z = v[c];
        if (fused && bias != nullptr) {
          z += bias[c];
          v[c] = z;
        }
        max = fmaxf(max, z);
      }
      max = WarpMax(max);
      float sum = 0;
      for (int c = lane; c < classes; c += 32) sum += expf(v[c] - max);
      sum = WarpSum(sum);
      float best = -INFINITY;
      int best_index = 0;
      for (int c = lane; c < classes; c += 32) {
        const float p = expf(v[c] - max) / sum;
        // The model's predictions are the softmax when fused, else the logits themselves.
        const float prediction = fused ? p : v[c];
        if (prediction > best) {
          best = prediction;
          best_index = c;
        }
        if (fused && probs != nullptr) probs[row * classes + c] = p;
        if (g != nullptr) g[c] = scale * (p - (c == label ? 1.0f : 0.0f));
      }
      WarpArgMax(best, best_index);
      loss = static_cast<double>(max) + log(static_cast<double>(sum)) - v[label];
      correct = best_index == label;
    }
  }
  if (lane == 0) {
    block_loss[warp] = row < rows ? loss : 0.0;
    block_correct[warp] = row < rows ? correct : 0u;
  }
  __syncthreads();
  if (warp == 0 && lane == 0) {
    double total = 0;
    unsigned long long total_correct = 0;
    for (int w = 0; w < kRowsPerBlock; ++w) {
      total += block_loss[w];
      total_correct += block_correct[w];
    }
    if (sums != nullptr) {
      atomicAdd(&sums->loss_sum, total);
      atomicAdd(&sums->correct, total_correct);
      if (blockIdx.x == 0) atomicAdd(&sums->examples, static_cast<unsigned long long>(rows));
    }
    if (counters != nullptr && blockIdx.x == 0) {
      counters->step += 1;
      counters->iteration += 1;
    }
  }
}

__device__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void DropoutKernel(CPtr in, Ptr out, Ptr mask, int64_t n, float rate, uint64_t seed,
                              const StepCounters* counters) {
  const uint64_t stream = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(counters->iteration)));
  const float keep_scale = 1.0f / (1.0f - rate);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float uniform =
        static_cast<float>(SplitMix64(stream + static_cast<uint64_t>(i)) >> 40) * 0x1.0p-24f;
    const float m = uniform >= rate ? keep_scale : 0.0f;
    mask[i] = m;
    out[i] = in[i] * m;
  }
}

__global__ void MultiplyKernel(Ptr g, CPtr mask, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    g[i] *= mask[i];
  }
}

__global__ void AddIntoKernel(Ptr dst, CPtr src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] += src[i];
  }
}

__global__ void ScaleKernel(Ptr dst, float factor, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] *= factor;
  }
}

__global__ void AxpbyKernel(float alpha, CPtr x, Ptr out, int64_t n, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = alpha * x[i];
    out[i] = accumulate ? out[i] + v : v;
  }
}

// AxpbyKernel two elements a thread.
__global__ void AxpbyPairsKernel(float alpha, CPtr x, Ptr out, int64_t n, bool accumulate) {
  for (int64_t i = 2 * (blockIdx.x * int64_t{blockDim.x} + threadIdx.x); i < n;
       i += 2 * int64_t{gridDim.x} * blockDim.x) {
    float2 v = LoadPair(x, i);
    v.x *= alpha;
    v.y *= alpha;
    if (accumulate) {
      const float2 o = LoadPair(out, i);
      v.x += o.x;
      v.y += o.y;
    }
    StorePair(out, i, v);
  }
}

__global__ void MultiplyIntoKernel(CPtr x, CPtr y, Ptr out, int64_t n, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i] * y[i];
    out[i] = accumulate ? out[i] + v : v;
  }
}

__global__ void AddBlocksKernel(CPtr x, int64_t x_stride, Ptr out, int64_t out_stride, int64_t rows,
                                int64_t width, bool accumulate) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    const float v = x[r * x_stride + c];
    if (accumulate) {
      out[r * out_stride + c] += v;
    } else {
      out[r * out_stride + c] = v;
    }
  }
}

__global__ void UnscaleKernel(float* g, int64_t scaled, int64_t n, LossScaleState* state) {
  const float inverse = 1.0f / state->scale;
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = g[i];
    if (i < scaled) {
      v *= inverse;
      g[i] = v;
    }
    bad |= !isfinite(v);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(&state->not_finite, 1);
}

__global__ void UpdateLossScaleKernel(LossScaleState* state, int growth_steps,
                                      StepCounters* counters) {
  if (state->not_finite != 0) {
    state->scale *= 0.5f;
    state->finite_steps = 0;
    counters->iteration -= 1;  // the skipped update
  } else if (++state->finite_steps >= growth_steps) {
    state->scale *= 2.0f;
    state->finite_steps = 0;
  }
  state->not_finite = 0;
}

__global__ void OptimizerKernel(OptimizerParams p, float* var, const float* grad, float* s0,
                                float* s1, float* s2, int64_t n, int64_t total,
                                const StepCounters* counters, const LossScaleState* skip) {
  if (skip != nullptr && skip->not_finite != 0) return;
  for (int64_t i = n + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    var[i] -= grad[i];  // non-trainable: the change as it is
  }
  __shared__ float alpha;
  if (p.kind == OptimizerParams::Kind::kAdam) {
    if (threadIdx.x == 0) {
      // As the CPU optimizer: the bias corrections in double, then float.
      const double step = static_cast<double>(counters->iteration);
      alpha = static_cast<float>(static_cast<double>(p.learning_rate) *
                                 sqrt(1 - pow(static_cast<double>(p.beta_2), step)) /
                                 (1 - pow(static_cast<double>(p.beta_1), step)));
    }
    __syncthreads();
  }
  const float lr = p.learning_rate;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i];
    switch (p.kind) {
      case OptimizerParams::Kind::kSgd:
        if (p.momentum == 0) {
          var[i] -= lr * g;
        } else {
          const float m = p.momentum * s0[i] - lr * g;
          s0[i] = m;
          var[i] += p.nesterov ? p.momentum * m - lr * g : m;
        }
        break;
      case OptimizerParams::Kind::kAdam: {
        float m = s0[i], v = s1[i];
        m += (g - m) * (1 - p.beta_1);
        v += (g * g - v) * (1 - p.beta_2);
        s0[i] = m;
        s1[i] = v;
        var[i] -= alpha * m / (sqrtf(v) + p.epsilon);
        break;
      }
      case OptimizerParams::Kind::kAdagrad: {
        const float accumulator = s0[i] + g * g;
        s0[i] = accumulator;
        var[i] -= lr * g / sqrtf(accumulator + p.epsilon);
        break;
      }
      case OptimizerParams::Kind::kRmsProp: {
        const float velocity = p.rho * s0[i] + (1 - p.rho) * g * g;
        s0[i] = velocity;
        float denominator = velocity + p.epsilon;
        if (p.centered) {
          const float average = p.rho * s2[i] + (1 - p.rho) * g;
          s2[i] = average;
          denominator = velocity - average * average + p.epsilon;
        }
        if (p.momentum > 0) {
          const float m = p.momentum * s1[i] + lr * g / sqrtf(denominator);
          s1[i] = m;
          var[i] -= m;
        } else {
          var[i] -= lr * g / sqrtf(denominator);
        }
        break;
      }
    }
  }
}

// ---- Convolutional layers ----

__device__ int64_t MinOf(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ int64_t MaxOf(int64_t a, int64_t b) { return a > b ? a : b; }

// Floor and ceiling of a / b for b > 0 and any a.
__device__ int64_t FloorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
__device__ int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }

// Output element i of a window operation: image b, window (oy, ox), channel c.
struct WindowOutput {
  int64_t b, oy, ox, c;
};
__device__ WindowOutput WindowOutputAt(const Window2D& w, int64_t i) {
  const int64_t c = i % w.out_c;
  int64_t t = i / w.out_c;
  const int64_t ox = t % w.out_w;
  t /= w.out_w;
  return {t / w.out_h, t % w.out_h, ox, c};
}

// f(index into x) for each in-bounds position of output o's window, in row-major order.
template <typename F>
__device__ void ForEachInWindow(const Window2D& w, const WindowOutput& o, F&& f) {
  const int64_t y0 = o.oy * w.stride_h - w.pad_top, x0 = o.ox * w.stride_w - w.pad_left;
  for (int64_t ky = 0; ky < w.kernel_h; ++ky) {
    const int64_t y = y0 + ky * w.dilation_h;
    if (y < 0 || y >= w.in_h) continue;
    for (int64_t kx = 0; kx < w.kernel_w; ++kx) {
      const int64_t xx = x0 + kx * w.dilation_w;
      if (xx < 0 || xx >= w.in_w) continue;
      f(((o.b * w.in_h + y) * w.in_w + xx) * w.in_c + o.c);
    }
  }
}

// The index into x of the first largest in-bounds position of output o's window (-1: none in
// bounds), and its value.
__device__ int64_t WindowArgMax(const Window2D& w, CPtr x, const WindowOutput& o, float* value) {
  int64_t best = -1;
  float best_value = 0;
  ForEachInWindow(w, o, [&](int64_t at) {
    const float v = x[at];
    if (best < 0 || v > best_value) {
      best = at;
      best_value = v;
    }
  });
  *value = best_value;
  return best;
}

// The in-bounds positions of window (oy, ox).
__device__ int64_t WindowCount(const Window2D& w, int64_t oy, int64_t ox) {
  const int64_t y0 = oy * w.stride_h - w.pad_top, x0 = ox * w.stride_w - w.pad_left;
  int64_t rows = 0, cols = 0;
  for (int64_t ky = 0; ky < w.kernel_h; ++ky) {
    const int64_t y = y0 + ky * w.dilation_h;
    rows += y >= 0 && y < w.in_h ? 1 : 0;
  }
  for (int64_t kx = 0; kx < w.kernel_w; ++kx) {
    const int64_t xx = x0 + kx * w.dilation_w;
    cols += xx >= 0 && xx < w.in_w ? 1 : 0;
  }
  return rows * cols;
}

__global__ void PoolKernel(Window2D w, int64_t batch, bool max, CPtr x, Ptr out) {
  const int64_t n = batch * w.out_h * w.out_w * w.out_c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const WindowOutput o = WindowOutputAt(w, i);
    if (max) {
      float value;
      WindowArgMax(w, x, o, &value);
      out[i] = value;
      continue;
    }
    float sum = 0;
    ForEachInWindow(w, o, [&](int64_t at) { sum += x[at]; });
    const int64_t count = WindowCount(w, o.oy, o.ox);
    out[i] = count > 0 ? sum / static_cast<float>(count) : 0.0f;
  }
}

// One thread per input element: the windows that hold it, in order.
__global__ void PoolBackwardKernel(Window2D w, int64_t batch, bool max, CPtr x, CPtr grad_out,
                                   Ptr grad_x, bool accumulate) {
  const int64_t n = batch * w.in_h * w.in_w * w.in_c;
  const int64_t span_h = (w.kernel_h - 1) * w.dilation_h, span_w = (w.kernel_w - 1) * w.dilation_w;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % w.in_c;
    int64_t t = i / w.in_c;
    const int64_t ix = t % w.in_w;
    t /= w.in_w;
    const int64_t iy = t % w.in_h, b = t / w.in_h;
    const int64_t oy_first = MaxOf(int64_t{0}, CeilDiv(iy + w.pad_top - span_h, w.stride_h));
    const int64_t oy_last = MinOf(w.out_h - 1, FloorDiv(iy + w.pad_top, w.stride_h));
    const int64_t ox_first = MaxOf(int64_t{0}, CeilDiv(ix + w.pad_left - span_w, w.stride_w));
    const int64_t ox_last = MinOf(w.out_w - 1, FloorDiv(ix + w.pad_left, w.stride_w));
    float g = 0;
    for (int64_t oy = oy_first; oy <= oy_last; ++oy) {
      const int64_t dy = iy + w.pad_top - oy * w.stride_h;
      if (dy % w.dilation_h != 0) continue;
      for (int64_t ox = ox_first; ox <= ox_last; ++ox) {
        const int64_t dx = ix + w.pad_left - ox * w.stride_w;
        if (dx % w.dilation_w != 0) continue;
        const float upstream = grad_out[((b * w.out_h + oy) * w.out_w + ox) * w.out_c + c];
        if (max) {
          float value;
          if (WindowArgMax(w, x, {b, oy, ox, c}, &value) == i) g += upstream;
        } else {
          g += upstream / static_cast<float>(WindowCount(w, oy, ox));
        }
      }
    }
    grad_x[i] = accumulate ? grad_x[i] + g : g;
  }
}

// The pooling gradient for windows that do not overlap (a stride at least the window's span,
// as pool_size 2 with the default strides): one thread per window routes its gradient to the
// window's inputs, which no other window holds, so the writes neither race nor depend on order.
// grad_x is zeroed first unless accumulating (positions in no window keep 0).
__global__ void PoolScatterKernel(Window2D w, int64_t batch, bool max, CPtr x, CPtr grad_out,
                                  Ptr grad_x) {
  const int64_t n = batch * w.out_h * w.out_w * w.out_c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const WindowOutput o = WindowOutputAt(w, i);
    const float upstream = grad_out[i];
    if (max) {
      float value;
      const int64_t best = WindowArgMax(w, x, o, &value);
      if (best >= 0) grad_x[best] += upstream;
      continue;
    }
    const int64_t count = WindowCount(w, o.oy, o.ox);
    if (count == 0) continue;
    const float share = upstream / static_cast<float>(count);
    ForEachInWindow(w, o, [&](int64_t at) { grad_x[at] += share; });
  }
}

bool WindowsOverlap(const Window2D& w) {
  return w.stride_h < (w.kernel_h - 1) * w.dilation_h + 1 ||
         w.stride_w < (w.kernel_w - 1) * w.dilation_w + 1;
}

// PoolBackwardKernel, or PoolScatterKernel where the windows do not overlap.
absl::Status PoolBackward(const Window2D& w, int64_t batch, bool max, CPtr x, CPtr grad_out,
                          Ptr grad_x, bool accumulate, cudaStream_t stream) {
  const int64_t n = batch * w.in_h * w.in_w * w.in_c;
  if (n <= 0) return absl::OkStatus();
  if (!WindowsOverlap(w)) {
    if (!accumulate) {
      STRATUM_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(grad_x.p, 0, static_cast<size_t>(n * SizeOf(grad_x.dtype)), stream));
    }
    const int64_t windows = batch * w.out_h * w.out_w * w.out_c;
    if (windows <= 0) return absl::OkStatus();
    PoolScatterKernel<<<Blocks(windows), kThreads, 0, stream>>>(w, batch, max, x, grad_out, grad_x);
    STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("PoolScatterKernel");
    return absl::OkStatus();
  }
  PoolBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(w, batch, max, x, grad_out, grad_x,
                                                         accumulate);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("PoolBackwardKernel");
  return absl::OkStatus();
}

constexpr int kSumLanes = 8;  // row lanes of a column-sum block (32 columns wide)

// Block (32, kSumLanes), grid (column tiles, row chunks): each chunk's sums into `partial`
// [chunks, terms * cols].
__global__ void ColumnPartialKernel(ColumnTerm term, CPtr a, CPtr b, CPtr mean, int64_t rows,
                                    int64_t cols, int64_t rows_per_chunk, float* partial) {
  __shared__ float shared[2][kSumLanes][kColumnTile + 1];
  const int64_t c = blockIdx.x * int64_t{kColumnTile} + threadIdx.x;
  const int64_t first = blockIdx.y * rows_per_chunk;
  const int64_t last = MinOf(rows, first + rows_per_chunk);
  float s0 = 0, s1 = 0;
  if (c < cols) {
    const float m = mean != nullptr ? mean[c] : 0.0f;
    for (int64_t r = first + threadIdx.y; r < last; r += kSumLanes) {
      const float v = a[r * cols + c];
      switch (term) {
        case ColumnTerm::kValue:
          s0 += v;
          break;
        case ColumnTerm::kSquaredDeviation:
          s0 += (v - m) * (v - m);
          break;
        case ColumnTerm::kGradSums:
          s0 += v;
          s1 += v * (b[r * cols + c] - m);
          break;
      }
    }
  }
  shared[0][threadIdx.y][threadIdx.x] = s0;
  shared[1][threadIdx.y][threadIdx.x] = s1;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float t0 = 0, t1 = 0;
  for (int lane = 0; lane < kSumLanes; ++lane) {
    t0 += shared[0][lane][threadIdx.x];
    t1 += shared[1][lane][threadIdx.x];
  }
  const int64_t terms = term == ColumnTerm::kGradSums ? 2 : 1;
  float* chunk = partial + blockIdx.y * terms * cols;
  chunk[c] = t0;
  if (terms == 2) chunk[cols + c] = t1;
}

// One warp per column: the lanes take the chunks in turn and add in a fixed order
// (deterministic), so a column of many chunks is not one thread's long chain of loads.
__global__ void ColumnFinishKernel(ColumnSumArgs args, const float* partial, int64_t chunks) {
  const int64_t c = blockIdx.x * int64_t{blockDim.y} + threadIdx.y;
  const int64_t cols = args.cols;
  if (c >= cols) return;
  const int64_t terms = args.term == ColumnTerm::kGradSums ? 2 : 1;
  float s0 = 0, s1 = 0;
  for (int64_t k = threadIdx.x; k < chunks; k += 32) {
    s0 += partial[k * terms * cols + c];
    if (terms == 2) s1 += partial[k * terms * cols + cols + c];
  }
  s0 = WarpSum(s0);
  s1 = WarpSum(s1);
  if (threadIdx.x != 0) return;
  if (terms == 1) {
    args.out[c] = args.accumulate ? args.out[c] + s0 : s0;
    return;
  }
  args.out[c] = s0;
  args.out[cols + c] = s1;
  if (args.grad_gamma != nullptr) args.grad_gamma[c] = s1 * rsqrtf(args.variance[c] + args.epsilon);
  if (args.grad_beta != nullptr) args.grad_beta[c] = s0;
}

__global__ void BatchNormKernel(CPtr x, int64_t n, int64_t width, CPtr mean, CPtr variance,
                                float epsilon, CPtr gamma, CPtr beta, Ptr y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % width;
    float scale = rsqrtf(variance[c] + epsilon);
    if (gamma != nullptr) scale *= gamma[c];
    float shift = -mean[c] * scale;
    if (beta != nullptr) shift += beta[c];
    y[i] = x[i] * scale + shift;
  }
}

// dx = k * dy + a * x + b per channel (see CpuDevice's BatchNormBackward).
__global__ void BatchNormBackwardKernel(CPtr dy, CPtr x, int64_t n, int64_t width, CPtr mean,
                                        CPtr variance, float epsilon, CPtr gamma, CPtr sums,
                                        float per_row, Ptr dx, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % width;
    const float inv_std = rsqrtf(variance[c] + epsilon);
    const float k = gamma != nullptr ? inv_std * gamma[c] : inv_std;
    float a = 0, b = 0;
    if (sums != nullptr) {
      a = -k * (inv_std * inv_std) * sums[width + c] * per_row;
      b = -k * sums[c] * per_row - a * mean[c];
    }
    const float v = dy[i] * k + x[i] * a + b;
    dx[i] = accumulate ? dx[i] + v : v;
  }
}

__global__ void KernelLayoutKernel(CPtr in, Ptr out, int64_t positions, int64_t in_c, int64_t out_c,
                                   bool to_hwio) {
  const int64_t n = positions * in_c * out_c;
  for (int64_t ohwi = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; ohwi < n;
       ohwi += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = ohwi % in_c;
    const int64_t t = ohwi / in_c;
    const int64_t p = t % positions, o = t / positions;
    const int64_t hwio = (p * in_c + i) * out_c + o;
    if (to_hwio) {
      out[hwio] = in[ohwi];
    } else {
      out[ohwi] = in[hwio];
    }
  }
}

__global__ void ShiftCopyKernel(CPtr in, int64_t batch, int64_t in_h, int64_t in_w,
                                int64_t channels, int64_t top, int64_t left, Ptr out, int64_t out_h,
                                int64_t out_w) {
  const int64_t n = batch * out_h * out_w * channels;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % channels;
    int64_t t = i / channels;
    const int64_t x = t % out_w - left;
    t /= out_w;
    const int64_t y = t % out_h - top, b = t / out_h;
    out[i] = y >= 0 && y < in_h && x >= 0 && x < in_w
                 ? in[((b * in_h + y) * in_w + x) * channels + c]
                 : 0.0f;
  }
}

// ---- Embeddings ----

// An id word (stratum/device/device.h's IdWord: an int32's bits in a float) as a row.
__device__ int64_t EmbeddingRowOf(float word, int64_t rows) {
  const int64_t id = __float_as_int(word);
  return id >= 0 && id < rows ? id : -1;
}

__global__ void EmbeddingLookupKernel(CPtr ids, int64_t count, CPtr table, int64_t rows,
                                      int64_t width, Ptr out) {
  const int64_t n = count * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = EmbeddingRowOf(ids[i / width], rows);
    out[i] = row >= 0 ? table[row * width + i % width] : 0.0f;
  }
}

__global__ void EmbeddingPositionsKernel(CPtr ids, int64_t count, const int64_t* rows,
                                         int64_t num_rows, Ptr positions) {
  const int64_t end = num_rows > 0 ? rows[num_rows - 1] + 1 : 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t id = EmbeddingRowOf(ids[i], end);
    int64_t low = 0, high = num_rows;  // the first row >= id in [low, high)
    while (low < high) {
      const int64_t mid = low + (high - low) / 2;
      if (rows[mid] < id) {
        low = mid + 1;
      } else {
        high = mid;
      }
    }
    positions[i] =
        __int_as_float(id >= 0 && low < num_rows && rows[low] == id ? static_cast<int>(low) : -1);
  }
}

// keys[i] = the row of id i (`rows` for none: sorted last, skipped), positions[i] = i.
__global__ void EmbeddingKeysKernel(CPtr ids, int64_t count, int64_t rows, int32_t* keys,
                                    int32_t* positions) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = EmbeddingRowOf(ids[i], rows);
    keys[i] = static_cast<int32_t>(row >= 0 ? row : rows);
    positions[i] = static_cast<int32_t>(i);
  }
}

// One block per run of equal keys (a row and its ids, sorted by position): threads (x, y) sum
// columns x (then x + blockDim.x, ...) of the run's positions y, y + blockDim.y, ..., then the
// y lanes add in a fixed order. A row that most ids name (a padding id, a frequent word) is
// summed by the whole block, not one thread; the order depends only on the run's length and
// the table's width, so the result is the same in every run.
__global__ void EmbeddingRunSumKernel(const int32_t* unique, const int32_t* run_lengths,
                                      const int32_t* run_starts, const int32_t* num_runs,
                                      const int32_t* positions, int64_t rows, CPtr grad_out,
                                      int64_t width, Ptr grad_table) {
  extern __shared__ float lanes[];  // [blockDim.y][blockDim.x]
  const int run = blockIdx.x;
  if (run >= *num_runs) return;
  const int32_t key = unique[run];
  if (key >= rows) return;  // ids outside the table
  const int64_t start = run_starts[run], length = run_lengths[run];
  for (int64_t c0 = 0; c0 < width; c0 += blockDim.x) {
    const int64_t c = c0 + threadIdx.x;
    float sum = 0;
    if (c < width) {
      // Four positions a lane per round, loaded before they are added: a long run (a row
      // most ids name) is bound by memory latency, not by the additions.
      const int64_t stride = blockDim.y;
      int64_t j = threadIdx.y;
      for (; j + 3 * stride < length; j += 4 * stride) {
        const int32_t* p = positions + start + j;
        const float a = grad_out[static_cast<int64_t>(p[0]) * width + c];
        const float b = grad_out[static_cast<int64_t>(p[stride]) * width + c];
        const float d = grad_out[static_cast<int64_t>(p[2 * stride]) * width + c];
        const float e = grad_out[static_cast<int64_t>(p[3 * stride]) * width + c];
        sum += (a + b) + (d + e);
      }
      for (; j < length; j += stride) {
        sum += grad_out[static_cast<int64_t>(positions[start + j]) * width + c];
      }
    }
    lanes[threadIdx.y * blockDim.x + threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < width) {
      float total = 0;
      for (unsigned y = 0; y < blockDim.y; ++y) total += lanes[y * blockDim.x + threadIdx.x];
      grad_table[key * width + c] = total;
    }
    __syncthreads();
  }
}

__global__ void AverageStepsKernel(CPtr x, int64_t batch, int64_t steps, int64_t width, Ptr out) {
  const int64_t n = batch * width;
  const float scale = 1.0f / static_cast<float>(steps);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / width, c = i % width;
    float sum = 0;
    for (int64_t s = 0; s < steps; ++s) sum += x[(b * steps + s) * width + c];
    out[i] = sum * scale;
  }
}

__global__ void AverageStepsGradKernel(CPtr grad_out, int64_t batch, int64_t steps, int64_t width,
                                       Ptr grad_x, bool accumulate) {
  const int64_t n = batch * steps * width;
  const float scale = 1.0f / static_cast<float>(steps);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % width, b = i / (steps * width);
    const float v = grad_out[b * width + c] * scale;
    grad_x[i] = accumulate ? grad_x[i] + v : v;
  }
}

// The bits of the sort keys: enough for `rows` itself (ids outside the table).
int KeyBits(int64_t rows) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= rows) ++bits;
  return bits;
}

constexpr size_t kScratchAlign = 256;

size_t Aligned(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// The cub passes' temporary storage for `count` ids: the sort, the run-length encoding and
// the scan of the run lengths share it.
size_t CubTempBytes(int64_t count, int64_t rows) {
  const int n = static_cast<int>(count);
  const int32_t* in = nullptr;
  int32_t* out = nullptr;
  size_t sort = 0, encode = 0, scan = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort, in, out, in, out, n, 0, KeyBits(rows));
  cub::DeviceRunLengthEncode::Encode(nullptr, encode, in, out, out, out, n);
  cub::DeviceScan::ExclusiveSum(nullptr, scan, in, out, n);
  return std::max({sort, encode, scan});
}

// The int32 arrays of EmbeddingGrad's scratch, `count` each (num_runs: one).
enum EmbeddingArray {
  kKeys,
  kPositions,
  kSortedKeys,
  kSortedPositions,
  kUnique,
  kRunLengths,
  kRunStarts,
  kNumRuns,
  kArrays
};

}  // namespace

absl::Status GatherRescale(const uint8_t* images, const uint8_t* labels, int64_t row_size,
                           const int32_t* order, const StepCounters* counters, int64_t stride,
                           int64_t offset, int rows, float scale, bool ids, Ptr x,
                           int32_t* labels_out, cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  GatherKernel<<<rows, 128, 0, stream>>>(images, labels, row_size, order, counters, stride, offset,
                                         scale, ids, x, labels_out);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("GatherKernel");
  return absl::OkStatus();
}

absl::Status BiasActivation(Act act, Ptr out, CPtr bias, int64_t rows, int64_t cols, Ptr logits,
                            cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  if (act == Act::kSoftmax) {
    const dim3 block(32, kRowsPerBlock);
    BiasSoftmaxKernel<<<Blocks(rows, kRowsPerBlock), block, 0, stream>>>(out, bias, logits, rows,
                                                                         cols);
    STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("BiasSoftmaxKernel");
    return absl::OkStatus();
  }
  if (act == Act::kLinear && bias == nullptr) return absl::OkStatus();
  if (cols % 2 == 0 && PairAligned(out) && PairAligned(bias)) {
    BiasActivationPairsKernel<<<Blocks(rows * cols / 2), kThreads, 0, stream>>>(act, out, bias,
                                                                                rows * cols, cols);
    STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("BiasActivationPairsKernel");
    return absl::OkStatus();
  }
  BiasActivationKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(act, out, bias, rows * cols,
                                                                     cols);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("BiasActivationKernel");
  return absl::OkStatus();
}

absl::Status ActivationBackward(Act act, CPtr out, Ptr g, int64_t rows, int64_t cols,
                                cudaStream_t stream) {
  if (rows <= 0 || act == Act::kLinear) return absl::OkStatus();
  if (act == Act::kSoftmax) {
    const dim3 block(32, kRowsPerBlock);
    SoftmaxBackwardKernel<<<Blocks(rows, kRowsPerBlock), block, 0, stream>>>(out, g, rows, cols);
    STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("SoftmaxBackwardKernel");
    return absl::OkStatus();
  }
  if ((rows * cols) % 2 == 0 && PairAligned(out) && PairAligned(g)) {
    ActivationBackwardPairsKernel<<<Blocks(rows * cols / 2), kThreads, 0, stream>>>(act, out, g,
                                                                                    rows * cols);
    STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("ActivationBackwardPairsKernel");
    return absl::OkStatus();
  }
  ActivationBackwardKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(act, out, g, rows * cols);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("ActivationBackwardKernel");
  return absl::OkStatus();
}

absl::Status ActivationBackwardColumnSum(Act act, CPtr out, Ptr g, int64_t rows, int64_t cols,
                                         Ptr column_sums, cudaStream_t stream, bool accumulate) {
  if (act == Act::kSoftmax) {
    return absl::InvalidArgumentError(
        "ActivationBackwardColumnSum takes elementwise activations; use ActivationBackward for "
        "softmax");
  }
  const dim3 block(kColumnTile, kRowLanes);
  BackwardColumnSumKernel<<<Blocks(cols, kColumnTile), block, 0, stream>>>(act, out, g, rows, cols,
                                                                           column_sums, accumulate);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("BackwardColumnSumKernel");
  return absl::OkStatus();
}

absl::Status SparseCrossEntropy(CrossEntropyInput input, Ptr values, CPtr bias, Ptr probs,
                                const int32_t* labels, int64_t rows, int classes, float scale,
                                Ptr grad, MetricSums* sums, StepCounters* counters,
                                cudaStream_t stream, const LossScaleState* loss_scale) {
  const dim3 block(32, kRowsPerBlock);
  SparseCrossEntropyKernel<<<Blocks(rows, kRowsPerBlock), block, 0, stream>>>(
      input, values, bias, probs, labels, rows, classes, scale, grad, sums, counters, loss_scale);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("SparseCrossEntropyKernel");
  return absl::OkStatus();
}

absl::Status DropoutForward(CPtr in, Ptr out, Ptr mask, int64_t n, float rate, uint64_t seed,
                            const StepCounters* counters, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  DropoutKernel<<<Blocks(n), kThreads, 0, stream>>>(in, out, mask, n, rate, seed, counters);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("DropoutKernel");
  return absl::OkStatus();
}

absl::Status Multiply(Ptr g, CPtr mask, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  MultiplyKernel<<<Blocks(n), kThreads, 0, stream>>>(g, mask, n);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("MultiplyKernel");
  return absl::OkStatus();
}

absl::Status AddInto(Ptr dst, CPtr src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  AddIntoKernel<<<Blocks(n), kThreads, 0, stream>>>(dst, src, n);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("AddIntoKernel");
  return absl::OkStatus();
}

absl::Status Scale(Ptr dst, float factor, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(dst, factor, n);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("ScaleKernel");
  return absl::OkStatus();
}

absl::Status Axpby(float alpha, CPtr x, Ptr out, int64_t n, bool accumulate, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  if (n % 2 == 0 && PairAligned(x) && PairAligned(out)) {
    AxpbyPairsKernel<<<Blocks(n / 2), kThreads, 0, stream>>>(alpha, x, out, n, accumulate);
    STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("AxpbyPairsKernel");
    return absl::OkStatus();
  }
  AxpbyKernel<<<Blocks(n), kThreads, 0, stream>>>(alpha, x, out, n, accumulate);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("AxpbyKernel");
  return absl::OkStatus();
}

absl::Status MultiplyInto(CPtr x, CPtr y, Ptr out, int64_t n, bool accumulate,
                          cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  MultiplyIntoKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, out, n, accumulate);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("MultiplyIntoKernel");
  return absl::OkStatus();
}

absl::Status AddBlocks(CPtr x, int64_t x_stride, Ptr out, int64_t out_stride, int64_t rows,
                       int64_t width, cudaStream_t stream, bool accumulate) {
  if (rows <= 0 || width <= 0) return absl::OkStatus();
  AddBlocksKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(x, x_stride, out, out_stride, rows,
                                                                 width, accumulate);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("AddBlocksKernel");
  return absl::OkStatus();
}

absl::Status ApplyOptimizer(const OptimizerParams& params, float* variables, const float* gradients,
                            float* slot0, float* slot1, float* slot2, int64_t n, int64_t total,
                            const StepCounters* counters, const LossScaleState* skip,
                            cudaStream_t stream) {
  if (total <= 0) return absl::OkStatus();
  OptimizerKernel<<<Blocks(std::max(n, total - n)), kThreads, 0, stream>>>(
      params, variables, gradients, slot0, slot1, slot2, n, total, counters, skip);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("OptimizerKernel");
  return absl::OkStatus();
}

absl::Status UnscaleGradients(float* g, int64_t scaled, int64_t n, LossScaleState* state,
                              cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  UnscaleKernel<<<Blocks(n), kThreads, 0, stream>>>(g, scaled, n, state);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("UnscaleKernel");
  return absl::OkStatus();
}

absl::Status UpdateLossScale(LossScaleState* state, int growth_steps, StepCounters* counters,
                             cudaStream_t stream) {
  UpdateLossScaleKernel<<<1, 1, 0, stream>>>(state, growth_steps, counters);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("UpdateLossScaleKernel");
  return absl::OkStatus();
}

absl::Status MaxPool2D(const Window2D& w, int64_t batch, CPtr x, Ptr out, cudaStream_t stream) {
  const int64_t n = batch * w.out_h * w.out_w * w.out_c;
  if (n <= 0) return absl::OkStatus();
  PoolKernel<<<Blocks(n), kThreads, 0, stream>>>(w, batch, true, x, out);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("PoolKernel");
  return absl::OkStatus();
}

absl::Status AvgPool2D(const Window2D& w, int64_t batch, CPtr x, Ptr out, cudaStream_t stream) {
  const int64_t n = batch * w.out_h * w.out_w * w.out_c;
  if (n <= 0) return absl::OkStatus();
  PoolKernel<<<Blocks(n), kThreads, 0, stream>>>(w, batch, false, x, out);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("PoolKernel");
  return absl::OkStatus();
}

absl::Status MaxPool2DBackward(const Window2D& w, int64_t batch, CPtr x, CPtr grad_out, Ptr grad_x,
                               bool accumulate, cudaStream_t stream) {
  return PoolBackward(w, batch, true, x, grad_out, grad_x, accumulate, stream);
}

absl::Status AvgPool2DBackward(const Window2D& w, int64_t batch, CPtr grad_out, Ptr grad_x,
                               bool accumulate, cudaStream_t stream) {
  return PoolBackward(w, batch, false, nullptr, grad_out, grad_x, accumulate, stream);
}

absl::Status ColumnSums(const ColumnSumArgs& args, float* partial, int64_t partial_floats,
                        cudaStream_t stream) {
  if (args.cols <= 0) return absl::OkStatus();
  const int64_t terms = args.term == ColumnTerm::kGradSums ? 2 : 1;
  const int64_t most_chunks = std::min<int64_t>(partial_floats / (terms * args.cols), 1024);
  if (most_chunks < 1) {
    return absl::InternalError(absl::StrCat("ColumnSums of ", args.cols,
                                            " columns needs more than its scratch of ",
                                            partial_floats, " floats"));
  }
  // About 1024 rows per chunk: enough blocks to fill the GPU, few partial sums to add.
  const int64_t chunks = std::clamp<int64_t>((args.rows + 1023) / 1024, 1, most_chunks);
  const int64_t rows_per_chunk = std::max<int64_t>((args.rows + chunks - 1) / chunks, 1);
  const dim3 grid(static_cast<unsigned>(Blocks(args.cols, kColumnTile)),
                  static_cast<unsigned>(chunks));
  ColumnPartialKernel<<<grid, dim3(kColumnTile, kSumLanes), 0, stream>>>(
      args.term, args.a, args.b, args.mean, args.rows, args.cols, rows_per_chunk, partial);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("ColumnPartialKernel");
  ColumnFinishKernel<<<Blocks(args.cols, 8), dim3(32, 8), 0, stream>>>(args, partial, chunks);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("ColumnFinishKernel");
  return absl::OkStatus();
}

absl::Status BatchNorm(CPtr x, int64_t rows, int64_t width, CPtr mean, CPtr variance, float epsilon,
                       CPtr gamma, CPtr beta, Ptr y, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n <= 0) return absl::OkStatus();
  BatchNormKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, width, mean, variance, epsilon, gamma,
                                                      beta, y);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("BatchNormKernel");
  return absl::OkStatus();
}

absl::Status BatchNormBackward(CPtr dy, CPtr x, int64_t rows, int64_t width, CPtr mean,
                               CPtr variance, float epsilon, CPtr gamma, CPtr sums, int64_t count,
                               Ptr dx, bool accumulate, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n <= 0) return absl::OkStatus();
  const float per_row = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
  BatchNormBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(
      dy, x, n, width, mean, variance, epsilon, gamma, sums, per_row, dx, accumulate);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("BatchNormBackwardKernel");
  return absl::OkStatus();
}

absl::Status KernelToOhwi(CPtr hwio, int64_t positions, int64_t in_c, int64_t out_c, Ptr ohwi,
                          cudaStream_t stream) {
  const int64_t n = positions * in_c * out_c;
  if (n <= 0) return absl::OkStatus();
  KernelLayoutKernel<<<Blocks(n), kThreads, 0, stream>>>(hwio, ohwi, positions, in_c, out_c, false);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("KernelLayoutKernel");
  return absl::OkStatus();
}

absl::Status KernelToHwio(CPtr ohwi, int64_t positions, int64_t in_c, int64_t out_c, Ptr hwio,
                          cudaStream_t stream) {
  const int64_t n = positions * in_c * out_c;
  if (n <= 0) return absl::OkStatus();
  KernelLayoutKernel<<<Blocks(n), kThreads, 0, stream>>>(ohwi, hwio, positions, in_c, out_c, true);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("KernelLayoutKernel");
  return absl::OkStatus();
}

absl::Status ShiftCopy2D(CPtr in, int64_t batch, int64_t in_h, int64_t in_w, int64_t channels,
                         int64_t top, int64_t left, Ptr out, int64_t out_h, int64_t out_w,
                         cudaStream_t stream) {
  const int64_t n = batch * out_h * out_w * channels;
  if (n <= 0) return absl::OkStatus();
  ShiftCopyKernel<<<Blocks(n), kThreads, 0, stream>>>(in, batch, in_h, in_w, channels, top, left,
                                                      out, out_h, out_w);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("ShiftCopyKernel");
  return absl::OkStatus();
}

absl::Status EmbeddingLookup(CPtr ids, int64_t count, CPtr table, int64_t rows, int64_t width,
                             Ptr out, cudaStream_t stream) {
  const int64_t n = count * width;
  if (n <= 0) return absl::OkStatus();
  EmbeddingLookupKernel<<<Blocks(n), kThreads, 0, stream>>>(ids, count, table, rows, width, out);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("EmbeddingLookupKernel");
  return absl::OkStatus();
}

absl::Status EmbeddingPositions(CPtr ids, int64_t count, const int64_t* rows, int64_t num_rows,
                                Ptr positions, cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  EmbeddingPositionsKernel<<<Blocks(count), kThreads, 0, stream>>>(ids, count, rows, num_rows,
                                                                   positions);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("EmbeddingPositionsKernel");
  return absl::OkStatus();
}

size_t EmbeddingGradScratchBytes(int64_t count, int64_t rows) {
  return kArrays * Aligned(static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(int32_t)) +
         Aligned(CubTempBytes(count, rows));
}

absl::Status EmbeddingGrad(CPtr ids, int64_t count, CPtr grad_out, int64_t rows, int64_t width,
                           Ptr grad_table, void* scratch, size_t scratch_bytes,
                           cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return absl::OkStatus();
  if (rows >= (int64_t{1} << 31) - 1 || count >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("an embedding table of ", rows, " rows looked up ", count,
                     " times in one step is past the GPU kernel's 2^31 - 1 rows and ids"));
  }
  STRATUM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
      grad_table.p, 0, static_cast<size_t>(rows * width * SizeOf(grad_table.dtype)), stream));
  if (count <= 0) return absl::OkStatus();
  if (scratch_bytes < EmbeddingGradScratchBytes(count, rows)) {
    return absl::InternalError(absl::StrCat("EmbeddingGrad of ", count, " ids given ",
                                            scratch_bytes, " bytes of scratch, fewer than ",
                                            EmbeddingGradScratchBytes(count, rows)));
  }
  const size_t array = Aligned(static_cast<size_t>(count) * sizeof(int32_t));
  auto* base = static_cast<char*>(scratch);
  auto at = [&](EmbeddingArray a) { return reinterpret_cast<int32_t*>(base + a * array); };
  void* temp = base + kArrays * array;
  const size_t temp_bytes = CubTempBytes(count, rows);
  const int n = static_cast<int>(count);
  EmbeddingKeysKernel<<<Blocks(count), kThreads, 0, stream>>>(ids, count, rows, at(kKeys),
                                                              at(kPositions));
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("EmbeddingKeysKernel");
  size_t bytes = temp_bytes;
  STRATUM_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortPairs(temp, bytes, at(kKeys), at(kSortedKeys), at(kPositions),
                                      at(kSortedPositions), n, 0, KeyBits(rows), stream));
  // The runs of equal rows, and where each starts among the sorted pairs.
  STRATUM_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(at(kRunLengths), 0, static_cast<size_t>(count) * sizeof(int32_t), stream));
  bytes = temp_bytes;
  STRATUM_CUDA_RETURN_IF_ERROR(cub::DeviceRunLengthEncode::Encode(
      temp, bytes, at(kSortedKeys), at(kUnique), at(kRunLengths), at(kNumRuns), n, stream));
  bytes = temp_bytes;
  STRATUM_CUDA_RETURN_IF_ERROR(
      cub::DeviceScan::ExclusiveSum(temp, bytes, at(kRunLengths), at(kRunStarts), n, stream));
  // Columns across x (a power of two up to 32), positions across y: 1024 threads.
  unsigned x = 1;
  while (x < 32 && x < width) x *= 2;
  const dim3 block(x, 1024 / x);
  const int64_t most_runs = std::min<int64_t>(count, rows + 1);
  EmbeddingRunSumKernel<<<static_cast<unsigned>(most_runs), block, 1024 * sizeof(float), stream>>>(
      at(kUnique), at(kRunLengths), at(kRunStarts), at(kNumRuns), at(kSortedPositions), rows,
      grad_out, width, grad_table);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("EmbeddingRunSumKernel");
  return absl::OkStatus();
}

absl::Status AverageSteps(CPtr x, int64_t batch, int64_t steps, int64_t width, Ptr out,
                          cudaStream_t stream) {
  const int64_t n = batch * width;
  if (n <= 0 || steps <= 0) return absl::OkStatus();
  AverageStepsKernel<<<Blocks(n), kThreads, 0, stream>>>(x, batch, steps, width, out);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("AverageStepsKernel");
  return absl::OkStatus();
}

absl::Status AverageStepsGrad(CPtr grad_out, int64_t batch, int64_t steps, int64_t width,
                              Ptr grad_x, bool accumulate, cudaStream_t stream) {
  const int64_t n = batch * steps * width;
  if (n <= 0) return absl::OkStatus();
  AverageStepsGradKernel<<<Blocks(n), kThreads, 0, stream>>>(grad_out, batch, steps, width, grad_x,
                                                             accumulate);
  STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED("AverageStepsGradKernel");
  return absl::OkStatus();
}

}  // namespace stratum::cuda
