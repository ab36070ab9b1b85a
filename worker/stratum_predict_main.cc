// stratum-predict: evaluates and predicts with a model that a training binary exported
// (--export, ModelCheckpoint): <dir>/model.json and its weights (model.safetensors), on the
// test data of a job or on IDX files, writing the model's outputs as CSV or NumPy's .npy.
//
//   stratum-predict --model DIR --job JOB.json [--output predictions.npy]
//   stratum-predict --model DIR --images X.gz [--labels Y.gz] [--output predictions.csv]
//
// With labels it prints the loss and accuracy, as the training binaries report them.
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/data/idx.h"
#include "stratum/job/job_spec.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/training/evaluate.h"
#include "stratum/training/fit_job.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/flags.h"
#include "stratum/util/logging.h"
#include "stratum/util/number_text.h"
#include "stratum/util/status_macros.h"

ABSL_FLAG(std::string, model, "",
          "The exported model's folder: model.json and model.safetensors (from --export or "
          "ModelCheckpoint)");
ABSL_FLAG(std::string, job, "", "Predict on this job's data.test (any format the job reads)");
ABSL_FLAG(std::string, images, "", "Predict on these IDX images (gzipped or not)");
ABSL_FLAG(std::string, labels, "", "With --images: their IDX labels, to evaluate");
ABSL_FLAG(std::string, loss, "",
          "The loss to evaluate with (default: the job's; else sparse_categorical_crossentropy "
          "for several outputs, binary_crossentropy for one)");
ABSL_FLAG(double, rescale, 0,
          "Multiply the inputs by this (default: the job's data.rescale; 1/255 for uint8 images)");
ABSL_FLAG(std::string, output, "",
          "Write the model's outputs here: .csv (the predicted class, then every output) or "
          ".npy (float32 [examples, outputs])");
ABSL_FLAG(int, batch_size, 256, "Examples per forward pass");
ABSL_FLAG(std::string, log_level, "warn", "trace, debug, info, warn, error or off");

namespace stratum {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "stratum-predict: %s\n", std::string(status.message()).c_str());
  return ExitCodeFor(status);
}

// The exported model and its trained variables, by name, shapes checked.
absl::StatusOr<std::pair<Model, std::vector<Tensor>>> LoadExport(const std::string& dir) {
  STRATUM_ASSIGN_OR_RETURN(const std::string text,
                           ReadWholeFile(dir + "/model.json", "the exported model"));
  STRATUM_ASSIGN_OR_RETURN(Model model, Model::FromKerasJson(text));
  STRATUM_ASSIGN_OR_RETURN(TensorFile weights, ReadSafetensors(dir + "/model.safetensors"));
  std::vector<Tensor> variables;
  for (const VariableSpec& spec : model.variables()) {
    auto found = std::find_if(weights.tensors.begin(), weights.tensors.end(),
                              [&](const auto& named) { return named.first == spec.name; });
    if (found == weights.tensors.end() || found->second.shape() != spec.shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, "/model.safetensors has no ", spec.name, " of shape ", spec.shape.ToString(),
          ": it was written for another model than ", dir, "/model.json; export them together"));
    }
    variables.push_back(found->second);
  }
  return std::make_pair(std::move(model), std::move(variables));
}

// The examples to predict on (x, y; y zeros without labels), their rescale, whether they
// have labels, and the job's loss when a job gave them.
struct Examples {
  Dataset data;
  double rescale = 1;
  bool labelled = false;
  nlohmann::json loss;
};

absl::StatusOr<Examples> LoadExamples(const Model& model) {
  Examples examples;
  const std::string job_path = absl::GetFlag(FLAGS_job);
  const std::string images = absl::GetFlag(FLAGS_images);
  if (job_path.empty() == images.empty()) {
    return absl::InvalidArgumentError(
        "give the examples with --job (its data.test) or --images (IDX), one of the two");
  }
  if (!job_path.empty()) {
    STRATUM_ASSIGN_OR_RETURN(JobSpec job, LoadJobSpec(job_path));
    if (!job.data.test.given()) {
      return absl::InvalidArgumentError(
          absl::StrCat(job_path, " has no data.test to predict on: give it one, or pass --images"));
    }
    job.data.train = job.data.test;  // only the test set is read
    STRATUM_ASSIGN_OR_RETURN(FitData data, LoadFitData(job.data, model));
    examples.data = data.test;
    examples.rescale = data.rescale;
    examples.labelled = true;
    examples.loss = job.loss;
    return examples;
  }
  STRATUM_ASSIGN_OR_RETURN(Tensor x, ReadIdxFile(images));
  Tensor y(DType::kUInt8, Shape({x.rows()}));
  y.SetZero();
  if (const std::string labels = absl::GetFlag(FLAGS_labels); !labels.empty()) {
    STRATUM_ASSIGN_OR_RETURN(y, ReadIdxFile(labels));
    if (y.rows() != x.rows()) {
      return absl::InvalidArgumentError(absl::StrCat("--labels ", labels, " has ", y.rows(),
                                                     " labels for the ", x.rows(),
                                                     " images of --images: give the pair"));
    }
    examples.labelled = true;
  }
  examples.rescale = x.dtype() == DType::kUInt8 ? 1.0 / 255 : 1.0;
  examples.data = Dataset::FromTensorSlices({std::move(x), std::move(y)});
  return examples;
}

