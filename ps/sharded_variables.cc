#include "stratum/ps/sharded_variables.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// The shard's rows of a whole variable (the variable itself when it is not sharded).
Tensor RowsOf(const Tensor& whole, const ShardSpec& shard) {
  if (whole.shape().rank() == 0 || shard.shape == whole.shape()) return whole;
  return whole.SliceRows(shard.first_row, shard.first_row + shard.shape.dim(0));
}

// The tensor bytes one request to a PS carries at most when the whole variables are
// created, assigned or pulled: a task's shards go in several requests, each well within a
// message (a larger shard in pieces of rows, but when created from values).
constexpr int64_t kRequestBytes = 64 << 20;

// The bytes of one row of `shape` (of the whole tensor for a scalar), as float32.
int64_t RowBytes(const Shape& shape) {
  const int64_t rows = shape.rank() == 0 ? 1 : std::max<int64_t>(shape.dim(0), 1);
  return shape.num_elements() / rows * static_cast<int64_t>(sizeof(float));
}

// Pieces [begin, end) of `count` rows of `row_bytes` each, of at most kRequestBytes (at
// least one row).
std::vector<std::pair<int64_t, int64_t>> RowPieces(int64_t count, int64_t row_bytes) {
  const int64_t per_piece = std::max<int64_t>(1, kRequestBytes / std::max<int64_t>(row_bytes, 1));
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (int64_t begin = 0; begin < count; begin += per_piece) {
    pieces.emplace_back(begin, std::min(count, begin + per_piece));
  }
  return pieces;
}

// `items` (with their bytes) in groups of at most kRequestBytes, in order.
template <typename T>
std::vector<std::vector<T>> InGroups(std::vector<std::pair<T, int64_t>> items) {
  std::vector<std::vector<T>> groups;
  int64_t bytes = 0;
  for (auto& [item, size] : items) {
    if (groups.empty() || (bytes + size > kRequestBytes && !groups.back().empty())) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(std::move(item));
    bytes += size;
  }
  return groups;
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

std::pair<size_t, size_t> ShardedVariables::SelectedRange(size_t s,
                                                          const std::vector<int64_t>& rows) const {
  const ShardSpec& shard = shards_[s];
  const int64_t end = shard.first_row + (shard.shape.rank() == 0 ? 1 : shard.shape.dim(0));
  const auto first = std::lower_bound(rows.begin(), rows.end(), shard.first_row);
  const auto last = std::lower_bound(first, rows.end(), end);
  return {static_cast<size_t>(first - rows.begin()), static_cast<size_t>(last - rows.begin())};
}

ShardedVariables::TaskReads ShardedVariables::ReadsOf(int task, const RowSelection& rows,
                                                      bool whole) const {
  TaskReads reads;
  std::vector<Placement> row_placements;
  for (size_t s : shards_of_task_[static_cast<size_t>(task)]) {
    const ShardSpec& shard = shards_[s];
    const size_t v = variable_of_shard_[s];
    const std::vector<int64_t>* selected = v < rows.size() ? rows[v] : nullptr;
    if (selected == nullptr) {
      if (!whole) continue;
      reads.names.push_back(shard.name);
      reads.placements.push_back({v, shard.first_row, shard.shape});
      continue;
    }
    const auto [begin, end] = SelectedRange(s, *selected);
    if (begin == end) continue;  // no row of this shard is wanted
    RowRead read{shard.name, {}};
    for (size_t i = begin; i < end; ++i) read.rows.push_back((*selected)[i] - shard.first_row);
    reads.row_reads.push_back(std::move(read));
    row_placements.push_back({v, static_cast<int64_t>(begin),
                              shard.shape.WithFirstDim(static_cast<int64_t>(end - begin))});
  }
  reads.placements.insert(reads.placements.end(), row_placements.begin(), row_placements.end());
  return reads;
}

std::vector<Tensor> ShardedVariables::NewValues(const RowSelection& rows) const {
  std::vector<Tensor> values;
  for (size_t v = 0; v < shapes_.size(); ++v) {
    const std::vector<int64_t>* selected = v < rows.size() ? rows[v] : nullptr;
    values.emplace_back(DType::kFloat32,
                        selected == nullptr
                            ? shapes_[v]
                            : shapes_[v].WithFirstDim(static_cast<int64_t>(selected->size())));
  }
  return values;
}

absl::Status ShardedVariables::Place(int task, const std::vector<Tensor>& values,
                                     const std::vector<Placement>& placements,
                                     std::vector<Tensor>& out) const {
  const PsClient& client = *clients_[static_cast<size_t>(task)];
  if (values.size() != placements.size()) {
    return absl::DataLossError(absl::StrCat(client.task(), " at ", client.address(), " answered ",
                                            values.size(), " values for ", placements.size(),
                                            ": is it a parameter server of this version?"));
  }
  for (size_t i = 0; i < placements.size(); ++i) {
    if (values[i].dtype() != DType::kFloat32 || values[i].shape() != placements[i].shape) {
      return absl::DataLossError(
          absl::StrCat(client.task(), " at ", client.address(), " answered ",
                       values[i].DebugString(), " where float32", placements[i].shape.ToString(),
                       " was asked: is it a parameter server of this version?"));
    }
    Tensor& target = out[placements[i].variable];
    std::memcpy(static_cast<char*>(target.raw_data()) +
                    static_cast<size_t>(placements[i].row * target.row_size()) * sizeof(float),
                values[i].raw_data(), values[i].byte_size());
  }
  return absl::OkStatus();
}

absl::Status ShardedVariables::CheckSelection(const RowSelection& rows) const {
  for (size_t v = 0; v < rows.size() && v < shapes_.size(); ++v) {
    if (rows[v] == nullptr) continue;
    const std::vector<int64_t>& selected = *rows[v];
    const int64_t table_rows = shapes_[v].rank() == 0 ? 0 : shapes_[v].dim(0);
    for (size_t i = 0; i < selected.size(); ++i) {
      if (selected[i] < 0 || selected[i] >= table_rows ||
          (i > 0 && selected[i] <= selected[i - 1])) {
        return absl::InvalidArgumentError(
            absl::StrCat("the rows selected of variable \"", names_[v],
                         "\" are not sorted, unique and within its ", table_rows, " rows (row ",
                         selected[i], " at position ", i, ")"));
      }
    }
  }
  return absl::OkStatus();
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
    for (auto& [key, group] : groups) {
      std::vector<std::pair<NamedValue, int64_t>> sized;
      for (NamedValue& value : group.second) {
        const auto bytes = static_cast<int64_t>(value.value.byte_size());
        sized.emplace_back(std::move(value), bytes);
      }
      for (const std::vector<NamedValue>& part : InGroups(std::move(sized))) {
        STRATUM_RETURN_IF_ERROR(clients_[static_cast<size_t>(task)]
                                    ->CreateVariables(part, *group.first, /*replace=*/true)
                                    .status());
      }
    }
    return absl::OkStatus();
  });
}

