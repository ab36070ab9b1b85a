// CudaDevice: the Device interface (stratum/device/device.h) on one GPU: matrix products on
// cuBLAS, convolutions on cuDNN (common/cuda/convolutions.h), the rest on the kernels of
// kernels.h, every operation queued on one stream, so a step's operations may be captured
// in a CUDA graph. Dropout draws its masks from a seed
// and the replica's iteration counter on the device, so a replayed graph draws new ones.
//
// Operations return nothing (the interface is the CPU's too); the first failure is kept and
// handed over by TakeStatus, which the replica checks after queueing a step.
//
// A convolution met for the first time while the stream is captured queues nothing and is
// left pending (has_pending): the caller discards that capture, calls PreparePending (which
// times cuDNN's algorithms for it) and captures again.
//
// Thread safety: used by one thread at a time (the replica's). Ownership: the stream, the
// cuBLAS handle and the counters are the caller's, and must outlive the device.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stratum/cuda/device.h"
#include "stratum/cuda/kernels.h"
#include "stratum/device/device.h"

struct cublasContext;

namespace stratum::cuda {

class Convolutions;
struct CublasLibrary;

struct CudaDeviceOptions {
  int device = 0;  // physical device
  cudaStream_t stream = nullptr;
  cublasContext* cublas = nullptr;
  const StepCounters* counters = nullptr;  // device memory: the dropout masks' iteration
  CachingAllocator* allocator = nullptr;   // scratch, cuDNN's workspaces
  bool allow_tf32 = true;                  // cuDNN may compute float32 convolutions in TF32
  // The compute type: float32, or bfloat16/float16 (mixed precision; see AddBuffer).
  ElementType compute = ElementType::kFloat32;
};

class CudaDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(const CudaDeviceOptions& options);
  ~CudaDevice() override;

  // Convolutions (or embedding scratch) left pending by a capture (see above), and their
  // planning.
  bool has_pending() const;
  absl::Status PreparePending();

  // In mixed precision, the buffers the device is given and the type of their elements: the
  // variables and their gradients, the layers' scratch (batch normalization's statistics)
  // and ids are float32, activations and their gradients of the compute type. The caller
  // (the executor) counts offsets in floats, and sized its buffers so; the device maps such
  // an offset into a half-precision buffer to that element. The operations convert between
  // the types as they read and write.
  void AddBuffer(const void* data, size_t bytes, ElementType type);
  ElementType compute() const { return compute_; }
  // p as the typed address of its element (AddBuffer); INTERNAL (recorded) for a pointer
  // outside the buffers in mixed precision.
  Ptr Typed(float* p) const;
  CPtr Typed(const float* p) const;

  // The first error since the last call, then OK again.
  absl::Status TakeStatus() const;

