#include "stratum/training/fit_job.h"

#include "stratum/checkpoint/checkpoint_folder.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "stratum/data/csv.h"
#include "stratum/data/idx.h"
#include "stratum/data/lookup.h"
#include "stratum/data/record_files.h"
#include "stratum/data/text_lines.h"
#include "stratum/device/device.h"
#include "stratum/model/optimizer.h"
#include "stratum/training/callbacks.h"
#include "stratum/util/memory.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

int64_t Rows(const Shape& shape) { return shape.rank() == 0 ? 1 : shape.dim(0); }

absl::Status CheckRowsAgree(const DataSourceSpec& source, const Shape& images,
                            const Shape& labels) {
  if (Rows(images) == Rows(labels)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(source.images, " has ", Rows(images), " images but ", source.labels, " has ",
                   Rows(labels), " labels: give the label file that belongs to these images"));
}

// Class ids are checked once here, where the file and the example can still be named: a bad
// one found by the loss mid-training could only be named by its place in a shuffled batch.
// A model of one output takes labels 0 and 1 (binary_crossentropy).
absl::Status CheckClassIds(const std::string& field, const std::string& path, const Tensor& labels,
                           int64_t classes) {
  const auto outside = FirstClassIdOutside(labels, labels.rows(), classes == 1 ? 2 : classes);
  if (!outside) return absl::OkStatus();
  if (classes == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".labels ", path, ": example ", outside->index, " has label ", outside->class_id,
        ", but the model has one output, which takes labels 0 and 1 (binary_crossentropy): give "
        "such labels, or give the model's last Dense layer one unit per class and a categorical "
        "loss"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ".labels ", path, ": example ", outside->index, " has class id ",
                   outside->class_id, ", outside the model's ", classes, " classes (0..",
                   classes - 1, "): give labels from 0 to ", classes - 1,
                   outside->class_id < 0 ? ""
                                         : absl::StrCat(", or give the model's last Dense layer at "
                                                        "least ",
                                                        outside->class_id + 1, " units")));
}

absl::StatusOr<Dataset> LoadSource(const std::string& field, const DataSourceSpec& source,
                                   int64_t classes, int64_t& examples) {
  STRATUM_ASSIGN_OR_RETURN(Tensor images, ReadIdxFile(source.images));
  STRATUM_ASSIGN_OR_RETURN(Tensor labels, ReadIdxFile(source.labels));
  STRATUM_RETURN_IF_ERROR(CheckRowsAgree(source, images.shape(), labels.shape()));
  STRATUM_RETURN_IF_ERROR(CheckClassIds(field, source.labels, labels, classes));
  examples = images.rows();
  return Dataset::FromTensorSlices({std::move(images), std::move(labels)});
}

// A tfrecord or csv source's files (patterns matched now) and its format.
struct RecordSource {
  std::vector<std::string> files;
  std::shared_ptr<const RecordFormat> format;
};

// Reads the features of several model inputs (each tensor of an element but the last, the
// label) as the one x a step takes: the features in the model's input order, flattened and
// side by side, as float32; as int32 ids for a model that takes only ids (exact beyond 2^24).
class ExampleReaderOfInputs final : public ExampleReader {
 public:
  ExampleReaderOfInputs(std::unique_ptr<ExampleReader> features, std::vector<int> order,
                        int64_t width, bool ids)
      : features_(std::move(features)), order_(std::move(order)), width_(width), ids_(ids) {}

  absl::StatusOr<std::optional<Element>> Next() override {
    STRATUM_ASSIGN_OR_RETURN(std::optional<Element> element, features_->Next());
    if (!element) return element;
    Tensor x(ids_ ? DType::kInt32 : DType::kFloat32, Shape({width_}));
    int64_t at = 0;
    for (int feature : order_) {
      const Tensor& values = (*element)[static_cast<size_t>(feature)];
      if (ids_) {
        Append<int32_t>(
            values, x.data<int32_t>() + at, [](int64_t v) { return IdOfWord(IdWord(v)); },
            [](float v) { return IdOfWord(IdWordOfValue(v)); });
      } else {
        Append<float>(
            values, x.data<float>() + at, [](int64_t v) { return static_cast<float>(v); },
            [](float v) { return v; });
      }
      at += values.num_elements();
    }
    Element assembled;
    assembled.push_back(std::move(x));
    assembled.push_back(std::move(element->back()));
    return assembled;
  }

