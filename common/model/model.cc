// Eigen's matrix products take their packing buffers from the stack up to this size, and from
// the heap above it (128 KiB by default). The reference model's first Dense layer needs 200
// KiB; 512 KiB keeps a step free of heap allocations for layers up to about 1,000 units while
// staying far below a thread's stack (8 MiB by default). Must precede every Eigen include.
#define EIGEN_STACK_ALLOCATION_LIMIT 524288

#include "stratum/model/model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/util/json_depth.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// In the order of LayerInfo's enums, which Model::layers() converts to.
enum class LayerKind { kFlatten, kDense, kActivation, kDropout };
enum class Activation { kLinear, kRelu, kSigmoid, kTanh, kSoftmax };

const char kSupportedLayers[] = "use InputLayer, Flatten, Dense, Activation or Dropout";
const char kSupportedActivations[] = "use relu, softmax, sigmoid, tanh or linear";
const char kSupportedInitializers[] =
    "use glorot_uniform, zeros, ones, he_uniform or lecun_uniform";

// A Keras initializer: its Stratum name and its own seed, if it has one.
struct Initializer {
  std::string name;  // "glorot_uniform", "zeros", ...
  std::optional<uint64_t> seed;
};

struct Layer {
  LayerKind kind = LayerKind::kFlatten;
  std::string name;
  std::string class_name;
  Activation activation = Activation::kLinear;
  int64_t units = 0;
  bool use_bias = true;
  float rate = 0;               // Dropout
  bool channels_first = false;  // Flatten
  Initializer kernel_initializer = {"glorot_uniform", std::nullopt};
  Initializer bias_initializer = {"zeros", std::nullopt};
  Shape output_shape;   // without the batch dimension
  int64_t in_size = 0;  // elements per example, in and out
  int64_t out_size = 0;
  int64_t in_width = 0;  // last dimension, in and out
  int64_t out_width = 0;
  int kernel = -1;  // indices into the variables
  int bias = -1;
};

using json = nlohmann::json;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;

// "GlorotUniform" / "glorot_uniform" -> "glorotuniform".
std::string Canonical(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c != '_') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

// Keras' default layer name for a class: "Dense" -> "dense".
std::string SnakeCase(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (std::isupper(c) && i > 0) out.push_back('_');
    out.push_back(static_cast<char>(std::tolower(c)));
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

std::string Dump(const json& value) {
  std::string out;
  DumpTo(value, 0, out);
  return out;
}

// Most elements one variable, one example's activations, or all parameters may hold: a
// float32 tensor of 2^31 elements is 8 GiB, far beyond what Stratum's models need, and the
// limit keeps every element count and byte size well inside int64.
constexpr int64_t kMaxElements = int64_t{1} << 31;

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

absl::StatusOr<Activation> ParseActivation(const std::string& where, const json& value) {
  if (value.is_null()) return Activation::kLinear;
  std::string name;
  if (value.is_string()) {
    name = value.get<std::string>();
  } else if (FindString(value, "config")) {
    name = *FindString(value, "config");  // Keras 3 {"class_name": "function", ...}
  } else {
    name = Dump(value);
  }
  static const std::pair<const char*, Activation> kNames[] = {{"linear", Activation::kLinear},
                                                              {"relu", Activation::kRelu},
                                                              {"sigmoid", Activation::kSigmoid},
                                                              {"tanh", Activation::kTanh},
                                                              {"softmax", Activation::kSoftmax}};
  for (const auto& [known, activation] : kNames) {
    if (name == known) return activation;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has activation \"", name,
                   "\", which Stratum does not support: ", kSupportedActivations));
}

