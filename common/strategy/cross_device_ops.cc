#include "stratum/strategy/cross_device_ops.h"

#include "absl/strings/str_cat.h"

namespace stratum {
namespace {

absl::Status CheckSameLayout(const std::vector<std::vector<Tensor>*>& per_replica) {
  if (per_replica.empty()) return absl::InvalidArgumentError("all-reduce over no replicas");
  const std::vector<Tensor>& first = *per_replica[0];
  for (size_t r = 1; r < per_replica.size(); ++r) {
    const std::vector<Tensor>& other = *per_replica[r];
    if (other.size() != first.size()) {
      return absl::InvalidArgumentError(absl::StrCat("replica ", r, " all-reduces ", other.size(),
                                                     " tensors but replica 0 ", first.size(),
                                                     ": every replica must pass the same list"));
    }
    for (size_t i = 0; i < first.size(); ++i) {
      if (!(other[i].shape() == first[i].shape()) || other[i].dtype() != DType::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "replica ", r, " tensor ", i, " is ", other[i].DebugString(), " but replica 0's is ",
            first[i].DebugString(), ": every replica must pass float32 tensors of one shape"));
      }
    }
  }
  return absl::OkStatus();
}

void Broadcast(std::vector<std::vector<Tensor>*>& per_replica, size_t root) {
  for (size_t r = 0; r < per_replica.size(); ++r) {
    if (r == root) continue;
    for (size_t i = 0; i < per_replica[r]->size(); ++i) {
      (*per_replica[r])[i].CopyFrom((*per_replica[root])[i]);
    }
  }
}

void ScaleForMean(ReduceOp op, std::vector<Tensor>& tensors, size_t replicas) {
  if (op != ReduceOp::kMean) return;
  for (Tensor& tensor : tensors) tensor.Flat() /= static_cast<float>(replicas);
}

}  // namespace

absl::StatusOr<Tensor> CrossDeviceOps::Reduce(ReduceOp op,
                                              const std::vector<Tensor>& values) const {
  return ReduceTensors(op, values);
}

absl::Status ReductionToOneDevice::BatchAllReduce(
    ReduceOp op, std::vector<std::vector<Tensor>*>& per_replica) const {
  if (absl::Status status = CheckSameLayout(per_replica); !status.ok()) return status;
  std::vector<Tensor>& destination = *per_replica[0];
  for (size_t r = 1; r < per_replica.size(); ++r) {
    for (size_t i = 0; i < destination.size(); ++i) {
      destination[i].Flat() += (*per_replica[r])[i].Flat();
    }
  }
  ScaleForMean(op, destination, per_replica.size());
  Broadcast(per_replica, 0);
  return absl::OkStatus();
}

absl::Status HierarchicalCopyAllReduce::BatchAllReduce(
    ReduceOp op, std::vector<std::vector<Tensor>*>& per_replica) const {
  if (absl::Status status = CheckSameLayout(per_replica); !status.ok()) return status;
  const size_t n = per_replica.size();
  for (size_t stride = 1; stride < n; stride *= 2) {
    for (size_t r = 0; r + stride < n; r += 2 * stride) {
      for (size_t i = 0; i < per_replica[r]->size(); ++i) {
        (*per_replica[r])[i].Flat() += (*per_replica[r + stride])[i].Flat();
      }
    }
  }
  ScaleForMean(op, *per_replica[0], n);
  Broadcast(per_replica, 0);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CrossDeviceOps>> MakeCrossDeviceOps(const std::string& name,
                                                                   int num_packs) {
  if (name == "ReductionToOneDevice") return std::make_unique<ReductionToOneDevice>();
  if (name == "HierarchicalCopyAllReduce") return std::make_unique<HierarchicalCopyAllReduce>();
#if STRATUM_WITH_CUDA
  if (name == "NcclAllReduce") return std::make_unique<NcclAllReduce>(num_packs);
#else
  (void)num_packs;
#endif
#if STRATUM_WITH_CUDA
  constexpr char kNccl[] = "or NcclAllReduce, for replicas on GPUs";
#else
  constexpr char kNccl[] = "NcclAllReduce needs the CUDA build and GPUs";
#endif
  return absl::InvalidArgumentError(
      absl::StrCat("cross-device op \"", name,
                   "\" is not one Stratum has: use ReductionToOneDevice or "
                   "HierarchicalCopyAllReduce (",
                   kNccl, ")"));
}

}  // namespace stratum
