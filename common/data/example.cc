#include "stratum/data/example.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stratum {
namespace {

// ---- the protobuf wire format, as much of it as tf.Example uses ----

constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

class Wire {
 public:
  explicit Wire(absl::string_view bytes)
      : p_(reinterpret_cast<const uint8_t*>(bytes.data())), end_(p_ + bytes.size()) {}
  bool done() const { return p_ == end_; }

  bool Varint(uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && p_ < end_; shift += 7) {
      const uint8_t byte = *p_++;
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }
  bool Tag(uint32_t& field, uint32_t& wire_type) {
    uint64_t tag;
    if (!Varint(tag) || tag >> 32 != 0) return false;
    field = static_cast<uint32_t>(tag >> 3);
    wire_type = static_cast<uint32_t>(tag & 7);
    return field != 0;
  }
  bool Bytes(absl::string_view& out) {
    uint64_t size;
    if (!Varint(size) || size > static_cast<uint64_t>(end_ - p_)) return false;
    out = absl::string_view(reinterpret_cast<const char*>(p_), size);
    p_ += size;
    return true;
  }
  bool Fixed32(uint32_t& out) {
    if (end_ - p_ < 4) return false;
    std::memcpy(&out, p_, 4);
    p_ += 4;
    return true;
  }
  bool Skip(uint32_t wire_type) {
    uint64_t ignored;
    absl::string_view bytes;
    switch (wire_type) {
      case kVarint:
        return Varint(ignored);
      case kFixed64:
        if (end_ - p_ < 8) return false;
        p_ += 8;
        return true;
      case kLengthDelimited:
        return Bytes(bytes);
      case kFixed32:
        if (end_ - p_ < 4) return false;
        p_ += 4;
        return true;
      default:
        return false;  // groups are not part of tf.Example
    }
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

absl::Status Malformed(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("the record is not a well-formed tf.train.Example (",
                                          what, "): check that the file holds Examples"));
}

// Feature's oneof: which list it holds, and the list message's bytes.
enum ListKind : uint32_t { kNoList = 0, kBytesList = 1, kFloatList = 2, kInt64List = 3 };

const char* ListName(uint32_t kind) {
  switch (kind) {
    case kBytesList:
      return "a bytes_list";
    case kFloatList:
      return "a float_list";
    case kInt64List:
      return "an int64_list";
    default:
      return "empty";
  }
}

const char* TypeName(FeatureSpec::Type type) {
  switch (type) {
    case FeatureSpec::Type::kFloat32:
      return "float32";
    case FeatureSpec::Type::kInt64:
      return "int64";
    case FeatureSpec::Type::kString:
      return "string";
  }
  return "?";
}

uint32_t ListOf(FeatureSpec::Type type) {
  switch (type) {
    case FeatureSpec::Type::kFloat32:
      return kFloatList;
    case FeatureSpec::Type::kInt64:
      return kInt64List;
    case FeatureSpec::Type::kString:
      return kBytesList;
  }
  return kNoList;
}

struct FeatureBytes {
  uint32_t kind = kNoList;
  absl::string_view list;
};

bool DecodeFeature(absl::string_view feature, FeatureBytes& out) {
  Wire wire(feature);
  out = {};
  while (!wire.done()) {
    uint32_t field, type;
    if (!wire.Tag(field, type)) return false;
    if (field >= kBytesList && field <= kInt64List && type == kLengthDelimited) {
      out.kind = field;  // a oneof: the last one set wins
      if (!wire.Bytes(out.list)) return false;
    } else if (!wire.Skip(type)) {
      return false;
    }
  }
  return true;
}

bool DecodeFloats(absl::string_view list, std::vector<float>& out) {
  Wire wire(list);
  while (!wire.done()) {
    uint32_t field, type;
    if (!wire.Tag(field, type)) return false;
    if (field == 1 && type == kLengthDelimited) {
      absl::string_view packed;
      if (!wire.Bytes(packed) || packed.size() % 4 != 0) return false;
      const size_t at = out.size();
      out.resize(at + packed.size() / 4);
      std::memcpy(out.data() + at, packed.data(), packed.size());
    } else if (field == 1 && type == kFixed32) {
      uint32_t bits;
      if (!wire.Fixed32(bits)) return false;
      float value;
      std::memcpy(&value, &bits, 4);
      out.push_back(value);
    } else if (!wire.Skip(type)) {
      return false;
    }
  }
  return true;
}

bool DecodeInt64s(absl::string_view list, std::vector<int64_t>& out) {
  Wire wire(list);
  while (!wire.done()) {
    uint32_t field, type;
    if (!wire.Tag(field, type)) return false;
    uint64_t value;
    if (field == 1 && type == kLengthDelimited) {
      absl::string_view packed;
      if (!wire.Bytes(packed)) return false;
      Wire values(packed);
      while (!values.done()) {
        if (!values.Varint(value)) return false;
        out.push_back(static_cast<int64_t>(value));
      }
    } else if (field == 1 && type == kVarint) {
      if (!wire.Varint(value)) return false;
      out.push_back(static_cast<int64_t>(value));
    } else if (!wire.Skip(type)) {
      return false;
    }
  }
  return true;
}

bool DecodeBytes(absl::string_view list, std::vector<absl::string_view>& out) {
  Wire wire(list);
  while (!wire.done()) {
    uint32_t field, type;
    if (!wire.Tag(field, type)) return false;
    if (field == 1 && type == kLengthDelimited) {
      absl::string_view value;
      if (!wire.Bytes(value)) return false;
      out.push_back(value);
    } else if (!wire.Skip(type)) {
      return false;
    }
  }
  return true;
}

template <typename T, typename D>
void FillDefault(Tensor& tensor, const std::vector<D>& values) {
  T* out = tensor.data<T>();
  const int64_t n = tensor.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<T>(values.size() == 1 ? values[0] : values[static_cast<size_t>(i)]);
  }
}

// OK when `count` values fit the spec: exactly `wanted` (FixedLen) or at most (VarLen).
absl::Status CheckCount(const FeatureSpec& spec, size_t count, int64_t wanted) {
  const auto limit = static_cast<size_t>(wanted);
  if (spec.kind == FeatureSpec::Kind::kFixedLen ? count == limit : count <= limit) {
    return absl::OkStatus();
  }
  if (spec.kind == FeatureSpec::Kind::kVarLen) {
    return absl::InvalidArgumentError(absl::StrCat("feature \"", spec.key, "\" has ", count,
                                                   " values, more than its pad_to ", spec.pad_to,
                                                   ": raise pad_to to the longest list"));
  }
  return absl::InvalidArgumentError(absl::StrCat("feature \"", spec.key, "\" has ", count,
                                                 " values, but its FixedLenFeature "
                                                 "shape ",
                                                 spec.shape.ToString(), " takes ", wanted,
                                                 ": fix the spec's shape, or the data"));
}

// ---- job-file specs ----

absl::Status SpecError(absl::string_view field, absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ".", key, ": ", what));
}

