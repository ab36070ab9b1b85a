// tf.train.Example parsing with a feature spec in tf.io's terms, as a job file gives it:
//
//   "features": {
//     "image": {"type": "FixedLenFeature", "dtype": "string", "decode_raw": "uint8",
//               "shape": [28, 28]},
//     "label": {"type": "FixedLenFeature", "dtype": "int64", "shape": [],
//               "default_value": 0},
//     "ids":   {"type": "VarLenFeature", "dtype": "int64", "pad_to": 200}
//   }
//
// FixedLenFeature(shape, dtype float32/int64/string, default_value): exactly
// shape.num_elements() values (or, when the feature is absent, its default_value, one
// value broadcast or one per element). Stratum's tensors hold no strings, so a string
// feature is either one bytes value decoded as tf.io.decode_raw(out_type = decode_raw,
// little-endian) into `shape`, or tokens (no decode_raw: one bytes value per element) that
// a StringLookup turns into int64 ids. VarLenFeature(dtype float32/int64/string tokens): a
// variable-length list, padded with zeros to `pad_to` values (padded_batch's
// padded_shapes; a longer list is an error naming its length), since Stratum's batches
// are dense.
//
// A feature may carry a lookup (stratum/data/lookup.h: the job's "preprocess"): a
// StringLookup on tokens, an IntegerLookup on int64 values; its values become the
// lookup's indices, int64, as the tutorial's dataset.map(lookup) makes them.
//
// The parser reads the wire format directly (no protobuf objects per record); it accepts
// packed and unpacked lists as protobuf does, and the last of repeated map keys.
//
// Thread safety: an ExampleParser is immutable; Parse from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "stratum/data/dataset.h"
#include "stratum/data/lookup.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

struct FeatureSpec {
  enum class Kind { kFixedLen, kVarLen };
  enum class Type { kFloat32, kInt64, kString };

  std::string key;
  Kind kind = Kind::kFixedLen;
  Type type = Type::kFloat32;
  Shape shape;                       // FixedLen: the value's shape (after decode_raw, for strings)
  DType decode_raw = DType::kUInt8;  // strings: the decoded element type
  bool tokens = false;               // strings without decode_raw: one token per element
  std::shared_ptr<const TokenLookup> lookup;  // tokens and int64: values to indices
  bool has_default = false;
  std::vector<double> float_default;   // float32: one value or shape.num_elements()
  std::vector<int64_t> int64_default;  // int64: likewise
  int64_t pad_to = 0;                  // VarLen: the padded length

  // The tensor Parse makes for this feature, per example.
  DType output_dtype() const;
  Shape output_shape() const;
};

// The specs of a job file's "features" object, in key order. `field` names it in errors
// (data.train.features). Unknown types, dtypes and keys are refused by name. Lookups are
// attached by the caller; a tokens feature without one is refused by Parse.
absl::StatusOr<std::vector<FeatureSpec>> ParseFeatureSpecs(const nlohmann::json& features,
                                                           absl::string_view field);

class ExampleParser {
 public:
  explicit ExampleParser(std::vector<FeatureSpec> specs);

  const std::vector<FeatureSpec>& specs() const { return specs_; }
  // One tensor per spec, in the specs' order, appended to `out`. INVALID_ARGUMENT naming
  // the feature for a value that does not fit its spec; DATA_LOSS when the record is not
  // a well-formed Example.
  absl::Status Parse(absl::string_view record, Element& out) const;

 private:
  std::vector<FeatureSpec> specs_;
};

}  // namespace stratum
