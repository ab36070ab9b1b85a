#include "stratum/worker/training_job.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/util/devices.h"
#include "stratum/worker/mirrored_strategy.h"

namespace stratum {

void ConfigureLocalDevices(const StrategySpec& spec) {
  SetIntraOpThreads(spec.intra_op_parallelism_threads);  // ParseJobSpec checked both are >= 1
  SetLogicalGpusPerGpu(spec.logical_gpus_per_gpu);
  if (spec.logical_gpus_per_gpu > 1 && VisibleGpuCount() == 0) {
    spdlog::warn(
        "strategy.logical_gpus_per_gpu is {}, but this process sees no GPU to split: the "
        "replicas train on the CPU devices",
        spec.logical_gpus_per_gpu);
  }
}

absl::StatusOr<std::unique_ptr<Strategy>> MakeLocalStrategy(const StrategySpec& spec) {
  ConfigureLocalDevices(spec);
  MirroredOptions options;
  options.devices = spec.devices;
  options.cross_device_ops = spec.cross_device_ops;
  options.num_packs = spec.num_packs;
  if (spec.type == "default") return std::unique_ptr<Strategy>(new DefaultStrategy());
  if (spec.type == "one_device") {
    if (spec.devices.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "strategy.devices lists ", spec.devices.size(), " devices (",
          absl::StrJoin(spec.devices, ", "),
          "), but one_device trains on one: list one, or use \"mirrored\" to train on all of "
          "them"));
    }
    auto strategy = OneDeviceStrategy::Create(spec.devices.empty() ? "CPU:0" : spec.devices[0]);
    if (!strategy.ok()) return strategy.status();
    return std::unique_ptr<Strategy>(std::move(*strategy));
  }
  if (spec.type == "mirrored") {
    auto strategy = MirroredStrategy::Create(options);
    if (!strategy.ok()) return strategy.status();
    return std::unique_ptr<Strategy>(std::move(*strategy));
  }
  if (spec.type == "central_storage") {
    auto strategy = CentralStorageStrategy::Create(options);
    if (!strategy.ok()) return strategy.status();
    return std::unique_ptr<Strategy>(std::move(*strategy));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "strategy.type \"", spec.type,
      "\" trains on a cluster, not in one process: run the job with stratum-launch --job, or "
      "use default, one_device, mirrored or central_storage with stratum-train"));
}

}  // namespace stratum
