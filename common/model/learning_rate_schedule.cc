#include "stratum/model/learning_rate_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using json = nlohmann::json;

const char kSchedules[] =
    "use ExponentialDecay, PiecewiseConstantDecay, InverseTimeDecay, PolynomialDecay, "
    "CosineDecay or CosineDecayRestarts";

// Reads a schedule's config, refusing keys the schedule does not have and values Keras would
// not take, naming both.
class ScheduleConfig {
 public:
  ScheduleConfig(std::string what, const json& config) : what_(std::move(what)), config_(config) {}

  absl::Status RefuseUnknown(std::set<std::string> keys) const {
    keys.insert("name");
    for (const auto& [key, value] : config_.items()) {
      if (keys.count(key) > 0) continue;
      keys.erase("name");
      return absl::InvalidArgumentError(absl::StrCat(
          what_, " has config key \"", key, "\", which Keras' schedule does not have: use ",
          absl::StrJoin(keys, ", "), " (or remove ", key, ")"));
    }
    return absl::OkStatus();
  }

  // A number; `positive`: above 0, else at least 0. Required without a default.
  absl::StatusOr<double> Number(const char* key, std::optional<double> fallback,
                                bool positive) const {
    if (!config_.contains(key) || config_[key].is_null()) {
      if (fallback) return *fallback;
      return absl::InvalidArgumentError(
          absl::StrCat(what_, " has no ", key, ": Keras requires it; set it"));
    }
    const json& v = config_[key];
    const double number = v.is_number() ? v.get<double>() : -1;
    if (!v.is_number() || !std::isfinite(number) || (positive ? number <= 0 : number < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(what_, " has ", key, " ", v.dump(), ": use a ",
                                                     positive ? "positive" : "non-negative",
                                                     " number"));
    }
    return number;
  }

  absl::StatusOr<bool> Bool(const char* key) const {
    if (!config_.contains(key) || config_[key].is_null()) return false;
    if (!config_[key].is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, " has ", key, " ", config_[key].dump(), ": use true or false"));
    }
    return config_[key].get<bool>();
  }

  absl::StatusOr<std::vector<double>> Numbers(const char* key) const {
    if (!config_.contains(key) || !config_[key].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, " has ", key, " ",
                       config_.contains(key) ? config_[key].dump() : std::string("missing"),
                       ": give a list of numbers"));
    }
    std::vector<double> numbers;
    for (const json& v : config_[key]) {
      if (!v.is_number()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what_, " has ", key, " ", config_[key].dump(), ": give numbers only"));
      }
      numbers.push_back(v.get<double>());
    }
    return numbers;
  }

  const std::string& what() const { return what_; }

 private:
  std::string what_;
  const json& config_;
};

}  // namespace

