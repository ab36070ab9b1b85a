#include "stratum/cuda/cuda_check.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "stratum/cuda/cublas_library.h"

namespace stratum::cuda {
namespace {

absl::Status Failed(const char* call, const char* file, int line, const std::string& error) {
  return absl::InternalError(absl::StrCat(call, " failed at ", file, ":", line, ": ", error));
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  return Failed(call, file, line,
                absl::StrCat(cudaGetErrorString(error), " (", cudaGetErrorName(error), ")"));
}

absl::Status CublasStatus(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  // A status came from a call, so the library is loaded.
  const absl::StatusOr<const CublasLibrary*> cublas = Cublas();
  if (!cublas.ok()) {
    return Failed(call, file, line, absl::StrCat("cuBLAS status ", static_cast<int>(status)));
  }
  return Failed(
      call, file, line,
      absl::StrCat((*cublas)->status_string(status), " (", (*cublas)->status_name(status), ")"));
}

absl::Status NcclStatus(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return absl::OkStatus();
  return Failed(
      call, file, line,
      absl::StrCat(ncclGetErrorString(result), " (ncclResult ", static_cast<int>(result), ")"));
}

void CheckOk(const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "stratum: fatal GPU error: %s\n", std::string(status.message()).c_str());
  std::abort();
}

}  // namespace stratum::cuda