absl::StatusOr<FeatureSpec> ParseOne(absl::string_view field, const std::string& key,
                                     const nlohmann::json& j) {
  FeatureSpec spec;
  spec.key = key;
  if (!j.is_object()) {
    return SpecError(field, key,
                     "is not an object: give {\"type\": \"FixedLenFeature\", \"dtype\": ..., "
                     "\"shape\": [...]}");
  }
  static const char* const kKnown[] = {"type",          "dtype",      "shape",
                                       "default_value", "decode_raw", "pad_to"};
  for (const auto& [name, value] : j.items()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown)) {
      return SpecError(
          field, key,
          absl::StrCat("unknown key \"", name, "\": use ", absl::StrJoin(kKnown, ", ")));
    }
  }
  const std::string type = j.value("type", std::string("FixedLenFeature"));
  if (type == "FixedLenFeature") {
    spec.kind = FeatureSpec::Kind::kFixedLen;
  } else if (type == "VarLenFeature") {
    spec.kind = FeatureSpec::Kind::kVarLen;
  } else {
    return SpecError(field, key,
                     absl::StrCat("type \"", type,
                                  "\" is not one Stratum parses: use FixedLenFeature or "
                                  "VarLenFeature (SparseFeature and RaggedFeature are not "
                                  "supported)"));
  }
  if (!j.contains("dtype") || !j["dtype"].is_string()) {
    return SpecError(field, key, "needs a dtype: \"float32\", \"int64\" or \"string\"");
  }
  const std::string dtype = j["dtype"].get<std::string>();
  if (dtype == "float32" || dtype == "float") {
    spec.type = FeatureSpec::Type::kFloat32;
  } else if (dtype == "int64") {
    spec.type = FeatureSpec::Type::kInt64;
  } else if (dtype == "string") {
    spec.type = FeatureSpec::Type::kString;
  } else {
    return SpecError(field, key,
                     absl::StrCat("dtype \"", dtype,
                                  "\" is not a tf.train.Example type: use float32, int64 or "
                                  "string"));
  }
  if (j.contains("shape")) {
    if (!j["shape"].is_array()) return SpecError(field, key, "shape is not a list of sizes");
    std::vector<int64_t> dims;
    int64_t elements = 1;
    constexpr int64_t kMaxElements = int64_t{1} << 31;
    for (const auto& d : j["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return SpecError(field, key, "shape holds a size that is not a count: give sizes >= 0");
      }
      const int64_t dim = d.get<int64_t>();
      // Checked before multiplying, so that no product overflows.
      if (dim > 0 && elements > kMaxElements / dim) {
        return SpecError(field, key,
                         absl::StrCat("shape ", d.dump(), "... holds more than ", kMaxElements,
                                      " values per example: give the shape of one example"));
      }
      elements *= dim;
      dims.push_back(dim);
    }
    spec.shape = Shape(std::move(dims));
  }
  if (spec.type == FeatureSpec::Type::kString && !j.contains("decode_raw")) {
    // Tokens: a StringLookup (the source's preprocess) makes them ids.
    spec.tokens = true;
    if (j.contains("default_value")) {
      return SpecError(field, key, "a string feature has no default_value in Stratum");
    }
  } else if (spec.type == FeatureSpec::Type::kString) {
    if (!j["decode_raw"].is_string()) {
      return SpecError(field, key,
                       "has a decode_raw that is not a type name: give \"decode_raw\": "
                       "\"uint8\" (or int32, int64, float32), as tf.io.decode_raw would");
    }
    absl::StatusOr<DType> out_type = DTypeFromName(j["decode_raw"].get<std::string>());
    if (!out_type.ok()) return SpecError(field, key, out_type.status().message());
    spec.decode_raw = *out_type;
    if (spec.kind != FeatureSpec::Kind::kFixedLen) {
      return SpecError(field, key,
                       "a VarLenFeature of strings takes no decode_raw: its strings are tokens "
                       "for a StringLookup; give a FixedLenFeature to decode one string");
    }
    if (j.contains("default_value")) {
      return SpecError(field, key, "a string feature has no default_value in Stratum");
    }
  } else if (j.contains("decode_raw")) {
    return SpecError(field, key, "decode_raw applies to string features only");
  }
  if (spec.kind == FeatureSpec::Kind::kVarLen) {
    if (j.contains("shape") || j.contains("default_value")) {
      return SpecError(field, key,
                       "a VarLenFeature has no shape or default_value: give pad_to instead");
    }
    if (!j.contains("pad_to") || !j["pad_to"].is_number_integer() ||
        j["pad_to"].get<int64_t>() < 1 || j["pad_to"].get<int64_t>() > (int64_t{1} << 24)) {
      return SpecError(field, key,
                       "a VarLenFeature needs pad_to, the length its lists are padded to with "
                       "zeros (Stratum's batches are dense): e.g. \"pad_to\": 200");
    }
    spec.pad_to = j["pad_to"].get<int64_t>();
  } else if (j.contains("pad_to")) {
    return SpecError(field, key, "pad_to applies to VarLenFeature only");
  }
  if (j.contains("default_value")) {
    const nlohmann::json& d = j["default_value"];
    std::vector<nlohmann::json> values;
    if (d.is_array()) {
      values.assign(d.begin(), d.end());
    } else {
      values.push_back(d);
    }
    const int64_t n = spec.shape.num_elements();
    if (values.size() != 1 && static_cast<int64_t>(values.size()) != n) {
      return SpecError(field, key,
                       absl::StrCat("default_value has ", values.size(), " values, but shape ",
                                    spec.shape.ToString(), " takes 1 (broadcast) or ", n));
    }
    for (const nlohmann::json& v : values) {
      if (spec.type == FeatureSpec::Type::kInt64 ? !v.is_number_integer() : !v.is_number()) {
        return SpecError(
            field, key,
            absl::StrCat("default_value holds ", v.dump(), ", not a ", TypeName(spec.type)));
      }
      if (spec.type == FeatureSpec::Type::kInt64) {
        spec.int64_default.push_back(v.get<int64_t>());
      } else if (std::abs(v.get<double>()) > std::numeric_limits<float>::max()) {
        return SpecError(field, key,
                         absl::StrCat("default_value holds ", v.dump(),
                                      ", beyond float32's range: give a smaller value"));
      } else {
        spec.float_default.push_back(v.get<double>());
      }
    }
    spec.has_default = true;
  }
  return spec;
}

}  // namespace

