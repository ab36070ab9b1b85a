#include "stratum/training/evaluate.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "stratum/device/device.h"
#include "stratum/strategy/distributed_dataset.h"
#include "stratum/util/sort_unique.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// An id as the int32 a model that takes only ids is given (IdWord's int32).
int32_t IdOf(int64_t id) { return IdOfWord(IdWord(id)); }

// x: raw features -> float32 [B, ...input_shape] times `rescale`; for a model that takes only
// ids, int32 ids [B, ...input_shape] (exact where float32 values are exact to 2^24 only).
absl::StatusOr<Tensor> ToModelInput(const Tensor& x, const Model& model, double rescale) {
  std::vector<int64_t> dims = {x.rows()};
  const Shape input = model.input_shape();
  for (int64_t dim : input.dims()) dims.push_back(dim);
  Shape shape(dims);
  if (shape.num_elements() != x.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data's examples are ", x.DebugString(), " but the model takes ",
        model.input_shape().ToString(), " per example: fix the model's input shape or the data"));
  }
  if (model.takes_only_ids()) {
    if (x.dtype() == DType::kInt32) return x.Reshape(shape);
    Tensor ids(DType::kInt32, shape);
    auto out = ids.Flat<int32_t>();
    switch (x.dtype()) {
      case DType::kUInt8:
        out = x.Flat<uint8_t>().cast<int32_t>();
        break;
      case DType::kFloat32:
        out = x.Flat().unaryExpr([](float v) { return IdOfWord(IdWordOfValue(v)); });
        break;
      case DType::kInt64:
        out = x.Flat<int64_t>().unaryExpr([](int64_t v) { return IdOf(v); });
        break;
      case DType::kInt32:
        break;
    }
    return ids;
  }
  Tensor out(DType::kFloat32, shape);
  const float scale = static_cast<float>(rescale);
  switch (x.dtype()) {
    case DType::kUInt8:
      out.Flat() = x.Flat<uint8_t>().cast<float>() * scale;
      break;
    case DType::kFloat32:
      out.Flat() = x.Flat() * scale;
      break;
    case DType::kInt32:
      out.Flat() = x.Flat<int32_t>().cast<float>() * scale;
      break;
    case DType::kInt64:
      out.Flat() = x.Flat<int64_t>().cast<float>() * scale;
      break;
  }
  return out;
}

}  // namespace

StepStats SumOverReplicas(const PerReplica<StepStats>& stats) {
  StepStats total{};
  for (const StepStats& s : stats.values()) Accumulate(total, s);
  return total;
}

void Accumulate(StepStats& into, const StepStats& more) {
  into.loss_sum += more.loss_sum;
  into.correct += more.correct;
  into.examples += more.examples;
  into.auc.Merge(more.auc);
}

absl::Status SumOverWorkers(const Strategy& strategy, StepStats& stats) {
  if (strategy.num_workers() == 1) return absl::OkStatus();
  // float32 counts are exact below 2^24 examples per epoch and worker. The AUC counts
  // travel always (zeros where a worker has none), so that every worker sends the same size.
  const int64_t size = 3 + 2 * AucCounts::kBuckets;
  Tensor values(DType::kFloat32, Shape({size}));
  values.SetZero();
  float* v = values.data<float>();
  v[0] = static_cast<float>(stats.loss_sum);
  v[1] = static_cast<float>(stats.correct);
  v[2] = static_cast<float>(stats.examples);
  const std::vector<double> counts = stats.auc.Values();
  for (size_t i = 0; i < counts.size(); ++i) v[3 + i] = static_cast<float>(counts[i]);
  std::vector<Tensor> across = {std::move(values)};
  STRATUM_RETURN_IF_ERROR(strategy.AllReduceAcrossWorkers(ReduceOp::kSum, across));
  v = across[0].data<float>();
  stats = {static_cast<double>(v[0]), static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2])};
  const std::vector<double> summed(v + 3, v + size);
  if (std::any_of(summed.begin(), summed.end(), [](double c) { return c != 0; })) {
    stats.auc = AucCounts::FromValues(summed.data(), static_cast<int64_t>(summed.size()));
  }
  return absl::OkStatus();
}