// The options of a Keras initializer object ({"class_name": ..., "config": {...}}): seed for
// the random ones, none for zeros and ones; a key Keras' class does not have is refused by
// name, as a layer's are, so a misspelt "sead" is not ignored.
absl::StatusOr<std::optional<uint64_t>> ParseInitializerSeed(const std::string& what,
                                                             const std::string& class_name,
                                                             bool seeded, const json& options) {
  if (!options.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " with config ", Dump(options),
                                                   ", which is not an object: write it as ",
                                                   seeded ? "{\"seed\": null}" : "{}"));
  }
  std::vector<std::string> unknown;
  for (const auto& [option, value] : options.items()) {
    if (!(seeded && option == "seed")) unknown.push_back(absl::StrCat("\"", option, "\""));
  }
  if (!unknown.empty()) {
    const bool one = unknown.size() == 1;
    const std::string fix =
        seeded
            ? absl::StrCat("check ", one ? "its" : "their", " spelling (", class_name,
                           " takes seed) or remove ", one ? "it" : "them")
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
                                                               {"lecununiform", "lecun_uniform"}};
  for (const auto& [canonical, initializer] : kNames) {
    if (Canonical(name) != canonical) continue;
    Initializer result{initializer, std::nullopt};
    const json* options = Find(value, "config");  // a name alone takes Keras' defaults
    if (options == nullptr) return result;
    const bool seeded = result.name != "zeros" && result.name != "ones";
    STRATUM_ASSIGN_OR_RETURN(
        result.seed,
        ParseInitializerSeed(absl::StrCat(where, " has ", key, " ", name), name, seeded, *options));
    return result;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has ", key, " \"", name,
                   "\", which Stratum does not support: ", kSupportedInitializers));
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
  for (const auto& [key, value] : config.items()) {
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

absl::StatusOr<Layer> ParseDense(Layer layer, const std::string& where, const json& config) {
  STRATUM_RETURN_IF_ERROR(
      RefuseUnknown(where, config,
                    {"units", "activation", "use_bias", "kernel_initializer", "bias_initializer",
                     "kernel_regularizer", "bias_regularizer", "kernel_constraint",
                     "bias_constraint", "lora_rank", "lora_alpha", "quantization_config"}));
  STRATUM_RETURN_IF_ERROR(
      RefuseSet(where, config,
                {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                 "kernel_constraint", "bias_constraint", "lora_rank", "quantization_config"}));
  if (const json* trainable = Find(config, "trainable"); trainable && *trainable != true) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has trainable ", Dump(*trainable),
                     ", which Stratum does not support: Stratum trains every layer, so set "
                     "trainable to true"));
  }
  const json* units = Find(config, "units");
  if (units == nullptr || !units->is_number_integer() || units->get<int64_t>() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has units ",
                                                   units ? Dump(*units) : std::string("missing"),
                                                   ": set units to a positive integer"));
  }
  layer.kind = LayerKind::kDense;
  layer.units = units->get<int64_t>();
  const json* activation = Find(config, "activation");
  STRATUM_ASSIGN_OR_RETURN(layer.activation,
                           ParseActivation(where, activation ? *activation : json()));
  if (const json* use_bias = Find(config, "use_bias")) {
    if (!use_bias->is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has use_bias ", Dump(*use_bias), ", which is not a boolean: use true or false"));
    }
    layer.use_bias = use_bias->get<bool>();
  }
  STRATUM_ASSIGN_OR_RETURN(layer.kernel_initializer,
                           ParseInitializer(where, config, "kernel_initializer", "glorot_uniform"));
  STRATUM_ASSIGN_OR_RETURN(layer.bias_initializer,
                           ParseInitializer(where, config, "bias_initializer", "zeros"));
  return layer;
}

absl::StatusOr<Layer> ParseLayer(const json& spec, size_t index,
                                 std::map<std::string, int>& default_names) {
  const std::optional<std::string> class_name = FindString(spec, "class_name");
  if (!class_name) {
    return absl::InvalidArgumentError(
        absl::StrCat("model layer ", index, " is ", Dump(spec),
                     ", which is not a Keras layer object: give it \"class_name\" and \"config\""));
  }
  Layer layer;
  layer.class_name = *class_name;
  static const json* const kEmptyConfig = new json(json::object());
  const json* found_config = Find(spec, "config");
  const json& config = found_config ? *found_config : *kEmptyConfig;
  if (!config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model layer ", index, " (", layer.class_name, ") has config ", Dump(config),
                     ", which is not an object: give the layer a config object such as {\"name\": "
                     "\"dense\", ...}"));
  }
  if (const std::optional<std::string> name = FindString(config, "name")) {
    layer.name = *name;
  } else {
    const std::string base = SnakeCase(layer.class_name);
    const int count = default_names[base]++;
    layer.name = count == 0 ? base : absl::StrCat(base, "_", count);
  }
  const std::string where = Where(layer.name, layer.class_name);
  STRATUM_RETURN_IF_ERROR(CheckDtype(where, config));
  if (layer.class_name == "Dense") return ParseDense(std::move(layer), where, config);
  STRATUM_RETURN_IF_ERROR(RefuseSet(where, config, {"activity_regularizer"}));
  if (layer.class_name == "Flatten") {
    STRATUM_RETURN_IF_ERROR(RefuseUnknown(where, config, {"data_format"}));
    layer.kind = LayerKind::kFlatten;
    if (const json* format = Find(config, "data_format")) {
      if (*format != "channels_first" && *format != "channels_last") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " has data_format ", Dump(*format), ": use \"channels_last\""));
      }
      layer.channels_first = *format == "channels_first";
    }
    return layer;
  }
  if (layer.class_name == "Activation") {
    STRATUM_RETURN_IF_ERROR(RefuseUnknown(where, config, {"activation"}));
    layer.kind = LayerKind::kActivation;
    const auto activation = config.find("activation");
    if (activation == config.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       " has no activation: set activation to relu, softmax, sigmoid, "
                       "tanh or linear"));
    }
    STRATUM_ASSIGN_OR_RETURN(layer.activation, ParseActivation(where, *activation));
    return layer;
  }
  if (layer.class_name == "Dropout") {
    STRATUM_RETURN_IF_ERROR(RefuseUnknown(where, config, {"rate", "noise_shape", "seed"}));
    layer.kind = LayerKind::kDropout;
    STRATUM_RETURN_IF_ERROR(RefuseSet(where, config, {"noise_shape"}));
    const json* rate = Find(config, "rate");
    if (rate == nullptr || !rate->is_number() || !(rate->get<double>() >= 0) ||
        rate->get<double>() >= 1) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has rate ",
                                                     rate ? Dump(*rate) : std::string("missing"),
                                                     ": set rate to a number in [0, 1)"));
    }
    layer.rate = rate->get<float>();
    return layer;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model layer \"", layer.name, "\" has class \"", layer.class_name,
                   "\", which Stratum does not support: ", kSupportedLayers));
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

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A uniform float in [0, 1) from 24 random bits (the same on every platform).
float Uniform01(std::mt19937_64& rng) {
  return static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);
}

