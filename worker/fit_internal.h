// What Fit (fit.cc) and the GPU path of Fit (gpu_fit.cc, gpu_train_steps.cc) share besides
// the epoch loop (stratum/training/epoch_loop.h): the GPU path's entry point, its data on
// the host, and the workers' names for messages. Internal to worker/. Single-threaded, as
// Fit.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/worker/fit.h"

namespace stratum {

#if STRATUM_WITH_CUDA
// Fit on the strategy's GPUs (every local replica on a GPU; one worker, or several in
// lock-step). UNIMPLEMENTED when the GPU path cannot train this job (the caller then trains
// on the CPU), always before the first collective, so that every worker decides alike;
// other errors are the job's.
absl::StatusOr<FitSummary> FitOnGpus(Strategy& strategy, const Model& model, const Loss& loss,
                                     const Optimizer& optimizer, const FitData& data,
                                     const FitOptions& options);
#endif

namespace fit_internal {

#if STRATUM_WITH_CUDA
// The examples of `dataset` (at most `examples`) as two tensors (features, labels), in
// order. UNIMPLEMENTED when it yields no (features, labels) pairs.
absl::StatusOr<std::pair<Tensor, Tensor>> Materialize(const Dataset& dataset, int64_t examples);
// The same for training data the GPU path keeps on the GPU: also UNIMPLEMENTED when the
// features are not uint8 (the job trains on the CPU), INVALID_ARGUMENT when an example is
// not `model`'s input size.
absl::StatusOr<std::pair<Tensor, Tensor>> MaterializeTrainingData(const Dataset& dataset,
                                                                  int64_t examples,
                                                                  const Model& model);
// The example order of one epoch: full shuffles of the n examples, `length` indices, a
// function of the seed and the epoch.
void DrawOrder(uint64_t seed, int64_t epoch, int64_t n, int64_t length, int32_t* out);
#endif

// Every worker's name in sync ("worker:1") with MultiWorkerMirroredStrategy; empty with one
// worker (EpochLoopSpec::worker_names).
std::vector<std::string> WorkerNames(const Strategy& strategy);

}  // namespace fit_internal
}  // namespace stratum
