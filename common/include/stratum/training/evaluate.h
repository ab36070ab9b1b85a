// The input pipeline and the evaluation every training loop shares: MakeBatches (rescaled
// float32 batches in the model's input shape, int32 ids for a model that takes only ids),
// EvaluateDataset (test-set loss and accuracy over a strategy's replicas, summed over the workers
// in sync) and the StepStats sums. Functions of their arguments; EvaluateDataset runs on the
// strategy's replicas and is, with several workers, a collective every worker calls.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stratum/data/dataset.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/strategy/strategy.h"
#include "stratum/training/fit_summary.h"

namespace stratum {

// Row-sparse variables (embedding tables) given as some of their rows
// (Workspace::SetVariableRows): rows[i] of variables[i], sorted and unique.
struct GivenTableRows {
  std::vector<int> variables;
  std::vector<std::vector<int64_t>> rows;
};

// The test-set loss and accuracy of `variables`, computed over the strategy's replicas
// (EpochLog's val_loss and val_accuracy, validated). With `given`, the tables it names are
// in `variables` as its rows alone (those RowsReadByDataset found), not whole.
absl::StatusOr<EpochLog> EvaluateDataset(Strategy& strategy, const Model& model, const Loss& loss,
                                         const std::vector<Tensor>& variables, const Dataset& data,
                                         double rescale, int64_t global_batch,
                                         const GivenTableRows* given = nullptr);

// The rows of the row-sparse `variables` that evaluating `data` in batches of `batch`
// reads, each sorted and unique: what a coordinator pulls of an embedding table to test it.
absl::StatusOr<std::vector<std::vector<int64_t>>> RowsReadByDataset(
    const Model& model, const std::vector<int>& variables, const Dataset& data, double rescale,
    int64_t batch);

// The batch pipeline Fit uses: rescaled float32 features, reshaped to the model's input; for
// a model that takes only ids, int32 ids (an id no int32 holds becomes kNoId: no row).
Dataset MakeBatches(const Dataset& examples, const Model& model, int64_t global_batch,
                    double rescale, int64_t shuffle_buffer, uint64_t seed, bool repeat,
                    bool drop_remainder = false);

// The per-replica figures of one step, summed.
StepStats SumOverReplicas(const PerReplica<StepStats>& stats);

// `into` += `more`.
void Accumulate(StepStats& into, const StepStats& more);

// `stats` summed over the workers in sync (a no-op with one; a collective with several).
absl::Status SumOverWorkers(const Strategy& strategy, StepStats& stats);

// The validation figures (val_loss, val_accuracy) of the test set's summed StepStats.
EpochLog ValidationLog(const StepStats& total);

}  // namespace stratum
