#include "stratum/ps/variable_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stratum/model/optimizer.h"
#include "stratum/tensor/gather_rows.h"
#include "stratum/util/error_kind.h"
#include "stratum/util/metrics.h"
#include "stratum/util/sort_unique.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// Rows to read of `value` (variable `name`): it has rows, and each is one of them.
absl::Status CheckRows(const std::string& name, const Tensor& value,
                       const std::vector<int64_t>& rows) {
  if (value.shape().rank() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable \"", name, "\" is a scalar, which has no rows: pull it whole"));
  }
  for (int64_t row : rows) {
    if (row < 0 || row >= value.rows()) {
      return absl::InvalidArgumentError(absl::StrCat("row ", row, " of variable \"", name,
                                                     "\" is out of range: it has rows 0..",
                                                     value.rows() - 1));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMatches(const std::string& name, const char* what, const Tensor& given,
                          const VariableInfo& info) {
  if (given.dtype() == info.dtype && given.shape() == info.shape) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " for variable \"", name, "\" is ", given.DebugString(), " but the variable is ",
      DTypeName(info.dtype), info.shape.ToString(), ": send a tensor of the variable's shape"));
}

// Values (`what`: "row gradients", "row values") for rows `rows` of variable `name`: float32
// [rows, ...] of a variable with rows, each of them within it.
absl::Status CheckRowValues(const std::string& name, const char* what, const Tensor& given,
                            const std::vector<int64_t>& rows, const VariableInfo& info) {
  if (info.shape.rank() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " for variable \"", name, "\", a scalar, which has no rows: send it whole"));
  }
  if (rows.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " for variable \"", name, "\" name no rows: send at least one row, or none"));
  }
  const Shape expected = info.shape.WithFirstDim(static_cast<int64_t>(rows.size()));
  if (given.dtype() != DType::kFloat32 || !(given.shape() == expected)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " for variable \"", name, "\" are ",
                                                   given.DebugString(), " for ", rows.size(),
                                                   " rows: send float32", expected.ToString()));
  }
  for (int64_t index : rows) {
    if (index < 0 || index >= info.shape.dim(0)) {
      return absl::InvalidArgumentError(absl::StrCat("row ", index, " of variable \"", name,
                                                     "\" is out of range: it has rows 0..",
                                                     info.shape.dim(0) - 1));
    }
  }
  return absl::OkStatus();
}

std::string OptimizerName(const nlohmann::json& config) {
  if (config.is_null()) return "";
  if (config.is_string()) return config.get<std::string>();
  return config.value("class_name", "");
}

}  // namespace

