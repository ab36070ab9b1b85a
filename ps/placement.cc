#include "stratum/ps/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace stratum {
namespace {

absl::Status FieldError(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("strategy.variable_partitioner.", field, " ", problem));
}

absl::StatusOr<int64_t> PositiveField(const nlohmann::json& json, const char* field,
                                      int64_t fallback) {
  if (!json.contains(field)) return fallback;
  const nlohmann::json& value = json.at(field);
  if (!value.is_number_integer() || value.get<int64_t>() < 1) {
    return FieldError(field, absl::StrCat("is ", value.dump(), ": use a positive integer"));
  }
  return value.get<int64_t>();
}

}  // namespace

absl::StatusOr<PartitionerSpec> PartitionerFromJson(const nlohmann::json& json) {
  PartitionerSpec spec;
  if (json.is_null()) return spec;
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return absl::InvalidArgumentError(
        "strategy.variable_partitioner needs a \"type\": fixed_shards, min_size or max_size");
  }
  const std::string type = json["type"];
  std::vector<std::string> allowed = {"type"};
  if (type == "fixed_shards") {
    spec.kind = PartitionerSpec::Kind::kFixedShards;
    allowed.push_back("num_shards");
    if (!json.contains("num_shards")) return FieldError("num_shards", "is missing");
    absl::StatusOr<int64_t> shards = PositiveField(json, "num_shards", 1);
    if (!shards.ok()) return shards.status();
    spec.num_shards = *shards;
  } else if (type == "min_size") {
    spec.kind = PartitionerSpec::Kind::kMinSize;
    allowed.insert(allowed.end(), {"min_shard_bytes", "max_shards"});
    absl::StatusOr<int64_t> min_bytes = PositiveField(json, "min_shard_bytes", 256 * 1024);
    if (!min_bytes.ok()) return min_bytes.status();
    absl::StatusOr<int64_t> max_shards = PositiveField(json, "max_shards", 1);
    if (!max_shards.ok()) return max_shards.status();
    spec.min_shard_bytes = *min_bytes;
    spec.max_shards = *max_shards;
  } else if (type == "max_size") {
    spec.kind = PartitionerSpec::Kind::kMaxSize;
    allowed.insert(allowed.end(), {"max_shard_bytes", "max_shards"});
    if (!json.contains("max_shard_bytes")) return FieldError("max_shard_bytes", "is missing");
    absl::StatusOr<int64_t> max_bytes = PositiveField(json, "max_shard_bytes", 1);
    if (!max_bytes.ok()) return max_bytes.status();
    spec.max_shard_bytes = *max_bytes;
    // TensorFlow's max_shards=None: no limit, written 0 (as the docs give it) or left out.
    const bool unlimited =
        !json.contains("max_shards") || json["max_shards"].is_null() || json["max_shards"] == 0;
    if (!unlimited) {
      absl::StatusOr<int64_t> max_shards = PositiveField(json, "max_shards", 0);
      if (!max_shards.ok()) return max_shards.status();
      spec.max_shards = *max_shards;
    }
  } else {
    return FieldError("type",
                      absl::StrCat("is \"", type, "\": use fixed_shards, min_size or max_size"));
  }
  for (const auto& [key, value] : json.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return FieldError(key, absl::StrCat("is not a field of a ", type, " partitioner"));
    }
  }
  return spec;
}

int64_t NumShards(const PartitionerSpec& partitioner, const Shape& shape) {
  if (shape.rank() == 0) return 1;
  const int64_t rows = shape.dim(0);
  if (rows <= 1) return 1;
  const double bytes = static_cast<double>(shape.num_elements()) * sizeof(float);
  switch (partitioner.kind) {
    case PartitionerSpec::Kind::kNone:
      return 1;
    case PartitionerSpec::Kind::kFixedShards:
      return std::min(partitioner.num_shards, rows);
    case PartitionerSpec::Kind::kMinSize: {
      // min_max_variable_partitioner: ceil(total / min_slice), capped by rows and max.
      const int64_t wanted =
          static_cast<int64_t>(std::ceil(bytes / static_cast<double>(partitioner.min_shard_bytes)));
      return std::max<int64_t>(1, std::min({rows, partitioner.max_shards, wanted}));
    }
    case PartitionerSpec::Kind::kMaxSize: {
      // variable_axis_size_partitioner: rows that fit in max_shard_bytes, at least one.
      const double bytes_per_row = bytes / static_cast<double>(rows);
      const int64_t rows_per_shard = std::max<int64_t>(
          1, static_cast<int64_t>(
                 std::floor(static_cast<double>(partitioner.max_shard_bytes) / bytes_per_row)));
      int64_t shards = (rows + rows_per_shard - 1) / rows_per_shard;
      if (partitioner.max_shards > 0) shards = std::min(shards, partitioner.max_shards);
      return shards;
    }
  }
  return 1;
}

std::vector<ShardSpec> ShardVariable(const std::string& name, const Shape& shape,
                                     const PartitionerSpec& partitioner) {
  const int64_t shards = NumShards(partitioner, shape);
  std::vector<ShardSpec> result;
  const int64_t rows = shape.rank() == 0 ? 1 : shape.dim(0);
  const int64_t row_elements =
      shape.rank() == 0 ? 1 : shape.num_elements() / std::max<int64_t>(rows, 1);
  int64_t first = 0;
  for (int64_t i = 0; i < shards; ++i) {
    const int64_t count = rows / shards + (i < rows % shards ? 1 : 0);
    ShardSpec shard;
    shard.variable = name;
    shard.name = shards == 1 ? name : absl::StrCat(name, "/part_", i);
    shard.shard_index = static_cast<int>(i);
    shard.num_shards = static_cast<int>(shards);
    shard.first_row = first;
    shard.shape = shape.rank() == 0 ? shape : shape.WithFirstDim(count);
    shard.bytes = count * row_elements * static_cast<int64_t>(sizeof(float));
    result.push_back(std::move(shard));
    first += count;
  }
  return result;
}

absl::StatusOr<PlacementPolicy> PlacementPolicyFromName(const std::string& name) {
  if (name == "round_robin") return PlacementPolicy::kRoundRobin;
  if (name == "balanced_bytes" || name.empty()) return PlacementPolicy::kBalancedBytes;
  return absl::InvalidArgumentError(absl::StrCat(
      "placement \"", name, "\" is not a placement policy: use balanced_bytes or round_robin"));
}

absl::Status PlaceShards(std::vector<ShardSpec>& shards, int num_ps, PlacementPolicy policy) {
  if (num_ps < 1) {
    return absl::InvalidArgumentError(
        "a parameter-server job needs at least one ps task to place variables on");
  }
  if (policy == PlacementPolicy::kRoundRobin) {
    for (size_t i = 0; i < shards.size(); ++i) shards[i].ps_task = static_cast<int>(i % num_ps);
    return absl::OkStatus();
  }
  std::vector<size_t> order(shards.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return shards[a].bytes > shards[b].bytes; });
  std::vector<int64_t> load(static_cast<size_t>(num_ps), 0);
  for (size_t i : order) {
    const size_t task =
        static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    shards[i].ps_task = static_cast<int>(task);
    load[task] += shards[i].bytes;
  }
  return absl::OkStatus();
}

}  // namespace stratum
