#include "stratum/worker/mirrored_strategy.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/util/devices.h"

namespace stratum {
namespace {

bool AllGpus(const std::vector<std::string>& devices) {
  for (const std::string& device : devices) {
    if (device.rfind("GPU:", 0) != 0) return false;
  }
  return !devices.empty();
}

// Whether two of the (GPU) devices are logical GPUs of one physical GPU.
bool SharesPhysicalGpu(const std::vector<std::string>& devices) {
  std::set<int> physical;
  for (const std::string& device : devices) {
    if (device.rfind("GPU:", 0) != 0) continue;
    if (!physical.insert(PhysicalGpuOf(std::stoi(device.substr(4)))).second) return true;
  }
  return false;
}

std::string DefaultCrossDeviceOps(const std::vector<std::string>& devices) {
  if (!AllGpus(devices)) return "ReductionToOneDevice";
  return SharesPhysicalGpu(devices) ? "HierarchicalCopyAllReduce" : "NcclAllReduce";
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveLocalDevices(
    const std::vector<std::string>& devices) {
  std::vector<std::string> resolved;
  if (devices.empty()) {
    for (int gpu = 0; gpu < VisibleGpuCount(); ++gpu) resolved.push_back(absl::StrCat("GPU:", gpu));
    if (resolved.empty()) resolved.push_back("CPU:0");
    return resolved;
  }
  std::set<std::string> seen;
  for (const std::string& device : devices) {
    absl::StatusOr<std::string> canonical = CanonicalDevice(device);
    if (!canonical.ok()) return canonical.status();
    if (!seen.insert(*canonical).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("device \"", device, "\" is listed twice: list each device once"));
    }
    resolved.push_back(*canonical);
  }
  return resolved;
}

absl::StatusOr<std::unique_ptr<MirroredStrategy>> MirroredStrategy::Create(
    const MirroredOptions& options) {
  absl::StatusOr<std::vector<std::string>> devices = ResolveLocalDevices(options.devices);
  if (!devices.ok()) return devices.status();
  std::string ops_name = options.cross_device_ops;
  if (ops_name.empty()) ops_name = DefaultCrossDeviceOps(*devices);
  if (ops_name == "NcclAllReduce" && !AllGpus(*devices)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cross-device op NcclAllReduce all-reduces between GPUs, and these replicas are on ",
        absl::StrJoin(*devices, ", "),
        ": use HierarchicalCopyAllReduce or ReductionToOneDevice (the default on CPUs)"));
  }
  if (ops_name == "NcclAllReduce" && SharesPhysicalGpu(*devices)) {
    return absl::InvalidArgumentError(
        "cross-device op NcclAllReduce needs one replica per physical GPU, but these devices "
        "are logical GPUs that share one: use HierarchicalCopyAllReduce or "
        "ReductionToOneDevice");
  }
  absl::StatusOr<std::unique_ptr<CrossDeviceOps>> ops =
      MakeCrossDeviceOps(ops_name, options.num_packs);
  if (!ops.ok()) return ops.status();
  return std::unique_ptr<MirroredStrategy>(
      new MirroredStrategy(*std::move(devices), *std::move(ops), options.strategy));
}

DistributedVariables MirroredStrategy::CreateVariables(const std::vector<Tensor>& initial,
                                                       std::vector<std::string> names) const {
  std::vector<std::vector<Tensor>> copies;
  for (int replica = 0; replica < NumLocalReplicas(); ++replica) {
    std::vector<Tensor> copy;
    for (const Tensor& value : initial) copy.push_back(value.Clone());
    copies.push_back(std::move(copy));
  }
  return DistributedVariables(std::move(copies), /*mirrored=*/true, this, std::move(names));
}

absl::StatusOr<std::unique_ptr<CentralStorageStrategy>> CentralStorageStrategy::Create(
    const MirroredOptions& options) {
  absl::StatusOr<std::vector<std::string>> devices = ResolveLocalDevices(options.devices);
  if (!devices.ok()) return devices.status();
  return std::unique_ptr<CentralStorageStrategy>(new CentralStorageStrategy(
      *std::move(devices), std::make_unique<ReductionToOneDevice>(), options.strategy));
}

}  // namespace stratum