absl::StatusOr<bool> VariableStore::Create(const std::string& name, const Tensor& initial,
                                           const nlohmann::json& optimizer_config, bool replace) {
  if (name.empty()) return absl::InvalidArgumentError("a variable needs a name");
  if (initial.dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat("variable \"", name, "\" is ",
                                                   initial.DebugString(),
                                                   ": parameter servers hold float32 variables"));
  }
  std::unique_ptr<Optimizer> optimizer;
  if (!optimizer_config.is_null()) {
    absl::StatusOr<std::unique_ptr<Optimizer>> made = Optimizer::FromKeras(optimizer_config);
    if (!made.ok()) return made.status();
    // Each push updates the variables of one PS: no PS sees a step's gradients together.
    if ((*made)->clipping().global_norm > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variable \"", name,
          "\" has an optimizer with global_clipnorm, which needs every "
          "gradient of a step at once, and a parameter server sees only its own variables: use "
          "clipnorm (per variable) or clipvalue in parameter-server jobs"));
    }
    optimizer = *std::move(made);
  }
  absl::MutexLock lock(&table_mutex_);
  const bool existed = variables_.count(name) > 0;
  // A push in flight keeps the replaced variable alive and updates it, not the new one.
  if (replace) variables_.erase(name);
  if (auto existing = variables_.find(name); existing != variables_.end()) {
    const Variable& variable = *existing->second;
    absl::MutexLock variable_lock(&variable.mutex);
    const bool same_optimizer =
        (optimizer == nullptr) == (variable.optimizer == nullptr) &&
        (optimizer == nullptr || (optimizer->name() == variable.optimizer->name() &&
                                  optimizer->config() == variable.optimizer->config()));
    if (variable.info.shape == initial.shape() && same_optimizer) return false;
    return absl::AlreadyExistsError(absl::StrCat(
        "variable \"", name, "\" exists as float32", variable.info.shape.ToString(), " with ",
        variable.info.optimizer.empty() ? "no optimizer" : variable.info.optimizer,
        ", and cannot be created again as ", initial.DebugString(), " with ",
        optimizer == nullptr ? "no optimizer" : optimizer->name(),
        ": use another name, or the same shape and optimizer"));
  }
  auto variable = std::make_shared<Variable>();
  {
    absl::MutexLock variable_lock(&variable->mutex);
    variable->info = {name, DType::kFloat32, initial.shape(), OptimizerName(optimizer_config), 0};
    if (optimizer != nullptr) variable->info.optimizer = optimizer->name();
    variable->value = initial.Clone();
    if (optimizer != nullptr) variable->slots = optimizer->NewSlots(variable->value);
    variable->optimizer = std::move(optimizer);
    variable->optimizer_config = optimizer_config;
  }
  variables_.emplace(name, std::move(variable));
  return !existed;
}

absl::StatusOr<std::shared_ptr<VariableStore::Variable>> VariableStore::Find(
    const std::string& name) const {
  absl::ReaderMutexLock lock(&table_mutex_);
  auto it = variables_.find(name);
  if (it == variables_.end()) {
    return WithErrorKind(
        absl::NotFoundError(absl::StrCat("variable \"", name,
                                         "\" does not exist on this parameter server: create it "
                                         "first (the coordinator creates every variable before "
                                         "training)")),
        ErrorKind::kVariableMissing);
  }
  return it->second;
}

namespace {

// stratum_ps_{pulled,pushed}_bytes_total and stratum_ps_updates_total: what the variables
// gave and took, whichever transport carried it.
Counter& PulledBytes() {
  static Counter& counter = MetricsRegistry::Global().GetCounter(
      "stratum_ps_pulled_bytes_total", "Bytes of variable values this parameter server read out.");
  return counter;
}
Counter& PushedBytes() {
  static Counter& counter = MetricsRegistry::Global().GetCounter(
      "stratum_ps_pushed_bytes_total", "Bytes of gradients this parameter server applied.");
  return counter;
}
Counter& Updates(bool rows) {
  static Counter& dense = MetricsRegistry::Global().GetCounter(
      "stratum_ps_updates_total", "Optimizer updates this parameter server applied.",
      {{"gradient", "dense"}});
  static Counter& sparse = MetricsRegistry::Global().GetCounter(
      "stratum_ps_updates_total", "Optimizer updates this parameter server applied.",
      {{"gradient", "rows"}});
  return rows ? sparse : dense;
}

}  // namespace

absl::StatusOr<Tensor> VariableStore::Read(const std::string& name) const {
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  absl::MutexLock lock(&(*variable)->mutex);
  PulledBytes().Add(static_cast<double>((*variable)->value.byte_size()));
  return (*variable)->value.Clone();
}

absl::StatusOr<VariableInfo> VariableStore::ReadInto(
    const std::string& name, const std::function<void*(const VariableInfo&)>& destination,
    const std::vector<int64_t>* rows) const {
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  const Variable& v = **variable;
  absl::MutexLock lock(&v.mutex);
  VariableInfo info = v.info;
  if (rows != nullptr) {
    STRATUM_RETURN_IF_ERROR(CheckRows(name, v.value, *rows));
    info.shape = v.info.shape.WithFirstDim(static_cast<int64_t>(rows->size()));
  }
  void* out = destination(info);
  const size_t bytes = static_cast<size_t>(info.shape.num_elements()) * sizeof(float);
  if (out == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no room to copy variable \"", name, "\" (", bytes, " bytes)"));
  }
  PulledBytes().Add(static_cast<double>(bytes));
  if (rows == nullptr) {
    if (bytes > 0) std::memcpy(out, v.value.raw_data(), bytes);
    return info;
  }
  GatherRows(v.value, rows->data(), rows->size(), out);
  return info;
}

