#include "stratum/model/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/tensor/gather_rows.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

const char kSupported[] = "use SGD, Adam, AdamW, Adagrad or RMSprop";

std::string Lower(const std::string& text) {
  std::string out = text;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Programmer errors: a PS or a training loop that pairs the wrong tensors.
void CheckSameShape(const Tensor& variable, const Tensor& gradient,
                    const std::vector<Tensor>& slots, size_t num_slots) {
  bool ok = variable.dtype() == DType::kFloat32 && gradient.dtype() == DType::kFloat32 &&
            variable.shape() == gradient.shape() && slots.size() == num_slots;
  for (const Tensor& slot : slots) ok = ok && slot.shape() == variable.shape();
  if (!ok) {
    std::fprintf(stderr,
                 "Optimizer::ApplyDense: variable %s, gradient %s and %zu slots (expected %zu of "
                 "the variable's shape) do not match\n",
                 variable.DebugString().c_str(), gradient.DebugString().c_str(), slots.size(),
                 num_slots);
    std::abort();
  }
}

// The config of one optimizer, read with checks; errors name the optimizer and the key.
class ConfigReader {
 public:
  ConfigReader(std::string optimizer, const nlohmann::json& config)
      : optimizer_(std::move(optimizer)), config_(config) {}

  // Which ends of a Number's range are allowed.
  enum class Range { kClosed, kBelowMax, kAboveMin };

  absl::StatusOr<float> Number(const char* key, float default_value, float min, float max,
                               Range range = Range::kClosed) const {
    if (!config_.contains(key) || config_[key].is_null()) return default_value;
    const nlohmann::json& value = config_[key];
    const std::string interval = absl::StrCat(range == Range::kAboveMin ? "(" : "[", min, ", ", max,
                                              range == Range::kBelowMax ? ")" : "]");
    if (!value.is_number()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer ", optimizer_, " has ", key, " ",
                                                     value.dump(), ", which is not a number: set ",
                                                     key, " to a number in ", interval));
    }
    const double number = value.get<double>();
    const bool inside = number >= min && number <= max &&
                        !(range == Range::kBelowMax && number == max) &&
                        !(range == Range::kAboveMin && number == min);
    if (!inside) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", optimizer_, " has ", key, " ", value.dump(), ", outside ",
                       interval, ": ", Why(key, range), "set ", key, " to a value in that range"));
    }
    return static_cast<float>(number);
  }

  // Why an end of a range is refused, where the reason is not plain.
  static std::string Why(const char* key, Range range) {
    const std::string name = key;
    if (range == Range::kBelowMax && absl::StartsWith(name, "beta")) {
      return absl::StrCat(name, " 1 never lets the moment move from 0 (its bias correction ",
                          "divides by 0); ");
    }
    if (range == Range::kAboveMin && name == "epsilon") {
      return "epsilon 0 divides a zero gradient by zero, making the variable NaN; ";
    }
    return "";
  }

  absl::StatusOr<bool> Bool(const char* key, bool default_value) const {
    if (!config_.contains(key) || config_[key].is_null()) return default_value;
    if (!config_[key].is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", optimizer_, " has ", key, " ", config_[key].dump(),
                       ", which is not a boolean: use true or false"));
    }
    return config_[key].get<bool>();
  }

  // learning_rate (or the legacy lr): a number or a Keras schedule.
  absl::StatusOr<stratum::LearningRate> LearningRate(float default_value) const {
    const char* key = config_.contains("learning_rate") ? "learning_rate" : "lr";
    if (config_.contains(key) && config_[key].is_object()) {
      return stratum::LearningRate::FromKeras(config_[key],
                                              absl::StrCat("optimizer ", optimizer_, "'s ", key));
    }
    STRATUM_ASSIGN_OR_RETURN(const float constant, Number(key, default_value, 0.0f, 1e6f));
    return stratum::LearningRate(constant);
  }

  // clipnorm, clipvalue and global_clipnorm: positive numbers when set (null or 0: off);
  // clipnorm and global_clipnorm exclude each other, as in Keras.
  absl::StatusOr<Optimizer::Clipping> Clipping() const {
    Optimizer::Clipping clipping;
    for (auto [key, field] : {std::pair{"clipnorm", &clipping.norm},
                              {"clipvalue", &clipping.value},
                              {"global_clipnorm", &clipping.global_norm}}) {
      if (!config_.contains(key) || config_[key].is_null()) continue;
      STRATUM_ASSIGN_OR_RETURN(*field, Number(key, 0.0f, 0.0f, 1e30f));
    }
    if (clipping.norm > 0 && clipping.global_norm > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer ", optimizer_,
          " sets both clipnorm and global_clipnorm, which Keras refuses too: keep one"));
    }
    return clipping;
  }

  // A key neither this optimizer nor Keras' common options have (a typo such as
  // "learnin_rate" would otherwise train at the default rate).
  absl::Status RefuseUnknown(const std::set<std::string>& own) const {
    static const std::set<std::string> kCommon = {"name",
                                                  "learning_rate",
                                                  "lr",
                                                  "clipnorm",
                                                  "clipvalue",
                                                  "global_clipnorm",
                                                  "weight_decay",
                                                  "decay",
                                                  "use_ema",
                                                  "ema_momentum",
                                                  "ema_overwrite_frequency",
                                                  "jit_compile",
                                                  "is_legacy_optimizer",
                                                  "loss_scale_factor",
                                                  "gradient_accumulation_steps"};
    for (const auto& [key, value] : config_.items()) {
      if (own.count(key) > 0 || kCommon.count(key) > 0) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", optimizer_, " has config key \"", key, "\", which Keras' ",
                       optimizer_, " does not have: use learning_rate", own.empty() ? "" : ", ",
                       absl::StrJoin(own, ", "), " (or remove ", key, ")"));
    }
    return absl::OkStatus();
  }

  // Keras options Stratum does not implement: refused unless null / false / 0.
  absl::Status RefuseUnsupported() const {
    for (const char* key : {"loss_scale_factor", "gradient_accumulation_steps"}) {
      if (!config_.contains(key) || config_[key].is_null()) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer ", optimizer_, " sets ", key, " to ", config_[key].dump(),
                       ", which Stratum does not support: remove ", key, " (or set it to None)"));
    }
    for (const char* key : {"use_ema", "amsgrad"}) {
      if (config_.contains(key) && config_[key].is_boolean() && config_[key].get<bool>()) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer ", optimizer_, " sets ", key,
                         " to true, which Stratum does not support: set ", key, " to false"));
      }
    }
    if (config_.contains("decay") && config_["decay"].is_number() &&
        config_["decay"].get<double>() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer ", optimizer_, " sets the legacy decay to ", config_["decay"].dump(),
          ", which Stratum does not support: remove decay (or set it to 0)"));
    }
    return absl::OkStatus();
  }

 private:
  std::string optimizer_;
  const nlohmann::json& config_;
};