absl::StatusOr<LearningRate> LearningRate::FromKeras(const json& value, const std::string& where) {
  LearningRate rate;
  if (value.is_number()) {
    const double number = value.get<double>();
    if (!(number >= 0 && number <= 1e6)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is ", value.dump(), ": use a number from 0 to 1e6, such as 0.001"));
    }
    rate.constant_ = static_cast<float>(number);
    return rate;
  }
  if (!value.is_object() || !value.contains("class_name") || !value["class_name"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is ", value.dump(),
                     ": give a number, or a Keras schedule {\"class_name\": \"ExponentialDecay\", "
                     "\"config\": {...}}"));
  }
  const std::string name = value["class_name"].get<std::string>();
  static const json kEmpty = json::object();
  const json& config =
      value.contains("config") && value["config"].is_object() ? value["config"] : kEmpty;
  const ScheduleConfig c(absl::StrCat(where, " (", name, ")"), config);
  if (name == "ExponentialDecay" || name == "InverseTimeDecay") {
    rate.kind_ = name == "ExponentialDecay" ? Kind::kExponential : Kind::kInverseTime;
    STRATUM_RETURN_IF_ERROR(
        c.RefuseUnknown({"initial_learning_rate", "decay_steps", "decay_rate", "staircase"}));
    STRATUM_ASSIGN_OR_RETURN(rate.initial_, c.Number("initial_learning_rate", {}, false));
    STRATUM_ASSIGN_OR_RETURN(rate.decay_steps_, c.Number("decay_steps", {}, true));
    STRATUM_ASSIGN_OR_RETURN(rate.decay_rate_, c.Number("decay_rate", {}, false));
    STRATUM_ASSIGN_OR_RETURN(rate.staircase_, c.Bool("staircase"));
  } else if (name == "PiecewiseConstantDecay") {
    rate.kind_ = Kind::kPiecewise;
    STRATUM_RETURN_IF_ERROR(c.RefuseUnknown({"boundaries", "values"}));
    STRATUM_ASSIGN_OR_RETURN(rate.boundaries_, c.Numbers("boundaries"));
    STRATUM_ASSIGN_OR_RETURN(rate.values_, c.Numbers("values"));
    if (rate.values_.size() != rate.boundaries_.size() + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.what(), " has ", rate.boundaries_.size(), " boundaries and ",
                       rate.values_.size(), " values: give one value more than boundaries"));
    }
    if (!std::is_sorted(rate.boundaries_.begin(), rate.boundaries_.end())) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.what(), " has boundaries out of order: list them increasing"));
    }
    rate.initial_ = rate.values_[0];
  } else if (name == "PolynomialDecay") {
    rate.kind_ = Kind::kPolynomial;
    STRATUM_RETURN_IF_ERROR(c.RefuseUnknown(
        {"initial_learning_rate", "decay_steps", "end_learning_rate", "power", "cycle"}));
    STRATUM_ASSIGN_OR_RETURN(rate.initial_, c.Number("initial_learning_rate", {}, false));
    STRATUM_ASSIGN_OR_RETURN(rate.decay_steps_, c.Number("decay_steps", {}, true));
    STRATUM_ASSIGN_OR_RETURN(rate.end_, c.Number("end_learning_rate", 0.0001, false));
    STRATUM_ASSIGN_OR_RETURN(rate.power_, c.Number("power", 1.0, false));
    STRATUM_ASSIGN_OR_RETURN(rate.cycle_, c.Bool("cycle"));
  } else if (name == "CosineDecay") {
    rate.kind_ = Kind::kCosine;
    STRATUM_RETURN_IF_ERROR(c.RefuseUnknown(
        {"initial_learning_rate", "decay_steps", "alpha", "warmup_target", "warmup_steps"}));
    STRATUM_ASSIGN_OR_RETURN(rate.initial_, c.Number("initial_learning_rate", {}, false));
    STRATUM_ASSIGN_OR_RETURN(rate.decay_steps_, c.Number("decay_steps", {}, true));
    STRATUM_ASSIGN_OR_RETURN(rate.alpha_, c.Number("alpha", 0.0, false));
    rate.warmup_ = config.contains("warmup_target") && !config["warmup_target"].is_null();
    if (rate.warmup_) {
      STRATUM_ASSIGN_OR_RETURN(rate.warmup_target_, c.Number("warmup_target", {}, false));
    }
    STRATUM_ASSIGN_OR_RETURN(rate.warmup_steps_, c.Number("warmup_steps", 0.0, false));
  } else if (name == "CosineDecayRestarts") {
    rate.kind_ = Kind::kCosineRestarts;
    STRATUM_RETURN_IF_ERROR(
        c.RefuseUnknown({"initial_learning_rate", "first_decay_steps", "t_mul", "m_mul", "alpha"}));
    STRATUM_ASSIGN_OR_RETURN(rate.initial_, c.Number("initial_learning_rate", {}, false));
    STRATUM_ASSIGN_OR_RETURN(rate.decay_steps_, c.Number("first_decay_steps", {}, true));
    STRATUM_ASSIGN_OR_RETURN(rate.t_mul_, c.Number("t_mul", 2.0, true));
    STRATUM_ASSIGN_OR_RETURN(rate.m_mul_, c.Number("m_mul", 1.0, false));
    STRATUM_ASSIGN_OR_RETURN(rate.alpha_, c.Number("alpha", 0.0, false));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is the schedule \"", name, "\", which Stratum does not support: ", kSchedules));
  }
  rate.config_ = config;
  rate.config_.erase("name");
  rate.constant_ = rate.At(0);
  return rate;
}