absl::StatusOr<Tensor> VariableStore::ReadRows(const std::string& name,
                                               const std::vector<int64_t>& indices) const {
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  const Variable& v = **variable;
  absl::MutexLock lock(&v.mutex);
  STRATUM_RETURN_IF_ERROR(CheckRows(name, v.value, indices));
  Tensor out(DType::kFloat32, v.value.shape().WithFirstDim(static_cast<int64_t>(indices.size())));
  PulledBytes().Add(static_cast<double>(out.byte_size()));
  GatherRows(v.value, indices.data(), indices.size(), out.raw_data());
  return out;
}

absl::Status VariableStore::Assign(const std::string& name, const Tensor& value,
                                   const std::vector<int64_t>* rows) {
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  Variable& v = **variable;
  absl::MutexLock lock(&v.mutex);
  if (rows == nullptr) {
    STRATUM_RETURN_IF_ERROR(CheckMatches(name, "value", value, v.info));
    v.value.CopyFrom(value);
  } else {
    STRATUM_RETURN_IF_ERROR(CheckRowValues(name, "row values", value, *rows, v.info));
    const int64_t row_size = v.value.row_size();
    for (size_t i = 0; i < rows->size(); ++i) {
      std::memcpy(v.value.data<float>() + (*rows)[i] * row_size,
                  value.data<float>() + static_cast<int64_t>(i) * row_size,
                  static_cast<size_t>(row_size) * sizeof(float));
    }
  }
  // A diverged variable trains again once its values are all finite (a large one assigned
  // in pieces of rows, once the last piece is).
  if (!v.diverged.empty() && AllFinite(v.value)) v.diverged.clear();
  return absl::OkStatus();
}

absl::Status VariableStore::CheckFinite(const std::string& name, const Tensor& gradient) {
  if (AllFinite(gradient)) return absl::OkStatus();
  {
    absl::MutexLock lock(&stats_mutex_);
    ++refused_non_finite_;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("gradient for variable \"", name,
                   "\" contains NaN or Inf and was refused (the variable "
                   "is unchanged): lower the learning rate or check the "
                   "loss and the input data"));
}

absl::Status VariableStore::CheckGradientLocked(const std::string& name, const Variable& v,
                                                const Tensor& gradient,
                                                const std::vector<int64_t>* rows) {
  if (v.optimizer == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("variable \"", name,
                     "\" has no optimizer, so gradients cannot be applied: create it "
                     "with one, or assign new values"));
  }
  if (!v.diverged.empty()) return absl::FailedPreconditionError(v.diverged);
  if (rows == nullptr) return CheckMatches(name, "gradient", gradient, v.info);
  return CheckRowValues(name, "row gradients", gradient, *rows, v.info);
}

absl::StatusOr<std::vector<int64_t>> VariableStore::ApplyPush(
    const std::vector<PushedGradient>& gradients) {
  if (gradients.size() > 1) {
    for (const PushedGradient& pushed : gradients) {
      STRATUM_RETURN_IF_ERROR(CheckGradient(*pushed.name, *pushed.gradient, pushed.rows));
    }
  }
  std::vector<int64_t> updates;
  for (const PushedGradient& pushed : gradients) {
    STRATUM_ASSIGN_OR_RETURN(const int64_t count,
                             pushed.rows != nullptr
                                 ? ApplyRowGradients(*pushed.name, *pushed.rows, *pushed.gradient)
                                 : ApplyGradient(*pushed.name, *pushed.gradient));
    updates.push_back(count);
  }
  return updates;
}

