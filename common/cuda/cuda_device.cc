#include "stratum/cuda/cuda_device.h"

#include <cublas_v2.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "stratum/cuda/cuda_check.h"

namespace stratum::cuda {
namespace {

Act ToAct(ActivationKind kind) { return static_cast<Act>(kind); }

}  // namespace

CudaDevice::CudaDevice(int device, cudaStream_t stream, cublasContext* cublas,
                       const StepCounters* counters)
    : device_(device), stream_(stream), cublas_(cublas), counters_(counters) {}

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

void CudaDevice::Conv2D(const Window2D&, int64_t, const float*, const float*, const float*,
                        float*) const {
  Record(absl::UnimplementedError("Conv2D has no CUDA kernel yet"));
}

void CudaDevice::Conv2DBackwardData(const Window2D&, int64_t, const float*, const float*,
                                    float*) const {
  Record(absl::UnimplementedError("Conv2D has no CUDA kernel yet"));
}

void CudaDevice::Conv2DBackwardWeights(const Window2D&, int64_t, const float*, const float*, float*,
                                       float*) const {
  Record(absl::UnimplementedError("Conv2D has no CUDA kernel yet"));
}

void CudaDevice::MaxPool2D(const Window2D&, int64_t, const float*, float*) const {
  Record(absl::UnimplementedError("MaxPooling2D has no CUDA kernel yet"));
}

void CudaDevice::MaxPool2DBackward(const Window2D&, int64_t, const float*, const float*,
                                   const float*, float*, bool) const {
  Record(absl::UnimplementedError("MaxPooling2D has no CUDA kernel yet"));
}

void CudaDevice::AvgPool2D(const Window2D&, int64_t, const float*, float*) const {
  Record(absl::UnimplementedError("AveragePooling2D has no CUDA kernel yet"));
}

void CudaDevice::AvgPool2DBackward(const Window2D&, int64_t, const float*, float*, bool) const {
  Record(absl::UnimplementedError("AveragePooling2D has no CUDA kernel yet"));
}

void CudaDevice::SumSquaredDeviations(const float*, const float*, int64_t, int64_t, float*) const {
  Record(absl::UnimplementedError("BatchNormalization has no CUDA kernel yet"));
}

void CudaDevice::BatchNorm(const float*, int64_t, int64_t, const float*, const float*, float,
                           const float*, const float*, float*) const {
  Record(absl::UnimplementedError("BatchNormalization has no CUDA kernel yet"));
}

void CudaDevice::BatchNormGradSums(const float*, const float*, int64_t, int64_t, const float*,
                                   const float*, float, float*, float*, float*) const {
  Record(absl::UnimplementedError("BatchNormalization has no CUDA kernel yet"));
}

void CudaDevice::BatchNormBackward(const float*, const float*, int64_t, int64_t, const float*,
                                   const float*, float, const float*, const float*, int64_t, float*,
                                   bool) const {
  Record(absl::UnimplementedError("BatchNormalization has no CUDA kernel yet"));
}

}  // namespace stratum::cuda
