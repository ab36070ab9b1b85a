// cuBLAS is loaded when first needed, not when a process starts (about 145 MiB of RSS that
// a CPU process never uses), and the table it is called through is whole. Needs no GPU:
// loading the library touches no device.
#include "stratum/cuda/cublas_library.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "stratum/testing/status_matchers.h"

namespace stratum::cuda {
namespace {

std::string MappedFiles() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str();
}

TEST(CublasLibraryTest, IsLoadedOnlyWhenFirstNeededWithEveryFunction) {
  EXPECT_EQ(MappedFiles().find("libcublas"), std::string::npos)
      << "cuBLAS is mapped before anything asked for it";
  const absl::StatusOr<const CublasLibrary*> cublas = Cublas();
  ASSERT_OK(cublas.status());
  const CublasLibrary& library = **cublas;
  for (const void* function : {reinterpret_cast<const void*>(library.create),
                               reinterpret_cast<const void*>(library.destroy),
                               reinterpret_cast<const void*>(library.set_stream),
                               reinterpret_cast<const void*>(library.set_workspace),
                               reinterpret_cast<const void*>(library.sgemm),
                               reinterpret_cast<const void*>(library.gemm_ex),
                               reinterpret_cast<const void*>(library.status_string),
                               reinterpret_cast<const void*>(library.status_name)}) {
    EXPECT_NE(function, nullptr);
  }
  EXPECT_NE(MappedFiles().find("libcublas"), std::string::npos);
  EXPECT_STREQ(library.status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  // Loaded once: the same table again.
  EXPECT_EQ(*Cublas(), *cublas);
}

}  // namespace
}  // namespace stratum::cuda