// Keras' fans: a 2-D kernel [in, out]; a vector counts as both.
std::pair<double, double> Fans(const Shape& shape) {
  if (shape.rank() == 2) return {static_cast<double>(shape.dim(0)), double(shape.dim(1))};
  const double n = static_cast<double>(shape.num_elements());
  return {n, n};
}

void ApplyActivation(Activation activation, const float* z, float* out, int64_t rows,
                     int64_t width) {
  const ConstMatrixMap in(z, rows, width);
  MatrixMap o(out, rows, width);
  switch (activation) {
    case Activation::kLinear:
      if (out != z) o = in;
      return;
    case Activation::kRelu:
      o.array() = in.array().max(0.0f);
      return;
    case Activation::kSigmoid:
      o.array() = (1.0f + (-in.array()).exp()).inverse();
      return;
    case Activation::kTanh:
      o.array() = in.array().tanh();
      return;
    case Activation::kSoftmax:
      for (int64_t r = 0; r < rows; ++r) {
        const float max = in.row(r).maxCoeff();
        o.row(r).array() = (in.row(r).array() - max).exp();
        o.row(r) /= o.row(r).sum();
      }
      return;
  }
}

// g <- g * activation'(.) in place, from the activation's output y.
void ActivationBackward(Activation activation, const float* y, float* g, int64_t rows,
                        int64_t width) {
  const ConstMatrixMap out(y, rows, width);
  MatrixMap grad(g, rows, width);
  switch (activation) {
    case Activation::kLinear:
      return;
    case Activation::kRelu:
      grad.array() = (out.array() > 0.0f).select(grad.array(), 0.0f);
      return;
    case Activation::kSigmoid:
      grad.array() *= out.array() * (1.0f - out.array());
      return;
    case Activation::kTanh:
      grad.array() *= 1.0f - out.array().square();
      return;
    case Activation::kSoftmax:
      for (int64_t r = 0; r < rows; ++r) {
        const float dot = (grad.row(r).array() * out.row(r).array()).sum();
        grad.row(r).array() = out.row(r).array() * (grad.row(r).array() - dot);
      }
      return;
  }
}

}  // namespace

struct Model::Impl {
  std::string name;
  Shape input_shape;
  std::vector<Layer> layers;
  std::vector<VariableSpec> variables;
  int64_t output_size = 0;
  int64_t max_width = 0;    // largest activation, in elements per example
  int first_trainable = 0;  // backward stops at this layer
  // Per-layer sizes; a workspace made for another model does not match.
  std::vector<int64_t> signature;

  // The layer whose softmax output the model returns (following dropouts that are the
  // identity in this mode), or -1: cross-entropies then use its logits.
  int SoftmaxOutputLayer(bool training) const {
    for (int i = static_cast<int>(layers.size()) - 1; i >= 0; --i) {
      const Layer& layer = layers[static_cast<size_t>(i)];
      if (layer.kind == LayerKind::kDropout && !(training && layer.rate > 0)) continue;
      const bool softmax =
          (layer.kind == LayerKind::kDense || layer.kind == LayerKind::kActivation) &&
          layer.activation == Activation::kSoftmax;
      return softmax ? i : -1;
    }
    return -1;
  }
};

// Scratch floats aligned as Eigen's packets are. Eigen's vectorised sums peel a start that
// is not packet-aligned, so the rounding of a sum depends on where its buffer lies: with
// malloc's 16-byte alignment, a multi-threaded process (whose allocation addresses vary from
// run to run) trained to different bits each run.
using Floats = std::vector<float, Eigen::aligned_allocator<float>>;

struct Workspace::State {
  explicit State(uint64_t seed) : rng(seed) {}

  int64_t capacity = 0;
  std::vector<int64_t> signature;
  std::vector<Floats> outputs;     // per layer; empty where the output aliases
  std::vector<Floats> logits;      // per softmax Dense layer
  std::vector<Floats> masks;       // per Dropout layer
  std::vector<const float*> acts;  // acts[i]: input of layer i; acts.back(): output
  Floats grad_a, grad_b;
  std::mt19937_64 rng;
};

Workspace::Workspace(std::unique_ptr<State> state) : state_(std::move(state)) {}
Workspace::~Workspace() = default;
int64_t Workspace::capacity() const { return state_->capacity; }
void Workspace::Reseed(uint64_t seed) { state_->rng.seed(seed); }