Tensor Filled(const Tensor& variable, float value) {
  Tensor slot(DType::kFloat32, variable.shape());
  if (value != 0) slot.Flat().setConstant(value);
  return slot;
}

class Sgd final : public Optimizer {
 public:
  Sgd(stratum::LearningRate learning_rate, Clipping clipping, float weight_decay, float momentum,
      bool nesterov)
      : Optimizer(std::move(learning_rate), clipping, weight_decay),
        momentum_(momentum),
        nesterov_(nesterov) {}

  std::string name() const override { return "SGD"; }
  nlohmann::json config() const override {
    return WithClipping({{"name", "SGD"},
                         {"learning_rate", learning_rate_schedule().ToKeras()},
                         {"momentum", momentum_},
                         {"nesterov", nesterov_}});
  }
  std::vector<std::string> SlotNames() const override {
    if (momentum_ == 0) return {};
    return {"momentum"};
  }
  bool RuleIgnoresZeroGradient() const override { return momentum_ == 0; }
  std::vector<Tensor> NewSlots(const Tensor& variable) const override {
    if (momentum_ == 0) return {};
    return {Filled(variable, 0)};
  }
  void Update(Tensor& variable, const Tensor& gradient, std::vector<Tensor>& slots,
              int64_t iteration) const override {
    CheckSameShape(variable, gradient, slots, momentum_ == 0 ? 0 : 1);
    auto var = variable.Flat();
    const auto g = gradient.Flat();
    const float lr = learning_rate(iteration);
    if (momentum_ == 0) {
      var -= lr * g;
      return;
    }
    auto m = slots[0].Flat();
    m = momentum_ * m - lr * g;
    if (nesterov_) {
      var += momentum_ * m - lr * g;
    } else {
      var += m;
    }
  }

