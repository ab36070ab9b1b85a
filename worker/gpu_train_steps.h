// The train step of a parameter-server worker whose local replicas are GPUs: the worker's
// training set lives on each GPU (uint8, uploaded once) and is read in the worker's own
// full shuffle per epoch; a step uploads the values pulled from the parameter servers into
// every replica's flat variable buffer, runs the forward and backward pass on the device
// (cuda::Replica, the same code as the GPU path of Fit), downloads the gradients to pinned
// memory and sums them over the local replicas, for the caller to push. The optimizer runs
// on the parameter servers, so the replicas' own is never applied.
//
// Internal to worker/. Thread safety: one thread at a time (the worker service holds its
// job's lock while it trains).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/worker/fit.h"

namespace stratum {

struct GpuTrainStepsOptions {
  std::vector<std::string> devices;  // "GPU:i", one per local replica
  int64_t batch_size_per_replica = 32;
  uint64_t seed = 1;  // the example order and the dropout masks
};

class GpuTrainSteps {
 public:
  // UNIMPLEMENTED when the GPU path cannot train this model, loss or data (the caller then
  // trains on the CPU); FAILED_PRECONDITION naming a device this process does not see;
  // INVALID_ARGUMENT when the data does not fill one step.
  static absl::StatusOr<std::unique_ptr<GpuTrainSteps>> Create(const Model& model, const Loss& loss,
                                                               const FitData& data,
                                                               const GpuTrainStepsOptions& options);
  ~GpuTrainSteps();
  GpuTrainSteps(const GpuTrainSteps&) = delete;
  GpuTrainSteps& operator=(const GpuTrainSteps&) = delete;

  // One step on the next batch of the worker's order with `variables` (the model's, as
  // pulled): `gradients` gets the gradients of the mean loss over the step's examples,
  // summed over the local replicas, as host tensors shaped like the variables.
  absl::Status Step(const std::vector<Tensor>& variables, std::vector<Tensor>& gradients);
  // The loss and accuracy sums of the steps since the last call.
  absl::StatusOr<StepStats> TakeMetrics();

 private:
  struct Impl;
  explicit GpuTrainSteps(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stratum
