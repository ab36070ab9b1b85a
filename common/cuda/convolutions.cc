#include "common/cuda/convolutions.h"

#include <cudnn.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/cuda/kernels.h"
#include "stratum/util/status_macros.h"

namespace stratum::cuda {
namespace {

// The most workspace one convolution may take; faster algorithms that want more are passed
// over.
constexpr size_t kMaxWorkspaceBytes = size_t{256} << 20;

absl::Status CudnnStatus(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                          cudnnGetErrorString(status), " (cudnnStatus ",
                                          static_cast<int>(status), ")"));
}

#define STRATUM_CUDNN_RETURN_IF_ERROR(call) STRATUM_GPU_RETURN_IF_ERROR_(CudnnStatus, call)

std::string Describe(const Window2D& w, int64_t batch) {
  return absl::StrCat("a ", w.kernel_h, "x", w.kernel_w, " convolution of ", batch, "x", w.in_h,
                      "x", w.in_w, "x", w.in_c, " into ", w.out_c, " channels");
}

// The fastest result that ran, within the workspace limit, and (without TF32) in full
// float32; the first that ran when none is in full float32.
template <typename Perf>
absl::StatusOr<Perf> Fastest(const Perf* results, int count, bool allow_tf32,
                             const std::string& what) {
  const Perf* first = nullptr;
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kMaxWorkspaceBytes) continue;
    if (first == nullptr) first = &r;
    if (allow_tf32 || r.mathType == CUDNN_FMA_MATH) return r;
  }
  if (first != nullptr) {
    Perf r = *first;
    r.mathType = CUDNN_FMA_MATH;
    return r;
  }
  return absl::InternalError(absl::StrCat("cuDNN has no algorithm for ", what, " within ",
                                          kMaxWorkspaceBytes >> 20, " MiB of workspace"));
}

}  // namespace

absl::Status CheckCudnnVersion() {
  const size_t loaded = cudnnGetVersion();
  if (loaded / 10000 == CUDNN_MAJOR) return absl::OkStatus();
  // cuDNN 9 numbers its versions major * 10000 + minor * 100, cuDNN 8 major * 1000 + ...
  const size_t major = loaded >= 90000 ? loaded / 10000 : loaded / 1000;
  const size_t minor = loaded >= 90000 ? loaded / 100 % 100 : loaded / 100 % 10;
  return absl::FailedPreconditionError(
      absl::StrCat("Stratum was built with cuDNN ", CUDNN_MAJOR, ".", CUDNN_MINOR,
                   ", but this process loaded cuDNN ", major, ".", minor, ": put a cuDNN ",
                   CUDNN_MAJOR, " library folder first in LD_LIBRARY_PATH"));
}

struct Convolutions::Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t filter = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgoPerf_t forward{};
  cudnnConvolutionBwdDataAlgoPerf_t backward_data{};
  cudnnConvolutionBwdFilterAlgoPerf_t backward_filter{};
  // The input as cuDNN sees it: padded by (top, left) .. (bottom, right) beyond the
  // symmetric padding the descriptor takes, when the layer's padding is asymmetric.
  bool explicit_pad = false;
  int64_t top = 0, left = 0, padded_h = 0, padded_w = 0;
  // In half precision: the kernel gradient computed in float32 from float32 copies of the
  // input and the output gradient, when cuDNN's timing says that is faster (its half-precision
  // kernel gradients can be slow for few input channels).
  bool filter_in_float = false;
  cudnnTensorDescriptor_t x_float = nullptr, y_float = nullptr;
  cudnnFilterDescriptor_t filter_float = nullptr;

  ~Plan() {
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (filter != nullptr) cudnnDestroyFilterDescriptor(filter);
    if (x_float != nullptr) cudnnDestroyTensorDescriptor(x_float);
    if (y_float != nullptr) cudnnDestroyTensorDescriptor(y_float);
    if (filter_float != nullptr) cudnnDestroyFilterDescriptor(filter_float);
    if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
  }
};

Convolutions::Convolutions(int device, cudaStream_t stream, CachingAllocator& allocator,
                           bool allow_tf32, ElementType compute)
    : device_(device),
      stream_(stream),
      allocator_(allocator),
      // Half-precision convolutions use tensor cores whatever TF32's setting.
      allow_tf32_(allow_tf32 || compute != ElementType::kFloat32),
      compute_(compute) {}

absl::Status Convolutions::CheckCompute(CPtr p, const char* what) const {
  if (p.dtype == compute_) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("a convolution's ", what, " is ", ElementTypeName(p.dtype),
                   " where the replica computes in ", ElementTypeName(compute_)));
}

Convolutions::~Convolutions() {
  plans_.clear();
  if (handle_ != nullptr) cudnnDestroy(handle_);
}

