#include "stratum/model/loss.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace stratum {
namespace {

// Keras' backend.epsilon(): the clip bound for probabilities.
constexpr float kEpsilon = 1e-7f;

const char kSupported[] =
    "use sparse_categorical_crossentropy, categorical_crossentropy, binary_crossentropy or "
    "mean_squared_error";

// "Sparse_Categorical_CrossEntropy" -> "sparsecategoricalcrossentropy".
std::string Canonical(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c != '_') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

absl::StatusOr<Loss> FromName(const std::string& name, bool from_logits) {
  const std::string canonical = Canonical(name);
  if (canonical == "sparsecategoricalcrossentropy") {
    return Loss::SparseCategoricalCrossentropy(from_logits);
  }
  if (canonical == "categoricalcrossentropy") return Loss::CategoricalCrossentropy(from_logits);
  if (canonical == "meansquarederror" || canonical == "mse") return Loss::MeanSquaredError();
  if (canonical == "binarycrossentropy" || canonical == "bce") {
    return Loss::BinaryCrossentropy(from_logits);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("loss \"", name, "\" is not supported by Stratum: ", kSupported));
}

// Refuses a config key whose value is not the harmless default.
absl::Status CheckConfig(const std::string& class_name, const nlohmann::json& config) {
  // A key no Keras loss of these has (a typo such as "from_logit" would otherwise be ignored).
  static const std::set<std::string> kKnown = {
      "name", "reduction", "from_logits", "label_smoothing", "ignore_class", "axis", "dtype", "fn"};
  for (const auto& [key, value] : config.items()) {
    if (kKnown.count(key) > 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "loss ", class_name, " has config key \"", key,
        "\", which Keras' losses do not have: check its spelling (from_logits, reduction, "
        "name, ...) or remove it"));
  }
  auto has = [&](const char* key) { return config.contains(key) && !config[key].is_null(); };
  if (has("label_smoothing") &&
      !(config["label_smoothing"].is_number() && config["label_smoothing"].get<double>() == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss ", class_name, " sets label_smoothing ", config["label_smoothing"].dump(),
        ", which Stratum does not support: remove label_smoothing (or set it to 0)"));
  }
  if (has("ignore_class")) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", class_name, " sets ignore_class ", config["ignore_class"].dump(),
                     ", which Stratum does not support: remove ignore_class (or set it to None)"));
  }
  if (has("axis") && !(config["axis"].is_number_integer() && config["axis"].get<int64_t>() == -1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", class_name, " sets axis ", config["axis"].dump(),
                     ", which Stratum does not support: use the default axis -1"));
  }
  if (has("reduction")) {
    const nlohmann::json& reduction = config["reduction"];
    if (!reduction.is_string() || (reduction != "auto" && reduction != "sum_over_batch_size")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss ", class_name, " has reduction ", reduction.dump(),
          ", which Stratum does not support: Stratum sums per-example losses and divides by the "
          "global batch size, so use \"sum_over_batch_size\""));
    }
  }
  if (has("from_logits") && !config["from_logits"].is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat("loss ", class_name, " has from_logits ",
                                                   config["from_logits"].dump(),
                                                   ", which is not a boolean: use true or false"));
  }
  return absl::OkStatus();
}

int64_t LabelAt(const Tensor& y, int64_t i) {
  switch (y.dtype()) {
    case DType::kInt32:
      return y.data<int32_t>()[i];
    case DType::kInt64:
      return y.data<int64_t>()[i];
    case DType::kUInt8:
      return y.data<uint8_t>()[i];
    case DType::kFloat32:
      break;
  }
  return -1;
}

}  // namespace

std::optional<ClassIdOutside> FirstClassIdOutside(const Tensor& y, int64_t count, int64_t classes) {
  if (y.dtype() == DType::kFloat32) return std::nullopt;
  count = std::min(count, y.num_elements());
  for (int64_t i = 0; i < count; ++i) {
    const int64_t label = LabelAt(y, i);
    if (label < 0 || label >= classes) return ClassIdOutside{i, label};
  }
  return std::nullopt;
}

namespace {

// The first index of the largest value, as argmax does.
int64_t ArgMax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

// log(sum(exp(z))), computed stably.
double LogSumExp(const float* z, int64_t n) {
  const float max = *std::max_element(z, z + n);
  double sum = 0;
  for (int64_t c = 0; c < n; ++c) sum += std::exp(static_cast<double>(z[c] - max));
  return max + std::log(sum);
}

// softmax(z) into out.
void Softmax(const float* z, int64_t n, float* out) {
  const float max = *std::max_element(z, z + n);
  float sum = 0;
  for (int64_t c = 0; c < n; ++c) {
    out[c] = std::exp(z[c] - max);
    sum += out[c];
  }
  for (int64_t c = 0; c < n; ++c) out[c] /= sum;
}

}  // namespace