absl::Status VariableStore::CheckGradient(const std::string& name, const Tensor& gradient,
                                          const std::vector<int64_t>* rows) {
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  {
    absl::MutexLock lock(&(*variable)->mutex);
    if (absl::Status status = CheckGradientLocked(name, **variable, gradient, rows); !status.ok()) {
      return status;
    }
  }
  return CheckFinite(name, gradient);
}

absl::StatusOr<int> VariableStore::SetLearningRate(float rate) {
  if (!(rate > 0) || !std::isfinite(rate)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning rate ", rate, " is not a positive number: give the rate to train with"));
  }
  std::vector<std::shared_ptr<Variable>> variables;
  {
    absl::MutexLock lock(&table_mutex_);
    for (const auto& [name, variable] : variables_) variables.push_back(variable);
  }
  int changed = 0;
  for (const std::shared_ptr<Variable>& variable : variables) {
    absl::MutexLock lock(&variable->mutex);
    if (variable->optimizer == nullptr || variable->optimizer_config == NonTrainableUpdateJson()) {
      continue;
    }
    nlohmann::json spec = variable->optimizer_config;
    if (spec.is_string()) spec = {{"class_name", spec}, {"config", nlohmann::json::object()}};
    if (!spec.contains("config") || !spec["config"].is_object())
      spec["config"] = nlohmann::json::object();
    if (spec["config"].contains("learning_rate") && spec["config"]["learning_rate"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variable \"", variable->info.name,
          "\" takes its learning rate from a schedule, which sets it at every update: a rate "
          "cannot be set on it (Keras refuses this too)"));
    }
    spec["config"]["learning_rate"] = rate;
    absl::StatusOr<std::unique_ptr<Optimizer>> made = Optimizer::FromKeras(spec);
    if (!made.ok()) return made.status();
    variable->optimizer = *std::move(made);
    variable->optimizer_config = std::move(spec);
    ++changed;
  }
  return changed;
}

absl::StatusOr<int64_t> VariableStore::ApplyGradient(const std::string& name,
                                                     const Tensor& gradient) {
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  Variable& v = **variable;
  absl::MutexLock lock(&v.mutex);
  if (absl::Status status = CheckGradientLocked(name, v, gradient, nullptr); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckFinite(name, gradient); !status.ok()) return status;
  v.optimizer->ApplyDense(v.value, gradient, v.slots, v.info.updates);
  PushedBytes().Add(static_cast<double>(gradient.byte_size()));
  Updates(false).Add();
  ++v.info.updates;
  STRATUM_RETURN_IF_ERROR(CheckUpdated(name, v, AllFinite(v.value)));
  return v.info.updates;
}

absl::Status VariableStore::CheckUpdated(const std::string& name, Variable& v, bool finite) {
  if (finite) return absl::OkStatus();
  const nlohmann::json& config = v.optimizer_config;
  const std::string optimizer =
      config.is_object() ? absl::StrCat(config.value("class_name", std::string("optimizer")), " ",
                                        config.value("config", nlohmann::json::object()).dump())
                         : config.dump();
  v.diverged = absl::StrCat(
      "variable \"", name, "\" became NaN or Inf at its update ", v.info.updates,
      ", from a finite gradient: its optimizer (", optimizer,
      ") diverges; lower the learning rate or clip the gradients (clipnorm). Its pushes are "
      "refused from now on; checkpoints refuse NaN and Inf, so the job's last one holds finite "
      "values to resume from");
  spdlog::error("{}", v.diverged);
  return absl::FailedPreconditionError(v.diverged);
}