 private:
  float momentum_;
  bool nesterov_;
};

class Adam final : public Optimizer {
 public:
  Adam(std::string name, stratum::LearningRate learning_rate, Clipping clipping, float weight_decay,
       float beta_1, float beta_2, float epsilon)
      : Optimizer(std::move(learning_rate), clipping, weight_decay),
        name_(std::move(name)),
        beta_1_(beta_1),
        beta_2_(beta_2),
        epsilon_(epsilon) {}

  std::string name() const override { return name_; }
  nlohmann::json config() const override {
    return WithClipping({{"name", name_},
                         {"learning_rate", learning_rate_schedule().ToKeras()},
                         {"beta_1", beta_1_},
                         {"beta_2", beta_2_},
                         {"epsilon", epsilon_},
                         {"amsgrad", false}});
  }
  std::vector<std::string> SlotNames() const override { return {"m", "v"}; }
  std::vector<Tensor> NewSlots(const Tensor& variable) const override {
    return {Filled(variable, 0), Filled(variable, 0)};
  }
  void Update(Tensor& variable, const Tensor& gradient, std::vector<Tensor>& slots,
              int64_t iteration) const override {
    CheckSameShape(variable, gradient, slots, 2);
    const double step = static_cast<double>(iteration + 1);
    const float alpha =
        static_cast<float>(learning_rate(iteration) * std::sqrt(1 - std::pow(beta_2_, step)) /
                           (1 - std::pow(beta_1_, step)));
    auto var = variable.Flat();
    const auto g = gradient.Flat();
    auto m = slots[0].Flat();
    auto v = slots[1].Flat();
    m += (g - m) * (1 - beta_1_);
    v += (g.square() - v) * (1 - beta_2_);
    var -= alpha * m / (v.sqrt() + epsilon_);
  }

 private:
  std::string name_;  // "Adam", or "AdamW" (its weight_decay defaults to 0.004)
  float beta_1_, beta_2_, epsilon_;
};

class Adagrad final : public Optimizer {
 public:
  Adagrad(stratum::LearningRate learning_rate, Clipping clipping, float weight_decay,
          float initial_accumulator_value, float epsilon)
      : Optimizer(std::move(learning_rate), clipping, weight_decay),
        initial_(initial_accumulator_value),
        epsilon_(epsilon) {}

  std::string name() const override { return "Adagrad"; }
  nlohmann::json config() const override {
    return WithClipping({{"name", "Adagrad"},
                         {"learning_rate", learning_rate_schedule().ToKeras()},
                         {"initial_accumulator_value", initial_},
                         {"epsilon", epsilon_}});
  }
  std::vector<std::string> SlotNames() const override { return {"accumulator"}; }
  bool RuleIgnoresZeroGradient() const override { return true; }
  std::vector<Tensor> NewSlots(const Tensor& variable) const override {
    return {Filled(variable, initial_)};
  }
  void Update(Tensor& variable, const Tensor& gradient, std::vector<Tensor>& slots,
              int64_t iteration) const override {
    CheckSameShape(variable, gradient, slots, 1);
    auto var = variable.Flat();
    const auto g = gradient.Flat();
    auto accumulator = slots[0].Flat();
    // Keras 3: epsilon inside the square root.
    accumulator += g.square();
    var -= learning_rate(iteration) * g / (accumulator + epsilon_).sqrt();
  }

 private:
  float initial_, epsilon_;
};

