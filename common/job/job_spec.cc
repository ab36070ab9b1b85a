#include "stratum/job/job_spec.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/util/json_text.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using json = nlohmann::json;

// Reads the fields of one JSON object, refusing unknown keys by name.
class Fields {
 public:
  Fields(const json& object, std::string path, absl::string_view source)
      : object_(object), path_(std::move(path)), source_(source) {}

  absl::Status CheckObject() const {
    if (object_.is_object()) return absl::OkStatus();
    return Error(path_, absl::StrCat("is ", object_.dump(), ", not an object"),
                 "write it as {...}");
  }

  absl::Status CheckKnown(const std::set<std::string>& known) const {
    for (const auto& [key, value] : object_.items()) {
      if (known.count(key) == 0) {
        return Error(Path(key), "is not a field Stratum knows",
                     absl::StrCat("use ", absl::StrJoin(known, ", ")));
      }
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Get(const std::string& key, T& out) const {
    if (!object_.contains(key)) return absl::OkStatus();
    const json& value = object_.at(key);
    bool fits = false;
    if constexpr (std::is_same_v<T, std::string>) {
      fits = value.is_string();
    } else if constexpr (std::is_same_v<T, bool>) {
      fits = value.is_boolean();
    } else if constexpr (std::is_integral_v<T>) {
      fits = value.is_number_integer() && (std::is_signed_v<T> || value.get<int64_t>() >= 0);
      // Not wrapped around: 4294967297 epochs is not 1 epoch.
      const bool in_range =
          !fits ||
          (value.is_number_unsigned()
               ? value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
               : value.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                     (std::is_same_v<T, uint64_t> ||
                      value.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max())));
      if (fits && !in_range) {
        return Error(Path(key), absl::StrCat("is ", value.dump(), ", which is out of range"),
                     absl::StrCat("write a value up to ", std::numeric_limits<T>::max()));
      }
    } else if constexpr (std::is_floating_point_v<T>) {
      fits = value.is_number();
    } else {
      fits = value.is_array();
      if (fits) {
        for (const json& item : value) fits = fits && item.is_string();
      }
    }
    if (!fits) {
      std::string shown = value.dump();
      if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
      return Error(Path(key), absl::StrCat("is ", shown, ", which has the wrong type"),
                   absl::StrCat("write a ", TypeName<T>()));
    }
    out = value.get<T>();
    return absl::OkStatus();
  }

  absl::Status Error(const std::string& path, const std::string& problem,
                     const std::string& fix) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": job field ", path, " ", problem, ": ", fix));
  }
  absl::string_view source() const { return source_; }
  std::string Path(const std::string& key) const {
    return path_.empty() ? key : absl::StrCat(path_, ".", key);
  }

 private:
  template <typename T>
  static const char* TypeName() {
    if constexpr (std::is_same_v<T, std::string>) return "string";
    if constexpr (std::is_same_v<T, bool>) return "boolean (true or false)";
    if constexpr (std::is_integral_v<T>) return "non-negative integer";
    if constexpr (std::is_floating_point_v<T>) return "number";
    return "list of strings";
  }

  const json& object_;
  std::string path_;
  absl::string_view source_;
};

std::string Resolve(const std::string& path, absl::string_view base_dir) {
  if (path.empty() || path.front() == '/' || base_dir.empty()) return path;
  return absl::StrCat(base_dir, "/", path);
}

absl::Status ParseIdxSource(const Fields& fields, const std::string& path,
                            absl::string_view base_dir, DataSourceSpec& out) {
  if (absl::Status s = fields.CheckKnown({"format", "images", "labels"}); !s.ok()) return s;
  for (absl::Status s : {fields.Get("images", out.images), fields.Get("labels", out.labels)}) {
    if (!s.ok()) return s;
  }
  if (out.images.empty() || out.labels.empty()) {
    return fields.Error(path, "needs \"images\" and \"labels\"",
                        "give the paths of the IDX image and label files");
  }
  out.images = Resolve(out.images, base_dir);
  out.labels = Resolve(out.labels, base_dir);
  return absl::OkStatus();
}

// The reading options tfrecord and csv share: tf.data's num_parallel_reads, interleave and
// ignore_errors.
absl::Status ParseReadOptions(const json& object, const Fields& fields, ReadOptions& out) {
  int64_t parallel = out.num_parallel_reads;
  if (absl::Status s = fields.Get("num_parallel_reads", parallel); !s.ok()) return s;
  if (absl::Status s = fields.Get("ignore_errors", out.ignore_errors); !s.ok()) return s;
  if (parallel < 1 || parallel > 256) {
    return fields.Error(fields.Path("num_parallel_reads"), absl::StrCat("is ", parallel),
                        "use 1 (one file after the other) to 256");
  }
  out.num_parallel_reads = static_cast<int>(parallel);
  if (!object.contains("interleave")) return absl::OkStatus();
  Fields interleave(object["interleave"], fields.Path("interleave"), fields.source());
  if (absl::Status s = interleave.CheckObject(); !s.ok()) return s;
  if (absl::Status s = interleave.CheckKnown({"cycle_length", "block_length", "deterministic"});
      !s.ok()) {
    return s;
  }
  int64_t cycle = out.cycle_length;
  int64_t block = out.block_length;
  for (absl::Status s :
       {interleave.Get("cycle_length", cycle), interleave.Get("block_length", block),
        interleave.Get("deterministic", out.deterministic)}) {
    if (!s.ok()) return s;
  }
  if (cycle < 1 || cycle > 256 || block < 1 || block > (int64_t{1} << 20)) {
    return interleave.Error(interleave.Path("cycle_length"),
                            absl::StrCat("is ", cycle, " with block_length ", block),
                            "use a cycle_length of 1 to 256 files and a block_length of at "
                            "least 1");
  }
  out.cycle_length = static_cast<int>(cycle);
  out.block_length = static_cast<int>(block);
  return absl::OkStatus();
}

