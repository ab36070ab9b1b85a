// VisibleGpuCount for CUDA builds: asks the runtime, and treats "no driver" or "no
// device" as zero GPUs so that the same binary runs on CPU-only machines.
#include <cuda_runtime_api.h>

#include "stratum/util/devices.h"

namespace stratum {

int VisibleGpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // Clears the sticky error so later CUDA calls start clean.
    return 0;
  }
  return count;
}

}  // namespace stratum
