// Checks of CUDA runtime, cuBLAS and NCCL calls. Every call on the GPU path goes through one
// of these macros, so a failure names the call, the file and line, and the library's error
// string:
//
//   STRATUM_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
//   // -> INTERNAL "cudaMalloc(&p, bytes) failed at common/cuda/device.cc:42: out of memory
//   //    (cudaErrorMemoryAllocation)"
//
// The RETURN forms return an absl::Status from the enclosing function (which must return
// absl::Status or absl::StatusOr). The CHECK forms abort with the same message, for
// programmer errors only (a destructor freeing memory it allocated, a kernel launch with a
// configuration the code computed itself).
//
// Thread-safe: the macros touch no shared state.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"

namespace stratum::cuda {

// The status of one call: OK, or the error naming `call` (its source text), file and line.
absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line);
absl::Status CublasStatus(cublasStatus_t status, const char* call, const char* file, int line);
absl::Status NcclStatus(ncclResult_t result, const char* call, const char* file, int line);

// Aborts with the status's message when it is not OK.
void CheckOk(const absl::Status& status);

}  // namespace stratum::cuda

#define STRATUM_CUDA_STATUS_(kind, call) ::stratum::cuda::kind(call, #call, __FILE__, __LINE__)

#define STRATUM_GPU_RETURN_IF_ERROR_(kind, call)                                 \
  do {                                                                           \
    const ::absl::Status stratum_gpu_status_ = STRATUM_CUDA_STATUS_(kind, call); \
    if (!stratum_gpu_status_.ok()) return stratum_gpu_status_;                   \
  } while (false)

#define STRATUM_CUDA_RETURN_IF_ERROR(call) STRATUM_GPU_RETURN_IF_ERROR_(CudaStatus, call)
#define STRATUM_CUBLAS_RETURN_IF_ERROR(call) STRATUM_GPU_RETURN_IF_ERROR_(CublasStatus, call)
#define STRATUM_NCCL_RETURN_IF_ERROR(call) STRATUM_GPU_RETURN_IF_ERROR_(NcclStatus, call)

#define STRATUM_CUDA_CHECK(call) ::stratum::cuda::CheckOk(STRATUM_CUDA_STATUS_(CudaStatus, call))
#define STRATUM_CUBLAS_CHECK(call) \
  ::stratum::cuda::CheckOk(STRATUM_CUDA_STATUS_(CublasStatus, call))
#define STRATUM_NCCL_CHECK(call) ::stratum::cuda::CheckOk(STRATUM_CUDA_STATUS_(NcclStatus, call))
// After a kernel launch: its configuration error, if any, naming the kernel.
#define STRATUM_CUDA_RETURN_IF_LAUNCH_FAILED(kernel)                                             \
  do {                                                                                           \
    const ::absl::Status stratum_gpu_status_ =                                                   \
        ::stratum::cuda::CudaStatus(cudaGetLastError(), kernel "<<<...>>>", __FILE__, __LINE__); \
    if (!stratum_gpu_status_.ok()) return stratum_gpu_status_;                                   \
  } while (false)