  std::string name() const override;
  void MatMul(const float* a, bool transpose_a, const float* b, bool transpose_b, int64_t m,
              int64_t n, int64_t k, float* c, bool accumulate) const override;
  void AddBias(float* x, const float* bias, int64_t rows, int64_t width) const override;
  void SumRows(const float* x, int64_t rows, int64_t width, float* out,
               bool accumulate) const override;
  void BiasActivation(ActivationKind kind, float* z, const float* bias, float* out, int64_t rows,
                      int64_t width) const override;
  void ActivationGradSumRows(ActivationKind kind, const float* y, float* g, int64_t rows,
                             int64_t width, float* sums) const override;
  void Activation(ActivationKind kind, const float* z, float* out, int64_t rows,
                  int64_t width) const override;
  void ActivationGrad(ActivationKind kind, const float* y, float* g, int64_t rows,
                      int64_t width) const override;
  void Copy(const float* x, float* out, int64_t n, bool accumulate) const override;
  void Multiply(const float* x, const float* y, float* out, int64_t n,
                bool accumulate) const override;
  void Scale(float alpha, const float* x, float* out, int64_t n, bool accumulate) const override;
  void Sum(const float* const* inputs, int count, float* out, int64_t n) const override;
  void Zero(float* out, int64_t n) const override;
  void CopyBlocks(const float* x, int64_t x_stride, float* out, int64_t out_stride, int64_t rows,
                  int64_t width, bool accumulate) const override;
  void Dropout(RandomStream& rng, float rate, const float* x, float* out, float* mask,
               int64_t n) const override;
  void EmbeddingLookup(const float* ids, int64_t count, const float* table, int64_t rows,
                       int64_t width, float* out) const override;
  void EmbeddingGrad(const float* ids, int64_t count, const float* grad_out, int64_t rows,
                     int64_t width, float* grad_table) const override;
  void EmbeddingPositions(const float* ids, int64_t count, const int64_t* rows, int64_t num_rows,
                          float* positions) const override;
  void AverageSteps(const float* x, int64_t batch, int64_t steps, int64_t width,
                    float* out) const override;
  void AverageStepsGrad(const float* grad_out, int64_t batch, int64_t steps, int64_t width,
                        float* grad_x, bool accumulate) const override;
  // No CUDA kernel: a masked GlobalAveragePooling1D trains on the CPU (Layer::RunsOnGpu), so
  // these record UNIMPLEMENTED if called.
  void AverageMaskedSteps(const float* x, const float* step_ids, int64_t batch, int64_t steps,
                          int64_t width, float* out) const override;
  void AverageMaskedStepsGrad(const float* grad_out, const float* step_ids, int64_t batch,
                              int64_t steps, int64_t width, float* grad_x,
                              bool accumulate) const override;
  void Conv2D(const Window2D& w, int64_t batch, const float* x, const float* kernel,
              const float* bias, float* out) const override;
  void Conv2DBackwardData(const Window2D& w, int64_t batch, const float* grad_out,
                          const float* kernel, float* grad_x) const override;
  void Conv2DBackwardWeights(const Window2D& w, int64_t batch, const float* x,
                             const float* grad_out, float* grad_kernel,
                             float* grad_bias) const override;
  void MaxPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const override;
  void MaxPool2DBackward(const Window2D& w, int64_t batch, const float* x, const float* out,
                         const float* grad_out, float* grad_x, bool accumulate) const override;
  void AvgPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const override;
  void AvgPool2DBackward(const Window2D& w, int64_t batch, const float* grad_out, float* grad_x,
                         bool accumulate) const override;
  void SumSquaredDeviations(const float* x, const float* mean, int64_t rows, int64_t width,
                            float* out) const override;
  void BatchNorm(const float* x, int64_t rows, int64_t width, const float* mean,
                 const float* variance, float epsilon, const float* gamma, const float* beta,
                 float* y) const override;
  void BatchNormGradSums(const float* dy, const float* x, int64_t rows, int64_t width,
                         const float* mean, const float* variance, float epsilon, float* sums,
                         float* grad_gamma, float* grad_beta) const override;
  void BatchNormBackward(const float* dy, const float* x, int64_t rows, int64_t width,
                         const float* mean, const float* variance, float epsilon,
                         const float* gamma, const float* sums, int64_t count, float* dx,
                         bool accumulate) const override;

 private:
  CudaDevice(const CudaDeviceOptions& options, DeviceBuffer partial);
  // `bytes` at `offset` of the conversion scratch (MatMul's float32 operands in the compute
  // type); null while a capture plans it (pending) or when it could not grow (recorded).
  Ptr CastScratch(size_t bytes, size_t offset) const;
  // Keeps the first failure.
  void Record(absl::Status status) const;
  // Column sums through the two-pass kernel, with this device's scratch.
  void ColumnSums(const ColumnSumArgs& args) const;

  const int device_;
  cudaStream_t stream_;
  cublasContext* cublas_;
  const CublasLibrary* cublas_library_;  // loaded before the device is created
  const StepCounters* counters_;
  CachingAllocator* allocator_;
  DeviceBuffer partial_;  // ColumnSums' partial sums
  const ElementType compute_;
  std::unique_ptr<Convolutions> convolutions_;
  // EmbeddingGrad's scratch: grows outside captures only; the buffers it replaced stay for
  // the graphs captured with them. pending_scratch_: the bytes a capture found missing.
  mutable GrowOnlyBuffer scratch_;
  mutable size_t pending_scratch_ = 0;
  struct Buffer {
    const char* start;
    size_t bytes;
    ElementType type;
  };
  std::vector<Buffer> buffers_;
  mutable GrowOnlyBuffer cast_scratch_;
  mutable size_t pending_cast_ = 0;
  mutable absl::Status status_;
};

}  // namespace stratum::cuda
