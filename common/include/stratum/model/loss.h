// Loss: the Keras losses Stratum trains with (sparse categorical cross-entropy, categorical
// cross-entropy, mean squared error), their values and gradients on a batch of model
// outputs, and the accuracy metric Keras pairs with each. The arithmetic follows Keras'
// TensorFlow backend: a cross-entropy on the output of a softmax uses the softmax's logits
// (log-sum-exp minus the label's logit, whatever from_logits says, as Keras does with the
// logits it caches on a softmax output), and one on other probabilities clips them to
// [1e-7, 1 - 1e-7]. Jobs refuse from_logits true on a softmax output (Model::CheckLoss).
//
// Thread safety: a Loss is an immutable value; every method is const and safe to call from
// several threads at once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stratum/device/device.h"
#include "stratum/model/auc.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

// What one step (or evaluation batch) measured.
struct StepStats {
  double loss_sum = 0;   // sum of the per-example losses, not scaled
  int64_t correct = 0;   // examples whose prediction matches the label (Keras' "accuracy")
  int64_t examples = 0;  // examples in the batch
  // Keras' AUC counts, for a model of one output trained with binary_crossentropy; empty
  // for other models.
  AucCounts auc;
};

// The first of the first `count` class ids in `y` (integers, [N] or [N, 1]) outside
// 0..classes-1, with its index; nullopt when all are in range or `y` holds no class ids.
struct ClassIdOutside {
  int64_t index;
  int64_t class_id;
};
std::optional<ClassIdOutside> FirstClassIdOutside(const Tensor& y, int64_t count, int64_t classes);

class Loss {
 public:
  enum class Kind {
    kSparseCategoricalCrossentropy,
    kCategoricalCrossentropy,
    kMeanSquaredError,
    kBinaryCrossentropy
  };

  // A Keras loss as it appears in compile(): a name ("sparse_categorical_crossentropy",
  // "categorical_crossentropy", "mean_squared_error", "mse", or a class name), or a
  // serialized object {"class_name": "SparseCategoricalCrossentropy", "config": {...}}.
  static absl::StatusOr<Loss> FromKeras(const nlohmann::json& spec);
  static Loss SparseCategoricalCrossentropy(bool from_logits = false);
  static Loss CategoricalCrossentropy(bool from_logits = false);
  static Loss MeanSquaredError();
  // Keras' binary_crossentropy: the mean over the outputs of each example's sigmoid
  // cross-entropy, on a sigmoid output's logits (as Keras takes the logits it caches on a
  // sigmoid: a saturated output still has a gradient), on other probabilities (clipped to
  // [1e-7, 1 - 1e-7]), or on logits (from_logits); targets 0/1 ids for one output, or
  // float32 [N, outputs]. Its
  // accuracy is Keras' binary_accuracy (the output above 0.5, or a logit above 0); with
  // several outputs an example counts as correct when all of them are.
  static Loss BinaryCrossentropy(bool from_logits = false);

  Kind kind() const { return kind_; }
  bool from_logits() const { return from_logits_; }
  bool is_crossentropy() const { return kind_ != Kind::kMeanSquaredError; }
  // The output activation whose logits it takes in place of the probabilities (the model
  // then skips that activation in the backward pass): softmax for the categorical
  // cross-entropies, sigmoid for binary_crossentropy on probabilities; kLinear for none.
  ActivationKind fused_activation() const {
    if (kind_ == Kind::kSparseCategoricalCrossentropy || kind_ == Kind::kCategoricalCrossentropy) {
      return ActivationKind::kSoftmax;
    }
    if (kind_ == Kind::kBinaryCrossentropy && !from_logits_) return ActivationKind::kSigmoid;
    return ActivationKind::kLinear;
  }
  // Whether targets are class ids ([B] integers) rather than [B, C] floats.
  bool sparse_targets() const { return kind_ == Kind::kSparseCategoricalCrossentropy; }
  // Keras' name: "sparse_categorical_crossentropy", ...
  std::string name() const;
  // The Keras object form: {"class_name": ..., "config": {"name", "from_logits"}}.
  nlohmann::json ToKeras() const;

  // Whether targets of this dtype and shape (examples first, any number of them) are what
  // this loss takes for a model with `classes` outputs: class ids ([N] or [N, 1], not
  // float32) for the sparse loss, float32 rows ([N, classes]) for the others.
  bool TakesTargets(DType dtype, const Shape& shape, int64_t classes) const;
  // Checks the targets of a batch of `batch` examples against a model with `classes` outputs:
  // dtype, shape, and (for class ids) the range 0..classes-1.
  absl::Status ValidateTargets(const Tensor& y, int64_t batch, int64_t classes) const;

  // Loss and accuracy of a batch, and optionally its gradient. `predictions` is the model's
  // [B, C] output. `logits`, when not null, holds the [B, C] values before the output's
  // fused_activation(): cross-entropies then use them (fused softmax or sigmoid +
  // cross-entropy). `grad`, when not
  // null, receives scale * d(sum of per-example losses) / d(predictions), or / d(logits) when
  // logits are used, as a row-major [B, C] array. `y` must have passed ValidateTargets.
  StepStats Compute(ConstMatrixMap predictions, const float* logits, const Tensor& y, float scale,
                    float* grad) const;

 private:
  Loss(Kind kind, bool from_logits) : kind_(kind), from_logits_(from_logits) {}

  Kind kind_;
  bool from_logits_;
};

}  // namespace stratum