absl::Status ShardedVariables::Create(const std::vector<InitialFill>& fills,
                                      const std::vector<nlohmann::json>& optimizers) {
  return ForEachTask([&](int task) -> absl::Status {
    // One request per optimizer; a fill is a few bytes, whatever its shard's size.
    std::map<std::string, std::pair<const nlohmann::json*, std::vector<FilledShard>>> groups;
    for (size_t s : shards_of_task_[static_cast<size_t>(task)]) {
      const ShardSpec& shard = shards_[s];
      const size_t v = variable_of_shard_[s];
      auto& [optimizer, filled] = groups[optimizers[v].dump()];
      optimizer = &optimizers[v];
      const int64_t row_size = shard.shape.rank() == 0 || shard.shape.dim(0) == 0
                                   ? 0
                                   : shard.shape.num_elements() / shard.shape.dim(0);
      filled.push_back({shard.name, shard.shape, fills[v], shard.first_row * row_size});
    }
    for (const auto& [key, group] : groups) {
      STRATUM_RETURN_IF_ERROR(clients_[static_cast<size_t>(task)]
                                  ->CreateVariables(group.second, *group.first, /*replace=*/true)
                                  .status());
    }
    return absl::OkStatus();
  });
}

absl::Status ShardedVariables::Assign(const std::vector<Tensor>& values) {
  if (values.size() != names_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("assigning ", values.size(), " values to ", names_.size(), " variables"));
  }
  return ForEachTask([&](int task) -> absl::Status {
    std::vector<std::pair<NamedValue, int64_t>> sized;
    for (size_t s : shards_of_task_[static_cast<size_t>(task)]) {
      const ShardSpec& shard = shards_[s];
      NamedValue value{shard.name, RowsOf(values[variable_of_shard_[s]], shard)};
      const auto bytes = static_cast<int64_t>(value.value.byte_size());
      if (bytes <= kRequestBytes || shard.shape.rank() == 0) {
        sized.emplace_back(std::move(value), bytes);
        continue;
      }
      const int64_t row_bytes = RowBytes(shard.shape);
      for (const auto& [begin, end] : RowPieces(shard.shape.dim(0), row_bytes)) {
        std::vector<int64_t> rows(static_cast<size_t>(end - begin));
        std::iota(rows.begin(), rows.end(), begin);
        sized.emplace_back(
            NamedValue{shard.name, value.value.SliceRows(begin, end), std::move(rows)},
            (end - begin) * row_bytes);
      }
    }
    for (const std::vector<NamedValue>& part : InGroups(std::move(sized))) {
      STRATUM_RETURN_IF_ERROR(clients_[static_cast<size_t>(task)]->Assign(part));
    }
    return absl::OkStatus();
  });
}