absl::Status ParseFiles(const json& object, const Fields& fields, absl::string_view base_dir,
                        DataSourceSpec& out) {
  if (object.contains("files") && object["files"].is_string()) {
    out.files = {object["files"].get<std::string>()};
  } else if (absl::Status s = fields.Get("files", out.files); !s.ok()) {
    return s;
  }
  if (out.files.empty()) {
    return fields.Error(fields.Path("files"), "is missing",
                        "give the data files, as a list of paths or glob patterns, e.g. "
                        "[\"data/train-*.tfrecord\"]");
  }
  for (std::string& file : out.files) file = Resolve(file, base_dir);
  std::string compression;
  if (absl::Status s = fields.Get("compression_type", compression); !s.ok()) return s;
  absl::StatusOr<Compression> parsed = CompressionFromName(compression);
  if (!parsed.ok()) {
    return fields.Error(fields.Path("compression_type"), absl::StrCat("is \"", compression, "\""),
                        "use \"\" (none), \"GZIP\" or \"ZLIB\"");
  }
  out.compression = *parsed;
  return ParseReadOptions(object, fields, out.read);
}

// The source's "preprocess": {feature: Keras layer}, each of `classes` (StringLookup and
// IntegerLookup for features and columns; TextVectorization and StringLookup for lines).
absl::Status ParsePreprocess(const json& object, const Fields& fields, absl::string_view base_dir,
                             DataSourceSpec& out,
                             const std::vector<std::string>& classes = {"StringLookup",
                                                                        "IntegerLookup"}) {
  if (!object.contains("preprocess")) return absl::OkStatus();
  const json& preprocess = object["preprocess"];
  const bool lines = out.format == "text";
  const std::string example =
      lines ? "{\"line\": {\"class_name\": \"TextVectorization\", \"config\": {\"vocabulary\": "
              "\"vocab.txt\", \"output_sequence_length\": 64}}}"
            : "{\"features\": {\"class_name\": \"StringLookup\", \"config\": {\"vocabulary\": "
              "[\"a\", \"b\"]}}}";
  if (!preprocess.is_object()) {
    return fields.Error(
        fields.Path("preprocess"), "is not an object",
        absl::StrCat("give the Keras layer each feature goes through, e.g. ", example));
  }
  for (const auto& [feature, layer] : preprocess.items()) {
    const std::string path = fields.Path(absl::StrCat("preprocess.", feature));
    const json* config = layer.is_object() && layer.contains("config") ? &layer["config"] : nullptr;
    const bool known =
        layer.is_object() && layer.contains("class_name") && layer["class_name"].is_string() &&
        std::find(classes.begin(), classes.end(), layer["class_name"].get<std::string>()) !=
            classes.end();
    if (!known || config == nullptr || !config->is_object()) {
      return fields.Error(path, absl::StrCat("is not a ", absl::StrJoin(classes, " or "), " layer"),
                          absl::StrCat("give one as Keras' to_json() writes it (the layers "
                                       "Stratum applies to data), e.g. ",
                                       example));
    }
    PreprocessSpec spec{feature, layer};
    json& vocabulary = spec.layer["config"]["vocabulary"];
    if (vocabulary.is_string()) vocabulary = Resolve(vocabulary.get<std::string>(), base_dir);
    if (vocabulary.is_null()) spec.layer["config"].erase("vocabulary");
    out.preprocess.push_back(std::move(spec));
  }
  return absl::OkStatus();
}

