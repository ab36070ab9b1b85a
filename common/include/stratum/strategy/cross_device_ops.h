// Cross-device ops: how the replicas of one process combine their values, as in
// tf.distribute: ReductionToOneDevice (the default on CPU) and HierarchicalCopyAllReduce;
// NcclAllReduce (GPU) implements the same interface in the CUDA build.
//
// An op sees every replica's buffers at once and leaves the identical result in each
// (bit for bit: one result is computed and copied), which is what keeps mirrored
// variables identical. Implementations are stateless and thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/strategy/reduce.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

class CrossDeviceOps {
 public:
  virtual ~CrossDeviceOps() = default;
  virtual std::string name() const = 0;

  // `per_replica[r]` is replica r's list of tensors (same length and shapes for every r).
  // Afterwards each replica's tensor i holds the SUM (or MEAN) over replicas of tensor i.
  virtual absl::Status BatchAllReduce(ReduceOp op,
                                      std::vector<std::vector<Tensor>*>& per_replica) const = 0;

  // The reduction of one value per replica, into a new tensor ("to one device").
  absl::StatusOr<Tensor> Reduce(ReduceOp op, const std::vector<Tensor>& values) const;
};

// Sums every replica's tensor onto the first replica's device, then copies the result
// back to each. Simple and exact; the CPU default.
class ReductionToOneDevice : public CrossDeviceOps {
 public:
  std::string name() const override { return "ReductionToOneDevice"; }
  absl::Status BatchAllReduce(ReduceOp op,
                              std::vector<std::vector<Tensor>*>& per_replica) const override;
};

// Adds pairs of replicas in a tree (0+1, 2+3, then 0+2, ...), then copies the root's
// result back down, as TensorFlow's hierarchical copy does over GPU links.
class HierarchicalCopyAllReduce : public CrossDeviceOps {
 public:
  std::string name() const override { return "HierarchicalCopyAllReduce"; }
  absl::Status BatchAllReduce(ReduceOp op,
                              std::vector<std::vector<Tensor>*>& per_replica) const override;
};

// NCCL's all-reduce between GPUs (the default on GPUs), in `num_packs` chunks as TF packs
// gradients. The GPU path (worker/gpu_fit.cc) reduces device buffers with NCCL; host
// tensors handed to BatchAllReduce are reduced as HierarchicalCopyAllReduce does.
class NcclAllReduce : public HierarchicalCopyAllReduce {
 public:
  explicit NcclAllReduce(int num_packs = 1) : num_packs_(num_packs < 1 ? 1 : num_packs) {}
  std::string name() const override { return "NcclAllReduce"; }
  int num_packs() const { return num_packs_; }

 private:
  int num_packs_;
};

// "ReductionToOneDevice", "HierarchicalCopyAllReduce", and in a CUDA build "NcclAllReduce"
// (with num_packs); an unknown name is an error listing the known ones.
absl::StatusOr<std::unique_ptr<CrossDeviceOps>> MakeCrossDeviceOps(const std::string& name,
                                                                   int num_packs = 1);

}  // namespace stratum
