#include "stratum/worker/multi_worker_mirrored_strategy.h"

namespace stratum {
namespace {

std::vector<Tensor*> Pointers(std::vector<Tensor>& values) {
  std::vector<Tensor*> pointers;
  for (Tensor& value : values) pointers.push_back(&value);
  return pointers;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MultiWorkerMirroredStrategy>> MultiWorkerMirroredStrategy::Create(
    const MirroredOptions& local, std::unique_ptr<Collectives> collectives,
    Rendezvous* rendezvous) {
  absl::StatusOr<std::vector<std::string>> devices = ResolveLocalDevices(local.devices);
  if (!devices.ok()) return devices.status();
  absl::StatusOr<std::unique_ptr<CrossDeviceOps>> ops = MakeCrossDeviceOps(
      local.cross_device_ops.empty() ? "ReductionToOneDevice" : local.cross_device_ops);
  if (!ops.ok()) return ops.status();
  return std::unique_ptr<MultiWorkerMirroredStrategy>(new MultiWorkerMirroredStrategy(
      *std::move(devices), *std::move(ops), local.strategy, std::move(collectives), rendezvous));
}

std::vector<std::string> MultiWorkerMirroredStrategy::WorkerNames() const {
  std::vector<std::string> names;
  for (int w = 0; w < collectives_->size(); ++w) {
    names.push_back(collectives_->transport().PeerName(w));
  }
  return names;
}

absl::Status MultiWorkerMirroredStrategy::AllReduceAcrossWorkers(
    ReduceOp op, std::vector<Tensor>& values) const {
  return collectives_->AllReduce(op, Pointers(values));
}

absl::Status MultiWorkerMirroredStrategy::BroadcastFromChief(std::vector<Tensor>& values) const {
  return collectives_->Broadcast(Pointers(values), /*root=*/0);
}

}  // namespace stratum