Loss Loss::SparseCategoricalCrossentropy(bool from_logits) {
  return Loss(Kind::kSparseCategoricalCrossentropy, from_logits);
}
Loss Loss::CategoricalCrossentropy(bool from_logits) {
  return Loss(Kind::kCategoricalCrossentropy, from_logits);
}
Loss Loss::MeanSquaredError() { return Loss(Kind::kMeanSquaredError, false); }
Loss Loss::BinaryCrossentropy(bool from_logits) {
  return Loss(Kind::kBinaryCrossentropy, from_logits);
}

absl::StatusOr<Loss> Loss::FromKeras(const nlohmann::json& spec) {
  if (spec.is_string()) return FromName(spec.get<std::string>(), false);
  if (!spec.is_object() || !spec.contains("class_name") || !spec["class_name"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss ", spec.dump(), " is neither a loss name nor a Keras loss object: ", kSupported,
        ", as a string or as {\"class_name\": ..., \"config\": {...}}"));
  }
  const std::string class_name = spec["class_name"].get<std::string>();
  const nlohmann::json config =
      spec.contains("config") && !spec["config"].is_null() ? spec["config"] : nlohmann::json{};
  // Keras 3 serializes a loss function (not a Loss object) as {"class_name": "function",
  // "config": "mean_squared_error"}.
  if (class_name == "function" && config.is_string()) return FromName(config, false);
  if (!config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", class_name, " has config ", config.dump(),
                     ", which is not an object: ", "write it as {\"from_logits\": false, ...}"));
  }
  const absl::Status checked = CheckConfig(class_name, config);
  if (!checked.ok()) return checked;
  const bool from_logits = config.contains("from_logits") && config["from_logits"].is_boolean() &&
                           config["from_logits"].get<bool>();
  return FromName(class_name, from_logits);
}

std::string Loss::name() const {
  switch (kind_) {
    case Kind::kSparseCategoricalCrossentropy:
      return "sparse_categorical_crossentropy";
    case Kind::kCategoricalCrossentropy:
      return "categorical_crossentropy";
    case Kind::kMeanSquaredError:
      return "mean_squared_error";
    case Kind::kBinaryCrossentropy:
      return "binary_crossentropy";
  }
  return "";
}

nlohmann::json Loss::ToKeras() const {
  static const char* const kClassNames[] = {"SparseCategoricalCrossentropy",
                                            "CategoricalCrossentropy", "MeanSquaredError",
                                            "BinaryCrossentropy"};
  nlohmann::json config = {{"name", name()}, {"reduction", "sum_over_batch_size"}};
  if (is_crossentropy()) config["from_logits"] = from_logits_;
  return {{"class_name", kClassNames[static_cast<int>(kind_)]}, {"config", config}};
}

bool Loss::TakesTargets(DType dtype, const Shape& shape, int64_t classes) const {
  // 0/1 ids for one output, as sparse labels are given; else float32 rows, as the others.
  if (kind_ == Kind::kBinaryCrossentropy && classes == 1 && dtype != DType::kFloat32) {
    return shape.rank() == 1 || (shape.rank() == 2 && shape.dim(1) == 1);
  }
  if (kind_ == Kind::kBinaryCrossentropy && classes == 1 && shape.rank() == 1) {
    return dtype == DType::kFloat32;
  }
  if (sparse_targets()) {
    return dtype != DType::kFloat32 &&
           (shape.rank() == 1 || (shape.rank() == 2 && shape.dim(1) == 1));
  }
  return dtype == DType::kFloat32 &&
         ((shape.rank() == 2 && shape.dim(1) == classes) ||
          (kind_ == Kind::kMeanSquaredError && classes == 1 && shape.rank() == 1));
}

