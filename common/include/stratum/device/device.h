// Device: the one interface through which a layer's math runs, so that the same layer code
// trains on the CPU and on a GPU. Every pointer is memory of the device (host memory for
// the CPU); a layer never reads or writes it directly. Matrices are row-major float32.
// Methods queue or run the operation; on the CPU they run before they return.
//
// Where a method takes `accumulate`, false overwrites the output and true adds to it: the
// model's backward pass adds the gradients of a tensor that feeds several layers.
//
// CpuDevice() is the CPU implementation, on Eigen and oneDNN (convolutions, poolings): stateless,
// so one instance serves every thread. A CUDA implementation (cuBLAS and the kernels of
// common/cuda/) is the GPU issue's.
//
// Thread safety: the methods of a Device are const and may run from several threads at
// once on distinct outputs.
#pragma once

#include <climits>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

namespace stratum {

// Keras' activations that Stratum's layers apply.
enum class ActivationKind { kLinear, kRelu, kSigmoid, kTanh, kSoftmax };

// Where a layer draws its random numbers (dropout masks): one stream per replica, reseeded
// by the training loop before each step so that a resumed run draws the same masks.
using RandomStream = std::mt19937_64;

// A uniform float in [0, 1) from 24 random bits: the same on every platform, so a seed
// gives the same initial values and dropout masks everywhere.
inline float Uniform01(RandomStream& rng) {
  return static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);
}

// Ids in the model's buffers. Every buffer is of 32-bit floats, and a tensor of ids (an
// input that takes ids, an IntegerLookup's indices, an Embedding's positions among given
// rows) keeps each id as the bits of an int32 in its float word: exact to 2^31 - 1, where a
// float's value is exact to 2^24 only. Such words are moved, never computed with (many are
// denormals or NaNs as floats). kNoId is the word of a value no int32 holds (it names no row).
inline constexpr int32_t kNoId = INT32_MIN;
// (memcpy, not std::bit_cast: nvcc compiles this header as C++17.)
inline float IdWord(int64_t id) {
  const int32_t value = id > kNoId && id <= INT32_MAX ? static_cast<int32_t>(id) : kNoId;
  float word;
  std::memcpy(&word, &value, sizeof word);
  return word;
}
inline int32_t IdOfWord(float word) {
  int32_t id;
  std::memcpy(&id, &word, sizeof id);
  return id;
}
// The id word of a float value, cast as TensorFlow casts an Embedding's float input (the
// integer part); kNoId for NaN and values no int32 holds.
inline float IdWordOfValue(float value) {
  return value > -2147483648.0f && value < 2147483648.0f ? IdWord(static_cast<int64_t>(value))
                                                         : IdWord(kNoId);
}

// The row an id word names in a table of `rows`, or -1 outside [0, rows).
inline int64_t EmbeddingRow(float word, int64_t rows) {
  const int32_t id = IdOfWord(word);
  return id >= 0 && id < rows ? id : -1;
}

// The geometry of a 2-D window operation (convolution, pooling) on channels-last batches:
// x [batch, in_h, in_w, in_c] -> out [batch, out_h, out_w, out_c]. Padding is explicit (Keras'
// "same" becomes top/left/bottom/right amounts); dilation 1 is none.
struct Window2D {
  int64_t in_h = 0, in_w = 0, in_c = 0;
  int64_t out_h = 0, out_w = 0, out_c = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // "CPU", "GPU:0".
  virtual std::string name() const = 0;

  // c[m, n] (+)= op(a) * op(b), where op(a) is [m, k] (a stored [k, m] when transpose_a)
  // and op(b) is [k, n] (b stored [n, k] when transpose_b).
  virtual void MatMul(const float* a, bool transpose_a, const float* b, bool transpose_b, int64_t m,
                      int64_t n, int64_t k, float* c, bool accumulate) const = 0;
  // x[r, :] += bias for every row of x [rows, width].
  virtual void AddBias(float* x, const float* bias, int64_t rows, int64_t width) const = 0;
  // out[width] (+)= the sum of the rows of x [rows, width] (a bias gradient).
  virtual void SumRows(const float* x, int64_t rows, int64_t width, float* out,
                       bool accumulate) const = 0;

