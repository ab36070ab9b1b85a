// Convolutions: Conv2D forward and backward on cuDNN 9 for one replica's stream, with the
// algorithms chosen once per shape (cuDNN's timed search, the fastest that fits) and cached.
//
// Keras' layouts are kept: activations channels-last (NHWC, which cuDNN takes as it is) and
// kernels [kh, kw, in_c, out_c], moved to cuDNN's [out_c, kh, kw, in_c] on the device for
// each call (a few KB). Padding that is larger at the bottom or right (Keras' "same" with a
// stride) goes through a padded copy of the input, since cuDNN pads symmetrically.
//
// A training step is captured in a CUDA graph, where nothing may be timed or allocated. A
// call made during a capture for a shape not yet planned queues nothing and is remembered
// (has_pending); the caller ends the capture, discards it, calls PreparePending (outside any
// capture: the searches, the workspace) and captures the step again. A call outside a
// capture plans its shape at once. Buffers only grow, and the ones replaced stay alive:
// graphs captured earlier still point at them.
//
// Thread safety: used by one thread at a time (the replica's).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "stratum/cuda/device.h"
#include "stratum/cuda/kernels.h"
#include "stratum/device/device.h"

struct cudnnContext;

namespace stratum::cuda {

// The cuDNN this process loaded: OK for a cuDNN 9 (what Stratum was built with), else
// FAILED_PRECONDITION naming both versions and the fix.
absl::Status CheckCudnnVersion();

class Convolutions {
 public:
  // allow_tf32: cuDNN may use TF32 tensor cores for float32 (TensorFlow's and PyTorch's
  // default); false keeps full float32 arithmetic.
  // compute: the type of the activations (and of the kernels as cuDNN takes them); a float32
  // kernel or kernel gradient is converted on its move between Keras' layout and cuDNN's.
  Convolutions(int device, cudaStream_t stream, CachingAllocator& allocator, bool allow_tf32,
               ElementType compute = ElementType::kFloat32);
  ~Convolutions();
  Convolutions(const Convolutions&) = delete;
  Convolutions& operator=(const Convolutions&) = delete;

  // out = x * kernel (no bias).
  absl::Status Forward(const Window2D& w, int64_t batch, CPtr x, CPtr kernel, Ptr out);
  absl::Status BackwardData(const Window2D& w, int64_t batch, CPtr grad_out, CPtr kernel,
                            Ptr grad_x);
  absl::Status BackwardWeights(const Window2D& w, int64_t batch, CPtr x, CPtr grad_out,
                               Ptr grad_kernel);

  bool has_pending() const { return !pending_.empty(); }
  absl::Status PreparePending();

 private:
  struct Plan;
  using Key = std::array<int64_t, 17>;
  static Key KeyOf(const Window2D& w, int64_t batch);

  // The plan of a shape, planned now when outside a capture; nullptr (and *status OK) when
  // the shape was left pending for a capture.
  Plan* Find(const Window2D& w, int64_t batch, absl::Status* status);
  absl::Status MakePlan(const Window2D& w, int64_t batch);
  absl::Status EnsureHandle();
  // The input padded for cuDNN (x itself when the padding is symmetric).
  absl::StatusOr<CPtr> Padded(const Plan& plan, const Window2D& w, int64_t batch, CPtr x);
  // `kernel` (Keras' layout) moved to cuDNN's, in kernels_, in the compute type.
  absl::StatusOr<CPtr> KernelForCudnn(const Window2D& w, CPtr kernel);
  // INTERNAL unless the activations `p` are of the compute type.
  absl::Status CheckCompute(CPtr p, const char* what) const;

  const int device_;
  cudaStream_t stream_;
  CachingAllocator& allocator_;
  const bool allow_tf32_;
  const ElementType compute_;
  cudnnContext* handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::set<Key> pending_;
  std::vector<std::pair<Window2D, int64_t>> pending_shapes_;  // in pending_'s order of arrival
  // The workspace, a kernel in cuDNN's layout, a padded input (or its gradient).
  GrowOnlyBuffer workspaces_, kernels_, padded_;
  // Float32 copies of an input and an output gradient (Plan::filter_in_float).
  GrowOnlyBuffer float_x_, float_dy_;
};

}  // namespace stratum::cuda
