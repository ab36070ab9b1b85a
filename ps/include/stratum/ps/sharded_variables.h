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
  // One optimizer would convert to a list of its fields: pass one per variable.
  absl::Status Create(const std::vector<Tensor>& initial, const nlohmann::json& optimizer) = delete;
  // The current values, whole.
  absl::StatusOr<std::vector<Tensor>> Pull();
  // Pushes whole-variable gradients (split into shards); with `pulled`, the updated values
  // come back in the same calls.
  absl::Status Push(const std::vector<Tensor>& gradients, std::vector<Tensor>* pulled = nullptr);

  const std::vector<ShardSpec>& shards() const { return shards_; }
  int num_ps() const { return static_cast<int>(clients_.size()); }
  PsClient& client(int task) { return *clients_[static_cast<size_t>(task)]; }

 private:
  // Runs fn(task) for every PS task that holds shards, in parallel; the first error wins.
  absl::Status ForEachTask(const std::function<absl::Status(int task)>& fn);
  // Writes pulled shard values of `task` into the whole variables.
  void Scatter(int task, const std::vector<Tensor>& values, std::vector<Tensor>& whole) const;

  std::vector<std::string> names_;
  std::vector<Shape> shapes_;
  std::vector<ShardSpec> shards_;
  std::vector<std::unique_ptr<PsClient>> clients_;
  std::vector<std::vector<size_t>> shards_of_task_;  // task -> indices into shards_
  std::vector<size_t> variable_of_shard_;            // shard index -> variable index
};

}  // namespace stratum
