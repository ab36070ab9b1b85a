// Reading Keras' serialized configs (model.to_json()): the JSON helpers, shapes, dtypes,
// activations and initializers that the model builder and every layer parse, with the
// refusals they share (an option Stratum does not implement, a key Keras' layer does not
// have). Every function type-checks what it reads: malformed JSON gives INVALID_ARGUMENT
// naming the field, never an exception. Internal to common/model/.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stratum/device/device.h"
#include "stratum/model/layer.h"
#include "stratum/model/model.h"
#include "stratum/tensor/tensor.h"

namespace stratum::keras {

using json = nlohmann::json;

// Most elements one variable, one example's activations, or all parameters may hold: a
// float32 tensor of 2^31 elements is 8 GiB, far beyond what Stratum's models need, and the
// limit keeps every element count and byte size well inside int64.
constexpr int64_t kMaxElements = int64_t{1} << 31;

// a * b, or nullopt when it exceeds kMaxElements (a, b >= 0).
std::optional<int64_t> CheckedProduct(int64_t a, int64_t b);

// "GlorotUniform" / "glorot_uniform" -> "glorotuniform".
std::string Canonical(const std::string& name);
// Keras' default layer name for a class: "Dense" -> "dense".
std::string SnakeCase(const std::string& name);
// How messages name a layer: model layer "dense" (Dense).
std::string Where(const std::string& layer, const std::string& class_name);

// The model text parsed, its nesting depth checked first.
absl::StatusOr<json> ParseText(absl::string_view text);
// Keras writes the file with json.dump(model.to_json()): the model text inside a string.
// Returns `input` itself, or the parsed text kept in `storage`; never copies the document.
absl::StatusOr<const json*> Unwrap(const json& input, json& storage);

// The value of `key` when `object` is an object that has it set to non-null; else nullptr.
// Unlike const operator[] and value(), safe on any JSON value.
const json* Find(const json& object, const char* key);
// A string member, or nullopt when it is absent, null or not a string.
std::optional<std::string> FindString(const json& object, const char* key);
// Compact JSON text for messages, like dump(), but with bounded recursion and length so a
// deeply nested or huge value cannot exhaust the stack or flood the message.
std::string Dump(const json& value);

// A shape from Keras' config; `with_batch` drops the leading (batch) dimension.
absl::StatusOr<Shape> ParseShape(const json& dims, bool with_batch, const std::string& where);
// The input shape a layer's config declares (batch_input_shape, batch_shape, input_shape).
absl::StatusOr<std::optional<Shape>> DeclaredInputShape(const std::string& where,
                                                        const json& config);
// "(None, 28, 28)".
std::string ShapeWithBatch(const Shape& shape);

// Refuses a dtype (or dtype policy) other than float32.
absl::Status CheckDtype(const std::string& where, const json& config);
// The dtype policy a layer's config names ("dtype": a string, or a Keras 2 Policy / Keras 3
// DTypePolicy object): float32 (also when absent), mixed_bfloat16 or mixed_float16; others
// refused by name.
absl::StatusOr<DtypePolicy> ParseDtypePolicy(const std::string& where, const json& config);
// A Keras activation by name (null is linear).
absl::StatusOr<ActivationKind> ParseActivation(const std::string& where, const json& value);

// A Keras initializer: its Stratum name and its own seed, if it has one.
struct Initializer {
  std::string name;  // "glorot_uniform", "zeros", ...
  std::optional<uint64_t> seed;
  float low = -0.05f, high = 0.05f;  // random_uniform's minval and maxval (Keras' defaults)
};
// config[key] as an initializer (a name or a {"class_name", "config"} object), or the default.
absl::StatusOr<Initializer> ParseInitializer(const std::string& where, const json& config,
                                             const char* key, const char* default_value);

// A Keras regularizer: L1, L2 or L1L2 (by name, "l1" / "l2" / "l1_l2" with Keras' default
// 0.01, or the object form {"class_name": "L2", "config": {"l2": 1e-5}}); absent or null
// is none (0, 0). Any other class or option is refused by name.
struct Regularizer {
  double l1 = 0;
  double l2 = 0;
};
absl::StatusOr<Regularizer> ParseRegularizer(const std::string& where, const json& config,
                                             const char* key);

// A layer's variable, drawn by `initializer` (random_uniform's range included) and
// regularized by `regularizer`: the one way layers declare their variables.
VariableSpec MakeVariable(std::string name, Shape shape, const Initializer& initializer,
                          const Regularizer& regularizer = {}, bool trainable = true);

// config[key] as a boolean, or `default_value` when absent or null.
absl::StatusOr<bool> ParseBool(const std::string& where, const json& config, const char* key,
                               bool default_value);

// Refuses trainable false on a layer with variables: Stratum trains every variable.
absl::Status RefuseFrozen(const std::string& where, const json& config);

// Options Stratum does not implement: refused unless absent or null.
absl::Status RefuseSet(const std::string& where, const json& config,
                       std::initializer_list<const char*> keys);
// A key neither this layer (`own`) nor Keras' base Layer has (a typo such as "activaton"
// would otherwise be ignored, and the layer built without it).
absl::Status RefuseUnknown(const std::string& where, const json& config,
                           std::initializer_list<const char*> own);

}  // namespace stratum::keras