absl::StatusOr<int64_t> VariableStore::ApplyRowGradients(const std::string& name,
                                                         const std::vector<int64_t>& indices,
                                                         const Tensor& row_gradients) {
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  Variable& v = **variable;
  absl::MutexLock lock(&v.mutex);
  if (absl::Status status = CheckGradientLocked(name, v, row_gradients, &indices); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckFinite(name, row_gradients); !status.ok()) return status;
  // Duplicate rows summed, in row order (a worker sends them so already: then no copy).
  const int64_t width = v.value.row_size();
  const bool unique_sorted = std::adjacent_find(indices.begin(), indices.end(),
                                                std::greater_equal<int64_t>()) == indices.end();
  bool finite = true;
  if (unique_sorted) {
    finite = v.optimizer->ApplyRows(v.value, indices, row_gradients, v.slots, v.info.updates);
  } else {
    std::vector<int64_t> rows(indices);
    SortUnique(rows, v.value.rows());
    Tensor summed(DType::kFloat32, v.info.shape.WithFirstDim(static_cast<int64_t>(rows.size())));
    summed.SetZero();
    for (size_t i = 0; i < indices.size(); ++i) {
      const auto at = std::lower_bound(rows.begin(), rows.end(), indices[i]) - rows.begin();
      const float* from = row_gradients.data<float>() + static_cast<int64_t>(i) * width;
      float* to = summed.data<float>() + at * width;
      for (int64_t k = 0; k < width; ++k) to[k] += from[k];
    }
    finite = v.optimizer->ApplyRows(v.value, rows, summed, v.slots, v.info.updates);
  }
  PushedBytes().Add(
      static_cast<double>(row_gradients.byte_size() + indices.size() * sizeof(int64_t)));
  Updates(true).Add();
  ++v.info.updates;
  STRATUM_RETURN_IF_ERROR(CheckUpdated(name, v, finite));
  return v.info.updates;
}

absl::Status VariableStore::CheckPull(const std::vector<std::string>& names, uint64_t max_bytes,
                                      const std::vector<RowRead>& row_reads) const {
  absl::flat_hash_set<std::string> seen;
  uint64_t bytes = 0;
  auto count = [&](const std::string& name, const int64_t* rows, size_t num_rows) -> absl::Status {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("the pull names variable \"", name,
                                                     "\" more than once: name each variable once"));
    }
    absl::StatusOr<VariableInfo> info = Info(name);
    if (!info.ok()) return info.status();
    if (rows == nullptr) {
      bytes += static_cast<uint64_t>(info->shape.num_elements()) * DTypeSize(info->dtype);
    } else {
      if (info->shape.rank() == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable \"", name, "\" is a scalar, which has no rows: pull it whole"));
      }
      const int64_t table_rows = info->shape.dim(0);
      for (size_t i = 0; i < num_rows; ++i) {
        if (rows[i] < 0 || rows[i] >= table_rows) {
          return absl::InvalidArgumentError(absl::StrCat("row ", rows[i], " of variable \"", name,
                                                         "\" is out of range: it has rows 0..",
                                                         table_rows - 1));
        }
      }
      bytes +=
          num_rows *
          static_cast<uint64_t>(info->shape.num_elements() / std::max<int64_t>(table_rows, 1)) *
          DTypeSize(info->dtype);
    }
    if (bytes > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the pull of ", names.size() + row_reads.size(), " variables would answer more than ",
          max_bytes, " bytes, the limit of one message: ",
          row_reads.empty() ? "pull fewer variables per request"
                            : "pull fewer variables or rows per request (smaller batches)"));
    }
    return absl::OkStatus();
  };
  for (const std::string& name : names) STRATUM_RETURN_IF_ERROR(count(name, nullptr, 0));
  for (const RowRead& read : row_reads) {
    STRATUM_RETURN_IF_ERROR(count(read.name, read.rows.data(), read.rows.size()));
  }
  return absl::OkStatus();
}