namespace {

void Grow(const Model::Impl& model, Workspace::State& ws, int64_t batch) {
  if (batch <= ws.capacity) return;
  const size_t n = model.layers.size();
  ws.outputs.resize(n);
  ws.logits.resize(n);
  ws.masks.resize(n);
  ws.acts.resize(n + 1);
  for (size_t i = 0; i < n; ++i) {
    const Layer& layer = model.layers[i];
    const auto size = static_cast<size_t>(batch * layer.out_size);
    if (layer.kind != LayerKind::kFlatten) ws.outputs[i].resize(size);
    if (layer.kind == LayerKind::kDropout) ws.masks[i].resize(size);
    if (layer.kind == LayerKind::kDense && layer.activation == Activation::kSoftmax) {
      ws.logits[i].resize(size);
    }
  }
  ws.grad_a.resize(static_cast<size_t>(batch * model.max_width));
  ws.grad_b.resize(static_cast<size_t>(batch * model.max_width));
  ws.capacity = batch;
}

// The forward pass; returns the output, [batch, output_size].
const float* Forward(const Model::Impl& model, const std::vector<Tensor>& variables, const float* x,
                     int64_t batch, bool training, Workspace::State& ws) {
  ws.acts[0] = x;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const Layer& layer = model.layers[i];
    const float* in = ws.acts[i];
    float* out = ws.outputs[i].data();
    switch (layer.kind) {
      case LayerKind::kFlatten:
        ws.acts[i + 1] = in;
        break;
      case LayerKind::kDropout: {
        if (!training || layer.rate == 0) {
          ws.acts[i + 1] = in;
          break;
        }
        const int64_t n = batch * layer.out_size;
        float* mask = ws.masks[i].data();
        const float keep_scale = 1.0f / (1.0f - layer.rate);
        for (int64_t j = 0; j < n; ++j) {
          mask[j] = Uniform01(ws.rng) >= layer.rate ? keep_scale : 0.0f;
        }
        FlatMap<float>(out, n) = ConstFlatMap<float>(in, n) * ConstFlatMap<float>(mask, n);
        ws.acts[i + 1] = out;
        break;
      }
      case LayerKind::kActivation:
        ApplyActivation(layer.activation, in, out, batch * layer.out_size / layer.out_width,
                        layer.out_width);
        ws.acts[i + 1] = out;
        break;
      case LayerKind::kDense: {
        const int64_t rows = batch * layer.in_size / layer.in_width;
        const Tensor& kernel = variables[static_cast<size_t>(layer.kernel)];
        float* z = layer.activation == Activation::kSoftmax ? ws.logits[i].data() : out;
        MatrixMap zm(z, rows, layer.units);
        zm.noalias() = ConstMatrixMap(in, rows, layer.in_width) * kernel.Matrix();
        if (layer.use_bias) {
          const Tensor& bias = variables[static_cast<size_t>(layer.bias)];
          zm.rowwise() += ConstRowVectorMap(bias.data<float>(), layer.units);
        }
        ApplyActivation(layer.activation, z, out, rows, layer.units);
        ws.acts[i + 1] = out;
        break;
      }
    }
  }
  return ws.acts.back();
}

// The backward pass from dL/d(output) in ws.grad_a (or dL/d(logits) of layer `fused`).
void Backward(const Model::Impl& model, const std::vector<Tensor>& variables, int64_t batch,
              bool training, int fused, Workspace::State& ws, std::vector<Tensor>& gradients) {
  float* g = ws.grad_a.data();
  float* other = ws.grad_b.data();
  for (int i = static_cast<int>(model.layers.size()) - 1; i >= model.first_trainable; --i) {
    if (fused >= 0 && i > fused) continue;  // identity dropouts after the fused softmax
    const Layer& layer = model.layers[static_cast<size_t>(i)];
    const bool skip_activation = i == fused;
    const float* out = ws.acts[static_cast<size_t>(i) + 1];
    switch (layer.kind) {
      case LayerKind::kFlatten:
        break;
      case LayerKind::kDropout:
        if (training && layer.rate > 0) {
          const int64_t n = batch * layer.out_size;
          FlatMap<float>(g, n) *= ConstFlatMap<float>(ws.masks[static_cast<size_t>(i)].data(), n);
        }
        break;
      case LayerKind::kActivation:
        if (!skip_activation) {
          ActivationBackward(layer.activation, out, g, batch * layer.out_size / layer.out_width,
                             layer.out_width);
        }
        break;
      case LayerKind::kDense: {
        const int64_t rows = batch * layer.in_size / layer.in_width;
        if (!skip_activation) ActivationBackward(layer.activation, out, g, rows, layer.units);
        const ConstMatrixMap grad(g, rows, layer.units);
        const ConstMatrixMap in(ws.acts[static_cast<size_t>(i)], rows, layer.in_width);
        gradients[static_cast<size_t>(layer.kernel)].Matrix().noalias() = in.transpose() * grad;
        if (layer.use_bias) {
          RowVectorMap(gradients[static_cast<size_t>(layer.bias)].data<float>(), layer.units) =
              grad.colwise().sum();
        }
        if (i > model.first_trainable) {
          MatrixMap(other, rows, layer.in_width).noalias() =
              grad * variables[static_cast<size_t>(layer.kernel)].Matrix().transpose();
          std::swap(g, other);
        }
        break;
      }
    }
  }
}

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::Model(const Model& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
Model& Model::operator=(const Model& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
Model::~Model() = default;

absl::StatusOr<Model> Model::FromKerasJson(absl::string_view text) {
  absl::StatusOr<json> parsed = ParseText(text);
  if (!parsed.ok()) return parsed.status();
  return FromKerasJson(*parsed);
}

absl::StatusOr<Model> Model::FromKerasJson(const std::string& text) {
  return FromKerasJson(absl::string_view(text));
}

absl::StatusOr<Model> Model::FromKerasJson(const char* text) {
  return FromKerasJson(absl::string_view(text));
}

namespace {

// The layers of a Sequential config: the "layers" list, or (old tf.keras) the whole config.
absl::StatusOr<const json*> LayerList(const json& config) {
  if (config.is_array()) return &config;
  if (!config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config is ", Dump(config),
                     ", which is not an object: pass the text of Keras' model.to_json() for a "
                     "Sequential model"));
  }
  const json* layers = Find(config, "layers");
  if (layers == nullptr || !layers->is_array() || layers->empty()) {
    return absl::InvalidArgumentError(
        "model config has no layers: pass a Sequential model with at least one layer");
  }
  return layers;
}

// A boolean InputLayer option; absent or null is false.
absl::StatusOr<bool> InputFlag(const json& config, const char* key) {
  const json* value = Find(config, key);
  if (value == nullptr) return false;
  if (!value->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat("model InputLayer has ", key, " ", Dump(*value),
                                                   ", which is not a boolean: use false"));
  }
  return value->get<bool>();
}