 private:
  // Writes `values` to `out` as T: integers through `integer`, floats through `real`.
  template <typename T, typename Integer, typename Real>
  static void Append(const Tensor& values, T* out, Integer integer, Real real) {
    const int64_t n = values.num_elements();
    switch (values.dtype()) {
      case DType::kInt64:
        for (int64_t i = 0; i < n; ++i) out[i] = integer(values.data<int64_t>()[i]);
        break;
      case DType::kUInt8:
        for (int64_t i = 0; i < n; ++i) out[i] = integer(values.data<uint8_t>()[i]);
        break;
      case DType::kInt32:
        for (int64_t i = 0; i < n; ++i) out[i] = integer(values.data<int32_t>()[i]);
        break;
      case DType::kFloat32:
        for (int64_t i = 0; i < n; ++i) out[i] = real(values.data<float>()[i]);
        break;
    }
  }

  std::unique_ptr<ExampleReader> features_;
  std::vector<int> order_;
  int64_t width_;
  bool ids_;
};

class RecordFormatOfInputs final : public RecordFormat {
 public:
  RecordFormatOfInputs(std::shared_ptr<const RecordFormat> features, std::vector<int> order,
                       int64_t width, bool ids)
      : features_(std::move(features)), order_(std::move(order)), width_(width), ids_(ids) {}
  absl::StatusOr<std::unique_ptr<ExampleReader>> Open(const std::string& path) const override {
    STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<ExampleReader> reader, features_->Open(path));
    return std::make_unique<ExampleReaderOfInputs>(std::move(reader), order_, width_, ids_);
  }
  absl::StatusOr<int64_t> Count(const std::string& path) const override {
    return features_->Count(path);
  }
  std::string Name() const override { return features_->Name(); }

 private:
  std::shared_ptr<const RecordFormat> features_;
  std::vector<int> order_;
  int64_t width_;
  bool ids_;
};

// The lookups of the source's preprocess, by feature.
absl::StatusOr<std::map<std::string, std::shared_ptr<const TokenLookup>>> SourceLookups(
    const std::string& field, const DataSourceSpec& source) {
  std::map<std::string, std::shared_ptr<const TokenLookup>> lookups;
  for (const PreprocessSpec& preprocess : source.preprocess) {
    STRATUM_ASSIGN_OR_RETURN(
        lookups[preprocess.feature],
        TokenLookup::FromKerasLayer(
            preprocess.layer, absl::StrCat("job field ", field, ".preprocess.", preprocess.feature),
            {}));
  }
  return lookups;
}

// How the model names input i in messages: "features" (InputLayer "model_input").
std::string InputName(const Model& model, size_t i) {
  const std::string& key = model.input_keys()[i];
  const std::string& name = model.input_names()[i];
  return key == name ? absl::StrCat("\"", key, "\"")
                     : absl::StrCat("\"", key, "\" (InputLayer \"", name, "\")");
}

