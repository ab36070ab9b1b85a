#include "stratum/ps/sharded_variables.h"

#include <cstring>
#include <future>
#include <map>

#include "absl/strings/str_cat.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// The shard's rows of a whole variable (the variable itself when it is not sharded).
Tensor RowsOf(const Tensor& whole, const ShardSpec& shard) {
  if (whole.shape().rank() == 0 || shard.shape == whole.shape()) return whole;
  return whole.SliceRows(shard.first_row, shard.first_row + shard.shape.dim(0));
}

}  // namespace

ShardedVariables::ShardedVariables(std::vector<std::string> names, std::vector<Shape> shapes,
                                   std::vector<ShardSpec> shards,
                                   std::vector<std::unique_ptr<PsClient>> clients)
    : names_(std::move(names)),
      shapes_(std::move(shapes)),
      shards_(std::move(shards)),
      clients_(std::move(clients)),
      shards_of_task_(clients_.size()) {
  for (size_t s = 0; s < shards_.size(); ++s) {
    shards_of_task_[static_cast<size_t>(shards_[s].ps_task)].push_back(s);
    const auto it = std::find(names_.begin(), names_.end(), shards_[s].variable);
    variable_of_shard_.push_back(static_cast<size_t>(it - names_.begin()));
  }
}

absl::Status ShardedVariables::ForEachTask(const std::function<absl::Status(int)>& fn) {
  std::vector<std::future<absl::Status>> results;
  for (size_t task = 0; task < clients_.size(); ++task) {
    if (shards_of_task_[task].empty()) continue;
    results.push_back(std::async(std::launch::async, fn, static_cast<int>(task)));
  }
  absl::Status first;
  for (auto& result : results) {
    absl::Status status = result.get();
    if (first.ok() && !status.ok()) first = status;
  }
  return first;
}

void ShardedVariables::Scatter(int task, const std::vector<Tensor>& values,
                               std::vector<Tensor>& whole) const {
  const std::vector<size_t>& mine = shards_of_task_[static_cast<size_t>(task)];
  for (size_t i = 0; i < mine.size() && i < values.size(); ++i) {
    const ShardSpec& shard = shards_[mine[i]];
    Tensor& target = whole[variable_of_shard_[mine[i]]];
    std::memcpy(static_cast<char*>(target.raw_data()) +
                    static_cast<size_t>(shard.first_row * target.row_size()) * sizeof(float),
                values[i].raw_data(), values[i].byte_size());
  }
}

absl::Status ShardedVariables::Create(const std::vector<Tensor>& initial,
                                      const std::vector<nlohmann::json>& optimizers) {
  return ForEachTask([&](int task) -> absl::Status {
    // One request per optimizer: the trainable variables', the non-trainable ones'.
    std::map<std::string, std::pair<const nlohmann::json*, std::vector<NamedValue>>> groups;
    for (size_t s : shards_of_task_[static_cast<size_t>(task)]) {
      const ShardSpec& shard = shards_[s];
      const size_t v = variable_of_shard_[s];
      auto& [optimizer, values] = groups[optimizers[v].dump()];
      optimizer = &optimizers[v];
      values.push_back({shard.name, RowsOf(initial[v], shard)});
    }
    for (const auto& [key, group] : groups) {
      STRATUM_RETURN_IF_ERROR(clients_[static_cast<size_t>(task)]
                                  ->CreateVariables(group.second, *group.first, /*replace=*/true)
                                  .status());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<Tensor>> ShardedVariables::Pull() {
  std::vector<Tensor> whole;
  for (const Shape& shape : shapes_) whole.emplace_back(DType::kFloat32, shape);
  absl::Status status = ForEachTask([&](int task) -> absl::Status {
    std::vector<std::string> names;
    for (size_t s : shards_of_task_[static_cast<size_t>(task)]) names.push_back(shards_[s].name);
    absl::StatusOr<std::vector<Tensor>> values = clients_[static_cast<size_t>(task)]->Pull(names);
    if (!values.ok()) return values.status();
    Scatter(task, *values, whole);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return whole;
}

absl::Status ShardedVariables::Push(const std::vector<Tensor>& gradients,
                                    std::vector<Tensor>* pulled) {
  if (pulled != nullptr) {
    pulled->clear();
    for (const Shape& shape : shapes_) pulled->emplace_back(DType::kFloat32, shape);
  }
  return ForEachTask([&](int task) -> absl::Status {
    std::vector<NamedValue> values;
    for (size_t s : shards_of_task_[static_cast<size_t>(task)]) {
      const ShardSpec& shard = shards_[s];
      const Tensor& gradient = gradients[variable_of_shard_[s]];
      values.push_back({shard.name, RowsOf(gradient, shard)});
    }
    std::vector<Tensor> back;
    absl::Status status =
        clients_[static_cast<size_t>(task)]->Push(values, pulled != nullptr ? &back : nullptr);
    if (!status.ok() || pulled == nullptr) return status;
    Scatter(task, back, *pulled);
    return absl::OkStatus();
  });
}

}  // namespace stratum