// The InputLayer's dtype, sparse and ragged options.
absl::Status CheckInputLayer(const json& config) {
  STRATUM_RETURN_IF_ERROR(
      CheckDtype(Where(FindString(config, "name").value_or("input_layer"), "InputLayer"), config));
  STRATUM_ASSIGN_OR_RETURN(const bool sparse, InputFlag(config, "sparse"));
  STRATUM_ASSIGN_OR_RETURN(const bool ragged, InputFlag(config, "ragged"));
  if (sparse || ragged) {
    return absl::InvalidArgumentError(
        "model InputLayer is sparse or ragged, which Stratum does not support: use a dense "
        "input");
  }
  return absl::OkStatus();
}

// Refuses a variable, an activation row or a parameter total over kMaxElements, which
// would take more memory than any machine Stratum runs on (or overflow int64 counts).
absl::Status CheckLayerSize(const std::string& where, const Layer& layer, int64_t in_width,
                            int64_t& total_parameters) {
  if (layer.kind != LayerKind::kDense) return absl::OkStatus();
  const std::optional<int64_t> kernel = CheckedProduct(in_width, layer.units);
  if (!kernel) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has a kernel of ", in_width, " x ", layer.units,
                     " elements, more than the 2^31 Stratum allows per variable: use fewer units"));
  }
  const int64_t parameters = *kernel + (layer.use_bias ? layer.units : 0);
  if (total_parameters + parameters > kMaxElements) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " brings the model to ", total_parameters + parameters,
                     " parameters, more than the 2^31 Stratum allows: use fewer or smaller "
                     "layers"));
  }
  total_parameters += parameters;
  return absl::OkStatus();
}