Dataset MakeBatches(const Dataset& examples, const Model& model, int64_t global_batch,
                    double rescale, int64_t shuffle_buffer, uint64_t seed, bool repeat,
                    bool drop_remainder) {
  Dataset dataset = examples;
  if (shuffle_buffer > 1) dataset = dataset.Shuffle(shuffle_buffer, seed);
  if (repeat) dataset = dataset.Repeat();
  return dataset.Batch(global_batch, drop_remainder)
      .Map([model, rescale](Element batch) -> absl::StatusOr<Element> {
        absl::StatusOr<Tensor> x = ToModelInput(batch[0], model, rescale);
        if (!x.ok()) return x.status();
        batch[0] = *std::move(x);
        return batch;
      })
      .Prefetch(2);
}

absl::StatusOr<EpochLog> EvaluateDataset(Strategy& strategy, const Model& model, const Loss& loss,
                                         const std::vector<Tensor>& variables, const Dataset& data,
                                         double rescale, int64_t global_batch,
                                         const GivenTableRows* given) {
  // Several workers: each evaluates its shard; the totals are summed over the workers.
  const int workers = strategy.num_workers();
  const Dataset shard = workers > 1 ? data.Shard(workers, strategy.worker_index()) : data;
  const Dataset batches =
      MakeBatches(shard, model, std::max<int64_t>(global_batch / workers, 1), rescale, 0, 0, false);
  // Already this worker's shard and batch: only split over the local replicas.
  absl::StatusOr<DistributedDataset> distributed =
      DistributedDataset::FromGlobalBatches(batches, strategy.NumLocalReplicas(), {});
  if (!distributed.ok()) return distributed.status();
  std::vector<std::unique_ptr<Workspace>> workspaces;
  for (int r = 0; r < strategy.NumLocalReplicas(); ++r) {
    workspaces.push_back(model.NewWorkspace(r));
    if (given != nullptr) {
      STRATUM_RETURN_IF_ERROR(workspaces.back()->SetVariableRows(given->variables, given->rows));
    }
  }
  auto iterator = distributed->MakeIterator();
  StepStats total{};
  while (true) {
    absl::StatusOr<std::optional<PerReplica<Element>>> batch = iterator->GetNext();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) break;
    const PerReplica<Element>& parts = **batch;
    absl::StatusOr<PerReplica<StepStats>> stats =
        strategy.Run<StepStats>([&](ReplicaContext& context) -> absl::StatusOr<StepStats> {
          const int r = context.local_replica_id();
          if (parts[r][0].rows() == 0) return StepStats{};
          return model.Evaluate(variables, parts[r][0], parts[r][1], loss, *workspaces[r]);
        });
    if (!stats.ok()) return stats.status();
    Accumulate(total, SumOverReplicas(*stats));
  }
  STRATUM_RETURN_IF_ERROR(SumOverWorkers(strategy, total));
  return ValidationLog(total);
}

absl::StatusOr<std::vector<std::vector<int64_t>>> RowsReadByDataset(
    const Model& model, const std::vector<int>& variables, const Dataset& data, double rescale,
    int64_t batch) {
  std::vector<std::vector<int64_t>> rows(variables.size());
  auto iterator = MakeBatches(data, model, batch, rescale, 0, 0, false).MakeIterator();
  while (true) {
    STRATUM_ASSIGN_OR_RETURN(std::optional<Element> next, iterator->GetNext());
    if (!next) break;
    STRATUM_ASSIGN_OR_RETURN(const std::vector<std::vector<int64_t>> read,
                             model.RowsRead({&next->front()}, variables));
    for (size_t t = 0; t < read.size(); ++t) {
      rows[t].insert(rows[t].end(), read[t].begin(), read[t].end());
    }
  }
  for (size_t t = 0; t < rows.size(); ++t) {  // sorted and unique once, not per batch
    SortUnique(rows[t], model.variables()[static_cast<size_t>(variables[t])].shape.dim(0));
  }
  return rows;
}

EpochLog ValidationLog(const StepStats& total) {
  EpochLog log;
  const double examples = static_cast<double>(std::max<int64_t>(total.examples, 1));
  log.val_loss = total.loss_sum / examples;
  log.val_accuracy = static_cast<double>(total.correct) / examples;
  if (!total.auc.empty()) log.val_auc = total.auc.Auc();
  log.validated = true;
  return log;
}

}  // namespace stratum