Convolutions::Key Convolutions::KeyOf(const Window2D& w, int64_t batch) {
  return {w.in_h,     w.in_w,     w.in_c,       w.out_h,     w.out_w,      w.out_c,
          w.kernel_h, w.kernel_w, w.stride_h,   w.stride_w,  w.dilation_h, w.dilation_w,
          w.pad_top,  w.pad_left, w.pad_bottom, w.pad_right, batch};
}

absl::Status Convolutions::EnsureHandle() {
  if (handle_ != nullptr) return absl::OkStatus();
  STRATUM_RETURN_IF_ERROR(CheckCudnnVersion());
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnCreate(&handle_));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnSetStream(handle_, stream_));
  return absl::OkStatus();
}

Convolutions::Plan* Convolutions::Find(const Window2D& w, int64_t batch, absl::Status* status) {
  const Key key = KeyOf(w, batch);
  if (auto found = plans_.find(key); found != plans_.end()) return found->second.get();
  if (IsCapturing(stream_)) {
    if (pending_.insert(key).second) pending_shapes_.emplace_back(w, batch);
    return nullptr;
  }
  *status = MakePlan(w, batch);
  if (!status->ok()) return nullptr;
  return plans_.at(key).get();
}

absl::Status Convolutions::PreparePending() {
  for (const auto& [w, batch] : pending_shapes_) {
    if (plans_.count(KeyOf(w, batch)) == 0) STRATUM_RETURN_IF_ERROR(MakePlan(w, batch));
  }
  pending_.clear();
  pending_shapes_.clear();
  return absl::OkStatus();
}