absl::Status Loss::ValidateTargets(const Tensor& y, int64_t batch, int64_t classes) const {
  if (!y.valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("y is empty, but loss ", name(), " needs targets: pass the batch's labels"));
  }
  const std::string expected_shape = sparse_targets()
                                         ? absl::StrCat("[", batch, "]")
                                         : absl::StrCat("[", batch, ", ", classes, "]");
  if (sparse_targets()) {
    if (y.dtype() == DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "y is ", y.DebugString(), ", but ", name(),
          " takes integer class ids (int32, int64 or uint8) of shape ", expected_shape,
          ": cast the labels to integers, or use categorical_crossentropy for one-hot labels"));
    }
    const bool shape_ok = y.shape().rank() >= 1 && y.shape().dim(0) == batch &&
                          TakesTargets(y.dtype(), y.shape(), classes);
    if (!shape_ok) {
      return absl::InvalidArgumentError(absl::StrCat("y is ", y.DebugString(), ", but ", name(),
                                                     " takes one class id per example: pass y of "
                                                     "shape ",
                                                     expected_shape));
    }
    if (const auto outside = FirstClassIdOutside(y, batch, classes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("y[", outside->index, "] is ", outside->class_id, ", outside the ", classes,
                       " classes of the model's output (0..", classes - 1,
                       "): check the labels, or the units of the model's last Dense layer"));
    }
    return absl::OkStatus();
  }
  const bool fits = y.shape().rank() >= 1 && y.shape().dim(0) == batch &&
                    TakesTargets(y.dtype(), y.shape(), classes);
  if (fits && kind_ == Kind::kBinaryCrossentropy && y.dtype() != DType::kFloat32) {
    if (const auto outside = FirstClassIdOutside(y, batch, 2)) {
      return absl::InvalidArgumentError(
          absl::StrCat("y[", outside->index, "] is ", outside->class_id,
                       ", but binary_crossentropy takes labels 0 and 1: check the labels, or use "
                       "sparse_categorical_crossentropy for class ids"));
    }
  }
  if (!fits && kind_ == Kind::kBinaryCrossentropy) {
    return absl::InvalidArgumentError(absl::StrCat(
        "y is ", y.DebugString(), ", but binary_crossentropy takes ",
        classes == 1 ? absl::StrCat("labels 0/1 of shape [", batch, "] or ") : std::string(),
        "float32 targets of shape ", expected_shape, ": pass one target row per example"));
  }
  if (!fits) {
    const std::string hint = kind_ == Kind::kCategoricalCrossentropy
                                 ? " (one-hot rows; for class ids use "
                                   "sparse_categorical_crossentropy)"
                                 : "";
    return absl::InvalidArgumentError(
        absl::StrCat("y is ", y.DebugString(), ", but ", name(), " takes float32 targets of shape ",
                     expected_shape, hint, ": pass one target row per example"));
  }
  return absl::OkStatus();
}