// The tfrecord features in the order of the model's inputs (each input takes the feature of
// its name; a model of one input takes the one feature, whatever its name), or an empty
// order when the one feature is x as it is.
absl::StatusOr<std::vector<int>> InputOrder(const std::string& field,
                                            const std::vector<FeatureSpec>& features,
                                            const Model& model) {
  const size_t inputs = model.input_names().size();
  const size_t given = features.size() - 1;  // the label is last
  if (inputs == 1 && given == 1) return std::vector<int>{};
  std::vector<int> order;
  std::vector<bool> used(given, false);
  const std::vector<Shape> shapes = model.input_shapes();
  for (size_t i = 0; i < inputs; ++i) {
    int found = -1;
    for (size_t f = 0; f < given; ++f) {
      if (features[f].key == model.input_keys()[i] || features[f].key == model.input_names()[i]) {
        found = static_cast<int>(f);
      }
    }
    if (found < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".features has no feature for the model's input ", InputName(model, i),
          ": name each feature after the model input it feeds (its key in the model's dict of "
          "inputs, or its InputLayer's name)"));
    }
    const FeatureSpec& feature = features[static_cast<size_t>(found)];
    const int64_t values = feature.output_shape().num_elements();
    if (values != shapes[i].num_elements()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": feature \"", feature.key, "\" has ", values,
                       " values per example, but the model's input ", InputName(model, i),
                       " takes ", shapes[i].ToString(), " (", shapes[i].num_elements(),
                       "): fix the feature's shape (or pad_to), or the input's"));
    }
    used[static_cast<size_t>(found)] = true;
    order.push_back(found);
  }
  for (size_t f = 0; f < given; ++f) {
    if (!used[f]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".features has feature \"", features[f].key,
                       "\", which no model input takes (the model's inputs are ",
                       absl::StrJoin(model.input_keys(), ", "),
                       "): remove it, or name it after the input it feeds"));
    }
  }
  return order;
}

// Text lines: each files entry resolved on its own, for its index labels its files' lines.
absl::StatusOr<RecordSource> OpenTextSource(const std::string& field, const DataSourceSpec& source,
                                            const Model& model) {
  RecordSource out;
  TextLineOptions options;
  options.compression = source.compression;
  for (size_t entry = 0; entry < source.files.size(); ++entry) {
    STRATUM_ASSIGN_OR_RETURN(
        const std::vector<std::string> files,
        ResolveDataFiles({source.files[entry]}, "", absl::StrCat(field, ".files[", entry, "]")));
    for (const std::string& file : files) {
      const auto [named, added] = options.labels.emplace(file, static_cast<int64_t>(entry));
      if (!added) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".files[", named->second, "] and [", entry, "] both name ", file,
                         ", whose lines they label ", named->second, " and ", entry,
                         ": name each file in one entry"));
      }
      out.files.push_back(file);
    }
  }
  const PreprocessSpec& preprocess = source.preprocess.at(0);
  STRATUM_ASSIGN_OR_RETURN(
      options.vectorizer,
      TextVectorizer::FromKerasLayer(preprocess.layer,
                                     absl::StrCat("job field ", field, ".preprocess.line"), {}));
  const int64_t wanted = model.input_shape().num_elements();
  options.length = options.vectorizer->output_sequence_length().value_or(wanted);
  if (model.input_names().size() != 1 || options.length != wanted) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": each line is ", options.length, " ids (", options.vectorizer->class_name(),
        options.vectorizer->output_sequence_length() ? "'s output_sequence_length" : "",
        "), but the model takes ", model.input_names().size() == 1 ? "" : "several inputs, ",
        model.input_shape().ToString(), " (", wanted,
        " values) per example: give the model one input of the line's ids, or set "
        "output_sequence_length to its length"));
  }
  out.format = TextLines(std::move(options));
  return out;
}

absl::StatusOr<RecordSource> OpenRecordSource(const std::string& field,
                                              const DataSourceSpec& source, const Model& model) {
  if (source.format == "text") return OpenTextSource(field, source, model);
  RecordSource out;
  STRATUM_ASSIGN_OR_RETURN(out.files,
                           ResolveDataFiles(source.files, "", absl::StrCat(field, ".files")));
  STRATUM_ASSIGN_OR_RETURN(const auto lookups, SourceLookups(field, source));
  if (source.format == "tfrecord") {
    std::vector<FeatureSpec> features = source.features;
    for (FeatureSpec& feature : features) {
      if (const auto lookup = lookups.find(feature.key); lookup != lookups.end()) {
        feature.lookup = lookup->second;
      }
    }
    STRATUM_ASSIGN_OR_RETURN(const std::vector<int> order, InputOrder(field, features, model));
    out.format = TFRecordExamples(source.compression, std::move(features));
    if (!order.empty()) {
      out.format = std::make_shared<RecordFormatOfInputs>(
          std::move(out.format), order, model.input_shape().num_elements(), model.takes_only_ids());
    }
    return out;
  }
  CsvOptions options = source.csv;
  options.lookups = lookups;
  if (model.input_names().size() > 1) options.input_columns = model.input_keys();
  absl::StatusOr<std::shared_ptr<const RecordFormat>> csv = CsvFormat(out.files[0], options);
  if (!csv.ok()) {
    return absl::Status(csv.status().code(), absl::StrCat(field, ": ", csv.status().message()));
  }
  out.format = *std::move(csv);
  return out;
}