std::vector<VariableInfo> VariableStore::List() const {
  std::vector<VariableInfo> infos;
  absl::ReaderMutexLock lock(&table_mutex_);
  for (const auto& [name, variable] : variables_) {
    absl::MutexLock variable_lock(&variable->mutex);
    infos.push_back(variable->info);
  }
  return infos;
}

absl::StatusOr<VariableInfo> VariableStore::Info(const std::string& name) const {
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  absl::MutexLock lock(&(*variable)->mutex);
  return (*variable)->info;
}

absl::StatusOr<VariableSnapshot> VariableStore::Snapshot(const std::string& name,
                                                         bool values) const {
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  const Variable& v = **variable;
  absl::MutexLock lock(&v.mutex);
  VariableSnapshot snapshot;
  snapshot.info = v.info;
  if (v.optimizer != nullptr) snapshot.slot_names = v.optimizer->SlotNames();
  if (values) {
    snapshot.value = v.value.Clone();
    for (const Tensor& slot : v.slots) snapshot.slots.push_back(slot.Clone());
  }
  snapshot.optimizer_config = v.optimizer_config;
  return snapshot;
}

absl::Status VariableStore::Restore(const VariableSnapshot& snapshot) {
  const std::string& name = snapshot.info.name;
  // A variable the job created before restoring keeps the job's optimizer, which goes on
  // from the checkpoint's slots (its learning rate may have changed since, as in Keras).
  nlohmann::json optimizer_config = snapshot.optimizer_config;
  if (absl::StatusOr<std::shared_ptr<Variable>> job = Find(name); job.ok()) {
    std::string trained_with = "none";
    if (!snapshot.optimizer_config.is_null()) {
      absl::StatusOr<std::unique_ptr<Optimizer>> made = Optimizer::FromKeras(optimizer_config);
      if (!made.ok()) return made.status();
      trained_with = (*made)->name();
    }
    absl::MutexLock lock(&(*job)->mutex);
    const std::string& job_uses = (*job)->info.optimizer.empty() ? "none" : (*job)->info.optimizer;
    if (job_uses != trained_with) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint's variable \"", name, "\" was trained with optimizer ", trained_with,
          ", but the job uses ", job_uses,
          ": use the job's earlier optimizer, or another checkpoint.dir to train from scratch"));
    }
    optimizer_config = (*job)->optimizer_config;
  }
  absl::StatusOr<bool> created = Create(name, snapshot.value, optimizer_config, /*replace=*/true);
  if (!created.ok()) return created.status();
  absl::StatusOr<std::shared_ptr<Variable>> variable = Find(name);
  if (!variable.ok()) return variable.status();
  Variable& v = **variable;
  absl::MutexLock lock(&v.mutex);
  if (snapshot.slots.size() != v.slots.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint's variable \"", name, "\" has ", snapshot.slots.size(),
                     " optimizer slots, but the job's optimizer needs ", v.slots.size(),
                     " (its settings differ, e.g. SGD's momentum): use the job's earlier "
                     "optimizer settings, or another checkpoint.dir to train from scratch"));
  }
  for (size_t s = 0; s < v.slots.size(); ++s) {
    if (!(snapshot.slots[s].shape() == v.slots[s].shape())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint slot ", s, " of variable \"", name, "\" is ", snapshot.slots[s].DebugString(),
          " but the variable needs ", v.slots[s].DebugString()));
    }
    v.slots[s].CopyFrom(snapshot.slots[s]);
  }
  v.info.updates = snapshot.info.updates;
  return absl::OkStatus();
}

int64_t VariableStore::refused_non_finite() const {
  absl::MutexLock lock(&stats_mutex_);
  return refused_non_finite_;
}

int64_t VariableStore::total_bytes() const {
  int64_t bytes = 0;
  absl::ReaderMutexLock lock(&table_mutex_);
  for (const auto& [name, variable] : variables_) {
    absl::MutexLock variable_lock(&variable->mutex);
    bytes += static_cast<int64_t>(variable->value.byte_size());
  }
  return bytes;
}

}  // namespace stratum