  // z += bias (when bias is set), then out = activation(z): a Dense layer's epilogue. For a
  // softmax, z keeps the logits and out must be another buffer; otherwise out may be z.
  virtual void BiasActivation(ActivationKind kind, float* z, const float* bias, float* out,
                              int64_t rows, int64_t width) const = 0;
  // ActivationGrad, then sums = the sums of the rows of g (a bias gradient) when set.
  virtual void ActivationGradSumRows(ActivationKind kind, const float* y, float* g, int64_t rows,
                                     int64_t width, float* sums) const = 0;

  // out = activation(z), rows of `width` (softmax is per row); out may be z.
  virtual void Activation(ActivationKind kind, const float* z, float* out, int64_t rows,
                          int64_t width) const = 0;
  // g <- g * activation'(.) in place, from the activation's output y.
  virtual void ActivationGrad(ActivationKind kind, const float* y, float* g, int64_t rows,
                              int64_t width) const = 0;

  // out (+)= x, n elements.
  virtual void Copy(const float* x, float* out, int64_t n, bool accumulate) const = 0;
  // out (+)= x * y elementwise; out may be x or y when not accumulating.
  virtual void Multiply(const float* x, const float* y, float* out, int64_t n,
                        bool accumulate) const = 0;
  // out (+)= alpha * x; out may be x when not accumulating.
  virtual void Scale(float alpha, const float* x, float* out, int64_t n, bool accumulate) const = 0;
  // out = sum of inputs[0..count), elementwise (count >= 1).
  virtual void Sum(const float* const* inputs, int count, float* out, int64_t n) const = 0;
  // out = 0.
  virtual void Zero(float* out, int64_t n) const = 0;

  // Block copies between row-major arrays: for each of `rows` rows, copies `width`
  // elements from x + r * x_stride to out + r * out_stride (+= when accumulating).
  // Concatenation and splitting along an axis are this.
  virtual void CopyBlocks(const float* x, int64_t x_stride, float* out, int64_t out_stride,
                          int64_t rows, int64_t width, bool accumulate) const = 0;

  // out = the convolution of x with kernel [kernel_h, kernel_w, in_c, out_c] (Keras' layout)
  // plus bias [out_c] when set.
  virtual void Conv2D(const Window2D& w, int64_t batch, const float* x, const float* kernel,
                      const float* bias, float* out) const = 0;
  // grad_x = d/dx of the convolution, from grad_out (overwritten).
  virtual void Conv2DBackwardData(const Window2D& w, int64_t batch, const float* grad_out,
                                  const float* kernel, float* grad_x) const = 0;
  // grad_kernel (and grad_bias, when set) from x and grad_out (overwritten).
  virtual void Conv2DBackwardWeights(const Window2D& w, int64_t batch, const float* x,
                                     const float* grad_out, float* grad_kernel,
                                     float* grad_bias) const = 0;
  // out = the maximum of each window (padding never wins); out_c == in_c.
  virtual void MaxPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const = 0;
  // grad_x (+)= grad_out routed to the first maximum of each window.
  virtual void MaxPool2DBackward(const Window2D& w, int64_t batch, const float* x, const float* out,
                                 const float* grad_out, float* grad_x, bool accumulate) const = 0;

  // out = the mean of each window's positions inside the input (padding does not count).
  virtual void AvgPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const = 0;
  // grad_x (+)= grad_out shared evenly over each window's positions.
  virtual void AvgPool2DBackward(const Window2D& w, int64_t batch, const float* grad_out,
                                 float* grad_x, bool accumulate) const = 0;