DType FeatureSpec::output_dtype() const {
  switch (type) {
    case Type::kFloat32:
      return DType::kFloat32;
    case Type::kInt64:
      return DType::kInt64;
    case Type::kString:
      return tokens ? DType::kInt64 : decode_raw;
  }
  return DType::kFloat32;
}

Shape FeatureSpec::output_shape() const { return kind == Kind::kVarLen ? Shape({pad_to}) : shape; }

absl::StatusOr<std::vector<FeatureSpec>> ParseFeatureSpecs(const nlohmann::json& features,
                                                           absl::string_view field) {
  if (!features.is_object() || features.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        " must be an object of feature specs, e.g. {\"image\": {\"type\": \"FixedLenFeature\", "
        "\"dtype\": \"string\", \"decode_raw\": \"uint8\", \"shape\": [28, 28]}, \"label\": "
        "{\"type\": \"FixedLenFeature\", \"dtype\": \"int64\", \"shape\": []}}"));
  }
  std::vector<FeatureSpec> specs;
  for (const auto& [key, value] : features.items()) {
    absl::StatusOr<FeatureSpec> spec = ParseOne(field, key, value);
    if (!spec.ok()) return spec.status();
    specs.push_back(*std::move(spec));
  }
  return specs;
}

ExampleParser::ExampleParser(std::vector<FeatureSpec> specs) : specs_(std::move(specs)) {}

