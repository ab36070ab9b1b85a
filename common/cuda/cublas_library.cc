#include "stratum/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace stratum::cuda {
namespace {

// A macro's expansion as a string: cublasCreate is the symbol cublasCreate_v2.
#define STRATUM_SYMBOL_NAME_(name) #name
#define STRATUM_SYMBOL_NAME(name) STRATUM_SYMBOL_NAME_(name)

absl::StatusOr<CublasLibrary> Load() {
  const std::string file = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuBLAS (", file, ") could not be loaded for the GPU path: ", dlerror(), ": install CUDA ",
        CUBLAS_VER_MAJOR,
        "'s cuBLAS, or put its folder in LD_LIBRARY_PATH (the CPU path needs neither)"));
  }
  CublasLibrary library{};
  std::string missing;
  auto resolve = [&](auto& function, const char* name) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(handle, name));
    if (function == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  };
  resolve(library.create, STRATUM_SYMBOL_NAME(cublasCreate));
  resolve(library.destroy, STRATUM_SYMBOL_NAME(cublasDestroy));
  resolve(library.set_stream, STRATUM_SYMBOL_NAME(cublasSetStream));
  resolve(library.set_workspace, STRATUM_SYMBOL_NAME(cublasSetWorkspace));
  resolve(library.sgemm, STRATUM_SYMBOL_NAME(cublasSgemm));
  resolve(library.gemm_ex, STRATUM_SYMBOL_NAME(cublasGemmEx));
  resolve(library.status_string, STRATUM_SYMBOL_NAME(cublasGetStatusString));
  resolve(library.status_name, STRATUM_SYMBOL_NAME(cublasGetStatusName));
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(file, " lacks ", missing, ": install the cuBLAS of CUDA ", CUBLAS_VER_MAJOR,
                     ", which Stratum was built against"));
  }
  return library;  // the handle stays open for the process
}

}  // namespace

absl::StatusOr<const CublasLibrary*> Cublas() {
  static const auto* const loaded = new absl::StatusOr<CublasLibrary>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace stratum::cuda
