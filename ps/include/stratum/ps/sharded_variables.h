// ShardedVariables: a model's variables as they live on the PS tasks of a job (whole, or
// split into row shards by a partitioner, and placed per task). Workers and the
// coordinator see whole variables; this class splits and joins the shards and talks to
// every PS task in parallel. Errors name the PS task. Thread-compatible (one caller at a
// time).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stratum/ps/placement.h"
#include "stratum/ps/ps_client.h"

namespace stratum {

class ShardedVariables {
 public:
  // `names` and `shapes`: the model's variables, in its order; `shards`: their placement
  // (every variable's shards, with ps_task set); `clients[t]`: PS task t.
  ShardedVariables(std::vector<std::string> names, std::vector<Shape> shapes,
                   std::vector<ShardSpec> shards, std::vector<std::unique_ptr<PsClient>> clients);

  // Creates every shard with its rows of `initial` and its variable's optimizer (one per
  // variable: a non-trainable one has NonTrainableUpdateJson()). Shards that exist (an
  // earlier job's, on a long-lived parameter server) start afresh: the job owns them.
  absl::Status Create(const std::vector<Tensor>& initial,
                      const std::vector<nlohmann::json>& optimizers);
  // The same, each PS making its shards' values from their variables' fills
  // (Model::InitialFills): no variable is built whole here, and only the fills travel.
  absl::Status Create(const std::vector<InitialFill>& fills,
                      const std::vector<nlohmann::json>& optimizers);
  // One optimizer would convert to a list of its fields: pass one per variable.
  absl::Status Create(const std::vector<Tensor>& initial, const nlohmann::json& optimizer) = delete;
  // Which rows of each variable a step takes, per variable in the model's order: nullptr
  // for all of it, else sorted, unique rows (a row-sparse table's, as Model::RowsRead gives
  // them). Empty: every variable whole.
  using RowSelection = std::vector<const std::vector<int64_t>*>;

  // The current values: whole, or the rows `rows` selects ([rows, ...], from the shards that
  // hold them; only those rows travel). Each PS answers in requests of at most kRequestBytes:
  // a shard or a selection larger than a message travels in pieces of rows.
  absl::StatusOr<std::vector<Tensor>> Pull(const RowSelection& rows = {});
  // Pushes gradients, split into shards: whole, or for the rows `rows` selects (row
  // gradients, [rows, ...]); with `pulled`, the updated values come back in the same calls:
  // whole, or the rows `next_rows` selects (the next step's).
  absl::Status Push(const std::vector<Tensor>& gradients, std::vector<Tensor>* pulled = nullptr,
                    const RowSelection& rows = {}, const RowSelection& next_rows = {});

  // Sets every variable to `values` (whole, in the order of the names given at
  // construction), each PS its shards, in requests of at most kRequestBytes (a larger shard
  // in pieces of rows); the optimizers' slots stay (EarlyStopping's restore_best_weights).
  absl::Status Assign(const std::vector<Tensor>& values);
  // Keras' optimizer.learning_rate = `rate` on every PS that holds shards (ReduceLROnPlateau).
  absl::Status SetLearningRate(float rate) {
    return ForEachTask(
        [&](int task) { return clients_[static_cast<size_t>(task)]->SetLearningRate(rate); });
  }

  const std::vector<ShardSpec>& shards() const { return shards_; }
  int num_ps() const { return static_cast<int>(clients_.size()); }
  PsClient& client(int task) { return *clients_[static_cast<size_t>(task)]; }

 private:
  // Runs fn(task) for every PS task that holds shards, in parallel; the first error wins.
  absl::Status ForEachTask(const std::function<absl::Status(int task)>& fn);
  // Where a value a PS task answers goes: into variable `variable` from row `row` on (a
  // shard's first row in the whole variable, or where its part of selected rows starts).
  struct Placement {
    size_t variable;
    int64_t row;
    Shape shape;  // what the PS answers: the shard's, or its selected rows'
  };
  // What a task is asked for the rows `rows` selects: whole shards by name, rows of the
  // others, and where each answer goes (whole ones first, as the PS answers).
  struct TaskReads {
    std::vector<std::string> names;
    std::vector<RowRead> row_reads;
    std::vector<Placement> placements;
  };
  TaskReads ReadsOf(int task, const RowSelection& rows, bool whole) const;
  // `reads` as requests that each answer at most kRequestBytes: whole shards by name, grouped;
  // a shard too large for one request, and rows read beyond one, in pieces of rows.
  std::vector<TaskReads> InRequests(TaskReads reads) const;
  // The selected rows of shard `s` of a row-selected variable: [begin, end) positions in the
  // selection.
  std::pair<size_t, size_t> SelectedRange(size_t s, const std::vector<int64_t>& rows) const;
  // Tensors for the values of every variable: whole, or of the rows selected.
  std::vector<Tensor> NewValues(const RowSelection& rows) const;
  // Copies the answers of task `task` where `placements` say; DATA_LOSS when the answer is
  // not what was asked (a count or a shape that differs: a PS of another version).
  absl::Status Place(int task, const std::vector<Tensor>& values,
                     const std::vector<Placement>& placements, std::vector<Tensor>& out) const;
  // INVALID_ARGUMENT unless every selection is sorted, unique and within its variable's rows.
  absl::Status CheckSelection(const RowSelection& rows) const;

  std::vector<std::string> names_;
  std::vector<Shape> shapes_;
  std::vector<ShardSpec> shards_;
  std::vector<std::unique_ptr<PsClient>> clients_;
  std::vector<std::vector<size_t>> shards_of_task_;  // task -> indices into shards_
  std::vector<size_t> variable_of_shard_;            // shard index -> variable index
};

}  // namespace stratum