// Each feature's lookup fits its values: a StringLookup makes a string feature's tokens ids,
// an IntegerLookup an int64 feature's; tokens need one.
absl::Status CheckFeatureLookups(const Fields& fields, const DataSourceSpec& out) {
  for (const PreprocessSpec& preprocess : out.preprocess) {
    const auto feature =
        std::find_if(out.features.begin(), out.features.end(),
                     [&](const FeatureSpec& f) { return f.key == preprocess.feature; });
    const std::string path = fields.Path(absl::StrCat("preprocess.", preprocess.feature));
    if (feature == out.features.end()) {
      return fields.Error(path, "names no feature", "name one of data's features");
    }
    const bool strings = preprocess.layer["class_name"] == "StringLookup";
    if (strings ? !feature->tokens : feature->type != FeatureSpec::Type::kInt64) {
      return fields.Error(
          path,
          absl::StrCat("is ", preprocess.layer["class_name"].get<std::string>(), " on a ",
                       feature->type == FeatureSpec::Type::kInt64     ? "int64"
                       : feature->type == FeatureSpec::Type::kFloat32 ? "float32"
                                                                      : "decode_raw string",
                       " feature"),
          "apply StringLookup to string features without decode_raw (tokens), and "
          "IntegerLookup to int64 features");
    }
  }
  for (const FeatureSpec& feature : out.features) {
    const bool looked_up =
        std::any_of(out.preprocess.begin(), out.preprocess.end(),
                    [&](const PreprocessSpec& p) { return p.feature == feature.key; });
    if (feature.tokens && !looked_up) {
      return fields.Error(
          fields.Path(absl::StrCat("features.", feature.key)),
          "is a string feature without decode_raw",
          absl::StrCat("Stratum's tensors hold numbers, so give \"decode_raw\": \"uint8\" (or "
                       "int32, int64, float32), as tf.io.decode_raw would, or make its tokens ids "
                       "with a StringLookup in ",
                       fields.Path("preprocess"), " (e.g. {\"", feature.key,
                       "\": {\"class_name\": \"StringLookup\", \"config\": {\"vocabulary\": "
                       "[...]}}})"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseTFRecordSource(const json& object, const Fields& fields,
                                 absl::string_view base_dir, DataSourceSpec& out) {
  if (absl::Status s =
          fields.CheckKnown({"format", "files", "compression_type", "features", "label_key",
                             "preprocess", "num_parallel_reads", "interleave", "ignore_errors"});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ParseFiles(object, fields, base_dir, out); !s.ok()) return s;
  if (!object.contains("features")) {
    return fields.Error(fields.Path("features"), "is missing",
                        "give the tf.train.Example features to read, in tf.io's terms, e.g. "
                        "{\"image\": {\"type\": \"FixedLenFeature\", \"dtype\": \"string\", "
                        "\"decode_raw\": \"uint8\", \"shape\": [28, 28]}, \"label\": {\"type\": "
                        "\"FixedLenFeature\", \"dtype\": \"int64\", \"shape\": []}}");
  }
  absl::StatusOr<std::vector<FeatureSpec>> features = ParseFeatureSpecs(
      object["features"], absl::StrCat(fields.source(), ": job field ", fields.Path("features")));
  if (!features.ok()) return features.status();
  out.features = *std::move(features);
  if (absl::Status s = fields.Get("label_key", out.label); !s.ok()) return s;
  const auto is_label = [&](const FeatureSpec& f) { return f.key == out.label; };
  if (std::none_of(out.features.begin(), out.features.end(), is_label)) {
    return fields.Error(
        fields.Path("label_key"),
        out.label.empty() ? "is missing"
                          : absl::StrCat("is \"", out.label, "\", which is not among the features"),
        "name the feature that holds the labels, e.g. \"label_key\": \"label\"");
  }
  if (out.features.size() < 2) {
    return fields.Error(fields.Path("features"), "has no feature besides the label",
                        "give the features the model takes (one per model input, by name)");
  }
  // The parser makes the inputs' features first, the label last.
  std::stable_partition(out.features.begin(), out.features.end(),
                        [&](const FeatureSpec& f) { return !is_label(f); });
  STRATUM_RETURN_IF_ERROR(ParsePreprocess(object, fields, base_dir, out));
  return CheckFeatureLookups(fields, out);
}

absl::Status ParseCsvSource(const json& object, const Fields& fields, absl::string_view base_dir,
                            DataSourceSpec& out) {
  if (absl::Status s = fields.CheckKnown(
          {"format", "files", "compression_type", "label_name", "preprocess", "column_names",
           "column_defaults", "select_columns", "field_delim", "use_quote_delim", "na_value",
           "header", "num_parallel_reads", "interleave", "ignore_errors"});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ParseFiles(object, fields, base_dir, out); !s.ok()) return s;
  CsvOptions& csv = out.csv;
  std::string delim = ",";
  for (absl::Status s :
       {fields.Get("label_name", csv.label_name), fields.Get("column_names", csv.column_names),
        fields.Get("select_columns", csv.select_columns), fields.Get("field_delim", delim),
        fields.Get("use_quote_delim", csv.use_quote_delim), fields.Get("na_value", csv.na_value),
        fields.Get("header", csv.header)}) {
    if (!s.ok()) return s;
  }
  if (csv.label_name.empty()) {
    return fields.Error(fields.Path("label_name"), "is missing",
                        "name the column that holds the labels");
  }
  if (delim.size() != 1) {
    return fields.Error(fields.Path("field_delim"), absl::StrCat("is \"", delim, "\""),
                        "use one character, such as \",\" or \"\\t\"");
  }
  csv.field_delim = delim[0];
  if (object.contains("column_defaults")) {
    const json& defaults = object["column_defaults"];
    if (!defaults.is_array()) {
      return fields.Error(fields.Path("column_defaults"), "is not a list",
                          "give one entry per column: a number (its type and default), \"\" "
                          "for text, or [] for a required column");
    }
    for (const json& d : defaults) {
      CsvColumnDefault column;
      if (d.is_number_integer()) {
        column = {CsvColumnDefault::Type::kInt64, false, d.get<double>()};
      } else if (d.is_number()) {
        column = {CsvColumnDefault::Type::kFloat32, false, d.get<double>()};
      } else if (d.is_string()) {
        column = {CsvColumnDefault::Type::kString, false, 0};
      } else if (d.is_array() && d.empty()) {
        column = {CsvColumnDefault::Type::kInfer, true, 0};
      } else {
        return fields.Error(fields.Path("column_defaults"), absl::StrCat("holds ", d.dump()),
                            "give a number (its type and default), \"\" for text, or [] for a "
                            "required column");
      }
      csv.column_defaults.push_back(column);
    }
  }
  csv.compression = out.compression;
  out.label = csv.label_name;
  return ParsePreprocess(object, fields, base_dir, out);
}

// Text lines (tf.data.TextLineDataset): each line through the TextVectorization (or
// StringLookup) in preprocess.line, labelled by the index of the files entry that names its
// file.
absl::Status ParseTextSource(const json& object, const Fields& fields, absl::string_view base_dir,
                             DataSourceSpec& out) {
  if (absl::Status s =
          fields.CheckKnown({"format", "files", "compression_type", "labels", "preprocess",
                             "num_parallel_reads", "interleave", "ignore_errors"});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ParseFiles(object, fields, base_dir, out); !s.ok()) return s;
  if (absl::Status s = fields.Get("labels", out.label); !s.ok()) return s;
  if (out.label != "file_index") {
    return fields.Error(
        fields.Path("labels"),
        out.label.empty() ? "is missing" : absl::StrCat("is \"", out.label, "\""),
        "give \"file_index\": a line's label is the index of the files entry that names its "
        "file (0 for the first), as TensorFlow's text-loading tutorial labels each file's "
        "lines; for a label on each line, read the file as csv with a field_delim");
  }
  STRATUM_RETURN_IF_ERROR(
      ParsePreprocess(object, fields, base_dir, out, {"TextVectorization", "StringLookup"}));
  if (out.preprocess.size() != 1 || out.preprocess[0].feature != "line") {
    return fields.Error(
        fields.Path(out.preprocess.empty() ? "preprocess"
                                           : "preprocess." + out.preprocess[0].feature),
        out.preprocess.empty() ? "is missing" : "names something other than \"line\"",
        "give the layer that makes each line ids, as {\"line\": {\"class_name\": "
        "\"TextVectorization\", \"config\": {\"vocabulary\": \"vocab.txt\", "
        "\"output_sequence_length\": 64}}}: Stratum's tensors hold numbers");
  }
  return absl::OkStatus();
}

absl::Status ParseSource(const json& object, const std::string& path, absl::string_view source,
                         absl::string_view base_dir, DataSourceSpec& out) {
  Fields fields(object, path, source);
  if (absl::Status s = fields.CheckObject(); !s.ok()) return s;
  if (absl::Status s = fields.Get("format", out.format); !s.ok()) return s;
  if (out.format == "idx") return ParseIdxSource(fields, path, base_dir, out);
  if (out.format == "tfrecord") return ParseTFRecordSource(object, fields, base_dir, out);
  if (out.format == "csv") return ParseCsvSource(object, fields, base_dir, out);
  if (out.format == "text") return ParseTextSource(object, fields, base_dir, out);
  return fields.Error(fields.Path("format"), absl::StrCat("is \"", out.format, "\""),
                      "Stratum reads \"idx\" (gzipped or not), \"tfrecord\" (tf.train.Example "
                      "records), \"csv\" and \"text\" (one example a line)");
}

// One argument of a Keras callback: its name, what it takes, and Keras' default (null for a
// string: required).
struct CallbackArgument {
  enum Type { kString, kNumber, kCount, kBool, kNumberOrNull, kEpochOrSteps };
  std::string name;
  Type type;
  json fallback;
};

// The callbacks Stratum runs, with every argument Keras 3 gives them.
const std::map<std::string, std::vector<CallbackArgument>>& KerasCallbacks() {
  using A = CallbackArgument;
  static const auto* table = new std::map<std::string, std::vector<CallbackArgument>>{
      {"EarlyStopping",
       {{"monitor", A::kString, "val_loss"},
        {"min_delta", A::kNumber, 0},
        {"patience", A::kCount, 0},
        {"verbose", A::kCount, 0},
        {"mode", A::kString, "auto"},
        {"baseline", A::kNumberOrNull, nullptr},
        {"restore_best_weights", A::kBool, false},
        {"start_from_epoch", A::kCount, 0}}},
      {"ReduceLROnPlateau",
       {{"monitor", A::kString, "val_loss"},
        {"factor", A::kNumber, 0.1},
        {"patience", A::kCount, 10},
        {"verbose", A::kCount, 0},
        {"mode", A::kString, "auto"},
        {"min_delta", A::kNumber, 1e-4},
        {"cooldown", A::kCount, 0},
        {"min_lr", A::kNumber, 0}}},
      {"TerminateOnNaN", {}},
      {"CSVLogger",
       {{"filename", A::kString, nullptr},
        {"separator", A::kString, ","},
        {"append", A::kBool, false}}},
      {"TensorBoard",
       {{"log_dir", A::kString, "logs"},
        {"histogram_freq", A::kCount, 0},
        {"write_graph", A::kBool, true},
        {"write_images", A::kBool, false},
        {"write_steps_per_second", A::kBool, false},
        {"update_freq", A::kEpochOrSteps, "epoch"},
        {"profile_batch", A::kCount, 0},
        {"embeddings_freq", A::kCount, 0}}},
      {"ModelCheckpoint",
       {{"filepath", A::kString, nullptr},
        {"monitor", A::kString, "val_loss"},
        {"verbose", A::kCount, 0},
        {"save_best_only", A::kBool, false},
        {"save_weights_only", A::kBool, false},
        {"mode", A::kString, "auto"},
        {"save_freq", A::kEpochOrSteps, "epoch"},
        {"initial_value_threshold", A::kNumberOrNull, nullptr}}},
      {"BackupAndRestore",
       {{"backup_dir", A::kString, nullptr},
        {"save_freq", A::kEpochOrSteps, "epoch"},
        {"delete_checkpoint", A::kBool, true},
        {"double_checkpoint", A::kBool, false}}},
  };
  return *table;
}

// Reads one entry of fit.callbacks ({"class_name": ..., "config": {...}}, or the class name
// alone) into `out`, every argument checked and defaulted.
absl::Status ParseCallback(const json& entry, const std::string& path, absl::string_view source,
                           CallbackSpec& out) {
  Fields fields(entry, path, source);
  json config = json::object();
  if (entry.is_string()) {
    out.class_name = entry.get<std::string>();
  } else {
    if (absl::Status s = fields.CheckObject(); !s.ok()) return s;
    if (absl::Status s = fields.CheckKnown({"class_name", "config", "module", "registered_name"});
        !s.ok()) {
      return s;
    }
    if (absl::Status s = fields.Get("class_name", out.class_name); !s.ok()) return s;
    if (entry.contains("config")) config = entry["config"];
  }
  const auto& table = KerasCallbacks();
  const auto known = table.find(out.class_name);
  if (known == table.end()) {
    std::vector<std::string> names;
    for (const auto& [name, arguments] : table) names.push_back(name);
    const std::string fix =
        out.class_name == "LearningRateScheduler"
            ? "a Python schedule function cannot travel in a job: give the optimizer's "
              "learning_rate a Keras schedule (ExponentialDecay, PiecewiseConstantDecay, "
              "CosineDecay, ...) instead"
            : absl::StrCat("use one of ", absl::StrJoin(names, ", "));
    return fields.Error(
        path, absl::StrCat("is the callback \"", out.class_name, "\", which Stratum does not run"),
        fix);
  }
  Fields arguments(config, absl::StrCat(path, ".config"), source);
  if (absl::Status s = arguments.CheckObject(); !s.ok()) return s;
  std::set<std::string> names;
  for (const CallbackArgument& argument : known->second) names.insert(argument.name);
  if (absl::Status s = arguments.CheckKnown(names); !s.ok()) return s;
  out.config = json::object();
  for (const CallbackArgument& argument : known->second) {
    const std::string where = arguments.Path(argument.name);
    if (!config.contains(argument.name)) {
      if (argument.fallback.is_null() && argument.type == CallbackArgument::kString) {
        return arguments.Error(where, "is missing",
                               absl::StrCat("give ", out.class_name, " its ", argument.name));
      }
      out.config[argument.name] = argument.fallback;
      continue;
    }
    const json& value = config[argument.name];
    absl::Status read;
    switch (argument.type) {
      case CallbackArgument::kString: {
        std::string text;
        read = arguments.Get(argument.name, text);
        break;
      }
      case CallbackArgument::kNumber: {
        double number = 0;
        read = arguments.Get(argument.name, number);
        break;
      }
      case CallbackArgument::kCount: {
        int64_t count = 0;
        read = arguments.Get(argument.name, count);
        if (read.ok() && count < 0) {
          read = arguments.Error(where, absl::StrCat("is ", count), "use 0 or more");
        }
        break;
      }
      case CallbackArgument::kBool: {
        bool flag = false;
        read = arguments.Get(argument.name, flag);
        break;
      }
      case CallbackArgument::kNumberOrNull:
        if (!value.is_null() && !value.is_number()) {
          read =
              arguments.Error(where, absl::StrCat("is ", value.dump()), "write a number or null");
        }
        break;
      case CallbackArgument::kEpochOrSteps:
        if (!(value == "epoch" || value == "batch" ||
              (value.is_number_integer() && value.get<int64_t>() >= 1))) {
          read = arguments.Error(where, absl::StrCat("is ", value.dump()),
                                 "write \"epoch\", \"batch\" or a number of steps (1 or more)");
        }
        break;
    }
    if (!read.ok()) return read;
    out.config[argument.name] = value == "batch" ? json(1) : value;
  }
  const json& c = out.config;
  auto refuse = [&](const std::string& name, const std::string& fix) {
    return arguments.Error(arguments.Path(name), absl::StrCat("is ", c[name].dump()), fix);
  };
  if (c.contains("mode") && c["mode"] != "auto" && c["mode"] != "min" && c["mode"] != "max") {
    return refuse("mode", "use \"auto\", \"min\" or \"max\"");
  }
  if (out.class_name == "ReduceLROnPlateau") {
    if (!(c["factor"].get<double>() >= 0 && c["factor"].get<double>() < 1)) {
      return refuse("factor", "use a factor from 0 up to (not including) 1: new_lr = lr * factor");
    }
    if (c["min_lr"].get<double>() < 0) return refuse("min_lr", "use 0 or a positive rate");
  }
  if (out.class_name == "TensorBoard") {
    for (const char* name : {"histogram_freq", "profile_batch", "embeddings_freq"}) {
      if (c[name] != 0) {
        return refuse(name,
                      "Stratum's TensorBoard writes scalars (loss, metrics, learning rate, "
                      "examples/s): leave it out or set it to 0");
      }
    }
    if (c["write_images"] != false) {
      return refuse("write_images", "Stratum's TensorBoard writes scalars: set it to false");
    }
  }
  if (out.class_name == "ModelCheckpoint") {
    const std::string filepath = c["filepath"];
    const bool weights_file = absl::EndsWith(filepath, ".weights.h5");
    if (c["save_weights_only"] == true && !weights_file) {
      return refuse("filepath",
                    "with save_weights_only the filepath must end in .weights.h5 (Keras' weights "
                    "format), as Keras demands");
    }
    if (c["save_weights_only"] == false &&
        (absl::EndsWith(filepath, ".keras") || absl::EndsWith(filepath, ".h5"))) {
      return refuse("filepath",
                    "Stratum does not write Keras' .keras archive or legacy .h5 model: give a "
                    "folder, which gets model.json, model.weights.h5 and model.safetensors, or "
                    "set save_weights_only true with a .weights.h5 path");
    }
    if (c["save_freq"] != "epoch") {
      return refuse("save_freq",
                    "Stratum's ModelCheckpoint saves at epochs' ends: set save_freq \"epoch\" "
                    "(BackupAndRestore saves every N steps)");
    }
  }
  if (out.class_name == "CSVLogger" && c["separator"].get<std::string>().size() != 1) {
    return refuse("separator", "use one character, such as \",\" or \";\"");
  }
  return absl::OkStatus();
}

// The placeholders of a Python format string (ModelCheckpoint's filepath,
// "ckpt-{epoch:02d}-{val_loss:.2f}"): each names one of `names`, with a format spec Python
// takes for its value (d for the epoch; f, e, g or % for the logs' numbers); {{ and }} are
// braces.
absl::Status CheckPythonFormat(const std::string& text, const std::set<std::string>& names,
                               const std::string& where, const Fields& fields) {
  for (size_t at = 0; at < text.size(); ++at) {
    if (text[at] == '}') {
      if (at + 1 < text.size() && text[at + 1] == '}') {
        ++at;
        continue;
      }
      return fields.Error(where, absl::StrCat("\"", text, "\" has a } without its {"),
                          "write }} for a brace");
    }
    if (text[at] != '{') continue;
    if (at + 1 < text.size() && text[at + 1] == '{') {
      ++at;
      continue;
    }
    const size_t end = text.find('}', at);
    if (end == std::string::npos) {
      return fields.Error(where, absl::StrCat("\"", text, "\" has a { without its }"),
                          "close the placeholder, as {epoch:02d}");
    }
    const std::string field = text.substr(at + 1, end - at - 1);
    const size_t colon = field.find(':');
    const std::string name = field.substr(0, colon);
    const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    if (names.count(name) == 0) {
      return fields.Error(
          where,
          absl::StrCat("has the placeholder {", field, "}, which the epochs' logs do not give"),
          absl::StrCat("use epoch or one of ", absl::StrJoin(names, ", ")));
    }
    static const std::regex kSpec("0?[0-9]*(\\.[0-9]+)?([dfeEgG%])?");
    std::smatch match;
    const bool integer = name == "epoch";
    if (!std::regex_match(spec, match, kSpec) ||
        (match[2].matched && (match[2].str() == "d") != integer)) {
      return fields.Error(
          where, absl::StrCat("has the placeholder {", field, "}, whose format Python refuses"),
          integer ? "format the epoch as {epoch} or {epoch:02d}"
                  : absl::StrCat("format the number as {", name, "} or {", name, ":.4f}"));
    }
    at = end;
  }
  return absl::OkStatus();
}

// fit.callbacks: each entry into job.fit.callbacks, except BackupAndRestore, which is the
// job's checkpoint (the one given under "checkpoint" too, or none).
absl::Status ParseCallbacks(const json& list, absl::string_view source, absl::string_view base_dir,
                            JobSpec& job) {
  if (!list.is_array()) {
    return Fields(list, "fit.callbacks", source)
        .Error("fit.callbacks", absl::StrCat("is ", list.dump().substr(0, 60), ", not a list"),
               "write [{\"class_name\": \"EarlyStopping\", \"config\": {\"patience\": 2}}, ...]");
  }
  // The keys of the epochs' logs: a monitor or a file name's placeholder must be one.
  std::set<std::string> logged = {"loss"};
  // Keras logs its AUC metric as "auc", however compile.metrics spells it.
  for (const std::string& metric : job.metrics) logged.insert(metric == "AUC" ? "auc" : metric);
  if (job.data.test.given() && job.fit.validate) {
    for (const std::string& name : std::vector<std::string>(logged.begin(), logged.end())) {
      logged.insert("val_" + name);
    }
  }
  bool backup = false;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = absl::StrCat("fit.callbacks[", i, "]");
    CallbackSpec callback;
    if (absl::Status s = ParseCallback(list[i], path, source, callback); !s.ok()) return s;
    Fields fields(list[i], path, source);
    const json& c = callback.config;
    if (callback.class_name == "CSVLogger") {
      callback.config["filename"] = Resolve(c["filename"].get<std::string>(), base_dir);
    } else if (callback.class_name == "TensorBoard") {
      callback.config["log_dir"] = Resolve(c["log_dir"].get<std::string>(), base_dir);
    } else if (callback.class_name == "ModelCheckpoint") {
      std::set<std::string> names = logged;
      names.insert("epoch");
      if (absl::Status s = CheckPythonFormat(c["filepath"], names,
                                             absl::StrCat(path, ".config.filepath"), fields);
          !s.ok()) {
        return s;
      }
      callback.config["filepath"] = Resolve(c["filepath"].get<std::string>(), base_dir);
    }
    // ModelCheckpoint reads its monitor only to save the best alone.
    if (c.contains("monitor") &&
        (callback.class_name != "ModelCheckpoint" || c["save_best_only"] == true)) {
      // Keras would warn at every epoch and do nothing: a monitor the logs lack is refused.
      const std::string monitor = c["monitor"];
      if (logged.count(monitor) == 0) {
        const bool needs_test =
            absl::StartsWith(monitor, "val_") && logged.count(monitor.substr(4)) > 0;
        return fields.Error(
            absl::StrCat(path, ".config.monitor"),
            absl::StrCat("is \"", monitor, "\", which ",
                         needs_test ? "is measured on data.test after each epoch, and this job "
                                      "has no data.test or sets fit.validate false"
                                    : "the epochs' logs do not have"),
            absl::StrCat(needs_test ? "give data.test, or " : "", "monitor one of ",
                         absl::StrJoin(logged, ", ")));
      }
    }
    if (callback.class_name != "BackupAndRestore") {
      job.fit.callbacks.push_back(std::move(callback));
      continue;
    }
    const std::string dir = Resolve(c["backup_dir"].get<std::string>(), base_dir);
    if (backup || (!job.checkpoint.dir.empty() && job.checkpoint.dir != dir)) {
      return fields.Error(path,
                          absl::StrCat("backs up into ", dir, ", and the job already has ",
                                       backup ? "a BackupAndRestore" : "checkpoint.dir ",
                                       backup ? "" : job.checkpoint.dir),
                          "give one backup folder: BackupAndRestore's backup_dir or "
                          "checkpoint.dir, not both");
    }
    backup = true;
    job.checkpoint.dir = dir;
    if (c["save_freq"].is_number()) job.checkpoint.every_steps = c["save_freq"].get<int64_t>();
    job.checkpoint.delete_at_end = c["delete_checkpoint"].get<bool>();
  }
  return absl::OkStatus();
}

absl::Status ParseStrategy(const json& object, absl::string_view source, StrategySpec& out) {
  Fields fields(object, "strategy", source);
  if (absl::Status s = fields.CheckObject(); !s.ok()) return s;
  if (absl::Status s = fields.CheckKnown({"type", "devices", "cross_device_ops", "num_packs",
                                          "logical_gpus_per_gpu", "intra_op_parallelism_threads",
                                          "variable_partitioner", "communication"});
      !s.ok()) {
    return s;
  }
  for (absl::Status s :
       {fields.Get("type", out.type), fields.Get("devices", out.devices),
        fields.Get("cross_device_ops", out.cross_device_ops),
        fields.Get("num_packs", out.num_packs),
        fields.Get("logical_gpus_per_gpu", out.logical_gpus_per_gpu),
        fields.Get("intra_op_parallelism_threads", out.intra_op_parallelism_threads)}) {
    if (!s.ok()) return s;
  }
  if (object.contains("variable_partitioner")) {
    out.variable_partitioner = object.at("variable_partitioner");
  }
  if (object.contains("communication")) {
    Fields communication(object.at("communication"), "strategy.communication", source);
    if (absl::Status s = communication.CheckObject(); !s.ok()) return s;
    if (absl::Status s =
            communication.CheckKnown({"implementation", "bytes_per_pack", "timeout_seconds"});
        !s.ok()) {
      return s;
    }
    for (absl::Status s :
         {communication.Get("implementation", out.communication.implementation),
          communication.Get("bytes_per_pack", out.communication.bytes_per_pack),
          communication.Get("timeout_seconds", out.communication.timeout_seconds)}) {
      if (!s.ok()) return s;
    }
    if (out.communication.bytes_per_pack < 0 || out.communication.timeout_seconds <= 0) {
      return communication.Error(
          "strategy.communication",
          "has a negative bytes_per_pack or a timeout that is not positive",
          "use bytes_per_pack >= 0 (0 packs every gradient together) and timeout_seconds > 0");
    }
  }
  static const std::set<std::string> kTypes = {"default",          "one_device",
                                               "mirrored",         "central_storage",
                                               "parameter_server", "multi_worker_mirrored"};
  if (kTypes.count(out.type) == 0) {
    return fields.Error("strategy.type", absl::StrCat("is \"", out.type, "\""),
                        absl::StrCat("use ", absl::StrJoin(kTypes, ", ")));
  }
  if (out.logical_gpus_per_gpu < 1) {
    return fields.Error("strategy.logical_gpus_per_gpu",
                        absl::StrCat("is ", out.logical_gpus_per_gpu), "use 1 (no split) or more");
  }
  if (out.intra_op_parallelism_threads < 1 || out.intra_op_parallelism_threads > 1024) {
    return fields.Error("strategy.intra_op_parallelism_threads",
                        absl::StrCat("is ", out.intra_op_parallelism_threads),
                        "use 1 (each replica on its own thread) up to 1024");
  }
  if (out.type == "default" && !out.devices.empty()) {
    return fields.Error("strategy.devices",
                        "is given for the default strategy, which runs on its one device",
                        "remove \"devices\", or use strategy.type \"one_device\" or \"mirrored\"");
  }
  return absl::OkStatus();
}

// The job's "data" object into job.data (the strategy already parsed).
absl::Status ParseData(const json& root, absl::string_view source, absl::string_view base_dir,
                       JobSpec& job) {
  Fields data(root["data"], "data", source);
  if (absl::Status s = data.CheckObject(); !s.ok()) return s;
  if (absl::Status s = data.CheckKnown({"train", "test", "rescale", "auto_shard_policy"});
      !s.ok()) {
    return s;
  }
  if (!root["data"].contains("train")) {
    return data.Error("data.train", "is missing", "give the training images and labels");
  }
  if (absl::Status s =
          ParseSource(root["data"]["train"], "data.train", source, base_dir, job.data.train);
      !s.ok()) {
    return s;
  }
  if (root["data"].contains("test")) {
    if (absl::Status s =
            ParseSource(root["data"]["test"], "data.test", source, base_dir, job.data.test);
        !s.ok()) {
      return s;
    }
  }
  for (absl::Status s : {data.Get("rescale", job.data.rescale),
                         data.Get("auto_shard_policy", job.data.auto_shard_policy)}) {
    if (!s.ok()) return s;
  }
  // Lock-step workers run the steps their counted data fills: one that skipped a damaged
  // file would run out early and leave the others waiting in an all-reduce.
  if (job.strategy.type == "multi_worker_mirrored" && job.data.train.read.ignore_errors) {
    return data.Error("data.train.ignore_errors", "is true for a multi_worker_mirrored job",
                      "its workers train in lock-step on data counted before training, so a "
                      "worker that skipped a damaged file would leave the others waiting: "
                      "repair or remove the file, and leave ignore_errors out");
  }
  if (root["data"].contains("rescale") && !(job.data.rescale > 0)) {
    return data.Error("data.rescale", absl::StrCat("is ", job.data.rescale),
                      "use a positive factor, such as 0.00392156862745098 (1/255) for pixels");
  }

  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view json_text, absl::string_view source,
                                     absl::string_view base_dir, JobSpecOptions options) {
  STRATUM_ASSIGN_OR_RETURN(
      const json root,
      ParseJsonText(json_text, absl::StrCat(source, ": the job"), source, "fix the file"));
  JobSpec job;
  Fields top(root, "", source);
  if (!root.is_object()) {  // the file itself, not a field of it
    std::string shown = root.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the job is ", shown,
        ", not a JSON object: write the job as one object, {\"model\": ..., \"compile\": ..., "
        "\"data\": ..., ...} (see examples/fashion_mnist.json)"));
  }
  if (absl::Status s =
          top.CheckKnown({"strategy", "model", "compile", "data", "fit", "checkpoint"});
      !s.ok()) {
    return s;
  }
  if (root.contains("strategy")) {
    if (absl::Status s = ParseStrategy(root["strategy"], source, job.strategy); !s.ok()) return s;
  }
  if (!root.contains("model")) {
    return top.Error("model", "is missing",
                     "add the Keras model.to_json() of a Sequential model under \"model\"");
  }
  job.model = root["model"];

  if (!root.contains("compile")) {
    return top.Error("compile", "is missing",
                     "add \"compile\": {\"optimizer\": \"adam\", \"loss\": "
                     "\"sparse_categorical_crossentropy\", \"metrics\": [\"accuracy\"]}");
  }
  Fields compile(root["compile"], "compile", source);
  if (absl::Status s = compile.CheckObject(); !s.ok()) return s;
  if (absl::Status s = compile.CheckKnown({"optimizer", "loss", "metrics"}); !s.ok()) return s;
  job.optimizer = root["compile"].value("optimizer", json("rmsprop"));
  if (!root["compile"].contains("loss")) {
    return compile.Error("compile.loss", "is missing",
                         "name a loss, e.g. \"sparse_categorical_crossentropy\"");
  }
  job.loss = root["compile"]["loss"];
  if (absl::Status s = compile.Get("metrics", job.metrics); !s.ok()) return s;
  for (const std::string& metric : job.metrics) {
    static const std::set<std::string> kMetrics = {
        "accuracy", "acc", "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy",
        "auc",      "AUC"};
    if (kMetrics.count(metric) == 0) {
      return compile.Error("compile.metrics", absl::StrCat("has \"", metric, "\""),
                           "Stratum reports the loss and the accuracy its loss pairs with "
                           "(\"accuracy\", \"sparse_categorical_accuracy\", "
                           "\"categorical_accuracy\", \"binary_accuracy\"), and Keras' AUC "
                           "(\"auc\") for a model of one sigmoid output");
    }
  }

  if (!root.contains("data") && options.needs_data) {
    return top.Error(
        "data", "is missing",
        "add \"data\": {\"train\": {\"images\": ..., \"labels\": ...}, \"test\": {...}}");
  }
  if (root.contains("data")) STRATUM_RETURN_IF_ERROR(ParseData(root, source, base_dir, job));

  if (root.contains("fit")) {
    Fields fit(root["fit"], "fit", source);
    if (absl::Status s = fit.CheckObject(); !s.ok()) return s;
    if (absl::Status s =
            fit.CheckKnown({"epochs", "steps_per_epoch", "batch_size_per_replica", "shuffle_buffer",
                            "seed", "validate", "steps_per_execution", "callbacks"});
        !s.ok()) {
      return s;
    }
    for (absl::Status s :
         {fit.Get("epochs", job.fit.epochs), fit.Get("steps_per_epoch", job.fit.steps_per_epoch),
          fit.Get("batch_size_per_replica", job.fit.batch_size_per_replica),
          fit.Get("shuffle_buffer", job.fit.shuffle_buffer), fit.Get("seed", job.fit.seed),
          fit.Get("validate", job.fit.validate),
          fit.Get("steps_per_execution", job.fit.steps_per_execution)}) {
      if (!s.ok()) return s;
    }
    if (job.fit.epochs < 1) {
      return fit.Error("fit.epochs", absl::StrCat("is ", job.fit.epochs), "train at least 1 epoch");
    }
    if (job.fit.batch_size_per_replica < 1 || job.fit.batch_size_per_replica > (1 << 20)) {
      return fit.Error("fit.batch_size_per_replica",
                       absl::StrCat("is ", job.fit.batch_size_per_replica), "use 1 to 1048576");
    }
    // Counts past 10^12 (years of steps) would only overflow the step arithmetic.
    constexpr int64_t kMost = 1000000000000;
    for (const auto& [name, value, least, fix] :
         {std::tuple{"fit.steps_per_epoch", job.fit.steps_per_epoch, 0,
                     "use 0 (one pass over the training data) or a number of steps up to "
                     "1000000000000"},
          std::tuple{"fit.shuffle_buffer", job.fit.shuffle_buffer, 0,
                     "use 0 (no shuffling) or a number of examples up to 1000000000000"},
          std::tuple{"fit.steps_per_execution", job.fit.steps_per_execution, 1,
                     "use 1 or more steps per closure, up to 1000000000000"}}) {
      if (value < least || value > kMost) return fit.Error(name, absl::StrCat("is ", value), fix);
    }
  }
  if (root.contains("checkpoint")) {
    Fields checkpoint(root["checkpoint"], "checkpoint", source);
    if (absl::Status s = checkpoint.CheckObject(); !s.ok()) return s;
    if (absl::Status s = checkpoint.CheckKnown({"dir", "every_steps", "max_to_keep"}); !s.ok()) {
      return s;
    }
    const json& fields = root["checkpoint"];
    const bool keep_all = fields.contains("max_to_keep") && fields["max_to_keep"].is_null();
    if (keep_all) job.checkpoint.max_to_keep = kKeepEveryCheckpoint;
    for (absl::Status s : {checkpoint.Get("dir", job.checkpoint.dir),
                           checkpoint.Get("every_steps", job.checkpoint.every_steps),
                           keep_all ? absl::OkStatus()
                                    : checkpoint.Get("max_to_keep", job.checkpoint.max_to_keep)}) {
      if (!s.ok()) return s;
    }
    if (job.checkpoint.every_steps < 0) {
      return checkpoint.Error(
          "checkpoint.every_steps", absl::StrCat("is ", job.checkpoint.every_steps),
          "use 0 (a checkpoint at every epoch's end only) or a number of steps");
    }
    if (job.checkpoint.max_to_keep < 1) {
      return checkpoint.Error("checkpoint.max_to_keep",
                              absl::StrCat("is ", job.checkpoint.max_to_keep),
                              "keep at least 1 checkpoint (the latest), or null for every one");
    }
    job.checkpoint.dir = Resolve(job.checkpoint.dir, base_dir);
  }
  if (root.contains("fit") && root["fit"].is_object() && root["fit"].contains("callbacks")) {
    if (absl::Status s = ParseCallbacks(root["fit"]["callbacks"], source, base_dir, job); !s.ok()) {
      return s;
    }
  }
  return job;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  // Read only a plain file of a job's size: a FIFO would block and /dev/zero never ends.
  constexpr uintmax_t kMaxJobBytes = 64 << 20;
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (!error && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job file ", path,
                     " is not a regular file (a folder, a pipe or a device): pass the "
                     "path of the job's JSON file to --job"));
  }
  if (const uintmax_t bytes = std::filesystem::file_size(path, error);
      !error && bytes > kMaxJobBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job file ", path, " has ", bytes,
                                                   " bytes, more than a job's ", kMaxJobBytes,
                                                   ": pass the path of the job's JSON file"));
  }
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("job file ", path, " cannot be read: check the path passed to --job"));
  }
  std::stringstream text;
  text << file.rdbuf();
  const size_t slash = path.rfind('/');
  const std::string base_dir = slash == std::string::npos ? "." : path.substr(0, slash);
  return ParseJobSpec(text.str(), path, base_dir);
}

}  // namespace stratum