absl::StatusOr<Model> BuildModel(const json& input) {
  json storage;
  STRATUM_ASSIGN_OR_RETURN(const json* unwrapped, Unwrap(input, storage));
  const json& spec = *unwrapped;
  const std::optional<std::string> model_class = FindString(spec, "class_name");
  if (!model_class) {
    return absl::InvalidArgumentError(
        "model JSON has no \"class_name\": pass the text of Keras' model.to_json() for a "
        "Sequential model");
  }
  const std::string& class_name = *model_class;
  if (class_name != "Sequential") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model has class \"", class_name,
        "\", which Stratum does not support: build the model as keras.Sequential([...]) and "
        "save its to_json()"));
  }
  const json* found_config = Find(spec, "config");
  if (found_config == nullptr) {
    return absl::InvalidArgumentError(
        "model config has no layers: pass a Sequential model with at least one layer");
  }
  const json& config = *found_config;
  STRATUM_ASSIGN_OR_RETURN(const json* layer_list, LayerList(config));
  const json& layers_json = *layer_list;
  if (layers_json.empty()) {
    return absl::InvalidArgumentError(
        "model config has no layers: pass a Sequential model with at least one layer");
  }
  auto impl = std::make_unique<Model::Impl>();
  impl->name = FindString(config, "name").value_or("sequential");

  std::optional<Shape> input_shape;
  std::map<std::string, int> default_names;
  for (size_t i = 0; i < layers_json.size(); ++i) {
    const json& layer_json = layers_json[i];
    const std::optional<std::string> layer_class = FindString(layer_json, "class_name");
    const bool is_input = layer_class == "InputLayer";
    if (!impl->layers.empty() && is_input) {
      return absl::InvalidArgumentError(
          absl::StrCat("model layer ", i, " is an InputLayer after other layers: put it first"));
    }
    const json* layer_config = Find(layer_json, "config");
    if (is_input && layer_config != nullptr && !layer_config->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model layer ", i, " (InputLayer) has config ", Dump(*layer_config),
                       ", which is not an object: give it {\"batch_shape\": [null, ...]}"));
    }
    if ((is_input || impl->layers.empty()) && !input_shape && layer_class &&
        layer_config != nullptr && layer_config->is_object()) {
      const std::string name = FindString(*layer_config, "name").value_or(absl::StrCat("#", i));
      STRATUM_ASSIGN_OR_RETURN(input_shape,
                               DeclaredInputShape(Where(name, *layer_class), *layer_config));
    }
    if (is_input) {
      if (layer_config != nullptr) STRATUM_RETURN_IF_ERROR(CheckInputLayer(*layer_config));
      continue;
    }
    STRATUM_ASSIGN_OR_RETURN(Layer layer, ParseLayer(layer_json, i, default_names));
    impl->layers.push_back(std::move(layer));
  }
  if (const json* build_shape = Find(config, "build_input_shape"); !input_shape && build_shape) {
    STRATUM_ASSIGN_OR_RETURN(Shape shape,
                             ParseShape(*build_shape, true, "model build_input_shape"));
    input_shape = shape;
  }
  if (!input_shape) {
    return absl::InvalidArgumentError(
        "model has no input shape: start the Sequential model with keras.Input(shape=(...)) or "
        "give its first layer input_shape=(...)");
  }
  if (impl->layers.empty()) {
    return absl::InvalidArgumentError(
        "model has only an InputLayer: add the layers to train (Flatten, Dense, ...)");
  }
  impl->input_shape = *input_shape;

  // Shapes and variables, layer by layer.
  Shape shape = *input_shape;
  std::set<std::string> names;
  int64_t max_width = shape.num_elements();
  int64_t total_parameters = 0;
  impl->first_trainable = -1;
  for (size_t i = 0; i < impl->layers.size(); ++i) {
    Layer& layer = impl->layers[i];
    const std::string where = Where(layer.name, layer.class_name);
    if (!names.insert(layer.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " repeats a layer name: give every layer a distinct name"));
    }
    layer.in_size = shape.num_elements();
    layer.in_width = shape.dim(shape.rank() - 1);
    STRATUM_RETURN_IF_ERROR(CheckLayerSize(where, layer, layer.in_width, total_parameters));
    switch (layer.kind) {
      case LayerKind::kFlatten:
        if (layer.channels_first && shape.rank() >= 2) {
          return absl::InvalidArgumentError(
              absl::StrCat(where,
                           " has data_format channels_first, which Stratum does not support: use "
                           "channels_last"));
        }
        shape = Shape({shape.num_elements()});
        break;
      case LayerKind::kDense: {
        // The output row is in_size / in_width * units; refuse it before Shape counts it.
        if (!CheckedProduct(layer.in_size / layer.in_width, layer.units)) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, " outputs ", layer.in_size / layer.in_width, " x ", layer.units,
              " elements per example, more than the 2^31 Stratum allows: use fewer units"));
        }
        std::vector<int64_t> dims = shape.dims();
        dims.back() = layer.units;
        shape = Shape(std::move(dims));
        layer.kernel = static_cast<int>(impl->variables.size());
        impl->variables.push_back({absl::StrCat(layer.name, "/kernel"),
                                   Shape({layer.in_width, layer.units}),
                                   layer.kernel_initializer.name, layer.kernel_initializer.seed});
        if (layer.use_bias) {
          layer.bias = static_cast<int>(impl->variables.size());
          impl->variables.push_back({absl::StrCat(layer.name, "/bias"), Shape({layer.units}),
                                     layer.bias_initializer.name, layer.bias_initializer.seed});
        }
        if (impl->first_trainable < 0) impl->first_trainable = static_cast<int>(i);
        break;
      }
      case LayerKind::kActivation:
      case LayerKind::kDropout:
        break;
    }
    layer.output_shape = shape;
    layer.out_size = shape.num_elements();
    layer.out_width = shape.dim(shape.rank() - 1);
    max_width = std::max(max_width, layer.out_size);
    impl->signature.push_back(layer.out_size);
  }
  if (shape.rank() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model output has shape ", ShapeWithBatch(shape),
        ", but Stratum's losses take (None, classes): add a Flatten layer before the last Dense "
        "layer"));
  }
  if (impl->first_trainable < 0) impl->first_trainable = static_cast<int>(impl->layers.size());
  impl->output_size = shape.dim(0);
  impl->max_width = max_width;
  return Model(std::move(impl));
}

}  // namespace

absl::StatusOr<Model> Model::FromKerasJson(const json& input) {
  // Every access above is type-checked; this is the safety net that keeps a JSON
  // exception (or an allocation failure) from crossing the component boundary.
  try {
    return BuildModel(input);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model JSON has an unexpected structure (", e.what(),
                     "): pass the text of Keras' model.to_json() for a Sequential model"));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "model JSON needs more memory than is available to load: pass a smaller model");
  }
}

const std::string& Model::name() const { return impl_->name; }
const std::vector<VariableSpec>& Model::variables() const { return impl_->variables; }
Shape Model::input_shape() const { return impl_->input_shape; }
int64_t Model::output_size() const { return impl_->output_size; }