// Streams the files: nothing is read now but each file's record count.
absl::StatusOr<Dataset> LoadRecordSource(const std::string& field, const DataSourceSpec& source,
                                         const Model& model, int64_t& examples) {
  STRATUM_ASSIGN_OR_RETURN(RecordSource opened, OpenRecordSource(field, source, model));
  ReadOptions read = source.read;
  STRATUM_ASSIGN_OR_RETURN(
      read.record_counts,
      CountRecords(opened.files, *opened.format, /*threads=*/4, source.read.ignore_errors));
  examples = 0;
  for (int64_t count : read.record_counts) examples += count;
  Dataset dataset = RecordFilesDataset(opened.files, opened.format, std::move(read));
  STRATUM_RETURN_IF_ERROR(dataset.status());
  return dataset;
}

// The first example of the source's files, for the checks before training; nullopt when the
// files hold none.
absl::StatusOr<std::optional<Element>> FirstExample(const std::string& field,
                                                    const DataSourceSpec& source,
                                                    const Model& model) {
  STRATUM_ASSIGN_OR_RETURN(RecordSource opened, OpenRecordSource(field, source, model));
  for (const std::string& file : opened.files) {
    STRATUM_ASSIGN_OR_RETURN(auto reader, opened.format->Open(file));
    STRATUM_ASSIGN_OR_RETURN(std::optional<Element> first, reader->Next());
    if (first) return first;
  }
  return std::nullopt;
}

absl::Status CheckRecordSource(const std::string& field, const DataSourceSpec& source,
                               const Model& model, const Loss& loss) {
  STRATUM_ASSIGN_OR_RETURN(const std::optional<Element> first, FirstExample(field, source, model));
  if (!first) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".files hold no examples, so the model could not ",
                     field == "data.test" ? "be tested on them" : "train on them",
                     ": point it at files with examples"));
  }
  const Tensor& x = (*first)[0];
  const Tensor& y = (*first)[1];
  const std::string input = source.format == "text"       ? "a line's ids"
                            : source.format != "tfrecord" ? "the feature columns"
                            : source.features.size() > 2
                                ? "the features"
                                : absl::StrCat("feature \"", source.features[0].key, "\"");
  const int64_t wanted = model.input_shape().num_elements();
  if (x.num_elements() != wanted) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", input, " is ", x.DebugString(), ", ", x.num_elements(),
        " values per example, but the model takes ", model.input_shape().ToString(), " (", wanted,
        " values) per example: fix the feature spec, or the model's input shape"));
  }
  std::vector<int64_t> dims = {1};
  for (int64_t d : y.shape().dims()) dims.push_back(d);
  const int64_t classes = model.output_size();
  if (!loss.TakesTargets(y.dtype(), Shape(dims), classes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": the label \"", source.label, "\" is ", DTypeName(y.dtype()), y.shape().ToString(),
        " per example, but ", loss.name(),
        loss.sparse_targets() ? " takes one integer class id per example (int64, shape [])"
                              : absl::StrCat(" takes float32 targets of shape [", classes, "]"),
        ": fix the label's spec, or the loss"));
  }
  // Text lines are labelled 0..entries-1 by their files entry.
  const auto entries = static_cast<int64_t>(source.files.size());
  const int64_t ids = classes == 1 ? 2 : classes;
  if (source.format == "text" && entries > ids) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".files has ", entries, " entries, whose lines are labelled 0 to ", entries - 1,
        " by their entry, but the model tells ", ids, " classes apart (", classes,
        classes == 1 ? " output" : " outputs",
        "): give one entry per class (a glob pattern names a class's files), or more outputs"));
  }
  return absl::OkStatus();
}

std::string Describe(const IdxHeader& header) {
  return absl::StrCat(DTypeName(header.dtype), header.shape.ToString());
}

