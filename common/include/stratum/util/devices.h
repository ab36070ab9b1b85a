// What compute devices this process can see.
#pragma once

namespace stratum {

// Number of CUDA GPUs visible to this process: 0 in a build without CUDA, and 0 when the
// driver or the devices are missing (never an error: a worker then runs on CPU).
int VisibleGpuCount();

}  // namespace stratum