std::vector<ShardedVariables::TaskReads> ShardedVariables::InRequests(TaskReads reads) const {
  // One part per whole shard or piece of rows, in the order read (whole shards first).
  struct Part {
    bool whole;
    RowRead read;  // the shard's name alone when whole
    Placement placement;
  };
  std::vector<std::pair<Part, int64_t>> parts;
  auto add_pieces = [&](const RowRead& read, const Placement& placement) {
    const int64_t row_bytes = RowBytes(placement.shape);
    for (const auto& [begin, end] : RowPieces(placement.shape.dim(0), row_bytes)) {
      RowRead piece{read.name, {read.rows.begin() + begin, read.rows.begin() + end}};
      parts.emplace_back(Part{false,
                              std::move(piece),
                              {placement.variable, placement.row + begin,
                               placement.shape.WithFirstDim(end - begin)}},
                         (end - begin) * row_bytes);
    }
  };
  for (size_t i = 0; i < reads.names.size(); ++i) {
    const Placement& placement = reads.placements[i];
    const int64_t bytes = placement.shape.num_elements() * static_cast<int64_t>(sizeof(float));
    if (bytes <= kRequestBytes || placement.shape.rank() == 0) {
      parts.emplace_back(Part{true, {reads.names[i], {}}, placement}, bytes);
      continue;
    }
    RowRead all{reads.names[i], std::vector<int64_t>(static_cast<size_t>(placement.shape.dim(0)))};
    std::iota(all.rows.begin(), all.rows.end(), 0);
    add_pieces(all, placement);
  }
  for (size_t i = 0; i < reads.row_reads.size(); ++i) {
    add_pieces(reads.row_reads[i], reads.placements[reads.names.size() + i]);
  }
  std::vector<TaskReads> requests;
  for (std::vector<Part>& group : InGroups(std::move(parts))) {
    // The PS answers the whole shards first, then the rows.
    TaskReads& request = requests.emplace_back();
    std::vector<Placement> row_placements;
    for (Part& part : group) {
      if (part.whole) {
        request.names.push_back(std::move(part.read.name));
        request.placements.push_back(std::move(part.placement));
      } else {
        request.row_reads.push_back(std::move(part.read));
        row_placements.push_back(std::move(part.placement));
      }
    }
    request.placements.insert(request.placements.end(), row_placements.begin(),
                              row_placements.end());
  }
  return requests;
}

absl::StatusOr<std::vector<Tensor>> ShardedVariables::Pull(const RowSelection& rows) {
  STRATUM_RETURN_IF_ERROR(CheckSelection(rows));
  std::vector<Tensor> values = NewValues(rows);
  absl::Status status = ForEachTask([&](int task) -> absl::Status {
    for (const TaskReads& request : InRequests(ReadsOf(task, rows, /*whole=*/true))) {
      absl::StatusOr<std::vector<Tensor>> answer =
          clients_[static_cast<size_t>(task)]->Pull(request.names, request.row_reads);
      if (!answer.ok()) return answer.status();
      STRATUM_RETURN_IF_ERROR(Place(task, *answer, request.placements, values));
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return values;
}

absl::Status ShardedVariables::Push(const std::vector<Tensor>& gradients,
                                    std::vector<Tensor>* pulled, const RowSelection& rows,
                                    const RowSelection& next_rows) {
  STRATUM_RETURN_IF_ERROR(CheckSelection(rows));
  STRATUM_RETURN_IF_ERROR(CheckSelection(next_rows));
  if (pulled != nullptr) *pulled = NewValues(next_rows);
  return ForEachTask([&](int task) -> absl::Status {
    std::vector<NamedValue> values;
    for (size_t s : shards_of_task_[static_cast<size_t>(task)]) {
      const ShardSpec& shard = shards_[s];
      const size_t v = variable_of_shard_[s];
      const Tensor& gradient = gradients[v];
      const std::vector<int64_t>* selected = v < rows.size() ? rows[v] : nullptr;
      if (selected == nullptr) {
        values.push_back({shard.name, RowsOf(gradient, shard)});
        continue;
      }
      const auto [begin, end] = SelectedRange(s, *selected);
      if (begin == end) continue;  // the step touched no row of this shard
      std::vector<int64_t> local;
      for (size_t i = begin; i < end; ++i) local.push_back((*selected)[i] - shard.first_row);
      values.push_back({shard.name,
                        gradient.SliceRows(static_cast<int64_t>(begin), static_cast<int64_t>(end)),
                        std::move(local)});
    }
    // Whole values come back for the whole gradients, in their order, then the rows read.
    const TaskReads reads = ReadsOf(task, next_rows, /*whole=*/pulled != nullptr);
    if (values.empty() && reads.placements.empty()) return absl::OkStatus();
    std::vector<Tensor> back;
    absl::Status status = clients_[static_cast<size_t>(task)]->Push(
        values, pulled != nullptr ? &back : nullptr, reads.row_reads);
    if (!status.ok() || pulled == nullptr) return status;
    return Place(task, back, reads.placements, *pulled);
  });
}

}  // namespace stratum
