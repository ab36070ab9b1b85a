// LearningRate: an optimizer's learning rate, a constant or one of Keras' schedules
// (keras.optimizers.schedules), evaluated at the optimizer's update count as Keras evaluates
// it (optimizer.iterations: 0 for the first update). On a parameter server the count is the
// variable's own number of updates.
//
// Schedules: ExponentialDecay, PiecewiseConstantDecay, InverseTimeDecay, PolynomialDecay,
// CosineDecay (with warmup) and CosineDecayRestarts, with Keras 3's formulas and defaults,
// computed in double and rounded to float once.
//
// Thread safety: immutable after FromKeras; copyable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace stratum {

class LearningRate {
 public:
  LearningRate(float constant = 0.001f) : constant_(constant) {}  // NOLINT: a rate is a number

  // A number, or a serialized schedule ({"class_name": "ExponentialDecay", "config": {...}},
  // Keras 3's module and registered_name keys allowed). `where` names the optimizer for
  // messages ("optimizer Adam's learning_rate"). INVALID_ARGUMENT naming the schedule and
  // key for anything else, or a value Keras would not take.
  static absl::StatusOr<LearningRate> FromKeras(const nlohmann::json& value,
                                                const std::string& where);

  // The rate of the update after `iteration` updates.
  float At(int64_t iteration) const;
  bool is_schedule() const { return kind_ != Kind::kConstant; }
  // Keras' class name ("ExponentialDecay"), or "constant".
  std::string name() const;
  // As Keras serializes it: the number, or {"class_name": ..., "config": {...}}.
  nlohmann::json ToKeras() const;

 private:
  enum class Kind {
    kConstant,
    kExponential,
    kPiecewise,
    kInverseTime,
    kPolynomial,
    kCosine,
    kCosineRestarts
  };

  Kind kind_ = Kind::kConstant;
  float constant_ = 0.001f;
  // The schedule's config as given (defaults filled in), and its numbers.
  nlohmann::json config_;
  double initial_ = 0, decay_steps_ = 1, decay_rate_ = 0, end_ = 0, power_ = 1, alpha_ = 0;
  double t_mul_ = 2, m_mul_ = 1, warmup_steps_ = 0;
  bool staircase_ = false, cycle_ = false, warmup_ = false;
  double warmup_target_ = 0;
  std::vector<double> boundaries_, values_;
};

}  // namespace stratum