std::vector<LayerInfo> Model::layers() const {
  std::vector<LayerInfo> result;
  for (const Layer& layer : impl_->layers) {
    LayerInfo info;
    info.kind = static_cast<LayerInfo::Kind>(layer.kind);
    info.activation = static_cast<LayerInfo::Activation>(layer.activation);
    info.name = layer.name;
    info.in_size = layer.in_size;
    info.out_size = layer.out_size;
    info.in_width = layer.in_width;
    info.out_width = layer.out_width;
    info.rate = layer.rate;
    info.kernel = layer.kernel;
    info.bias = layer.bias;
    result.push_back(std::move(info));
  }
  return result;
}

int64_t Model::num_parameters() const {
  int64_t total = 0;
  for (const VariableSpec& spec : impl_->variables) total += spec.shape.num_elements();
  return total;
}

std::string Model::Summary() const {
  auto with_commas = [](int64_t n) {
    const std::string digits = std::to_string(n);
    std::string out;
    for (size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
      out.push_back(digits[i]);
    }
    return out;
  };
  auto pad = [](std::string text, size_t width) {
    if (text.size() < width) text.append(width - text.size(), ' ');
    return text + " ";
  };
  std::ostringstream out;
  const std::string rule(65, '_');
  out << "Model: \"" << impl_->name << "\"\n" << rule << "\n";
  out << pad(" Layer (type)", 28) << pad("Output Shape", 25) << "Param #\n";
  out << std::string(65, '=') << "\n";
  for (const Layer& layer : impl_->layers) {
    int64_t params = 0;
    if (layer.kind == LayerKind::kDense) {
      params = layer.in_width * layer.units + (layer.use_bias ? layer.units : 0);
    }
    out << pad(absl::StrCat(" ", layer.name, " (", layer.class_name, ")"), 28)
        << pad(ShapeWithBatch(layer.output_shape), 25) << with_commas(params) << "\n";
  }
  out << std::string(65, '=') << "\n";
  out << "Total params: " << with_commas(num_parameters()) << "\n";
  out << "Trainable params: " << with_commas(num_parameters()) << "\n";
  out << "Non-trainable params: 0\n" << rule << "\n";
  return out.str();
}

std::vector<Tensor> Model::InitialVariables(uint64_t seed) const {
  std::vector<Tensor> result;
  for (size_t v = 0; v < impl_->variables.size(); ++v) {
    const VariableSpec& spec = impl_->variables[v];
    Tensor tensor(DType::kFloat32, spec.shape);
    auto flat = tensor.Flat();
    const auto [fan_in, fan_out] = Fans(spec.shape);
    double limit = 0;
    if (spec.initializer == "glorot_uniform") limit = std::sqrt(6.0 / (fan_in + fan_out));
    if (spec.initializer == "he_uniform") limit = std::sqrt(6.0 / fan_in);
    if (spec.initializer == "lecun_uniform") limit = std::sqrt(3.0 / fan_in);
    if (spec.initializer == "ones") flat.setConstant(1.0f);
    if (limit > 0) {
      // A seed of the initializer's own gives the same values in every run, as in Keras
      // (two such initializers with one seed give one another's values, as there too).
      std::mt19937_64 rng(spec.seed.has_value() ? SplitMix64(*spec.seed)
                                                : SplitMix64(seed ^ SplitMix64(v + 1)));
      const auto l = static_cast<float>(limit);
      for (Eigen::Index j = 0; j < flat.size(); ++j) flat[j] = l * (2 * Uniform01(rng) - 1);
    }
    result.push_back(std::move(tensor));
  }
  return result;
}

absl::Status Model::CheckLoss(const Loss& loss) const {
  if (!loss.is_crossentropy() || !loss.from_logits()) return absl::OkStatus();
  const int softmax = impl_->SoftmaxOutputLayer(false);
  if (softmax < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "loss ", loss.name(), " has from_logits true, but the model's output (layer \"",
      impl_->layers[static_cast<size_t>(softmax)].name,
      "\") is a softmax, so it gives probabilities, not logits: set from_logits to false, or "
      "make the last layer's activation linear"));
}

std::unique_ptr<Workspace> Model::NewWorkspace(uint64_t seed) const {
  auto state = std::make_unique<Workspace::State>(seed);
  state->signature = impl_->signature;
  return std::make_unique<Workspace>(std::move(state));
}