absl::Status ExampleParser::Parse(absl::string_view record, Element& out) const {
  // Where each spec's Feature is in the record (a feature absent has no bytes).
  thread_local std::vector<FeatureBytes> found;
  thread_local std::vector<char> present;
  found.assign(specs_.size(), FeatureBytes{});
  present.assign(specs_.size(), 0);
  Wire example(record);
  while (!example.done()) {
    uint32_t field, type;
    if (!example.Tag(field, type)) return Malformed("a bad field tag");
    if (field != 1 || type != kLengthDelimited) {
      if (!example.Skip(type)) return Malformed("a field that runs past the record");
      continue;
    }
    absl::string_view features;
    if (!example.Bytes(features)) return Malformed("features run past the record");
    Wire entries(features);
    while (!entries.done()) {
      uint32_t entry_field, entry_type;
      if (!entries.Tag(entry_field, entry_type)) return Malformed("a bad map entry tag");
      if (entry_field != 1 || entry_type != kLengthDelimited) {
        if (!entries.Skip(entry_type)) return Malformed("a bad field in features");
        continue;
      }
      absl::string_view entry_bytes;
      if (!entries.Bytes(entry_bytes)) return Malformed("a map entry runs past its features");
      Wire entry(entry_bytes);
      absl::string_view key;
      absl::string_view value;
      while (!entry.done()) {
        uint32_t f, t;
        if (!entry.Tag(f, t)) return Malformed("a bad tag in a map entry");
        if (f == 1 && t == kLengthDelimited) {
          if (!entry.Bytes(key)) return Malformed("a key runs past its entry");
        } else if (f == 2 && t == kLengthDelimited) {
          if (!entry.Bytes(value)) return Malformed("a value runs past its entry");
        } else if (!entry.Skip(t)) {
          return Malformed("a bad field in a map entry");
        }
      }
      for (size_t i = 0; i < specs_.size(); ++i) {
        if (specs_[i].key != key) continue;
        FeatureBytes decoded;
        if (!DecodeFeature(value, decoded)) {
          return Malformed(absl::StrCat("feature \"", key, "\" is not a Feature"));
        }
        // As TF's parser: a Feature with no list set is skipped, so an earlier value of the
        // same key stays; otherwise the last one wins.
        if (decoded.kind == kNoList && present[i] != 0) break;
        found[i] = decoded;
        present[i] = 1;
        break;
      }
    }
  }

  thread_local std::vector<float> floats;
  thread_local std::vector<int64_t> ints;
  thread_local std::vector<absl::string_view> bytes;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FeatureSpec& spec = specs_[i];
    const FeatureBytes& feature = found[i];
    Tensor tensor(spec.output_dtype(), spec.output_shape());
    const int64_t wanted = tensor.num_elements();
    const bool absent = present[i] == 0 || feature.kind == kNoList;
    if (!absent && feature.kind != ListOf(spec.type)) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature \"", spec.key, "\" is ", ListName(feature.kind),
                       ", but its spec's "
                       "dtype is ",
                       TypeName(spec.type), ": fix the spec's dtype"));
    }
    if (spec.kind == FeatureSpec::Kind::kFixedLen && absent) {
      if (!spec.has_default) {
        return absl::InvalidArgumentError(
            absl::StrCat("feature \"", spec.key,
                         "\" is missing from the example and its spec "
                         "has no default_value: give one, or check the feature's name"));
      }
      if (spec.type == FeatureSpec::Type::kInt64) {
        FillDefault<int64_t>(tensor, spec.int64_default);
      } else {
        FillDefault<float>(tensor, spec.float_default);
      }
      out.push_back(std::move(tensor));
      continue;
    }
    if (spec.kind == FeatureSpec::Kind::kVarLen) tensor.SetZero();
    if (absent) {
      out.push_back(std::move(tensor));
      continue;
    }
    bool ok = true;
    size_t count = 0;
    switch (spec.type) {
      case FeatureSpec::Type::kFloat32:
        floats.clear();
        ok = DecodeFloats(feature.list, floats);
        count = floats.size();
        if (absl::Status fits = CheckCount(spec, count, wanted); ok && !fits.ok()) return fits;
        if (ok) std::memcpy(tensor.raw_data(), floats.data(), count * sizeof(float));
        break;
      case FeatureSpec::Type::kInt64:
        ints.clear();
        ok = DecodeInt64s(feature.list, ints);
        count = ints.size();
        if (absl::Status fits = CheckCount(spec, count, wanted); ok && !fits.ok()) return fits;
        if (ok && spec.lookup != nullptr) {
          int64_t* out = tensor.data<int64_t>();
          for (size_t v = 0; v < count; ++v) out[v] = spec.lookup->Index(ints[v]);
        } else if (ok) {
          std::memcpy(tensor.raw_data(), ints.data(), count * sizeof(int64_t));
        }
        break;
      case FeatureSpec::Type::kString: {
        bytes.clear();
        ok = DecodeBytes(feature.list, bytes);
        if (!ok) break;
        if (spec.tokens) {
          if (spec.lookup == nullptr) {
            return absl::InvalidArgumentError(absl::StrCat(
                "feature \"", spec.key,
                "\" holds string tokens, but no StringLookup makes them ids (Stratum's tensors "
                "hold numbers): give one in the source's preprocess, or decode_raw to read one "
                "string as numbers"));
          }
          count = bytes.size();
          if (absl::Status fits = CheckCount(spec, count, wanted); !fits.ok()) return fits;
          int64_t* out = tensor.data<int64_t>();
          for (size_t v = 0; v < count; ++v) out[v] = spec.lookup->Index(bytes[v]);
          break;
        }
        if (bytes.size() != 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "feature \"", spec.key, "\" has ", bytes.size(),
              " bytes values, but decode_raw takes one: give a FixedLenFeature of one string"));
        }
        if (bytes[0].size() != tensor.byte_size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "feature \"", spec.key, "\" holds ", bytes[0].size(), " bytes, but decode_raw ",
              DTypeName(spec.decode_raw), " into shape ", spec.shape.ToString(), " takes ",
              tensor.byte_size(), ": fix the spec's shape or decode_raw"));
        }
        std::memcpy(tensor.raw_data(), bytes[0].data(), bytes[0].size());
        break;
      }
    }
    if (!ok) return Malformed(absl::StrCat("feature \"", spec.key, "\" has a malformed list"));
    out.push_back(std::move(tensor));
  }
  return absl::OkStatus();
}

}  // namespace stratum
