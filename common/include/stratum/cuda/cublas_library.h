// cuBLAS, loaded the first time a GPU replica needs it instead of when a process starts.
// Linked, cuBLAS brings libcublasLt, whose static data alone put about 145 MiB into the RSS
// of every Stratum process, GPU or not: a CPU worker training a 1 GiB embedding table
// peaked at 236 MiB with it and about 90 MiB without it. Loaded with dlopen (the library of
// the CUDA major version built against, found as the dynamic loader finds libraries:
// LD_LIBRARY_PATH, the cache, RUNPATH), its functions called through this table.
//
// Thread-safe: loaded once; the table is immutable.
#pragma once

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace stratum::cuda {

// The cuBLAS functions Stratum calls (cublas_v2.h's names map to the _v2 symbols).
struct CublasLibrary {
  decltype(&cublasCreate) create;
  decltype(&cublasDestroy) destroy;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasSetWorkspace) set_workspace;
  decltype(&cublasSgemm) sgemm;
  // The exported cublasGemmEx (the header overloads it with an inline cudaDataType form).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  decltype(&cublasGetStatusString) status_string;
  decltype(&cublasGetStatusName) status_name;
};

// The library, loaded on the first call; FAILED_PRECONDITION naming the file and the fix
// when it cannot be loaded or lacks a function.
absl::StatusOr<const CublasLibrary*> Cublas();

}  // namespace stratum::cuda
