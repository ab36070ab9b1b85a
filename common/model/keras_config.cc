#include "common/model/keras_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/util/json_depth.h"
#include "stratum/util/status_macros.h"

namespace stratum::keras {
namespace {

const char kSupportedActivations[] = "use relu, softmax, sigmoid, tanh or linear";
const char kSupportedInitializers[] =
    "use glorot_uniform, zeros, ones, he_uniform, lecun_uniform or random_uniform";

}  // namespace

// "GlorotUniform" / "glorot_uniform" -> "glorotuniform".
std::string Canonical(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c != '_') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

// Keras' default layer name for a class, as its to_snake_case makes it: "Dense" -> "dense",
// "MaxPooling2D" -> "max_pooling2d", "Conv2D" -> "conv2d".
std::string SnakeCase(const std::string& name) {
  auto upper = [](char c) { return std::isupper(static_cast<unsigned char>(c)) != 0; };
  auto lower = [](char c) { return std::islower(static_cast<unsigned char>(c)) != 0; };
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    // An underscore before a capital that starts a word (followed by a lower-case letter),
    // or that follows a lower-case letter.
    const bool word = i > 0 && upper(name[i]) && i + 1 < name.size() && lower(name[i + 1]);
    const bool after_lower = i > 0 && upper(name[i]) && lower(name[i - 1]);
    if (word || after_lower) out.push_back('_');
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(name[i]))));
  }
  return out;
}

std::string Where(const std::string& layer, const std::string& class_name) {
  return absl::StrCat("model layer \"", layer, "\" (", class_name, ")");
}

absl::StatusOr<json> ParseText(absl::string_view text) {
  if (absl::Status deep =
          CheckJsonDepth(text, "the model JSON", "pass the text of Keras' model.to_json()");
      !deep.ok()) {
    return deep;
  }
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("model JSON is not valid JSON (", e.what(),
                                                   "): pass the text of Keras' model.to_json()"));
  }
}

// Keras writes the file with json.dump(model.to_json()): the model text inside a string.
// Returns `input` itself, or the parsed text kept in `storage`; never copies the document.
absl::StatusOr<const json*> Unwrap(const json& input, json& storage) {
  const json* value = &input;
  for (int depth = 0; depth < 3 && value->is_string(); ++depth) {
    STRATUM_ASSIGN_OR_RETURN(json parsed, ParseText(value->get_ref<const std::string&>()));
    storage = std::move(parsed);
    value = &storage;
  }
  return value;
}

// The value of `key` when `object` is an object that has it set to non-null; else nullptr.
// Unlike const operator[] and value(), safe on any JSON value.
const json* Find(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// A string member, or nullopt when it is absent, null or not a string.
std::optional<std::string> FindString(const json& object, const char* key) {
  const json* value = Find(object, key);
  if (value == nullptr || !value->is_string()) return std::nullopt;
  return value->get<std::string>();
}

namespace {

// Compact JSON text for messages, like dump(), but with bounded recursion and length so a
// deeply nested or huge value cannot exhaust the stack or flood the message.
void DumpTo(const json& value, int depth, std::string& out) {
  constexpr size_t kMaxChars = 200;
  constexpr int kMaxDepth = 8;
  if (out.size() > kMaxChars) return;
  if (!value.is_structured()) {
    out += value.dump();
  } else if (depth >= kMaxDepth) {
    out += value.is_array() ? "[...]" : "{...}";
  } else if (value.is_array()) {
    out += '[';
    for (size_t i = 0; i < value.size() && out.size() <= kMaxChars; ++i) {
      if (i > 0) out += ',';
      DumpTo(value[i], depth + 1, out);
    }
    out += ']';
  } else {
    out += '{';
    bool first = true;
    for (auto it = value.begin(); it != value.end() && out.size() <= kMaxChars; ++it) {
      if (!first) out += ',';
      first = false;
      out += json(it.key()).dump();
      out += ':';
      DumpTo(it.value(), depth + 1, out);
    }
    out += '}';
  }
  if (out.size() > kMaxChars) {
    out.resize(kMaxChars);
    out += "...";
  }
}

}  // namespace

std::string Dump(const json& value) {
  std::string out;
  DumpTo(value, 0, out);
  return out;
}

// a * b, or nullopt when it exceeds kMaxElements (a, b >= 0).
std::optional<int64_t> CheckedProduct(int64_t a, int64_t b) {
  if (a != 0 && b > kMaxElements / a) return std::nullopt;
  return a * b;
}

// A shape from Keras' config; `with_batch` drops the leading (batch) dimension.
absl::StatusOr<Shape> ParseShape(const json& dims, bool with_batch, const std::string& where) {
  if (!dims.is_array() || (with_batch && dims.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is ", Dump(dims),
                     ", which is not a list of dimensions: write it as [null, 28, 28]"));
  }
  std::vector<int64_t> out;
  int64_t elements = 1;
  for (size_t i = with_batch ? 1 : 0; i < dims.size(); ++i) {
    if (!dims[i].is_number_integer() || dims[i].get<int64_t>() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is ", Dump(dims), ", whose dimension ", i, " is ", Dump(dims[i]),
                       ": Stratum needs a fixed, positive size for every dimension but the "
                       "batch"));
    }
    out.push_back(dims[i].get<int64_t>());
    const std::optional<int64_t> product = CheckedProduct(elements, out.back());
    if (!product) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is ", Dump(dims),
                       ", more than 2^31 elements per example: use a smaller input shape"));
    }
    elements = *product;
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is ", Dump(dims),
                     ", a scalar per example: give each example at least one "
                     "dimension, such as [null, 784]"));
  }
  return Shape(std::move(out));
}

