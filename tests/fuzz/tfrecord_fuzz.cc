// TFRecord files of tf.train.Example records, as a job's data source reads them: the
// first byte picks the compression (none, GZIP, ZLIB), the rest is the file. Any bytes are
// examples that fit the features or an error naming the file and offset, never a crash.
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "fuzz_file.h"
#include "nlohmann/json.hpp"
#include "stratum/data/example.h"
#include "stratum/data/record_files.h"

namespace {

// A spec with each kind of feature: a required decoded image, defaults, a padded id list.
const std::shared_ptr<const stratum::RecordFormat>& Format(stratum::Compression compression) {
  static const std::vector<stratum::FeatureSpec> specs = [] {
    const nlohmann::json features = nlohmann::json::parse(R"({
      "image": {"type": "FixedLenFeature", "dtype": "string", "decode_raw": "uint8", "shape": [28, 28]},
      "label": {"type": "FixedLenFeature", "dtype": "int64", "shape": [], "default_value": 0},
      "ids": {"type": "VarLenFeature", "dtype": "int64", "pad_to": 8},
      "score": {"type": "FixedLenFeature", "dtype": "float32", "shape": [2], "default_value": [0, 1]}
    })");
    absl::StatusOr<std::vector<stratum::FeatureSpec>> parsed =
        stratum::ParseFeatureSpecs(features, "fuzz.features");
    if (!parsed.ok()) std::abort();
    return *parsed;
  }();
  static const std::shared_ptr<const stratum::RecordFormat> formats[] = {
      stratum::TFRecordExamples(stratum::Compression::kNone, specs),
      stratum::TFRecordExamples(stratum::Compression::kGzip, specs),
      stratum::TFRecordExamples(stratum::Compression::kZlib, specs)};
  return formats[static_cast<int>(compression)];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto compression = static_cast<stratum::Compression>(data[0] % 3);
  const std::string path = stratum::fuzz::WriteInput("input.tfrecord", data + 1, size - 1);
  const stratum::RecordFormat& format = *Format(compression);
  absl::StatusOr<std::unique_ptr<stratum::ExampleReader>> reader = format.Open(path);
  if (!reader.ok()) return 0;
  int64_t read = 0;
  for (;;) {
    absl::StatusOr<std::optional<stratum::Element>> example = (*reader)->Next();
    if (!example.ok() || !example->has_value()) break;
    ++read;
  }
  // Counting reads the same framing without parsing: never fewer records than parsed.
  absl::StatusOr<int64_t> counted = format.Count(path);
  if (counted.ok() && *counted < read) std::abort();
  return 0;
}
