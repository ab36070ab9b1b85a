// Fit's backup and restore (Keras' BackupAndRestore): the whole training state of a Fit —
// variables, optimizer slots, where the loop stands (epoch, step in it, iteration) and the
// history so far — in one safetensors file per checkpoint, under the layout of
// stratum/checkpoint/checkpoint_folder.h, so a job that is killed and started again
// resumes where its last checkpoint stands and ends as the uninterrupted run would.
// Plain functions; not thread-safe per folder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

struct FitState {
  int64_t epoch = 0;          // epochs completed
  int64_t step_in_epoch = 0;  // steps completed of the epoch in progress
  int64_t iteration = 0;      // optimizer updates applied
  StepStats epoch_stats;      // the epoch in progress so far, summed over every worker
  nlohmann::json history = nlohmann::json::array();  // completed epochs' logs
  std::vector<Tensor> variables;
  std::vector<std::vector<Tensor>> slots;  // per variable, optimizer.SlotNames() order
  int64_t global_batch = 0;                // of the run that saved it; 0: not recorded
  int64_t num_workers = 0;  // that the data was sharded over in that run; 0: not recorded
  // The order of that run's data: fit.shuffle_buffer (0 or 1: not shuffled) and fit.seed;
  // nullopt: not recorded.
  std::optional<int64_t> shuffle_buffer;
  std::optional<uint64_t> seed;
};

// Writes `state` as the checkpoint of step `state.iteration`.
absl::Status SaveFitCheckpoint(const std::string& dir, int max_to_keep, const Model& model,
                               const Optimizer& optimizer, const FitState& state);

// The latest checkpoint of `dir`, checked against `model` and `optimizer` (names, shapes,
// checksum), or nullopt when there is none. FAILED_PRECONDITION, naming the mismatch, for
// a checkpoint of another model or optimizer.
absl::StatusOr<std::optional<FitState>> LoadLatestFitCheckpoint(const std::string& dir,
                                                                const Model& model,
                                                                const Optimizer& optimizer);

}  // namespace stratum