namespace {

// The name of the dtype (or policy) a config gives; float32 when it gives none.
std::string DtypeName(const json& config) {
  const json* dtype = Find(config, "dtype");
  if (dtype == nullptr || dtype->is_null()) return "float32";
  const json* policy_config = Find(*dtype, "config");  // a DTypePolicy / Policy object
  if (dtype->is_string()) return dtype->get<std::string>();
  if (policy_config != nullptr && FindString(*policy_config, "name")) {
    return *FindString(*policy_config, "name");
  }
  return Dump(*dtype);
}

}  // namespace

absl::StatusOr<DtypePolicy> ParseDtypePolicy(const std::string& where, const json& config) {
  const std::string name = DtypeName(config);
  if (name == "float32") return DtypePolicy::kFloat32;
  if (name == "mixed_bfloat16") return DtypePolicy::kMixedBfloat16;
  if (name == "mixed_float16") return DtypePolicy::kMixedFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has dtype \"", name,
                   "\", which Stratum does not support: use float32, or a mixed precision policy "
                   "(mixed_bfloat16, mixed_float16: variables in float32, computed in half "
                   "precision on GPUs)"));
}

absl::Status CheckDtype(const std::string& where, const json& config) {
  const json* dtype = Find(config, "dtype");
  if (dtype == nullptr) return absl::OkStatus();
  std::string name;
  const json* policy_config = Find(*dtype, "config");  // a DTypePolicy / Policy object
  if (dtype->is_string()) {
    name = dtype->get<std::string>();
  } else if (policy_config != nullptr && FindString(*policy_config, "name")) {
    name = *FindString(*policy_config, "name");
  } else {
    name = Dump(*dtype);
  }
  if (name == "float32") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      where, " has dtype \"", name, "\", which Stratum does not support: use float32"));
}

absl::StatusOr<ActivationKind> ParseActivation(const std::string& where, const json& value) {
  if (value.is_null()) return ActivationKind::kLinear;
  std::string name;
  if (value.is_string()) {
    name = value.get<std::string>();
  } else if (FindString(value, "config")) {
    name = *FindString(value, "config");  // Keras 3 {"class_name": "function", ...}
  } else {
    name = Dump(value);
  }
  static const std::pair<const char*, ActivationKind> kNames[] = {
      {"linear", ActivationKind::kLinear},
      {"relu", ActivationKind::kRelu},
      {"sigmoid", ActivationKind::kSigmoid},
      {"tanh", ActivationKind::kTanh},
      {"softmax", ActivationKind::kSoftmax}};
  for (const auto& [known, activation] : kNames) {
    if (name == known) return activation;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has activation \"", name,
                   "\", which Stratum does not support: ", kSupportedActivations));
}