// Fit reshapes each example to the model's input shape: any layout of as many values fits.
absl::Status CheckImages(const std::string& field, const std::string& path, const IdxHeader& header,
                         const Model& model) {
  int64_t per_example = 1;
  for (int d = 1; d < header.shape.rank(); ++d) per_example *= header.shape.dim(d);
  const int64_t wanted = model.input_shape().num_elements();
  if (per_example == wanted) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " ", path, " is ", Describe(header), ", ", per_example,
      per_example == 1 ? " value" : " values", " per example, but the model takes ",
      model.input_shape().ToString(), " (", wanted, wanted == 1 ? " value" : " values",
      ") per example: point ", field, " at the images file, or change the model's input shape"));
}

absl::Status CheckLabels(const std::string& source_field, const std::string& path,
                         const IdxHeader& header, const Model& model, const Loss& loss) {
  const int64_t classes = model.output_size();
  if (loss.TakesTargets(header.dtype, header.shape, classes)) return absl::OkStatus();
  const std::string field = absl::StrCat(source_field, ".labels");
  const std::string what = absl::StrCat(field, " ", path, " is ", Describe(header), ", but ");
  const int64_t rows = Rows(header.shape);
  if (!loss.sparse_targets()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, loss.name(), " takes float32 targets of shape [", rows, ", ", classes,
        "] (one row per example for the model's ", classes,
        " outputs): give such a file, or use sparse_categorical_crossentropy for class ids"));
  }
  if (header.dtype == DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, loss.name(),
                     " takes integer class ids (uint8 or int32): give a file of class ids, or use "
                     "categorical_crossentropy for one-hot float32 rows"));
  }
  const char* example =
      source_field == "data.test" ? "t10k-labels-idx1-ubyte.gz" : "train-labels-idx1-ubyte.gz";
  return absl::InvalidArgumentError(absl::StrCat(
      what, loss.name(), " takes one class id per example, a file of shape [", rows, "]: point ",
      field, " at the labels of ", source_field, ".images (an idx1 file, such as ", example, ")"));
}

// A header that does not fit may be a corrupt file rather than the wrong one (a damaged
// dimension count reads as another shape): when the file's data does not match its own
// header either, that is what to report. Read only on this error path.
absl::Status CorruptOr(const std::string& path, absl::Status mismatch) {
  if (mismatch.ok()) return mismatch;
  absl::StatusOr<Tensor> whole = ReadIdxFile(path);
  return whole.ok() ? mismatch : whole.status();
}

absl::Status CheckSourceHeaders(const std::string& field, const DataSourceSpec& source,
                                const Model& model, const Loss& loss) {
  STRATUM_ASSIGN_OR_RETURN(const IdxHeader images, ReadIdxHeader(source.images));
  STRATUM_ASSIGN_OR_RETURN(const IdxHeader labels, ReadIdxHeader(source.labels));
  STRATUM_RETURN_IF_ERROR(CorruptOr(
      source.images, CheckImages(absl::StrCat(field, ".images"), source.images, images, model)));
  STRATUM_RETURN_IF_ERROR(
      CorruptOr(source.labels, CheckLabels(field, source.labels, labels, model, loss)));
  STRATUM_RETURN_IF_ERROR(CheckRowsAgree(source, images.shape, labels.shape));
  // A test set of no examples measures nothing: its accuracy would read 0, as if measured.
  if (field == "data.test" && images.shape.rank() > 0 && images.shape.dim(0) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.test.images ", source.images,
                     " holds no examples, so the model could not be tested on it: point "
                     "data.test at a test set with examples, or remove data.test"));
  }
  return absl::OkStatus();
}

// Keras' Rescaling(1/255) for uint8 pixels; other data is taken as it is.
double DefaultRescale(const DataSourceSpec& source) {
  bool pixels = source.format == "tfrecord" &&
                std::all_of(source.features.begin(), source.features.end() - 1,
                            [](const FeatureSpec& f) { return f.output_dtype() == DType::kUInt8; });
  if (source.format == "idx") {
    absl::StatusOr<IdxHeader> header = ReadIdxHeader(source.images);
    pixels = !header.ok() || header->dtype == DType::kUInt8;
  }
  return pixels ? 1.0 / 255.0 : 1.0;
}