class RmsProp final : public Optimizer {
 public:
  RmsProp(stratum::LearningRate learning_rate, Clipping clipping, float weight_decay, float rho,
          float momentum, float epsilon, bool centered)
      : Optimizer(std::move(learning_rate), clipping, weight_decay),
        rho_(rho),
        momentum_(momentum),
        epsilon_(epsilon),
        centered_(centered) {}

  std::string name() const override { return "RMSprop"; }
  nlohmann::json config() const override {
    return WithClipping({{"name", "RMSprop"},
                         {"learning_rate", learning_rate_schedule().ToKeras()},
                         {"rho", rho_},
                         {"momentum", momentum_},
                         {"epsilon", epsilon_},
                         {"centered", centered_}});
  }
  std::vector<std::string> SlotNames() const override {
    std::vector<std::string> names = {"velocity"};
    if (momentum_ > 0) names.push_back("momentum");
    if (centered_) names.push_back("average_gradient");
    return names;
  }
  std::vector<Tensor> NewSlots(const Tensor& variable) const override {
    std::vector<Tensor> slots;
    for (size_t i = 0; i < SlotNames().size(); ++i) slots.push_back(Filled(variable, 0));
    return slots;
  }
  void Update(Tensor& variable, const Tensor& gradient, std::vector<Tensor>& slots,
              int64_t iteration) const override {
    const size_t num_slots = 1 + (momentum_ > 0 ? 1 : 0) + (centered_ ? 1 : 0);
    CheckSameShape(variable, gradient, slots, num_slots);
    auto var = variable.Flat();
    const auto g = gradient.Flat();
    auto velocity = slots[0].Flat();
    const float lr = learning_rate(iteration);
    velocity = rho_ * velocity + (1 - rho_) * g.square();
    // Keras 3: increment = lr * g / sqrt(denominator), epsilon inside the root.
    auto apply = [&](const auto& denominator) {
      if (momentum_ > 0) {
        auto momentum = slots[1].Flat();
        momentum = momentum_ * momentum + lr * g / denominator.sqrt();
        var -= momentum;
      } else {
        var -= lr * g / denominator.sqrt();
      }
    };
    if (centered_) {
      auto average = slots[num_slots - 1].Flat();
      average = rho_ * average + (1 - rho_) * g;
      apply(velocity - average.square() + epsilon_);
    } else {
      apply(velocity + epsilon_);
    }
  }

 private:
  float rho_, momentum_, epsilon_;
  bool centered_;
};

