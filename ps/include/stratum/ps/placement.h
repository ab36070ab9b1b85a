// Where variables live in a parameter-server job: partitioners that split a variable
// along axis 0 into shards (TensorFlow's FixedShards, MinSize and MaxSize arithmetic),
// and placement of the shards over the PS tasks: round-robin (TensorFlow's), or balanced
// by bytes (Stratum's default: round-robin by count leaves some PS tasks idle and others
// overloaded when variables differ in size, TF issues #46278 and #45291). Plain functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stratum/tensor/tensor.h"

namespace stratum {

struct PartitionerSpec {
  enum class Kind { kNone, kFixedShards, kMinSize, kMaxSize } kind = Kind::kNone;
  int64_t num_shards = 1;                // FixedShards
  int64_t min_shard_bytes = 256 * 1024;  // MinSize
  int64_t max_shard_bytes = 0;           // MaxSize
  int64_t max_shards = 0;                // MinSize (default 1) and MaxSize (0: no limit)
};

// From the job's strategy.variable_partitioner: null (no partitioning),
// {"type": "fixed_shards", "num_shards": 4}, {"type": "min_size", "min_shard_bytes":
// 262144, "max_shards": 4}, {"type": "max_size", "max_shard_bytes": 1048576,
// "max_shards": 8}. Unknown types or fields are refused by name.
absl::StatusOr<PartitionerSpec> PartitionerFromJson(const nlohmann::json& json);

// How many shards a float32 variable of `shape` gets (TensorFlow's arithmetic).
int64_t NumShards(const PartitionerSpec& partitioner, const Shape& shape);

struct ShardSpec {
  std::string name;      // the variable's name, or "name/part_i" when sharded
  std::string variable;  // the variable it belongs to
  int shard_index = 0;
  int num_shards = 1;
  int64_t first_row = 0;  // rows [first_row, first_row + shape.dim(0)) of the variable
  Shape shape;
  int64_t bytes = 0;
  int ps_task = 0;  // filled in by PlaceShards
};

// The shards of one variable: rows split like `div`, the first rows % n shards one row
// longer.
std::vector<ShardSpec> ShardVariable(const std::string& name, const Shape& shape,
                                     const PartitionerSpec& partitioner);

enum class PlacementPolicy { kRoundRobin, kBalancedBytes };

absl::StatusOr<PlacementPolicy> PlacementPolicyFromName(const std::string& name);

// Assigns ps_task to each shard. Round-robin: in order, task i % num_ps. Balanced: the
// largest shards first, each to the task holding the fewest bytes so far (ties: the
// lowest task index); deterministic.
absl::Status PlaceShards(std::vector<ShardSpec>& shards, int num_ps, PlacementPolicy policy);

}  // namespace stratum