StepStats Loss::Compute(ConstMatrixMap predictions, const float* logits, const Tensor& y,
                        float scale, float* grad) const {
  const int64_t batch = predictions.rows();
  const int64_t classes = predictions.cols();
  StepStats stats;
  stats.examples = batch;
  // Float rows, or class ids (sparse losses; 0/1 labels of a binary cross-entropy).
  const float* targets =
      sparse_targets() || y.dtype() != DType::kFloat32 ? nullptr : y.data<float>();
  for (int64_t i = 0; i < batch; ++i) {
    const float* p = predictions.data() + i * classes;
    float* g = grad == nullptr ? nullptr : grad + i * classes;
    const float* t = targets == nullptr ? nullptr : targets + i * classes;
    // With fused logits, or from_logits, the cross-entropy works on logits z.
    const float* z = logits != nullptr ? logits + i * classes : (from_logits_ ? p : nullptr);
    switch (kind_) {
      case Kind::kSparseCategoricalCrossentropy: {
        const int64_t label = LabelAt(y, i);
        stats.correct += ArgMax(p, classes) == label;
        if (z != nullptr) {
          stats.loss_sum += LogSumExp(z, classes) - z[label];
          if (g == nullptr) break;
          if (logits == nullptr) {
            Softmax(z, classes, g);
          } else {
            std::copy(p, p + classes, g);  // the predictions are softmax(logits)
          }
          g[label] -= 1;
          for (int64_t c = 0; c < classes; ++c) g[c] *= scale;
          break;
        }
        // log(clip(p)) as logits: loss = log(sum q) - log(q[label]).
        float sum = 0;
        for (int64_t c = 0; c < classes; ++c) sum += std::clamp(p[c], kEpsilon, 1 - kEpsilon);
        const float q_label = std::clamp(p[label], kEpsilon, 1 - kEpsilon);
        stats.loss_sum +=
            std::log(static_cast<double>(sum)) - std::log(static_cast<double>(q_label));
        if (g == nullptr) break;
        for (int64_t c = 0; c < classes; ++c) {
          const bool inside = p[c] >= kEpsilon && p[c] <= 1 - kEpsilon;
          const float d = 1 / sum - (c == label ? 1 / q_label : 0.0f);
          g[c] = inside ? scale * d : 0.0f;
        }
        break;
      }
      case Kind::kCategoricalCrossentropy: {
        stats.correct += ArgMax(p, classes) == ArgMax(t, classes);
        if (z != nullptr) {
          const double lse = LogSumExp(z, classes);
          double loss = 0;
          float t_sum = 0;
          for (int64_t c = 0; c < classes; ++c) {
            loss += t[c] * (lse - z[c]);
            t_sum += t[c];
          }
          stats.loss_sum += loss;
          if (g == nullptr) break;
          if (logits == nullptr) {
            Softmax(z, classes, g);
          } else {
            std::copy(p, p + classes, g);
          }
          for (int64_t c = 0; c < classes; ++c) g[c] = scale * (g[c] * t_sum - t[c]);
          break;
        }
        // Keras normalizes the probabilities, clips them, and takes -sum(t * log(q)).
        float sum = 0;
        for (int64_t c = 0; c < classes; ++c) sum += p[c];
        double loss = 0;
        float dot = 0;  // sum over c of dL/dp_hat[c] * p_hat[c]
        for (int64_t c = 0; c < classes; ++c) {
          const float p_hat = p[c] / sum;
          const float q = std::clamp(p_hat, kEpsilon, 1 - kEpsilon);
          loss -= t[c] * std::log(static_cast<double>(q));
          const bool inside = p_hat >= kEpsilon && p_hat <= 1 - kEpsilon;
          const float d = inside ? -t[c] / q : 0.0f;
          if (g != nullptr) g[c] = d;
          dot += d * p_hat;
        }
        stats.loss_sum += loss;
        if (g == nullptr) break;
        for (int64_t c = 0; c < classes; ++c) g[c] = scale * (g[c] - dot) / sum;
        break;
      }
      case Kind::kBinaryCrossentropy: {
        // Keras' mean over the outputs; on logits (from_logits, or a sigmoid output's),
        // sigmoid_cross_entropy_with_logits.
        bool all_correct = true;
        double loss = 0;
        const float per_output = scale / static_cast<float>(classes);
        for (int64_t c = 0; c < classes; ++c) {
          const float target = t != nullptr ? t[c] : static_cast<float>(LabelAt(y, i));
          const float out = p[c];
          const bool positive = from_logits_ ? out > 0 : out > 0.5f;
          all_correct = all_correct && positive == (target > 0.5f);
          if (classes == 1) {
            stats.auc.Add(from_logits_ ? 1.0f / (1.0f + std::exp(-out)) : out, target > 0.5f);
          }
          if (z != nullptr) {
            const float logit = z[c];
            loss += std::max(logit, 0.0f) - logit * target + std::log1p(std::exp(-std::abs(logit)));
            // d/d(logit): sigmoid(logit) - target, the predictions themselves when fused.
            const float sigmoid = logits != nullptr ? out : 1.0f / (1.0f + std::exp(-logit));
            if (g != nullptr) g[c] = per_output * (sigmoid - target);
            continue;
          }
          const float q = std::clamp(out, kEpsilon, 1 - kEpsilon);
          loss -= target * std::log(static_cast<double>(q)) +
                  (1 - target) * std::log(static_cast<double>(1 - q));
          if (g != nullptr) {
            const bool inside = out >= kEpsilon && out <= 1 - kEpsilon;
            g[c] = inside ? per_output * ((1 - target) / (1 - q) - target / q) : 0.0f;
          }
        }
        stats.correct += all_correct;
        stats.loss_sum += loss / static_cast<double>(classes);
        break;
      }
      case Kind::kMeanSquaredError: {
        if (classes == 1) {
          stats.correct += static_cast<float>(p[0] > 0.5f) == t[0];
        } else {
          stats.correct += ArgMax(p, classes) == ArgMax(t, classes);
        }
        double loss = 0;
        for (int64_t c = 0; c < classes; ++c) {
          const float d = p[c] - t[c];
          loss += static_cast<double>(d) * d;
          if (g != nullptr) g[c] = scale * 2 * d / static_cast<float>(classes);
        }
        stats.loss_sum += loss / static_cast<double>(classes);
        break;
      }
    }
  }
  return stats;
}

}  // namespace stratum