absl::StatusOr<std::unique_ptr<Optimizer>> Build(const std::string& class_name,
                                                 const nlohmann::json& config) {
  const std::string kind = Lower(class_name);
  std::string display = class_name;
  if (kind == "sgd") display = "SGD";
  if (kind == "adam") display = "Adam";
  if (kind == "adamw") display = "AdamW";
  if (kind == "adagrad") display = "Adagrad";
  if (kind == "rmsprop") display = "RMSprop";
  const ConfigReader reader(display, config);
  if (kind == "sgd") {
    STRATUM_RETURN_IF_ERROR(reader.RefuseUnknown({"momentum", "nesterov"}));
    STRATUM_RETURN_IF_ERROR(reader.RefuseUnsupported());
    STRATUM_ASSIGN_OR_RETURN(const Optimizer::Clipping clipping, reader.Clipping());
    STRATUM_ASSIGN_OR_RETURN(
        const float weight_decay,
        reader.Number("weight_decay", kind == "adamw" ? 0.004f : 0.0f, 0.0f, 1.0f));
    STRATUM_ASSIGN_OR_RETURN(stratum::LearningRate lr, reader.LearningRate(0.01f));
    STRATUM_ASSIGN_OR_RETURN(float momentum, reader.Number("momentum", 0.0f, 0.0f, 1.0f));
    STRATUM_ASSIGN_OR_RETURN(bool nesterov, reader.Bool("nesterov", false));
    return std::unique_ptr<Optimizer>(
        new Sgd(std::move(lr), clipping, weight_decay, momentum, nesterov));
  }
  if (kind == "adam" || kind == "adamw") {
    STRATUM_RETURN_IF_ERROR(reader.RefuseUnknown({"beta_1", "beta_2", "epsilon", "amsgrad"}));
    STRATUM_RETURN_IF_ERROR(reader.RefuseUnsupported());
    STRATUM_ASSIGN_OR_RETURN(const Optimizer::Clipping clipping, reader.Clipping());
    STRATUM_ASSIGN_OR_RETURN(
        const float weight_decay,
        reader.Number("weight_decay", kind == "adamw" ? 0.004f : 0.0f, 0.0f, 1.0f));
    STRATUM_ASSIGN_OR_RETURN(stratum::LearningRate lr, reader.LearningRate(0.001f));
    using Range = ConfigReader::Range;
    STRATUM_ASSIGN_OR_RETURN(float beta_1,
                             reader.Number("beta_1", 0.9f, 0.0f, 1.0f, Range::kBelowMax));
    STRATUM_ASSIGN_OR_RETURN(float beta_2,
                             reader.Number("beta_2", 0.999f, 0.0f, 1.0f, Range::kBelowMax));
    STRATUM_ASSIGN_OR_RETURN(float epsilon,
                             reader.Number("epsilon", 1e-7f, 0.0f, 1e6f, Range::kAboveMin));
    return std::unique_ptr<Optimizer>(
        new Adam(display, std::move(lr), clipping, weight_decay, beta_1, beta_2, epsilon));
  }
  if (kind == "adagrad") {
    STRATUM_RETURN_IF_ERROR(reader.RefuseUnknown({"initial_accumulator_value", "epsilon"}));
    STRATUM_RETURN_IF_ERROR(reader.RefuseUnsupported());
    STRATUM_ASSIGN_OR_RETURN(const Optimizer::Clipping clipping, reader.Clipping());
    STRATUM_ASSIGN_OR_RETURN(
        const float weight_decay,
        reader.Number("weight_decay", kind == "adamw" ? 0.004f : 0.0f, 0.0f, 1.0f));
    STRATUM_ASSIGN_OR_RETURN(stratum::LearningRate lr, reader.LearningRate(0.001f));
    STRATUM_ASSIGN_OR_RETURN(float initial,
                             reader.Number("initial_accumulator_value", 0.1f, 0.0f, 1e30f));
    STRATUM_ASSIGN_OR_RETURN(float epsilon, reader.Number("epsilon", 1e-7f, 0.0f, 1e6f));
    if (initial == 0 && epsilon == 0) {
      return absl::InvalidArgumentError(
          "optimizer Adagrad has initial_accumulator_value 0 and epsilon 0: a zero gradient "
          "then divides 0 by 0, making the variable NaN; give epsilon (Keras' default 1e-7) or "
          "initial_accumulator_value (0.1) a positive value");
    }
    return std::unique_ptr<Optimizer>(
        new Adagrad(std::move(lr), clipping, weight_decay, initial, epsilon));
  }
  if (kind == "rmsprop") {
    STRATUM_RETURN_IF_ERROR(reader.RefuseUnknown({"rho", "momentum", "epsilon", "centered"}));
    STRATUM_RETURN_IF_ERROR(reader.RefuseUnsupported());
    STRATUM_ASSIGN_OR_RETURN(const Optimizer::Clipping clipping, reader.Clipping());
    STRATUM_ASSIGN_OR_RETURN(
        const float weight_decay,
        reader.Number("weight_decay", kind == "adamw" ? 0.004f : 0.0f, 0.0f, 1.0f));
    STRATUM_ASSIGN_OR_RETURN(stratum::LearningRate lr, reader.LearningRate(0.001f));
    STRATUM_ASSIGN_OR_RETURN(float rho, reader.Number("rho", 0.9f, 0.0f, 1.0f));
    STRATUM_ASSIGN_OR_RETURN(float momentum, reader.Number("momentum", 0.0f, 0.0f, 1.0f));
    STRATUM_ASSIGN_OR_RETURN(
        float epsilon, reader.Number("epsilon", 1e-7f, 0.0f, 1e6f, ConfigReader::Range::kAboveMin));
    STRATUM_ASSIGN_OR_RETURN(bool centered, reader.Bool("centered", false));
    return std::unique_ptr<Optimizer>(
        new RmsProp(std::move(lr), clipping, weight_decay, rho, momentum, epsilon, centered));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer \"", class_name, "\" is not supported by Stratum: ", kSupported));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::FromKeras(const nlohmann::json& spec) {
  if (spec.is_string()) return Build(spec.get<std::string>(), nlohmann::json::object());
  if (!spec.is_object() || !spec.contains("class_name") || !spec["class_name"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", spec.dump(), " is neither a name nor a Keras optimizer object: ", kSupported,
        ", as \"adam\" or {\"class_name\": \"Adam\", \"config\": {...}}"));
  }
  const std::string class_name = spec["class_name"].get<std::string>();
  const nlohmann::json config = spec.contains("config") && !spec["config"].is_null()
                                    ? spec["config"]
                                    : nlohmann::json::object();
  if (!config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer ", class_name, " has config ", config.dump(),
                     ", which is not an object: write it as {\"learning_rate\": 0.001, ...}"));
  }
  return Build(class_name, config);
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::WithLearningRate(float rate) const {
  nlohmann::json given = config();
  given["learning_rate"] = rate;
  given["weight_decay"] = weight_decay_;  // AdamW's default is not 0
  return FromKeras({{"class_name", name()}, {"config", given}});
}