  // Batch normalization over the rows of x [rows, width], one channel per column (Keras'
  // axis -1). The statistics come in passes, so that a layer may sum them over replicas
  // between passes: SumRows gives the sums of x, then, with the mean,
  // out[c] = sum over rows of (x[r, c] - mean[c])^2.
  virtual void SumSquaredDeviations(const float* x, const float* mean, int64_t rows, int64_t width,
                                    float* out) const = 0;
  // y = gamma * (x - mean) / sqrt(variance + epsilon) + beta; gamma null is 1, beta null 0.
  virtual void BatchNorm(const float* x, int64_t rows, int64_t width, const float* mean,
                         const float* variance, float epsilon, const float* gamma,
                         const float* beta, float* y) const = 0;
  // The backward pass's sums from dy [rows, width]: sums[0, width) = sum of dy over rows,
  // sums[width, 2 width) = sum of dy * (x - mean); and from them, when set, grad_gamma =
  // sums[width + c] / sqrt(variance + epsilon), grad_beta = sums[c] (overwritten).
  virtual void BatchNormGradSums(const float* dy, const float* x, int64_t rows, int64_t width,
                                 const float* mean, const float* variance, float epsilon,
                                 float* sums, float* grad_gamma, float* grad_beta) const = 0;
  // dx (+)= d/dx of BatchNorm. With `sums` (BatchNormGradSums' over the `count` rows the
  // statistics came from), the batch statistics' own dependence on x counts (training);
  // without, mean and variance are constants (inference: the moving statistics).
  virtual void BatchNormBackward(const float* dy, const float* x, int64_t rows, int64_t width,
                                 const float* mean, const float* variance, float epsilon,
                                 const float* gamma, const float* sums, int64_t count, float* dx,
                                 bool accumulate) const = 0;
  // Embedding lookup: out[i, :] = table[ids[i], :] for the `count` ids (id words: IdWord)
  // of a table [rows, width]; an id outside
  // [0, rows) gives zeros (TensorFlow's GPU behaviour; the CPU refuses such ids in Keras).
  virtual void EmbeddingLookup(const float* ids, int64_t count, const float* table, int64_t rows,
                               int64_t width, float* out) const = 0;
  // The table's gradient (overwritten): grad_table[r, :] = the sum of grad_out[i, :] over
  // the ids i equal to r, in the order of i (deterministic); ids outside the table add nothing.
  virtual void EmbeddingGrad(const float* ids, int64_t count, const float* grad_out, int64_t rows,
                             int64_t width, float* grad_table) const = 0;
  // For ids into a table given as some of its rows (`rows`: `num_rows` sorted, unique row
  // ids, in this device's memory): positions[i] = where in `rows` the row ids[i] names is, or
  // -1 when it is not there (so that a lookup in those rows gives zeros and moves nothing),
  // as id words.
  virtual void EmbeddingPositions(const float* ids, int64_t count, const int64_t* rows,
                                  int64_t num_rows, float* positions) const = 0;
  // out[b, :] = the mean over s of x[b, s, :] for x [batch, steps, width] (Keras'
  // GlobalAveragePooling1D), and its gradient: grad_x[b, s, :] (+)= grad_out[b, :] / steps.
  virtual void AverageSteps(const float* x, int64_t batch, int64_t steps, int64_t width,
                            float* out) const = 0;
  virtual void AverageStepsGrad(const float* grad_out, int64_t batch, int64_t steps, int64_t width,
                                float* grad_x, bool accumulate) const = 0;
  // The same over the steps whose id word step_ids[b, s] is not 0 (the mask of an Embedding
  // with mask_zero): out[b, :] = their mean, zeros when every step of b is padding (where
  // Keras divides 0 by 0), and grad_x[b, s, :] (+)= grad_out[b, :] / their count at those
  // steps, 0 (or nothing added) at the others.
  virtual void AverageMaskedSteps(const float* x, const float* step_ids, int64_t batch,
                                  int64_t steps, int64_t width, float* out) const = 0;
  virtual void AverageMaskedStepsGrad(const float* grad_out, const float* step_ids, int64_t batch,
                                      int64_t steps, int64_t width, float* grad_x,
                                      bool accumulate) const = 0;

  // Inverted dropout: mask = 1 / (1 - rate) with probability 1 - rate, else 0, and
  // out = x * mask. The CPU draws the mask from `rng`; a GPU from a seed drawn from it and
  // a counter on the device, so that a step captured in a CUDA graph draws anew each replay.
  virtual void Dropout(RandomStream& rng, float rate, const float* x, float* out, float* mask,
                       int64_t n) const = 0;
};

// The CPU implementation.
const Device& CpuDevice();

}  // namespace stratum