namespace {

// RandomUniform, by any of its names.
bool IsUniformName(const std::string& class_name) {
  return Canonical(class_name) == "randomuniform" || Canonical(class_name) == "uniform";
}

// The options of a Keras initializer object ({"class_name": ..., "config": {...}}): seed for
// the random ones (and RandomUniform's minval and maxval, read by the caller), none for zeros
// and ones; a key Keras' class does not have is refused by name, as a layer's are, so a
// misspelt "sead" is not ignored.

absl::StatusOr<std::optional<uint64_t>> ParseInitializerSeed(const std::string& what,
                                                             const std::string& class_name,
                                                             bool seeded, const json& options) {
  if (!options.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " with config ", Dump(options),
                                                   ", which is not an object: write it as ",
                                                   seeded ? "{\"seed\": null}" : "{}"));
  }
  std::vector<std::string> unknown;
  const bool range = IsUniformName(class_name);
  for (const auto& [option, value] : options.items()) {
    const bool known =
        (seeded && option == "seed") || (range && (option == "minval" || option == "maxval"));
    if (!known) unknown.push_back(absl::StrCat("\"", option, "\""));
  }
  if (!unknown.empty()) {
    const bool one = unknown.size() == 1;
    const std::string fix =
        seeded
            ? absl::StrCat("check ", one ? "its" : "their", " spelling (", class_name,
                           range ? " takes minval, maxval and seed" : " takes seed", ") or remove ",
                           one ? "it" : "them")
            : absl::StrCat("remove ", one ? "it" : "them", " (", class_name, " takes no options)");
    return absl::InvalidArgumentError(absl::StrCat(what, " with config ", one ? "key " : "keys ",
                                                   absl::StrJoin(unknown, ", "), ", which Keras' ",
                                                   class_name, " does not have: ", fix));
  }
  const json* seed = Find(options, "seed");
  if (seed == nullptr) return std::optional<uint64_t>();
  if (!seed->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " with seed ", Dump(*seed),
        ", which is not an integer: write an integer, or null to draw from the run's seed "
        "(fit.seed)"));
  }
  // A negative seed keeps its bits: any integer Keras takes is a seed.
  return std::optional<uint64_t>(seed->is_number_unsigned()
                                     ? seed->get<uint64_t>()
                                     : static_cast<uint64_t>(seed->get<int64_t>()));
}

}  // namespace

absl::StatusOr<Initializer> ParseInitializer(const std::string& where, const json& config,
                                             const char* key, const char* default_value) {
  const json* found = Find(config, key);
  if (found == nullptr) return Initializer{default_value, std::nullopt};
  const json& value = *found;
  std::string name;
  if (value.is_string()) {
    name = value.get<std::string>();
  } else if (FindString(value, "class_name")) {
    name = *FindString(value, "class_name");
  } else {
    name = Dump(value);
  }
  static const std::pair<const char*, const char*> kNames[] = {{"glorotuniform", "glorot_uniform"},
                                                               {"zeros", "zeros"},
                                                               {"ones", "ones"},
                                                               {"heuniform", "he_uniform"},
                                                               {"lecununiform", "lecun_uniform"},
                                                               {"randomuniform", "random_uniform"},
                                                               {"uniform", "random_uniform"}};
  for (const auto& [canonical, initializer] : kNames) {
    if (Canonical(name) != canonical) continue;
    Initializer result{initializer, std::nullopt};
    const json* options = Find(value, "config");  // a name alone takes Keras' defaults
    if (options == nullptr) return result;
    const bool seeded = result.name != "zeros" && result.name != "ones";
    const std::string what = absl::StrCat(where, " has ", key, " ", name);
    STRATUM_ASSIGN_OR_RETURN(result.seed, ParseInitializerSeed(what, name, seeded, *options));
    if (result.name == "random_uniform") {
      for (auto [option, bound] : {std::pair{"minval", &result.low}, {"maxval", &result.high}}) {
        const json* v = Find(*options, option);
        if (v == nullptr) continue;
        if (!v->is_number()) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, " with ", option, " ", Dump(*v), ": use a number, such as -0.05"));
        }
        *bound = v->get<float>();
      }
      if (!(result.low < result.high)) {
        return absl::InvalidArgumentError(absl::StrCat(what, " with minval ", result.low,
                                                       " and maxval ", result.high,
                                                       ": minval must be below maxval"));
      }
    }
    return result;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has ", key, " \"", name,
                   "\", which Stratum does not support: ", kSupportedInitializers));
}

VariableSpec MakeVariable(std::string name, Shape shape, const Initializer& initializer,
                          const Regularizer& regularizer, bool trainable) {
  VariableSpec spec{std::move(name), std::move(shape), initializer.name, initializer.seed,
                    regularizer.l1,  regularizer.l2,   trainable};
  spec.uniform_low = initializer.low;
  spec.uniform_high = initializer.high;
  return spec;
}

