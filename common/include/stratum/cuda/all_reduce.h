// The cross-device ops of MirroredStrategy on GPUs (the device side of
// stratum/strategy/cross_device_ops.h): each replica's flat gradient buffer, on its own
// stream, becomes the SUM over replicas, queued on the streams (events order them; the
// host does not wait).
//
//   NcclAllReduce: ncclAllReduce over one communicator per replica, in num_packs chunks.
//     Needs one replica per physical GPU (NCCL refuses two ranks on one device), as TF.
//   HierarchicalCopyAllReduce: pairwise adds in a tree (0+1, 2+3, then 0+2, ...), then the
//     root's result copied to every replica.
//   ReductionToOneDevice: every replica's buffer added onto replica 0's, then copied back.
//
// The copy-based ops compute one result and copy it, so every replica ends bit-identical.
// Thread safety: one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/cuda/device.h"

namespace stratum::cuda {

struct ReplicaBuffer {
  float* data = nullptr;           // device memory of `device`
  const Stream* stream = nullptr;  // the replica's stream (on `device`)
};

class DeviceAllReduce {
 public:
  virtual ~DeviceAllReduce() = default;
  virtual std::string name() const = 0;
  // Every buffer holds `count` floats; afterwards each holds the sum.
  virtual absl::Status AllReduce(const std::vector<ReplicaBuffer>& buffers, int64_t count) = 0;
};

// `name` is a CrossDeviceOps name; `devices` the physical device of each replica,
// `allocators` one per physical device (indexed by device). INVALID_ARGUMENT for
// NcclAllReduce over replicas that share a GPU (logical GPUs), naming the other ops.
absl::StatusOr<std::unique_ptr<DeviceAllReduce>> MakeDeviceAllReduce(
    const std::string& name, int num_packs, const std::vector<int>& devices,
    const std::vector<CachingAllocator*>& allocators, int64_t count);

}  // namespace stratum::cuda
