// The logical GPU configuration and the intra-op threads, the same in builds with and
// without CUDA.
#include <atomic>

#include "stratum/util/devices.h"

namespace stratum {
namespace {

std::atomic<int> logical_per_gpu{1};
std::atomic<int> intra_op_threads{1};

}  // namespace

bool SetLogicalGpusPerGpu(int per_gpu) {
  if (per_gpu < 1) return false;
  logical_per_gpu = per_gpu;
  return true;
}

int LogicalGpusPerGpu() { return logical_per_gpu; }

int PhysicalGpuOf(int logical) { return logical / logical_per_gpu; }

bool SetIntraOpThreads(int threads) {
  if (threads < 1) return false;
  intra_op_threads = threads;
  return true;
}

int IntraOpThreads() { return intra_op_threads; }

}  // namespace stratum
