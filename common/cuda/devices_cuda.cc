// VisibleGpuCount for CUDA builds: asks the runtime, and treats "no driver" or "no
// device" as zero GPUs so that the same binary runs on CPU-only machines.
#include "stratum/cuda/device.h"
#include "stratum/util/devices.h"

namespace stratum {

int VisibleGpuCount() { return cuda::PhysicalGpuCount() * LogicalGpusPerGpu(); }

}  // namespace stratum