namespace {

absl::StatusOr<int64_t> CheckInputs(const Model::Impl& model, const std::vector<Tensor>& variables,
                                    const Tensor& x, Workspace& ws) {
  if (ws.state().signature != model.signature) {
    return absl::InvalidArgumentError(
        absl::StrCat("the workspace was made for another model than \"", model.name,
                     "\": create it with this model's NewWorkspace()"));
  }
  if (variables.size() != model.variables.size()) {
    std::vector<std::string> names;
    for (const VariableSpec& spec : model.variables) names.push_back(spec.name);
    return absl::InvalidArgumentError(absl::StrCat(
        "variables has ", variables.size(), " tensors, but model \"", model.name, "\" has ",
        model.variables.size(), " (", absl::StrJoin(names, ", "),
        "): pass the tensors of InitialVariables() or of a checkpoint, in that order"));
  }
  for (size_t i = 0; i < variables.size(); ++i) {
    const VariableSpec& spec = model.variables[i];
    if (!variables[i].valid() || variables[i].dtype() != DType::kFloat32 ||
        variables[i].shape() != spec.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", i, " (\"", spec.name, "\") is ",
                       variables[i].valid() ? variables[i].DebugString() : std::string("empty"),
                       ", but the model expects float32", spec.shape.ToString(),
                       ": pass the model's variables in the order of Model::variables()"));
    }
  }
  const Shape& in = model.input_shape;
  // Compared in place: a step must not allocate.
  bool shaped = x.valid() && x.shape().rank() == in.rank() + 1;
  for (int d = 0; shaped && d < in.rank(); ++d) shaped = x.shape().dim(d + 1) == in.dim(d);
  const bool flat = x.valid() && x.shape().rank() == 2 && x.shape().dim(1) == in.num_elements();
  if (!x.valid() || x.dtype() != DType::kFloat32 || !(shaped || flat)) {
    std::vector<int64_t> expected = {x.valid() && x.shape().rank() > 0 ? x.shape().dim(0) : 0};
    expected.insert(expected.end(), in.dims().begin(), in.dims().end());
    return absl::InvalidArgumentError(
        absl::StrCat("x is ", x.valid() ? x.DebugString() : std::string("empty"), ", but model \"",
                     model.name, "\" takes float32 inputs of shape ", Shape(expected).ToString(),
                     " (batch first): convert or reshape the batch"));
  }
  return x.shape().dim(0);
}

void EnsureGradients(const Model::Impl& model, std::vector<Tensor>& gradients) {
  if (gradients.size() != model.variables.size()) gradients.resize(model.variables.size());
  for (size_t i = 0; i < gradients.size(); ++i) {
    const Shape& shape = model.variables[i].shape;
    if (!gradients[i].valid() || gradients[i].dtype() != DType::kFloat32 ||
        gradients[i].shape() != shape) {
      gradients[i] = Tensor(DType::kFloat32, shape);
    }
  }
}

const float* LogitsOf(const Model::Impl& model, const Workspace::State& ws, int layer) {
  if (layer < 0) return nullptr;
  if (model.layers[static_cast<size_t>(layer)].kind == LayerKind::kDense) {
    return ws.logits[static_cast<size_t>(layer)].data();
  }
  return ws.acts[static_cast<size_t>(layer)];  // an Activation layer's input
}

}  // namespace

absl::StatusOr<StepStats> Model::TrainStep(const std::vector<Tensor>& variables, const Tensor& x,
                                           const Tensor& y, const Loss& loss, float loss_scale,
                                           Workspace& ws, std::vector<Tensor>& gradients) const {
  STRATUM_ASSIGN_OR_RETURN(const int64_t batch, CheckInputs(*impl_, variables, x, ws));
  STRATUM_RETURN_IF_ERROR(loss.ValidateTargets(y, batch, impl_->output_size));
  EnsureGradients(*impl_, gradients);
  if (batch == 0) {
    for (Tensor& gradient : gradients) gradient.SetZero();
    return StepStats{};
  }
  Workspace::State& state = ws.state();
  Grow(*impl_, state, batch);
  const float* output = Forward(*impl_, variables, x.data<float>(), batch, true, state);
  const int fused = loss.is_crossentropy() ? impl_->SoftmaxOutputLayer(true) : -1;
  const StepStats stats =
      loss.Compute(ConstMatrixMap(output, batch, impl_->output_size),
                   LogitsOf(*impl_, state, fused), y, loss_scale, state.grad_a.data());
  Backward(*impl_, variables, batch, true, fused, state, gradients);
  return stats;
}

absl::StatusOr<StepStats> Model::Evaluate(const std::vector<Tensor>& variables, const Tensor& x,
                                          const Tensor& y, const Loss& loss, Workspace& ws) const {
  STRATUM_ASSIGN_OR_RETURN(const int64_t batch, CheckInputs(*impl_, variables, x, ws));
  STRATUM_RETURN_IF_ERROR(loss.ValidateTargets(y, batch, impl_->output_size));
  if (batch == 0) return StepStats{};
  Workspace::State& state = ws.state();
  Grow(*impl_, state, batch);
  const float* output = Forward(*impl_, variables, x.data<float>(), batch, false, state);
  const int fused = loss.is_crossentropy() ? impl_->SoftmaxOutputLayer(false) : -1;
  return loss.Compute(ConstMatrixMap(output, batch, impl_->output_size),
                      LogitsOf(*impl_, state, fused), y, 1.0f, nullptr);
}

absl::StatusOr<Tensor> Model::Predict(const std::vector<Tensor>& variables, const Tensor& x,
                                      Workspace& ws) const {
  STRATUM_ASSIGN_OR_RETURN(const int64_t batch, CheckInputs(*impl_, variables, x, ws));
  Tensor result(DType::kFloat32, Shape({batch, impl_->output_size}));
  if (batch == 0) return result;
  Workspace::State& state = ws.state();
  Grow(*impl_, state, batch);
  const float* output = Forward(*impl_, variables, x.data<float>(), batch, false, state);
  std::copy(output, output + batch * impl_->output_size, result.data<float>());
  return result;
}

}  // namespace stratum
