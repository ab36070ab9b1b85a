#include "stratum/cuda/cuda_device.h"

#include <cublas_v2.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/convolutions.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/util/status_macros.h"

namespace stratum::cuda {
namespace {

Act ToAct(ActivationKind kind) { return static_cast<Act>(kind); }

// ColumnSums' scratch: 1024 row chunks of 128 channels' two sums, or fewer chunks of more.
constexpr int64_t kPartialFloats = int64_t{1} << 18;

// Below this many rows one pass (a block per 32 columns) is as fast as two.
constexpr int64_t kTwoPassRows = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const CudaDeviceOptions& options) {
  STRATUM_ASSIGN_OR_RETURN(
      DeviceBuffer partial,
      DeviceBuffer::Allocate(*options.allocator, static_cast<size_t>(kPartialFloats) * 4));
  return std::unique_ptr<CudaDevice>(new CudaDevice(options, std::move(partial)));
}

CudaDevice::CudaDevice(const CudaDeviceOptions& options, DeviceBuffer partial)
    : device_(options.device),
      stream_(options.stream),
      cublas_(options.cublas),
      counters_(options.counters),
      allocator_(options.allocator),
      partial_(std::move(partial)),
      convolutions_(std::make_unique<Convolutions>(options.device, options.stream,
                                                   *options.allocator, options.allow_tf32)) {}

CudaDevice::~CudaDevice() = default;

bool CudaDevice::has_pending() const {
  return convolutions_->has_pending() || pending_scratch_ > 0;
}

absl::Status CudaDevice::PreparePending() {
  STRATUM_RETURN_IF_ERROR(convolutions_->PreparePending());
  if (pending_scratch_ > 0) {
    STRATUM_RETURN_IF_ERROR(scratch_.Reserve(*allocator_, pending_scratch_).status());
  }
  pending_scratch_ = 0;
  return absl::OkStatus();
}

void CudaDevice::ColumnSums(const ColumnSumArgs& args) const {
  Record(cuda::ColumnSums(args, partial_.as<float>(), kPartialFloats, stream_));
}

absl::Status CudaDevice::TakeStatus() const { return std::exchange(status_, absl::OkStatus()); }

void CudaDevice::Record(absl::Status status) const {
  if (status_.ok() && !status.ok()) status_ = std::move(status);
}

std::string CudaDevice::name() const { return absl::StrCat("GPU:", device_); }

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
void CudaDevice::MatMul(const float* a, bool transpose_a, const float* b, bool transpose_b,
                        int64_t m, int64_t n, int64_t k, float* c, bool accumulate) const {
  if (m == 0 || n == 0) return;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int lda = static_cast<int>(transpose_a ? m : k);
  const int ldb = static_cast<int>(transpose_b ? k : n);
  Record(STRATUM_CUDA_STATUS_(
      CublasStatus,
      cublasSgemm(cublas_, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                  transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                  static_cast<int>(k), &alpha, b, ldb, a, lda, &beta, c, static_cast<int>(n))));
}

void CudaDevice::AddBias(float* x, const float* bias, int64_t rows, int64_t width) const {
  Record(cuda::BiasActivation(Act::kLinear, x, bias, rows, width, nullptr, stream_));
}

void CudaDevice::SumRows(const float* x, int64_t rows, int64_t width, float* out,
                         bool accumulate) const {
  if (rows >= kTwoPassRows && width <= kPartialFloats) {
    ColumnSums({.term = ColumnTerm::kValue,
                .a = x,
                .rows = rows,
                .cols = width,
                .out = out,
                .accumulate = accumulate});
    return;
  }
  // A linear "activation" leaves x as it is: only the column sums are written.
  Record(ActivationBackwardColumnSum(Act::kLinear, x, const_cast<float*>(x), rows, width, out,
                                     stream_, accumulate));
}

void CudaDevice::BiasActivation(ActivationKind kind, float* z, const float* bias, float* out,
                                int64_t rows, int64_t width) const {
  if (kind == ActivationKind::kSoftmax) {
    // The kernel reads `out` and keeps the logits (z + bias) in z.
    Copy(z, out, rows * width, false);
    Record(cuda::BiasActivation(Act::kSoftmax, out, bias, rows, width, z, stream_));
    return;
  }
  Record(cuda::BiasActivation(ToAct(kind), z, bias, rows, width, nullptr, stream_));
  if (out != z) Copy(z, out, rows * width, false);
}

void CudaDevice::ActivationGradSumRows(ActivationKind kind, const float* y, float* g, int64_t rows,
                                       int64_t width, float* sums) const {
  if (kind == ActivationKind::kSoftmax) {
    Record(ActivationBackward(Act::kSoftmax, y, g, rows, width, stream_));
    if (sums != nullptr) SumRows(g, rows, width, sums, false);
    return;
  }
  if (sums == nullptr && kind == ActivationKind::kLinear) return;
  Record(ActivationBackwardColumnSum(ToAct(kind), y, g, rows, width, sums, stream_));
}

void CudaDevice::Activation(ActivationKind kind, const float* z, float* out, int64_t rows,
                            int64_t width) const {
  if (out != z) Copy(z, out, rows * width, false);
  if (kind == ActivationKind::kSoftmax) {
    // The kernel keeps the logits it read: here they are the input's own values.
    Record(cuda::BiasActivation(Act::kSoftmax, out, nullptr, rows, width, const_cast<float*>(z),
                                stream_));
    return;
  }
  Record(cuda::BiasActivation(ToAct(kind), out, nullptr, rows, width, nullptr, stream_));
}

void CudaDevice::ActivationGrad(ActivationKind kind, const float* y, float* g, int64_t rows,
                                int64_t width) const {
  Record(ActivationBackward(ToAct(kind), y, g, rows, width, stream_));
}

void CudaDevice::Copy(const float* x, float* out, int64_t n, bool accumulate) const {
  if (n <= 0) return;
  if (accumulate) {
    Record(AddInto(out, x, n, stream_));
  } else if (out != x) {
    Record(STRATUM_CUDA_STATUS_(CudaStatus,
                                cudaMemcpyAsync(out, x, static_cast<size_t>(n) * sizeof(float),
                                                cudaMemcpyDeviceToDevice, stream_)));
  }
}

void CudaDevice::Multiply(const float* x, const float* y, float* out, int64_t n,
                          bool accumulate) const {
  Record(MultiplyInto(x, y, out, n, accumulate, stream_));
}

void CudaDevice::Scale(float alpha, const float* x, float* out, int64_t n, bool accumulate) const {
  Record(Axpby(alpha, x, out, n, accumulate, stream_));
}

void CudaDevice::Sum(const float* const* inputs, int count, float* out, int64_t n) const {
  Copy(inputs[0], out, n, false);
  for (int i = 1; i < count; ++i) Copy(inputs[i], out, n, true);
}

void CudaDevice::Zero(float* out, int64_t n) const {
  if (n <= 0) return;
  Record(STRATUM_CUDA_STATUS_(
      CudaStatus, cudaMemsetAsync(out, 0, static_cast<size_t>(n) * sizeof(float), stream_)));
}

void CudaDevice::CopyBlocks(const float* x, int64_t x_stride, float* out, int64_t out_stride,
                            int64_t rows, int64_t width, bool accumulate) const {
  if (rows <= 0 || width <= 0) return;
  if (accumulate) {
    Record(AddBlocks(x, x_stride, out, out_stride, rows, width, stream_));
    return;
  }
  Record(STRATUM_CUDA_STATUS_(
      CudaStatus, cudaMemcpy2DAsync(out, static_cast<size_t>(out_stride) * sizeof(float), x,
                                    static_cast<size_t>(x_stride) * sizeof(float),
                                    static_cast<size_t>(width) * sizeof(float),
                                    static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_)));
}

void CudaDevice::Dropout(RandomStream& rng, float rate, const float* x, float* out, float* mask,
                         int64_t n) const {
  Record(DropoutForward(x, out, mask, n, rate, rng(), counters_, stream_));
}

void CudaDevice::EmbeddingLookup(const float* ids, int64_t count, const float* table, int64_t rows,
                                 int64_t width, float* out) const {
  Record(cuda::EmbeddingLookup(ids, count, table, rows, width, out, stream_));
}

void CudaDevice::EmbeddingPositions(const float* ids, int64_t count, const int64_t* rows,
                                    int64_t num_rows, float* positions) const {
  Record(cuda::EmbeddingPositions(ids, count, rows, num_rows, positions, stream_));
}

void CudaDevice::EmbeddingGrad(const float* ids, int64_t count, const float* grad_out, int64_t rows,
                               int64_t width, float* grad_table) const {
  if (count >= (int64_t{1} << 31)) {
    return Record(absl::InvalidArgumentError(absl::StrCat(
        "an embedding looked up ", count,
        " times in one step is past the GPU kernel's 2^31 - 1 ids: use a smaller batch")));
  }
  const size_t needed = EmbeddingGradScratchBytes(count, rows);
  if (!scratch_.Holds(needed)) {
    if (IsCapturing(stream_)) {
      pending_scratch_ = std::max(pending_scratch_, needed);  // this capture is a plan
      return;
    }
    if (absl::Status status = scratch_.Reserve(*allocator_, needed).status(); !status.ok()) {
      return Record(status);
    }
  }
  Record(cuda::EmbeddingGrad(ids, count, grad_out, rows, width, grad_table, scratch_.data(),
                             scratch_.size(), stream_));
}

void CudaDevice::AverageSteps(const float* x, int64_t batch, int64_t steps, int64_t width,
                              float* out) const {
  Record(cuda::AverageSteps(x, batch, steps, width, out, stream_));
}

void CudaDevice::AverageStepsGrad(const float* grad_out, int64_t batch, int64_t steps,
                                  int64_t width, float* grad_x, bool accumulate) const {
  Record(cuda::AverageStepsGrad(grad_out, batch, steps, width, grad_x, accumulate, stream_));
}

void CudaDevice::Conv2D(const Window2D& w, int64_t batch, const float* x, const float* kernel,
                        const float* bias, float* out) const {
  Record(convolutions_->Forward(w, batch, x, kernel, out));
  if (bias != nullptr) AddBias(out, bias, batch * w.out_h * w.out_w, w.out_c);
}

void CudaDevice::Conv2DBackwardData(const Window2D& w, int64_t batch, const float* grad_out,
                                    const float* kernel, float* grad_x) const {
  Record(convolutions_->BackwardData(w, batch, grad_out, kernel, grad_x));
}

void CudaDevice::Conv2DBackwardWeights(const Window2D& w, int64_t batch, const float* x,
                                       const float* grad_out, float* grad_kernel,
                                       float* grad_bias) const {
  Record(convolutions_->BackwardWeights(w, batch, x, grad_out, grad_kernel));
  if (grad_bias != nullptr) SumRows(grad_out, batch * w.out_h * w.out_w, w.out_c, grad_bias, false);
}

void CudaDevice::MaxPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const {
  Record(cuda::MaxPool2D(w, batch, x, out, stream_));
}

void CudaDevice::MaxPool2DBackward(const Window2D& w, int64_t batch, const float* x,
                                   const float* /*out*/, const float* grad_out, float* grad_x,
                                   bool accumulate) const {
  Record(cuda::MaxPool2DBackward(w, batch, x, grad_out, grad_x, accumulate, stream_));
}

void CudaDevice::AvgPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const {
  Record(cuda::AvgPool2D(w, batch, x, out, stream_));
}

void CudaDevice::AvgPool2DBackward(const Window2D& w, int64_t batch, const float* grad_out,
                                   float* grad_x, bool accumulate) const {
  Record(cuda::AvgPool2DBackward(w, batch, grad_out, grad_x, accumulate, stream_));
}

void CudaDevice::SumSquaredDeviations(const float* x, const float* mean, int64_t rows,
                                      int64_t width, float* out) const {
  ColumnSums({.term = ColumnTerm::kSquaredDeviation,
              .a = x,
              .mean = mean,
              .rows = rows,
              .cols = width,
              .out = out});
}

void CudaDevice::BatchNorm(const float* x, int64_t rows, int64_t width, const float* mean,
                           const float* variance, float epsilon, const float* gamma,
                           const float* beta, float* y) const {
  Record(cuda::BatchNorm(x, rows, width, mean, variance, epsilon, gamma, beta, y, stream_));
}

void CudaDevice::BatchNormGradSums(const float* dy, const float* x, int64_t rows, int64_t width,
                                   const float* mean, const float* variance, float epsilon,
                                   float* sums, float* grad_gamma, float* grad_beta) const {
  ColumnSums({.term = ColumnTerm::kGradSums,
              .a = dy,
              .b = x,
              .mean = mean,
              .rows = rows,
              .cols = width,
              .out = sums,
              .variance = variance,
              .epsilon = epsilon,
              .grad_gamma = grad_gamma,
              .grad_beta = grad_beta});
}

void CudaDevice::BatchNormBackward(const float* dy, const float* x, int64_t rows, int64_t width,
                                   const float* mean, const float* variance, float epsilon,
                                   const float* gamma, const float* sums, int64_t count, float* dx,
                                   bool accumulate) const {
  Record(cuda::BatchNormBackward(dy, x, rows, width, mean, variance, epsilon, gamma, sums, count,
                                 dx, accumulate, stream_));
}

}  // namespace stratum::cuda
