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

  // A Keras optimizer as compile() takes it: a name ("adam", "sgd", "rmsprop", "adagrad"),
  // or a serialized object {"class_name": "Adam", "config": {"learning_rate": 0.001, ...}}
  // (tf.keras or Keras 3 form); learning_rate may be a Keras schedule (learning_rate_schedule.h).
  // Options Stratum does not implement (clipnorm, clipvalue, global_clipnorm, weight_decay,
  // use_ema, amsgrad, loss_scale_factor, gradient_accumulation_steps) are refused by name.
  static absl::StatusOr<std::unique_ptr<Optimizer>> FromKeras(const nlohmann::json& spec);

  // Keras' class name: "SGD", "Adam", "Adagrad", "RMSprop".
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
  // One update of `variable` by `gradient` (same shape, float32). `iteration` is the number
  // of updates already applied to this variable (0 for the first). Shapes that do not match
  // are a programmer error and abort.
  virtual void ApplyDense(Tensor& variable, const Tensor& gradient, std::vector<Tensor>& slots,
                          int64_t iteration) const = 0;
  // ApplyDense on every variable; slots[i] belongs to vars[i] and is created when empty.
  // With `specs` (the model's variables), a non-trainable variable takes
  // NonTrainableUpdate() instead, and keeps no slots.
  void Apply(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
             std::vector<std::vector<Tensor>>& slots, int64_t iteration,
             std::span<const VariableSpec> specs = {}) const;

 protected:
  explicit Optimizer(LearningRate learning_rate) : learning_rate_(std::move(learning_rate)) {}

 private:
  LearningRate learning_rate_;
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
