// VisibleGpuCount for builds without CUDA.
#include "stratum/util/devices.h"

namespace stratum {

int VisibleGpuCount() { return 0; }

}  // namespace stratum