absl::Status Convolutions::MakePlan(const Window2D& w, int64_t batch) {
  STRATUM_RETURN_IF_ERROR(EnsureHandle());
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  // The searches below time kernels on the stream: what was queued before runs first.
  STRATUM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  auto plan = std::make_unique<Plan>();
  const int64_t pad_h = std::min(w.pad_top, w.pad_bottom);
  const int64_t pad_w = std::min(w.pad_left, w.pad_right);
  plan->top = w.pad_top - pad_h;
  plan->left = w.pad_left - pad_w;
  plan->padded_h = w.in_h + plan->top + (w.pad_bottom - pad_h);
  plan->padded_w = w.in_w + plan->left + (w.pad_right - pad_w);
  plan->explicit_pad = plan->padded_h != w.in_h || plan->padded_w != w.in_w;
  auto i = [](int64_t v) { return static_cast<int>(v); };
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->x));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->y));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&plan->filter));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(&plan->conv));
  // Data in the compute type; the arithmetic in float32 (cuDNN's pseudo-half configurations).
  const cudnnDataType_t data_type = compute_ == ElementType::kBfloat16  ? CUDNN_DATA_BFLOAT16
                                    : compute_ == ElementType::kFloat16 ? CUDNN_DATA_HALF
                                                                        : CUDNN_DATA_FLOAT;
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NHWC, data_type,
                                                           i(batch), i(w.in_c), i(plan->padded_h),
                                                           i(plan->padded_w)));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(
      plan->y, CUDNN_TENSOR_NHWC, data_type, i(batch), i(w.out_c), i(w.out_h), i(w.out_w)));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(plan->filter, data_type,
                                                           CUDNN_TENSOR_NHWC, i(w.out_c), i(w.in_c),
                                                           i(w.kernel_h), i(w.kernel_w)));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
      plan->conv, i(pad_h), i(pad_w), i(w.stride_h), i(w.stride_w), i(w.dilation_h),
      i(w.dilation_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  STRATUM_CUDNN_RETURN_IF_ERROR(
      cudnnSetConvolutionMathType(plan->conv, allow_tf32_ ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  int n = 0, c = 0, h = 0, width = 0;
  STRATUM_CUDNN_RETURN_IF_ERROR(
      cudnnGetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->filter, &n, &c, &h, &width));
  const std::string what = Describe(w, batch);
  if (h != w.out_h || width != w.out_w || c != w.out_c) {
    return absl::InternalError(absl::StrCat("cuDNN makes ", h, "x", width, "x", c, " of ", what,
                                            ", where the layer expects ", w.out_h, "x", w.out_w,
                                            "x", w.out_c));
  }

  int count = 0;
  cudnnConvolutionFwdAlgoPerf_t forward[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  STRATUM_CUDNN_RETURN_IF_ERROR(
      cudnnFindConvolutionForwardAlgorithm(handle_, plan->x, plan->filter, plan->conv, plan->y,
                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, forward));
  STRATUM_ASSIGN_OR_RETURN(plan->forward, Fastest(forward, count, allow_tf32_, what));
  cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionBackwardDataAlgorithm(
      handle_, plan->filter, plan->y, plan->conv, plan->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
      &count, data));
  STRATUM_ASSIGN_OR_RETURN(plan->backward_data,
                           Fastest(data, count, allow_tf32_, "the input gradient of " + what));
  cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionBackwardFilterAlgorithm(
      handle_, plan->x, plan->y, plan->conv, plan->filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
      &count, filter));
  STRATUM_ASSIGN_OR_RETURN(plan->backward_filter,
                           Fastest(filter, count, allow_tf32_, "the kernel gradient of " + what));
  const int64_t x_elements = batch * plan->padded_h * plan->padded_w * w.in_c;
  const int64_t y_elements = batch * w.out_h * w.out_w * w.out_c;
  if (compute_ != ElementType::kFloat32) {
    STRATUM_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->x_float));
    STRATUM_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&plan->y_float));
    STRATUM_CUDNN_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&plan->filter_float));
    STRATUM_CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(plan->x_float, CUDNN_TENSOR_NHWC,
                                                             CUDNN_DATA_FLOAT, i(batch), i(w.in_c),
                                                             i(plan->padded_h), i(plan->padded_w)));
    STRATUM_CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(plan->y_float, CUDNN_TENSOR_NHWC,
                                                             CUDNN_DATA_FLOAT, i(batch), i(w.out_c),
                                                             i(w.out_h), i(w.out_w)));
    STRATUM_CUDNN_RETURN_IF_ERROR(
        cudnnSetFilter4dDescriptor(plan->filter_float, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC,
                                   i(w.out_c), i(w.in_c), i(w.kernel_h), i(w.kernel_w)));
    cudnnConvolutionBwdFilterAlgoPerf_t in_float[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    STRATUM_CUDNN_RETURN_IF_ERROR(cudnnFindConvolutionBackwardFilterAlgorithm(
        handle_, plan->x_float, plan->y_float, plan->conv, plan->filter_float,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, in_float));
    absl::StatusOr<cudnnConvolutionBwdFilterAlgoPerf_t> fastest =
        Fastest(in_float, count, true, "the kernel gradient of " + what);
    // The copies to float32 read and write both tensors once (about 2 TB/s).
    const double copy_ms = static_cast<double>(x_elements + y_elements) *
                           static_cast<double>(SizeOf(compute_) + 4) / 2e12 * 1e3;
    if (fastest.ok() && fastest->time + copy_ms < plan->backward_filter.time) {
      plan->backward_filter = *fastest;
      plan->filter_in_float = true;
      STRATUM_RETURN_IF_ERROR(
          float_x_.Reserve(allocator_, static_cast<size_t>(x_elements) * 4).status());
      STRATUM_RETURN_IF_ERROR(
          float_dy_.Reserve(allocator_, static_cast<size_t>(y_elements) * 4).status());
    }
  }

  const size_t workspace =
      std::max({plan->forward.memory, plan->backward_data.memory, plan->backward_filter.memory});
  STRATUM_RETURN_IF_ERROR(workspaces_.Reserve(allocator_, workspace).status());
  const size_t kernel_bytes =
      static_cast<size_t>(w.kernel_h * w.kernel_w * w.in_c * w.out_c) * sizeof(float);
  STRATUM_RETURN_IF_ERROR(kernels_.Reserve(allocator_, kernel_bytes).status());
  if (plan->explicit_pad) {
    const size_t padded_bytes =
        static_cast<size_t>(batch * plan->padded_h * plan->padded_w * w.in_c) * sizeof(float);
    STRATUM_RETURN_IF_ERROR(padded_.Reserve(allocator_, padded_bytes).status());
  }
  plans_.emplace(KeyOf(w, batch), std::move(plan));
  return absl::OkStatus();
}

absl::StatusOr<CPtr> Convolutions::Padded(const Plan& plan, const Window2D& w, int64_t batch,
                                          CPtr x) {
  if (!plan.explicit_pad) return x;
  const Ptr padded(padded_.data(), compute_);
  STRATUM_RETURN_IF_ERROR(ShiftCopy2D(x, batch, w.in_h, w.in_w, w.in_c, plan.top, plan.left, padded,
                                      plan.padded_h, plan.padded_w, stream_));
  return padded;
}

absl::StatusOr<CPtr> Convolutions::KernelForCudnn(const Window2D& w, CPtr kernel) {
  const Ptr ohwi(kernels_.data(), compute_);
  STRATUM_RETURN_IF_ERROR(
      KernelToOhwi(kernel, w.kernel_h * w.kernel_w, w.in_c, w.out_c, ohwi, stream_));
  return ohwi;
}