// The factor the model's inputs take: data.rescale, or the default above; 1 for ids, which
// are looked up as they are (a factor would turn id 3 into 0.0118), and one factor serves
// every input, so values beside ids must come scaled.
absl::StatusOr<double> Rescale(const DataSpec& spec, const Model& model) {
  if (!model.takes_ids()) return spec.rescale > 0 ? spec.rescale : DefaultRescale(spec.train);
  if (spec.rescale > 0 && spec.rescale != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.rescale is ", spec.rescale,
        ", but the model's input takes ids (an Embedding reads it, or its InputLayer has "
        "dtype int32 or int64), which are not rescaled: remove data.rescale, or set it to 1"));
  }
  if (!model.takes_only_ids() && spec.rescale != 1) {
    return absl::InvalidArgumentError(
        "the model takes ids on some inputs and values on others, and one data.rescale "
        "serves them all: give the values already scaled and set data.rescale to 1");
  }
  return 1.0;
}

}  // namespace

absl::StatusOr<FitData> LoadFitData(const DataSpec& spec, const Model& model) {
  FitData data;
  const int64_t classes = model.output_size();
  auto load = [&](const std::string& field, const DataSourceSpec& source, int64_t& examples) {
    return source.format == "idx" ? LoadSource(field, source, classes, examples)
                                  : LoadRecordSource(field, source, model, examples);
  };
  absl::StatusOr<Dataset> train = load("data.train", spec.train, data.train_examples);
  if (!train.ok()) return train.status();
  data.train = *std::move(train);
  STRATUM_ASSIGN_OR_RETURN(data.rescale, Rescale(spec, model));
  if (spec.test.given()) {
    absl::StatusOr<Dataset> test = load("data.test", spec.test, data.test_examples);
    if (!test.ok()) return test.status();
    data.test = *std::move(test);
    data.has_test = true;
  }
  return data;
}