float LearningRate::At(int64_t iteration) const {
  const double step = static_cast<double>(iteration);
  const double pi = std::numbers::pi;
  double lr = constant_;
  switch (kind_) {
    case Kind::kConstant:
      break;
    case Kind::kExponential: {
      double p = step / decay_steps_;
      if (staircase_) p = std::floor(p);
      lr = initial_ * std::pow(decay_rate_, p);
      break;
    }
    case Kind::kInverseTime: {
      double p = step / decay_steps_;
      if (staircase_) p = std::floor(p);
      lr = initial_ / (1 + decay_rate_ * p);
      break;
    }
    case Kind::kPiecewise: {
      // values[i] while step <= boundaries[i]; the last value after the last boundary.
      size_t i = 0;
      while (i < boundaries_.size() && step > boundaries_[i]) ++i;
      lr = values_[i];
      break;
    }
    case Kind::kPolynomial: {
      double steps = decay_steps_, s = step;
      if (cycle_) {
        // The decay restarts each decay_steps (Keras: the first period when step is 0).
        const double periods = s == 0 ? 1 : std::ceil(s / decay_steps_);
        steps = decay_steps_ * periods;
      } else {
        s = std::min(s, decay_steps_);
      }
      lr = (initial_ - end_) * std::pow(1 - s / steps, power_) + end_;
      break;
    }
    case Kind::kCosine: {
      auto decayed = [&](double s, double from) {
        const double cosine = 0.5 * (1 + std::cos(pi * s / decay_steps_));
        return from * ((1 - alpha_) * cosine + alpha_);
      };
      if (!warmup_) {
        lr = decayed(std::min(step, decay_steps_), initial_);
        break;
      }
      const double s = std::min(step, decay_steps_ + warmup_steps_);
      lr = s < warmup_steps_ ? (warmup_target_ - initial_) * (s / warmup_steps_) + initial_
                             : decayed(s - warmup_steps_, warmup_target_);
      break;
    }
    case Kind::kCosineRestarts: {
      double fraction = step / decay_steps_;
      double restart = 0;
      if (t_mul_ == 1.0) {
        restart = std::floor(fraction);
        fraction -= restart;
      } else {
        restart = std::floor(std::log(1 - fraction * (1 - t_mul_)) / std::log(t_mul_));
        const double done = (1 - std::pow(t_mul_, restart)) / (1 - t_mul_);
        fraction = (fraction - done) / std::pow(t_mul_, restart);
      }
      const double cosine = 0.5 * std::pow(m_mul_, restart) * (1 + std::cos(pi * fraction));
      lr = initial_ * ((1 - alpha_) * cosine + alpha_);
      break;
    }
  }
  return static_cast<float>(lr);
}

std::string LearningRate::name() const {
  switch (kind_) {
    case Kind::kConstant:
      return "constant";
    case Kind::kExponential:
      return "ExponentialDecay";
    case Kind::kPiecewise:
      return "PiecewiseConstantDecay";
    case Kind::kInverseTime:
      return "InverseTimeDecay";
    case Kind::kPolynomial:
      return "PolynomialDecay";
    case Kind::kCosine:
      return "CosineDecay";
    case Kind::kCosineRestarts:
      return "CosineDecayRestarts";
  }
  return "constant";
}

json LearningRate::ToKeras() const {
  if (kind_ == Kind::kConstant) return constant_;
  return {{"class_name", name()}, {"config", config_}};
}

}  // namespace stratum