absl::Status Convolutions::Forward(const Window2D& w, int64_t batch, CPtr x, CPtr kernel, Ptr out) {
  STRATUM_RETURN_IF_ERROR(CheckCompute(x, "input"));
  STRATUM_RETURN_IF_ERROR(CheckCompute(out, "output"));
  absl::Status status;
  Plan* plan = Find(w, batch, &status);
  if (plan == nullptr) return status;
  STRATUM_ASSIGN_OR_RETURN(const CPtr ohwi, KernelForCudnn(w, kernel));
  STRATUM_ASSIGN_OR_RETURN(const CPtr input, Padded(*plan, w, batch, x));
  const float one = 1.0f, zero = 0.0f;
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(plan->conv, plan->forward.mathType));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(
      handle_, &one, plan->x, input.p, plan->filter, ohwi.p, plan->conv, plan->forward.algo,
      workspaces_.data(), plan->forward.memory, &zero, plan->y, out.p));
  return absl::OkStatus();
}

absl::Status Convolutions::BackwardData(const Window2D& w, int64_t batch, CPtr grad_out,
                                        CPtr kernel, Ptr grad_x) {
  STRATUM_RETURN_IF_ERROR(CheckCompute(grad_out, "output gradient"));
  STRATUM_RETURN_IF_ERROR(CheckCompute(grad_x, "input gradient"));
  absl::Status status;
  Plan* plan = Find(w, batch, &status);
  if (plan == nullptr) return status;
  STRATUM_ASSIGN_OR_RETURN(const CPtr ohwi, KernelForCudnn(w, kernel));
  const Ptr target = plan->explicit_pad ? Ptr(padded_.data(), compute_) : grad_x;
  const float one = 1.0f, zero = 0.0f;
  STRATUM_CUDNN_RETURN_IF_ERROR(
      cudnnSetConvolutionMathType(plan->conv, plan->backward_data.mathType));
  STRATUM_CUDNN_RETURN_IF_ERROR(
      cudnnConvolutionBackwardData(handle_, &one, plan->filter, ohwi.p, plan->y, grad_out.p,
                                   plan->conv, plan->backward_data.algo, workspaces_.data(),
                                   plan->backward_data.memory, &zero, plan->x, target.p));
  if (!plan->explicit_pad) return absl::OkStatus();
  // The padded input's gradient, cropped to the input.
  return ShiftCopy2D(target, batch, plan->padded_h, plan->padded_w, w.in_c, -plan->top, -plan->left,
                     grad_x, w.in_h, w.in_w, stream_);
}

absl::Status Convolutions::BackwardWeights(const Window2D& w, int64_t batch, CPtr x, CPtr grad_out,
                                           Ptr grad_kernel) {
  STRATUM_RETURN_IF_ERROR(CheckCompute(x, "input"));
  STRATUM_RETURN_IF_ERROR(CheckCompute(grad_out, "output gradient"));
  absl::Status status;
  Plan* plan = Find(w, batch, &status);
  if (plan == nullptr) return status;
  STRATUM_ASSIGN_OR_RETURN(CPtr input, Padded(*plan, w, batch, x));
  CPtr output_grad = grad_out;
  cudnnTensorDescriptor_t x_desc = plan->x, y_desc = plan->y;
  cudnnFilterDescriptor_t filter_desc = plan->filter;
  Ptr ohwi(kernels_.data(), compute_);
  if (plan->filter_in_float) {
    const Ptr x_float(float_x_.data(), ElementType::kFloat32);
    const Ptr dy_float(float_dy_.data(), ElementType::kFloat32);
    STRATUM_RETURN_IF_ERROR(Axpby(
        1.0f, input, x_float, batch * plan->padded_h * plan->padded_w * w.in_c, false, stream_));
    STRATUM_RETURN_IF_ERROR(
        Axpby(1.0f, grad_out, dy_float, batch * w.out_h * w.out_w * w.out_c, false, stream_));
    input = x_float;
    output_grad = dy_float;
    x_desc = plan->x_float;
    y_desc = plan->y_float;
    filter_desc = plan->filter_float;
    ohwi = Ptr(kernels_.data(), ElementType::kFloat32);
  }
  const float one = 1.0f, zero = 0.0f;
  STRATUM_CUDNN_RETURN_IF_ERROR(
      cudnnSetConvolutionMathType(plan->conv, plan->backward_filter.mathType));
  STRATUM_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(
      handle_, &one, x_desc, input.p, y_desc, output_grad.p, plan->conv, plan->backward_filter.algo,
      workspaces_.data(), plan->backward_filter.memory, &zero, filter_desc, ohwi.p));
  return KernelToHwio(ohwi, w.kernel_h * w.kernel_w, w.in_c, w.out_c, grad_kernel, stream_);
}

}  // namespace stratum::cuda