void Optimizer::ApplyDense(Tensor& variable, const Tensor& gradient, std::vector<Tensor>& slots,
                           int64_t iteration) const {
  // Keras' _apply_weight_decay, decoupled from the gradient (AdamW): the variable shrinks by
  // weight_decay * learning rate before the rule's update.
  if (weight_decay_ > 0) variable.Flat() *= 1.0f - weight_decay_ * learning_rate(iteration);
  if (clipping_.norm <= 0 && clipping_.value <= 0) {
    Update(variable, gradient, slots, iteration);
    return;
  }
  // Keras' clip_by_norm (g * clipnorm / max(norm, clipnorm)), then clip by value.
  Tensor clipped = gradient.Clone();
  auto g = clipped.Flat();
  if (clipping_.norm > 0) {
    const double norm = std::sqrt(static_cast<double>(g.square().sum()));
    if (norm > clipping_.norm) g *= static_cast<float>(clipping_.norm / norm);
  }
  if (clipping_.value > 0) g = g.cwiseMax(-clipping_.value).cwiseMin(clipping_.value);
  Update(variable, clipped, slots, iteration);
}

namespace {

// `rows` of a variable of `shape` set from `row_values` [rows, ...], the others zero.
Tensor Scattered(const Tensor& row_values, std::span<const int64_t> rows, const Shape& shape) {
  Tensor dense(DType::kFloat32, shape);
  dense.SetZero();
  const int64_t width = dense.row_size();
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(row_values.data<float>() + static_cast<int64_t>(i) * width, width,
                dense.data<float>() + rows[i] * width);
  }
  return dense;
}

}  // namespace

bool Optimizer::ApplyRows(Tensor& variable, std::span<const int64_t> rows,
                          const Tensor& row_gradients, std::vector<Tensor>& slots,
                          int64_t iteration) const {
  const auto count = static_cast<int64_t>(rows.size());
  const int64_t width = variable.row_size();
  bool ok = variable.shape().rank() > 0 && row_gradients.dtype() == DType::kFloat32 &&
            row_gradients.num_elements() == count * width;
  for (int64_t i = 0; ok && i < count; ++i) {
    ok = rows[i] >= 0 && rows[i] < variable.rows() && (i == 0 || rows[i] > rows[i - 1]);
  }
  if (!ok) {
    std::fprintf(stderr,
                 "Optimizer::ApplyRows: %s for %lld rows (sorted, unique, in range) of variable "
                 "%s do not match\n",
                 row_gradients.DebugString().c_str(), static_cast<long long>(count),
                 variable.DebugString().c_str());
    std::abort();
  }
  // The rows (and their slots' rows) gathered side by side, one update of them all, then
  // scattered back: the update rule runs once, vectorized, whatever the number of rows.
  const Shape shape = variable.shape().WithFirstDim(count);
  auto gather = [&](const Tensor& from) {
    Tensor out(DType::kFloat32, shape);
    GatherRows(from, rows.data(), rows.size(), out.raw_data());
    return out;
  };
  auto scatter = [&](const Tensor& from, Tensor& to) {
    for (int64_t i = 0; i < count; ++i) {
      std::copy_n(from.data<float>() + i * width, width, to.data<float>() + rows[i] * width);
    }
  };
  if (slots.empty()) slots = NewSlots(variable);
  Tensor value = gather(variable);
  std::vector<Tensor> row_slots;
  for (const Tensor& slot : slots) row_slots.push_back(gather(slot));
  if (row_gradients.shape() == shape) {
    ApplyDense(value, row_gradients, row_slots, iteration);
  } else {
    ApplyDense(value, *row_gradients.Reshape(shape), row_slots, iteration);
  }
  scatter(value, variable);
  for (size_t s = 0; s < slots.size(); ++s) scatter(row_slots[s], slots[s]);
  return AllFinite(value);
}

