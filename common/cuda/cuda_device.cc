#include "stratum/cuda/cuda_device.h"

#include <cublas_v2.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/convolutions.h"
#include "stratum/cuda/cublas_library.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/util/status_macros.h"

namespace stratum::cuda {
namespace {

Act ToAct(ActivationKind kind) { return static_cast<Act>(kind); }

cudaDataType_t CudaType(ElementType dtype) {
  switch (dtype) {
    case ElementType::kBfloat16:
      return CUDA_R_16BF;
    case ElementType::kFloat16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// ColumnSums' scratch: 1024 row chunks of 128 channels' two sums, or fewer chunks of more.
constexpr int64_t kPartialFloats = int64_t{1} << 18;

// Below this many rows one pass (a block per 32 columns) is as fast as two.
constexpr int64_t kTwoPassRows = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const CudaDeviceOptions& options) {
  STRATUM_RETURN_IF_ERROR(Cublas().status());
  STRATUM_ASSIGN_OR_RETURN(
      DeviceBuffer partial,
      DeviceBuffer::Allocate(*options.allocator, static_cast<size_t>(kPartialFloats) * 4));
  return std::unique_ptr<CudaDevice>(new CudaDevice(options, std::move(partial)));
}

CudaDevice::CudaDevice(const CudaDeviceOptions& options, DeviceBuffer partial)
    : device_(options.device),
      stream_(options.stream),
      cublas_(options.cublas),
      cublas_library_(*Cublas()),
      counters_(options.counters),
      allocator_(options.allocator),
      partial_(std::move(partial)),
      compute_(options.compute),
      convolutions_(std::make_unique<Convolutions>(options.device, options.stream,
                                                   *options.allocator, options.allow_tf32,
                                                   options.compute)) {}

CudaDevice::~CudaDevice() = default;

bool CudaDevice::has_pending() const {
  return convolutions_->has_pending() || pending_scratch_ > 0 || pending_cast_ > 0;
}

absl::Status CudaDevice::PreparePending() {
  STRATUM_RETURN_IF_ERROR(convolutions_->PreparePending());
  if (pending_scratch_ > 0) {
    STRATUM_RETURN_IF_ERROR(scratch_.Reserve(*allocator_, pending_scratch_).status());
  }
  pending_scratch_ = 0;
  if (pending_cast_ > 0) {
    STRATUM_RETURN_IF_ERROR(cast_scratch_.Reserve(*allocator_, pending_cast_).status());
  }
  pending_cast_ = 0;
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

void CudaDevice::AddBuffer(const void* data, size_t bytes, ElementType type) {
  if (data != nullptr && bytes > 0) {
    buffers_.push_back({static_cast<const char*>(data), bytes, type});
  }
}

// A float32 buffer's pointers are what they say; in a half-precision one, a pointer `k` floats
// past the start addresses element k (the executor counts its offsets in floats).
CPtr CudaDevice::Typed(const float* p) const {
  if (compute_ == ElementType::kFloat32 || p == nullptr) return CPtr(p, ElementType::kFloat32);
  const char* c = reinterpret_cast<const char*>(p);
  for (const Buffer& buffer : buffers_) {
    if (c < buffer.start || c >= buffer.start + buffer.bytes) continue;
    if (buffer.type == ElementType::kFloat32) return CPtr(p, ElementType::kFloat32);
    return CPtr(buffer.start + (c - buffer.start) / 4 * SizeOf(buffer.type), buffer.type);
  }
  Record(absl::InternalError(
      "a mixed-precision replica's device was given a pointer outside its buffers"));
  return CPtr(p, ElementType::kFloat32);
}

Ptr CudaDevice::Typed(float* p) const {
  const CPtr typed = Typed(static_cast<const float*>(p));
  return Ptr(const_cast<void*>(typed.p), typed.dtype);
}

Ptr CudaDevice::CastScratch(size_t bytes, size_t offset) const {
  const size_t needed = offset + bytes;
  if (!cast_scratch_.Holds(needed)) {
    if (IsCapturing(stream_)) {
      pending_cast_ = std::max(pending_cast_, needed);  // this capture is a plan
      return nullptr;
    }
    if (absl::Status status = cast_scratch_.Reserve(*allocator_, needed).status(); !status.ok()) {
      Record(status);
      return nullptr;
    }
  }
  return Ptr(static_cast<char*>(cast_scratch_.data()) + offset, compute_);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. In float32, cublasSgemm
// (TF32 tensor cores when allowed). In mixed precision, A and B in the compute type (a
// float32 operand, a variable, is converted first into scratch) with float32 accumulation,
// and C in its own type: an activation in the compute type, a variable's gradient float32.
void CudaDevice::MatMul(const float* a, bool transpose_a, const float* b, bool transpose_b,
                        int64_t m, int64_t n, int64_t k, float* c, bool accumulate) const {
  if (m == 0 || n == 0) return;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int lda = static_cast<int>(transpose_a ? m : k);
  const int ldb = static_cast<int>(transpose_b ? k : n);
  const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CPtr ta = Typed(a), tb = Typed(b);
  const Ptr tc = Typed(c);
  if (compute_ == ElementType::kFloat32) {
    Record(STRATUM_CUDA_STATUS_(
        CublasStatus, cublas_library_->sgemm(cublas_, op_b, op_a, static_cast<int>(n),
                                             static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                             ldb, a, lda, &beta, c, static_cast<int>(n))));
    return;
  }
  size_t used = 0;
  for (CPtr* operand : {&ta, &tb}) {
    if (operand->dtype == compute_) continue;
    const int64_t count = operand == &ta ? m * k : k * n;
    const size_t bytes = static_cast<size_t>(count * SizeOf(compute_) + 255) / 256 * 256;
    const Ptr cast = CastScratch(bytes, used);
    if (cast == nullptr) return;  // planned, or failed (recorded)
    used += bytes;
    Record(Axpby(1.0f, *operand, cast, count, false, stream_));
    *operand = cast;
  }
  const cudaDataType_t half = CudaType(compute_);
  Record(STRATUM_CUDA_STATUS_(
      CublasStatus,
      cublas_library_->gemm_ex(cublas_, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                               static_cast<int>(k), &alpha, tb.p, half, ldb, ta.p, half, lda, &beta,
                               tc.p, CudaType(tc.dtype), static_cast<int>(n), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT)));
}

void CudaDevice::AddBias(float* x, const float* bias, int64_t rows, int64_t width) const {
  Record(cuda::BiasActivation(Act::kLinear, Typed(x), Typed(bias), rows, width, nullptr, stream_));
}

void CudaDevice::SumRows(const float* x, int64_t rows, int64_t width, float* out,
                         bool accumulate) const {
  if (rows >= kTwoPassRows && width <= kPartialFloats) {
    ColumnSums({.term = ColumnTerm::kValue,
                .a = Typed(x),
                .rows = rows,
                .cols = width,
                .out = Typed(out),
                .accumulate = accumulate});
    return;
  }
  // A linear "activation" leaves x as it is: only the column sums are written.
  Record(ActivationBackwardColumnSum(Act::kLinear, Typed(x), Typed(const_cast<float*>(x)), rows,
                                     width, Typed(out), stream_, accumulate));
}

void CudaDevice::BiasActivation(ActivationKind kind, float* z, const float* bias, float* out,
                                int64_t rows, int64_t width) const {
  if (kind == ActivationKind::kSoftmax) {
    // The kernel reads `out` and keeps the logits (z + bias) in z.
    Copy(z, out, rows * width, false);
    Record(cuda::BiasActivation(Act::kSoftmax, Typed(out), Typed(bias), rows, width, Typed(z),
                                stream_));
    return;
  }
  Record(cuda::BiasActivation(ToAct(kind), Typed(z), Typed(bias), rows, width, nullptr, stream_));
  if (out != z) Copy(z, out, rows * width, false);
}

void CudaDevice::ActivationGradSumRows(ActivationKind kind, const float* y, float* g, int64_t rows,
                                       int64_t width, float* sums) const {
  if (kind == ActivationKind::kSoftmax) {
    Record(ActivationBackward(Act::kSoftmax, Typed(y), Typed(g), rows, width, stream_));
    if (sums != nullptr) SumRows(g, rows, width, sums, false);
    return;
  }
  if (sums == nullptr && kind == ActivationKind::kLinear) return;
  Record(ActivationBackwardColumnSum(ToAct(kind), Typed(y), Typed(g), rows, width, Typed(sums),
                                     stream_));
}

void CudaDevice::Activation(ActivationKind kind, const float* z, float* out, int64_t rows,
                            int64_t width) const {
  if (out != z) Copy(z, out, rows * width, false);
  if (kind == ActivationKind::kSoftmax) {
    // The kernel keeps the logits it read: here they are the input's own values.
    Record(cuda::BiasActivation(Act::kSoftmax, Typed(out), nullptr, rows, width,
                                Typed(const_cast<float*>(z)), stream_));
    return;
  }
  Record(cuda::BiasActivation(ToAct(kind), Typed(out), nullptr, rows, width, nullptr, stream_));
}

void CudaDevice::ActivationGrad(ActivationKind kind, const float* y, float* g, int64_t rows,
                                int64_t width) const {
  Record(ActivationBackward(ToAct(kind), Typed(y), Typed(g), rows, width, stream_));
}

void CudaDevice::Copy(const float* x, float* out, int64_t n, bool accumulate) const {
  if (n <= 0) return;
  const CPtr from = Typed(x);
  const Ptr to = Typed(out);
  if (accumulate) {
    Record(AddInto(to, from, n, stream_));
  } else if (from.dtype != to.dtype) {
    Record(Axpby(1.0f, from, to, n, false, stream_));
  } else if (out != x) {
    Record(STRATUM_CUDA_STATUS_(
        CudaStatus, cudaMemcpyAsync(to.p, from.p, static_cast<size_t>(n * SizeOf(to.dtype)),
                                    cudaMemcpyDeviceToDevice, stream_)));
  }
}

void CudaDevice::Multiply(const float* x, const float* y, float* out, int64_t n,
                          bool accumulate) const {
  Record(MultiplyInto(Typed(x), Typed(y), Typed(out), n, accumulate, stream_));
}

void CudaDevice::Scale(float alpha, const float* x, float* out, int64_t n, bool accumulate) const {
  Record(Axpby(alpha, Typed(x), Typed(out), n, accumulate, stream_));
}

void CudaDevice::Sum(const float* const* inputs, int count, float* out, int64_t n) const {
  Copy(inputs[0], out, n, false);
  for (int i = 1; i < count; ++i) Copy(inputs[i], out, n, true);
}

void CudaDevice::Zero(float* out, int64_t n) const {
  if (n <= 0) return;
  const Ptr to = Typed(out);
  Record(STRATUM_CUDA_STATUS_(
      CudaStatus, cudaMemsetAsync(to.p, 0, static_cast<size_t>(n * SizeOf(to.dtype)), stream_)));
}

void CudaDevice::CopyBlocks(const float* x, int64_t x_stride, float* out, int64_t out_stride,
                            int64_t rows, int64_t width, bool accumulate) const {
  if (rows <= 0 || width <= 0) return;
  const CPtr from = Typed(x);
  const Ptr to = Typed(out);
  if (accumulate || from.dtype != to.dtype) {
    Record(AddBlocks(from, x_stride, to, out_stride, rows, width, stream_, accumulate));
    return;
  }
  const auto size = static_cast<size_t>(SizeOf(to.dtype));
  Record(STRATUM_CUDA_STATUS_(
      CudaStatus,
      cudaMemcpy2DAsync(to.p, static_cast<size_t>(out_stride) * size, from.p,
                        static_cast<size_t>(x_stride) * size, static_cast<size_t>(width) * size,
                        static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_)));
}

void CudaDevice::Dropout(RandomStream& rng, float rate, const float* x, float* out, float* mask,
                         int64_t n) const {
  Record(DropoutForward(Typed(x), Typed(out), Typed(mask), n, rate, rng(), counters_, stream_));
}

void CudaDevice::EmbeddingLookup(const float* ids, int64_t count, const float* table, int64_t rows,
                                 int64_t width, float* out) const {
  Record(cuda::EmbeddingLookup(Typed(ids), count, Typed(table), rows, width, Typed(out), stream_));
}

void CudaDevice::EmbeddingPositions(const float* ids, int64_t count, const int64_t* rows,
                                    int64_t num_rows, float* positions) const {
  Record(cuda::EmbeddingPositions(Typed(ids), count, rows, num_rows, Typed(positions), stream_));
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
  Record(cuda::EmbeddingGrad(Typed(ids), count, Typed(grad_out), rows, width, Typed(grad_table),
                             scratch_.data(), scratch_.size(), stream_));
}

void CudaDevice::AverageSteps(const float* x, int64_t batch, int64_t steps, int64_t width,
                              float* out) const {
  Record(cuda::AverageSteps(Typed(x), batch, steps, width, Typed(out), stream_));
}

void CudaDevice::AverageStepsGrad(const float* grad_out, int64_t batch, int64_t steps,
                                  int64_t width, float* grad_x, bool accumulate) const {
  Record(cuda::AverageStepsGrad(Typed(grad_out), batch, steps, width, Typed(grad_x), accumulate,
                                stream_));
}

void CudaDevice::AverageMaskedSteps(const float*, const float*, int64_t, int64_t, int64_t,
                                    float*) const {
  Record(absl::UnimplementedError(
      "the mean over the steps an Embedding's mask_zero leaves has no CUDA kernel"));
}

void CudaDevice::AverageMaskedStepsGrad(const float*, const float*, int64_t, int64_t, int64_t,
                                        float*, bool) const {
  Record(absl::UnimplementedError(
      "the mean over the steps an Embedding's mask_zero leaves has no CUDA kernel"));
}

void CudaDevice::Conv2D(const Window2D& w, int64_t batch, const float* x, const float* kernel,
                        const float* bias, float* out) const {
  Record(convolutions_->Forward(w, batch, Typed(x), Typed(kernel), Typed(out)));
  if (bias != nullptr) AddBias(out, bias, batch * w.out_h * w.out_w, w.out_c);
}

void CudaDevice::Conv2DBackwardData(const Window2D& w, int64_t batch, const float* grad_out,
                                    const float* kernel, float* grad_x) const {
  const Ptr target = Typed(grad_x);
  if (target.dtype == compute_) {
    Record(convolutions_->BackwardData(w, batch, Typed(grad_out), Typed(kernel), target));
    return;
  }
  // A float32 target (a layer's scratch, to be added to another gradient): through the
  // conversion scratch.
  const int64_t n = batch * w.in_h * w.in_w * w.in_c;
  const Ptr half = CastScratch(static_cast<size_t>(n * SizeOf(compute_)), 0);
  if (half == nullptr) return;  // planned, or failed (recorded)
  Record(convolutions_->BackwardData(w, batch, Typed(grad_out), Typed(kernel), half));
  Record(Axpby(1.0f, half, target, n, false, stream_));
}

void CudaDevice::Conv2DBackwardWeights(const Window2D& w, int64_t batch, const float* x,
                                       const float* grad_out, float* grad_kernel,
                                       float* grad_bias) const {
  Record(convolutions_->BackwardWeights(w, batch, Typed(x), Typed(grad_out), Typed(grad_kernel)));
  if (grad_bias != nullptr) SumRows(grad_out, batch * w.out_h * w.out_w, w.out_c, grad_bias, false);
}

void CudaDevice::MaxPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const {
  Record(cuda::MaxPool2D(w, batch, Typed(x), Typed(out), stream_));
}

void CudaDevice::MaxPool2DBackward(const Window2D& w, int64_t batch, const float* x,
                                   const float* /*out*/, const float* grad_out, float* grad_x,
                                   bool accumulate) const {
  Record(cuda::MaxPool2DBackward(w, batch, Typed(x), Typed(grad_out), Typed(grad_x), accumulate,
                                 stream_));
}

void CudaDevice::AvgPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const {
  Record(cuda::AvgPool2D(w, batch, Typed(x), Typed(out), stream_));
}

void CudaDevice::AvgPool2DBackward(const Window2D& w, int64_t batch, const float* grad_out,
                                   float* grad_x, bool accumulate) const {
  Record(cuda::AvgPool2DBackward(w, batch, Typed(grad_out), Typed(grad_x), accumulate, stream_));
}

void CudaDevice::SumSquaredDeviations(const float* x, const float* mean, int64_t rows,
                                      int64_t width, float* out) const {
  ColumnSums({.term = ColumnTerm::kSquaredDeviation,
              .a = Typed(x),
              .mean = Typed(mean),
              .rows = rows,
              .cols = width,
              .out = Typed(out)});
}

void CudaDevice::BatchNorm(const float* x, int64_t rows, int64_t width, const float* mean,
                           const float* variance, float epsilon, const float* gamma,
                           const float* beta, float* y) const {
  Record(cuda::BatchNorm(Typed(x), rows, width, Typed(mean), Typed(variance), epsilon, Typed(gamma),
                         Typed(beta), Typed(y), stream_));
}

void CudaDevice::BatchNormGradSums(const float* dy, const float* x, int64_t rows, int64_t width,
                                   const float* mean, const float* variance, float epsilon,
                                   float* sums, float* grad_gamma, float* grad_beta) const {
  ColumnSums({.term = ColumnTerm::kGradSums,
              .a = Typed(dy),
              .b = Typed(x),
              .mean = Typed(mean),
              .rows = rows,
              .cols = width,
              .out = Typed(sums),
              .variance = Typed(variance),
              .epsilon = epsilon,
              .grad_gamma = Typed(grad_gamma),
              .grad_beta = Typed(grad_beta)});
}

void CudaDevice::BatchNormBackward(const float* dy, const float* x, int64_t rows, int64_t width,
                                   const float* mean, const float* variance, float epsilon,
                                   const float* gamma, const float* sums, int64_t count, float* dx,
                                   bool accumulate) const {
  Record(cuda::BatchNormBackward(Typed(dy), Typed(x), rows, width, Typed(mean), Typed(variance),
                                 epsilon, Typed(gamma), Typed(sums), count, Typed(dx), accumulate,
                                 stream_));
}

}  // namespace stratum::cuda