// NumPy's .npy format (version 1.0): float32 [rows, columns].
std::string NpyOf(const std::vector<float>& values, int64_t rows, int64_t columns) {
  std::string header = absl::StrFormat(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows, columns);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return out;
}

int Run() {
  if (absl::Status logging = InitLogging("stratum-predict", absl::GetFlag(FLAGS_log_level));
      !logging.ok()) {
    return Fail(logging);
  }
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    return Fail(absl::InvalidArgumentError(
        "no model given: pass --model=DIR, a folder that --export or ModelCheckpoint wrote"));
  }
  const std::string output = absl::GetFlag(FLAGS_output);
  if (!output.empty() && !absl::EndsWith(output, ".csv") && !absl::EndsWith(output, ".npy")) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--output ", output, " is neither .csv nor .npy: name the file so")));
  }
  if (!output.empty()) {
    if (absl::Status s = CheckWritableFileFolder(output, "--output"); !s.ok()) return Fail(s);
  }
  if (absl::GetFlag(FLAGS_batch_size) < 1) {
    return Fail(absl::InvalidArgumentError("--batch_size must be 1 or more"));
  }
  absl::StatusOr<std::pair<Model, std::vector<Tensor>>> loaded = LoadExport(dir);
  if (!loaded.ok()) return Fail(loaded.status());
  const Model& model = loaded->first;
  const std::vector<Tensor>& variables = loaded->second;
  absl::StatusOr<Examples> examples = LoadExamples(model);
  if (!examples.ok()) return Fail(examples.status());
  const double rescale =
      absl::GetFlag(FLAGS_rescale) > 0 ? absl::GetFlag(FLAGS_rescale) : examples->rescale;
  nlohmann::json loss_json = examples->loss;
  if (!absl::GetFlag(FLAGS_loss).empty()) loss_json = absl::GetFlag(FLAGS_loss);
  if (loss_json.is_null()) {
    loss_json = model.output_size() > 1 ? "sparse_categorical_crossentropy" : "binary_crossentropy";
  }
  absl::StatusOr<Loss> loss = Loss::FromKeras(loss_json);
  if (!loss.ok()) return Fail(loss.status());

  const Dataset batches = MakeBatches(examples->data, model, absl::GetFlag(FLAGS_batch_size),
                                      rescale, /*shuffle_buffer=*/0, /*seed=*/0, /*repeat=*/false);
  std::unique_ptr<Workspace> workspace = model.NewWorkspace(0);
  std::vector<float> outputs;
  StepStats stats{};
  int64_t rows = 0;
  const int64_t columns = model.output_size();
  if (!batches.status().ok()) return Fail(batches.status());
  const std::unique_ptr<Iterator> iterator = batches.MakeIterator();
  for (;;) {
    absl::StatusOr<std::optional<Element>> batch = iterator->GetNext();
    if (!batch.ok()) return Fail(batch.status());
    if (!batch->has_value()) break;
    const Element& element = **batch;
    absl::StatusOr<Tensor> predicted = model.Predict(variables, element[0], *workspace);
    if (!predicted.ok()) return Fail(predicted.status());
    outputs.insert(outputs.end(), predicted->data<float>(),
                   predicted->data<float>() + predicted->num_elements());
    rows += predicted->rows();
    if (examples->labelled) {
      absl::StatusOr<StepStats> evaluated =
          model.Evaluate(variables, element[0], element[1], *loss, *workspace);
      if (!evaluated.ok()) return Fail(evaluated.status());
      Accumulate(stats, *evaluated);
    }
  }
  if (examples->labelled && stats.examples > 0) {
    const double seen = static_cast<double>(stats.examples);
    std::printf("%lld examples: accuracy %.4f, loss %.4f\n", static_cast<long long>(rows),
                static_cast<double>(stats.correct) / seen, stats.loss_sum / seen);
  } else {
    std::printf("%lld examples predicted (no labels: nothing to evaluate)\n",
                static_cast<long long>(rows));
  }
  if (output.empty()) return kExitSuccess;
  std::string text;
  if (absl::EndsWith(output, ".npy")) {
    text = NpyOf(outputs, rows, columns);
  } else {
    text = "predicted";
    for (int64_t c = 0; c < columns; ++c) absl::StrAppend(&text, ",output_", c);
    text += "\n";
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = outputs.data() + r * columns;
      const int64_t predicted =
          columns > 1 ? std::max_element(row, row + columns) - row : (row[0] > 0.5f ? 1 : 0);
      absl::StrAppend(&text, predicted);
      for (int64_t c = 0; c < columns; ++c) absl::StrAppend(&text, ",", PythonFloat(row[c]));
      text += "\n";
    }
  }
  if (absl::Status written = WriteFileAtomically(output, text); !written.ok()) return Fail(written);
  std::printf("wrote the outputs of %lld examples to %s\n", static_cast<long long>(rows),
              output.c_str());
  return kExitSuccess;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(
      argc, argv,
      "stratum-predict: evaluates and predicts with an exported model.\n"
      "  stratum-predict --model=DIR --job=JOB.json [--output=out.npy]\n"
      "  stratum-predict --model=DIR --images=X.gz [--labels=Y.gz] [--output=out.csv]\n"
      "Exit codes: 0 success, 1 failure, 2 configuration error.");
  return stratum::Run();
}
