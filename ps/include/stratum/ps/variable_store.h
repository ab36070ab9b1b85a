// VariableStore: the variables a parameter server holds, with their optimizer state, and
// the updates workers push. Plain C++ (no gRPC): the PS service adapts it.
//
// Every request is validated before anything changes: an unknown variable, a dtype or
// shape that does not match, row indices out of range, or a gradient with NaN or Inf is
// refused (INVALID_ARGUMENT / NOT_FOUND naming the variable and the problem) and leaves
// the variable as it was. Refused non-finite gradients are counted.
//
// Thread safety: all methods are thread-safe. Each variable has its own lock, so pushes
// to different variables proceed in parallel; the table of variables has a reader/writer
// lock taken only briefly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "stratum/model/optimizer.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

struct VariableInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  std::string optimizer;  // Keras class name, "" for none
  int64_t updates = 0;    // updates applied so far
};

// Some rows of axis 0 of a variable, in the order wanted: what a worker pulls of an
// embedding table (the rows its batch reads).
struct RowRead {
  std::string name;
  std::vector<int64_t> rows;
};

// A copy of a variable and its optimizer slots, for checkpoints.
struct VariableSnapshot {
  VariableInfo info;
  Tensor value;
  std::vector<std::string> slot_names;
  std::vector<Tensor> slots;
  nlohmann::json optimizer_config;
};

class VariableStore {
 public:
  VariableStore() = default;
  VariableStore(const VariableStore&) = delete;
  VariableStore& operator=(const VariableStore&) = delete;

  // Creates `name` with `initial` (float32) and the Keras optimizer `optimizer` (null: no
  // optimizer; ApplyGradient is then refused). Creating an existing variable again with
  // the same dtype, shape and optimizer is a no-op that returns false; a different spec
  // is ALREADY_EXISTS naming the difference. With `replace` an existing variable starts
  // afresh instead (value, optimizer, slots, update count), whatever its spec: a new job's
  // coordinator initializes its variables, whatever an earlier job left on a long-lived
  // parameter server. Returns true when no variable of the name existed.
  absl::StatusOr<bool> Create(const std::string& name, const Tensor& initial,
                              const nlohmann::json& optimizer, bool replace = false);

  absl::StatusOr<Tensor> Read(const std::string& name) const;
  // Copies the value of `name`, under its lock, into the memory `destination` returns for
  // the variable's info (info.shape.num_elements() floats), without a new tensor between:
  // a transport copies straight into what it sends. Returns the info, with the updates
  // applied at the time of the copy. `destination` returning nullptr (no room) is
  // RESOURCE_EXHAUSTED.
  // With `rows`, only those rows of axis 0, in order (the info's shape then has that many
  // rows); rows out of range are INVALID_ARGUMENT, before `destination` is asked.
  absl::StatusOr<VariableInfo> ReadInto(
      const std::string& name, const std::function<void*(const VariableInfo&)>& destination,
      const std::vector<int64_t>* rows = nullptr) const;
  // Rows `indices` of axis 0, in order (duplicates allowed).
  absl::StatusOr<Tensor> ReadRows(const std::string& name,
                                  const std::vector<int64_t>& indices) const;
  // Sets the variable's value, or with `rows` (sorted or not, each once) those rows of axis 0
  // to `value` ([rows, ...]); the optimizer's slots stay. A diverged variable trains again
  // once it holds only finite values.
  absl::Status Assign(const std::string& name, const Tensor& value,
                      const std::vector<int64_t>* rows = nullptr);
  // Keras' optimizer.learning_rate = `rate`: every variable whose optimizer is a job's (not
  // the non-trainable variables' update) applies its next updates with that constant rate,
  // its slots as they are; the config it is saved with says so. Returns how many changed.
  // INVALID_ARGUMENT for a rate that is not positive and finite, or a variable whose
  // learning rate is a schedule.
  absl::StatusOr<int> SetLearningRate(float rate);

