// MirroredStrategy and CentralStorageStrategy: several replicas in one process, one per
// local device. Logical CPU devices ("CPU:0", "CPU:1") give several replicas without
// GPUs, each on its own thread, so the mirrored machinery runs anywhere.
//
// Mirrored: a copy of every variable per replica; gradients are all-reduced and every
// replica applies the same update to its copy, so the copies stay identical bit for bit.
// CentralStorage: one copy of the variables (on the CPU) that every replica reads;
// gradients are reduced onto it and applied once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/strategy/strategy.h"

namespace stratum {

struct MirroredOptions {
  // Empty: every visible GPU, or "CPU:0" when there is none (as TensorFlow).
  std::vector<std::string> devices;
  // Empty: NcclAllReduce on GPUs that are distinct physical devices,
  // HierarchicalCopyAllReduce on logical GPUs that share one, ReductionToOneDevice on CPUs
  // (TensorFlow's choices).
  std::string cross_device_ops;
  int num_packs = 1;  // NcclAllReduce
  StrategyOptions strategy;
};

class MirroredStrategy : public Strategy {
 public:
  static absl::StatusOr<std::unique_ptr<MirroredStrategy>> Create(const MirroredOptions& options);
  std::string name() const override { return "MirroredStrategy"; }
  DistributedVariables CreateVariables(const std::vector<Tensor>& initial,
                                       std::vector<std::string> names = {}) const override;

 protected:
  using Strategy::Strategy;
};

// The devices of `devices` checked and canonical ("cpu:0" -> "CPU:0"); empty: every
// visible GPU, else "CPU:0". An unknown or repeated device is an error naming it.
absl::StatusOr<std::vector<std::string>> ResolveLocalDevices(
    const std::vector<std::string>& devices);

class CentralStorageStrategy : public Strategy {
 public:
  // `options.cross_device_ops` is ignored: gradients always reduce onto the one copy.
  static absl::StatusOr<std::unique_ptr<CentralStorageStrategy>> Create(
      const MirroredOptions& options);
  std::string name() const override { return "CentralStorageStrategy"; }

 private:
  using Strategy::Strategy;
};

}  // namespace stratum