nlohmann::json Optimizer::WithClipping(nlohmann::json config) const {
  if (clipping_.norm > 0) config["clipnorm"] = clipping_.norm;
  if (clipping_.value > 0) config["clipvalue"] = clipping_.value;
  if (clipping_.global_norm > 0) config["global_clipnorm"] = clipping_.global_norm;
  if (weight_decay_ > 0) config["weight_decay"] = weight_decay_;
  return config;
}

void Optimizer::Apply(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                      std::vector<std::vector<Tensor>>& slots, int64_t iteration,
                      std::span<const VariableSpec> specs,
                      std::span<const std::vector<int64_t>* const> rows) const {
  if (slots.size() != vars.size()) slots.resize(vars.size());
  auto trainable = [&](size_t i) { return i >= specs.size() || specs[i].trainable; };
  // global_clipnorm: one factor for every trainable variable's gradient (Keras'
  // clip_by_global_norm: clip / max(global norm, clip)).
  float scale = 1;
  if (clipping_.global_norm > 0) {
    double squares = 0;
    for (size_t i = 0; i < vars.size(); ++i) {
      if (trainable(i)) squares += static_cast<double>(grads[i].Flat().square().sum());
    }
    const double norm = std::sqrt(squares);
    if (norm > clipping_.global_norm) scale = static_cast<float>(clipping_.global_norm / norm);
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    const Optimizer& update = trainable(i) ? *this : NonTrainableUpdate();
    if (slots[i].empty()) slots[i] = update.NewSlots(vars[i]);
    const std::vector<int64_t>* selected = i < rows.size() ? rows[i] : nullptr;
    const auto apply = [&](const Tensor& gradient) {
      if (selected == nullptr) {
        update.ApplyDense(vars[i], gradient, slots[i], iteration);
      } else if (update.ZeroGradientChangesNothing()) {
        (void)update.ApplyRows(vars[i], *selected, gradient, slots[i], iteration);
      } else {
        // Keras' update of the whole table: the other rows' moments decay, and move them.
        update.ApplyDense(vars[i], Scattered(gradient, *selected, vars[i].shape()), slots[i],
                          iteration);
      }
    };
    if (scale == 1 || !trainable(i)) {
      apply(grads[i]);
      continue;
    }
    Tensor scaled = grads[i].Clone();
    scaled.Flat() *= scale;
    apply(scaled);
  }
}

nlohmann::json NonTrainableUpdateJson() {
  return {{"class_name", "SGD"}, {"config", {{"learning_rate", 1.0}}}};
}

const Optimizer& NonTrainableUpdate() {
  static const Optimizer* const kUpdate = Optimizer::FromKeras(NonTrainableUpdateJson())->release();
  return *kUpdate;
}

const nlohmann::json& UpdateJsonFor(const VariableSpec& spec, const nlohmann::json& optimizer) {
  static const nlohmann::json* const kUpdate = new nlohmann::json(NonTrainableUpdateJson());
  return spec.trainable ? optimizer : *kUpdate;
}

}  // namespace stratum