namespace {

// What fit.callbacks ask of the training that it cannot do, refused before training.
absl::Status CheckCallbacksFit(const JobSpec& job, const Optimizer& optimizer) {
  for (size_t i = 0; i < job.fit.callbacks.size(); ++i) {
    const CallbackSpec& callback = job.fit.callbacks[i];
    const std::string field =
        absl::StrCat("job field fit.callbacks[", i, "] (", callback.class_name, ")");
    if (callback.class_name == "ReduceLROnPlateau" &&
        optimizer.learning_rate_schedule().is_schedule()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " sets the learning rate, and the optimizer's learning_rate is the schedule ",
          optimizer.learning_rate_schedule().name(),
          ", which sets it at every step (Keras refuses this too): give the optimizer a "
          "constant learning_rate, or leave ReduceLROnPlateau out"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FitOptions> FitOptionsFrom(const JobSpec& job) {
  const FitSpec& spec = job.fit;
  FitOptions options;
  STRATUM_ASSIGN_OR_RETURN(options.auto_shard_policy,
                           AutoShardPolicyFromName(job.data.auto_shard_policy));
  options.checkpoint_dir = job.checkpoint.dir;
  options.checkpoint_every_steps = job.checkpoint.every_steps;
  options.max_to_keep = job.checkpoint.max_to_keep;
  options.epochs = spec.epochs;
  options.steps_per_epoch = spec.steps_per_epoch;
  options.batch_size_per_replica = spec.batch_size_per_replica;
  options.shuffle_buffer = spec.shuffle_buffer;
  options.seed = spec.seed;
  options.validate = spec.validate;
  STRATUM_ASSIGN_OR_RETURN(const std::unique_ptr<Optimizer> optimizer,
                           Optimizer::FromKeras(job.optimizer));
  STRATUM_RETURN_IF_ERROR(CheckCallbacksFit(job, *optimizer));
  options.callbacks = spec.callbacks;
  options.metrics = job.metrics;
  options.model_json = job.model;
  return options;
}

absl::Status CheckDataHeaders(const DataSpec& data, const Model& model, const Loss& loss) {
  auto check = [&](const std::string& field, const DataSourceSpec& source) {
    return source.format == "idx" ? CheckSourceHeaders(field, source, model, loss)
                                  : CheckRecordSource(field, source, model, loss);
  };
  STRATUM_RETURN_IF_ERROR(check("data.train", data.train));
  if (!data.test.given()) return absl::OkStatus();
  return check("data.test", data.test);
}

namespace {

std::string GiB(double bytes) { return absl::StrFormat("%.1f GiB", bytes / (1u << 30)); }

}  // namespace

absl::Status CheckMemoryFits(const Model& model, const Optimizer& optimizer,
                             int64_t batch_per_replica, int replicas, int copies) {
  const double per_copy = static_cast<double>(model.num_parameters()) * sizeof(float) *
                          (2.0 + static_cast<double>(optimizer.SlotNames().size()));
  const double per_replica =
      static_cast<double>(model.WorkspaceFloats(batch_per_replica)) * sizeof(float);
  const double needed = per_copy * copies + per_replica * replicas;
  const std::optional<uint64_t> available = AvailableMemoryBytes();
  if (!available || needed <= static_cast<double>(*available)) return absl::OkStatus();
  // A configuration error (exit 2): the job, as it is, cannot train here.
  return absl::InvalidArgumentError(absl::StrCat(
      "the model does not fit in memory: training it needs about ", GiB(needed), " (",
      model.num_parameters(), " parameters, with their gradients and the optimizer's ",
      optimizer.SlotNames().size(), " slot(s), in ", copies, copies == 1 ? " copy" : " copies",
      ", and the activations of ", batch_per_replica, " examples on each of ", replicas,
      replicas == 1 ? " replica" : " replicas", "), but ", GiB(static_cast<double>(*available)),
      " is available: make the model's largest layers smaller, or the batch, or train on a "
      "machine with more memory"));
}

absl::Status DeleteBackupOfCompleteJob(const CheckpointSpec& checkpoint, FILE* out) {
  if (!checkpoint.delete_at_end || checkpoint.dir.empty()) return absl::OkStatus();
  STRATUM_RETURN_IF_ERROR(DeleteCheckpoints(checkpoint.dir));
  std::fprintf(out,
               "BackupAndRestore: the job is complete, so its backup in %s is deleted "
               "(delete_checkpoint); a run again starts afresh\n",
               checkpoint.dir.c_str());
  std::fflush(out);
  return absl::OkStatus();
}

absl::Status CheckTrainingJob(const JobSpec& job) {
  STRATUM_ASSIGN_OR_RETURN(const Model model, Model::FromKerasJson(job.model));
  STRATUM_ASSIGN_OR_RETURN(const Loss loss, Loss::FromKeras(job.loss));
  STRATUM_RETURN_IF_ERROR(model.CheckLoss(loss));
  STRATUM_ASSIGN_OR_RETURN(const std::unique_ptr<Optimizer> optimizer,
                           Optimizer::FromKeras(job.optimizer));
  // A parameter-server job's variables live on the PSs (sharded), not in one process.
  if (job.strategy.type != "parameter_server") {
    const int replicas = std::max<int>(1, static_cast<int>(job.strategy.devices.size()));
    STRATUM_RETURN_IF_ERROR(
        CheckMemoryFits(model, *optimizer, job.fit.batch_size_per_replica, replicas, replicas));
  }
  STRATUM_RETURN_IF_ERROR(FitOptionsFrom(job).status());
  if (MeasuresAuc(job.metrics) &&
      (loss.kind() != Loss::Kind::kBinaryCrossentropy || model.output_size() != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compile.metrics asks for \"auc\", which Stratum measures as Keras' AUC of a model of "
        "one output trained with binary_crossentropy, but this model has ",
        model.output_size(), " outputs and the loss is ", loss.name(),
        ": leave \"auc\" out, or train a binary classifier (Dense(1, activation=\"sigmoid\"), "
        "binary_crossentropy)"));
  }
  return CheckDataHeaders(job.data, model, loss);
}

}  // namespace stratum