absl::StatusOr<Regularizer> ParseRegularizer(const std::string& where, const json& config,
                                             const char* key) {
  const json* value = Find(config, key);
  if (value == nullptr) return Regularizer{};
  std::string name;
  if (value->is_string()) {
    name = value->get<std::string>();
  } else if (FindString(*value, "class_name")) {
    name = *FindString(*value, "class_name");
  } else {
    name = Dump(*value);
  }
  const std::string canonical = Canonical(name);
  const bool l1 = canonical == "l1" || canonical == "l1l2";
  const bool l2 = canonical == "l2" || canonical == "l1l2";
  if (!l1 && !l2) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has ", key, " \"", name,
                                                   "\", which Stratum does not support: use L1, "
                                                   "L2 or L1L2"));
  }
  // Keras' defaults: 0.01 for a name or an L1/L2 without its factor; L1L2() is 0 and 0.
  const double fallback = canonical == "l1l2" && value->is_object() ? 0.0 : 0.01;
  Regularizer result{l1 ? fallback : 0, l2 ? fallback : 0};
  const json* options = value->is_object() ? Find(*value, "config") : nullptr;
  if (options == nullptr) return result;
  if (!options->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has ", key, " with config ",
                                                   Dump(*options), ", which is not an object"));
  }
  for (const auto& [option, factor] : options->items()) {
    const bool known = (option == "l1" && l1) || (option == "l2" && l2);
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has ", key, " ", name, " with config key \"", option,
                       "\", which Keras' ", name, " does not have: use ",
                       l1 && l2 ? "l1 and l2"
                       : l1     ? "l1"
                                : "l2"));
    }
    if (!factor.is_number() || !(factor.get<double>() >= 0) ||
        !std::isfinite(factor.get<double>())) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has ", key, " ", name, " with ",
                                                     option, " ", Dump(factor),
                                                     ": use a non-negative number"));
    }
    (option == "l1" ? result.l1 : result.l2) = factor.get<double>();
  }
  return result;
}

absl::StatusOr<bool> ParseBool(const std::string& where, const json& config, const char* key,
                               bool default_value) {
  const json* value = Find(config, key);
  if (value == nullptr) return default_value;
  if (!value->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has ", key, " ", Dump(*value),
                                                   ", which is not a boolean: use true or false"));
  }
  return value->get<bool>();
}

absl::Status RefuseFrozen(const std::string& where, const json& config) {
  const json* trainable = Find(config, "trainable");
  if (trainable == nullptr || *trainable == true) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has trainable ", Dump(*trainable),
                   ", which Stratum does not support: Stratum trains every layer, so set "
                   "trainable to true"));
}

// Options Stratum does not implement: refused unless absent or null.
absl::Status RefuseSet(const std::string& where, const json& config,
                       std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (const json* value = Find(config, key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " sets ", key, " to ", Dump(*value),
                       ", which Stratum does not support: remove it (set it to None)"));
    }
  }
  return absl::OkStatus();
}

// A key neither this layer nor Keras' base Layer has (a typo such as "activaton" would
// otherwise be ignored, and the layer built without it).
absl::Status RefuseUnknown(const std::string& where, const json& config,
                           std::initializer_list<const char*> own) {
  static const std::set<std::string> kBase = {
      "name",        "trainable", "dtype",    "batch_input_shape",   "batch_shape",
      "input_shape", "dynamic",   "autocast", "activity_regularizer"};
  for (const auto& item : config.items()) {
    const std::string& key = item.key();  // a name, not a structured binding: clang 14 captures it
    if (kBase.count(key) > 0 ||
        std::any_of(own.begin(), own.end(), [&key](const char* k) { return key == k; })) {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has config key \"", key, "\", which Keras' layer does not have: ",
        "check its spelling (this layer takes ", absl::StrJoin(own, ", "), ") or remove it"));
  }
  return absl::OkStatus();
}

// The input shape a layer's config declares, if any.
absl::StatusOr<std::optional<Shape>> DeclaredInputShape(const std::string& where,
                                                        const json& config) {
  for (const char* key : {"batch_input_shape", "batch_shape"}) {
    if (const json* dims = Find(config, key)) {
      STRATUM_ASSIGN_OR_RETURN(Shape shape, ParseShape(*dims, true, absl::StrCat(where, " ", key)));
      return std::optional<Shape>(shape);
    }
  }
  if (const json* dims = Find(config, "input_shape")) {
    STRATUM_ASSIGN_OR_RETURN(Shape shape,
                             ParseShape(*dims, false, absl::StrCat(where, " input_shape")));
    return std::optional<Shape>(shape);
  }
  return std::optional<Shape>();
}

std::string ShapeWithBatch(const Shape& shape) {
  std::vector<std::string> dims = {"None"};
  for (int64_t dim : shape.dims()) dims.push_back(std::to_string(dim));
  return absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
}

}  // namespace stratum::keras