  // One optimizer update with a dense gradient; returns the variable's update count. An
  // update that makes the value NaN or Inf from a finite gradient (a diverging optimizer:
  // too high a learning rate) is FAILED_PRECONDITION saying so, and so is every later push
  // to the variable until finite values are assigned (checkpoints refuse non-finite
  // values, so the last one stays finite). ApplyRowGradients checks the rows it updated.
  absl::StatusOr<int64_t> ApplyGradient(const std::string& name, const Tensor& gradient);
  // One optimizer update of rows `indices` with `row_gradients` ([indices, row...]);
  // repeated indices are summed first, as TensorFlow does for IndexedSlices.
  absl::StatusOr<int64_t> ApplyRowGradients(const std::string& name,
                                            const std::vector<int64_t>& indices,
                                            const Tensor& row_gradients);

  // The checks ApplyGradient (rows == nullptr) or ApplyRowGradients would make, without
  // applying anything: a service checks every gradient of a request before it applies
  // the first, so a bad request changes nothing.
  absl::Status CheckGradient(const std::string& name, const Tensor& gradient,
                             const std::vector<int64_t>* rows);

  // One gradient of a push: dense (rows == nullptr), or of rows `*rows`.
  struct PushedGradient {
    const std::string* name;
    const Tensor* gradient;
    const std::vector<int64_t>* rows;
  };
  // A push as both of the PS's paths (gRPC and the raw data path) apply it: with several
  // gradients, every one is checked before the first is applied (a bad one changes
  // nothing); then each is applied in order, the first failure ending the push. Returns
  // each gradient's update count.
  absl::StatusOr<std::vector<int64_t>> ApplyPush(const std::vector<PushedGradient>& gradients);

  std::vector<VariableInfo> List() const;
  absl::StatusOr<VariableInfo> Info(const std::string& name) const;
  // A pull of `names` as both of the PS's paths (gRPC and raw data) check it before a byte
  // of the answer is made: every name once, every variable there, and the values within
  // `max_bytes` (RESOURCE_EXHAUSTED otherwise: a 36 KB request must not make a 400 MB
  // answer).
  // Row reads are checked alike: every variable named once in all, rows in range, and
  // their bytes counted.
  absl::Status CheckPull(const std::vector<std::string>& names, uint64_t max_bytes,
                         const std::vector<RowRead>& row_reads = {}) const;
  // A copy of the variable, its slots and its optimizer, taken together under its lock; with
  // `values` false, all but the tensors (value and slots left empty, slot_names set): what
  // a save lays out before it copies.
  absl::StatusOr<VariableSnapshot> Snapshot(const std::string& name, bool values = true) const;
  // Replaces (or creates) a variable from a snapshot (checkpoint restore).
  absl::Status Restore(const VariableSnapshot& snapshot);

  int64_t refused_non_finite() const;
  int64_t total_bytes() const;

 private:
  struct Variable {
    mutable absl::Mutex mutex;
    VariableInfo info ABSL_GUARDED_BY(mutex);
    Tensor value ABSL_GUARDED_BY(mutex);
    std::vector<Tensor> slots ABSL_GUARDED_BY(mutex);
    std::unique_ptr<Optimizer> optimizer ABSL_GUARDED_BY(mutex);
    nlohmann::json optimizer_config ABSL_GUARDED_BY(mutex);
    // Set when an update from a finite gradient made the value NaN or Inf: why, said to
    // every later push (an Assign of finite values clears it).
    std::string diverged ABSL_GUARDED_BY(mutex);
  };
  // After an update whose values came out `finite` or not: FAILED_PRECONDITION, and the
  // variable marked diverged, when the update made them NaN or Inf.
  static absl::Status CheckUpdated(const std::string& name, Variable& variable, bool finite)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(variable.mutex);

  absl::StatusOr<std::shared_ptr<Variable>> Find(const std::string& name) const;
  absl::Status CheckFinite(const std::string& name, const Tensor& gradient);
  // Shape, dtype, optimizer and row checks; the variable's lock must be held.
  static absl::Status CheckGradientLocked(const std::string& name, const Variable& variable,
                                          const Tensor& gradient, const std::vector<int64_t>* rows);

  mutable absl::Mutex table_mutex_;
  std::map<std::string, std::shared_ptr<Variable>> variables_ ABSL_GUARDED_BY(table_mutex_);
  // A leaf lock: taken with a variable's lock held, never the other way round.
  mutable absl::Mutex stats_mutex_;
  int64_t refused_non_finite_ ABSL_GUARDED_BY(stats_mutex_) = 0;
};

}  // namespace stratum
