// Optimizer: Keras' SGD, Adam, Adagrad and RMSprop update rules (Keras 3 / tf.keras >= 2.11
// formulas and defaults), applied one variable at a time so that a parameter server can hold
// the state (slots) of only the variables it owns.
//
// An Optimizer holds hyper-parameters only; every bit of training state lives in the slots
// the caller keeps beside each variable (NewSlots) and in the iteration count it passes.
// Thread safety: all methods are const; distinct variables may be updated from distinct
// threads at once. Ownership: FromKeras returns a unique_ptr the caller owns.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "stratum/model/layer.h"
#include "stratum/model/learning_rate_schedule.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // A Keras optimizer as compile() takes it: a name ("adam", "adamw", "sgd", "rmsprop", "adagrad"),
  // or a serialized object {"class_name": "Adam", "config": {"learning_rate": 0.001, ...}}
  // (tf.keras or Keras 3 form); learning_rate may be a Keras schedule (learning_rate_schedule.h),
  // clipnorm, clipvalue or global_clipnorm clip the gradients (Clipping), and weight_decay
  // shrinks the variables (AdamW's default 0.004). Options Stratum does not implement
  // (use_ema, amsgrad, loss_scale_factor, gradient_accumulation_steps) are refused by name.
  static absl::StatusOr<std::unique_ptr<Optimizer>> FromKeras(const nlohmann::json& spec);

  // This optimizer with the constant learning rate `rate` (Keras' optimizer.learning_rate =
  // rate, which ReduceLROnPlateau sets), the rest as it is; its slots carry over.
  absl::StatusOr<std::unique_ptr<Optimizer>> WithLearningRate(float rate) const;

  // Keras' class name: "SGD", "Adam", "AdamW", "Adagrad", "RMSprop".
  virtual std::string name() const = 0;
  // Keras' get_config() keys for this optimizer's hyper-parameters.
  virtual nlohmann::json config() const = 0;
  // The rate of the first update, and of the update after `iteration` updates (a schedule's
  // value there; the constant otherwise).
  float learning_rate() const { return learning_rate_.At(0); }
  float learning_rate(int64_t iteration) const { return learning_rate_.At(iteration); }
  const LearningRate& learning_rate_schedule() const { return learning_rate_; }

  // Names of the per-variable state tensors, in the order NewSlots returns them
  // (Adam: {"m", "v"}; SGD without momentum: none).
  virtual std::vector<std::string> SlotNames() const = 0;
  // Fresh state for `variable`: tensors of its shape, with Keras' initial values.
  virtual std::vector<Tensor> NewSlots(const Tensor& variable) const = 0;
  // Keras' gradient clipping, before each update (0: off): clipnorm scales each variable's
  // gradient to an L2 norm of at most `norm`; global_clipnorm scales every trainable
  // variable's gradient by one factor so that their joint norm is at most `global_norm`
  // (Apply only: it needs the whole step's gradients; Keras allows one of the two); then
  // clipvalue clips each element into [-value, value].
  struct Clipping {
    float norm = 0;
    float value = 0;
    float global_norm = 0;
  };
  const Clipping& clipping() const { return clipping_; }

  // One update of `variable` by `gradient` (same shape, float32), clipnorm and clipvalue
  // applied first. `iteration` is the number of updates already applied to this variable (0
  // for the first). Shapes that do not match are a programmer error and abort.
  void ApplyDense(Tensor& variable, const Tensor& gradient, std::vector<Tensor>& slots,
                  int64_t iteration) const;
  // Whether an update by a zero gradient leaves the variable and its slots as they are (SGD
  // without momentum, Adagrad, without weight decay): then ApplyRows is exactly the dense
  // update of a gradient that is zero outside its rows.
  bool ZeroGradientChangesNothing() const {
    return weight_decay_ == 0 && RuleIgnoresZeroGradient();
  }
  // Keras' weight_decay (decoupled, as AdamW's): before each update the variable is scaled by
  // 1 - weight_decay * learning rate. 0: none.
  float weight_decay() const { return weight_decay_; }
  // One update of rows `rows` (sorted, unique) of `variable` [rows, ...] by `row_gradients`
  // [rows.size(), ...], as TensorFlow's sparse kernels (resource_sparse_apply_*, LazyAdam)
  // apply IndexedSlices: only those rows and the same rows of the slots change (an untouched
  // row's momentum or Adam moments do not decay, unlike Keras' dense update), with clipnorm
  // over all the given rows together, then clipvalue, as ApplyDense clips a dense gradient.
  // The parameter servers update embedding tables so. Shapes or rows that do not match are a
  // programmer error and abort. Returns whether the updated rows are all finite (checked while
  // they are gathered, not read again from the table).
  bool ApplyRows(Tensor& variable, std::span<const int64_t> rows, const Tensor& row_gradients,
                 std::vector<Tensor>& slots, int64_t iteration) const;
  // ApplyDense on every variable (after global_clipnorm over the trainable ones); slots[i]
  // belongs to vars[i] and is created when empty. With `specs` (the model's variables), a
  // non-trainable variable takes NonTrainableUpdate() instead, and keeps no slots.
  // With `rows`, a variable whose entry is set (a row-sparse table given as those rows)
  // takes its gradient for those rows: by ApplyRows where that is exactly Keras' dense update
  // (ZeroGradientChangesNothing), else by the dense update of the gradient scattered into
  // zeros, as Keras updates the whole table. The global norm counts those rows, which are all
  // the rows with a gradient.
  void Apply(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
             std::vector<std::vector<Tensor>>& slots, int64_t iteration,
             std::span<const VariableSpec> specs = {},
             std::span<const std::vector<int64_t>* const> rows = {}) const;

 protected:
  Optimizer(LearningRate learning_rate, Clipping clipping, float weight_decay = 0)
      : learning_rate_(std::move(learning_rate)),
        clipping_(clipping),
        weight_decay_(weight_decay) {}
  // Whether the rule's update by a zero gradient changes neither the variable nor the slots.
  virtual bool RuleIgnoresZeroGradient() const { return false; }
  // The update rule itself, on the clipped gradient.
  virtual void Update(Tensor& variable, const Tensor& gradient, std::vector<Tensor>& slots,
                      int64_t iteration) const = 0;
  // The clipping keys Keras' get_config() has (set ones only), added to `config`.
  nlohmann::json WithClipping(nlohmann::json config) const;

 private:
  LearningRate learning_rate_;
  Clipping clipping_;
  float weight_decay_;
};

// How a non-trainable variable (BatchNormalization's moving statistics) is updated: its
// gradient is the change the step makes (VariableSpec::trainable), subtracted as it is: SGD
// with learning rate 1, which keeps no slots. Parameter servers hold such variables with
// it, as the optimizer NonTrainableUpdateJson() names.
const Optimizer& NonTrainableUpdate();
nlohmann::json NonTrainableUpdateJson();
// The optimizer that updates `spec`: `optimizer` for a trainable variable, else the above.
const nlohmann::json& UpdateJsonFor(const VariableSpec& spec, const nlohmann::json& optimizer);

}  // namespace stratum
