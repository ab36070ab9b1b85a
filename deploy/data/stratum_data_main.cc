// stratum-data: data-set tools.
//   stratum-data convert: writes an IDX or CSV data set as TFRecord shards of tf.Example
//     (what TensorFlow input pipelines read), and prints the job file's "data.train" entry
//     that reads them.
//   stratum-data count: the examples of TFRecord, CSV or text-line files, each TFRecord
//     file's CRCs checked.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "stratum/data/convert.h"
#include "stratum/data/csv.h"
#include "stratum/data/idx.h"
#include "stratum/data/record_files.h"
#include "stratum/data/text_lines.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/flags.h"

ABSL_FLAG(std::string, from, "idx", "convert: the input format, idx or csv");
ABSL_FLAG(std::string, images, "", "convert --from=idx: the IDX images file (gzipped or not)");
ABSL_FLAG(std::string, labels, "", "convert --from=idx: the IDX labels file");
ABSL_FLAG(std::string, files, "",
          "convert --from=csv, count: comma-separated files or glob patterns");
ABSL_FLAG(std::string, label_name, "", "convert --from=csv: the label column");
ABSL_FLAG(std::string, out, "",
          "convert: the output prefix; shards are PREFIX-00000-of-0000N.tfrecord[.gz]");
ABSL_FLAG(int, shards, 1, "convert: the number of TFRecord files to write");
ABSL_FLAG(std::string, compression_type, "", "convert, count: \"\", GZIP or ZLIB");
ABSL_FLAG(std::string, format, "tfrecord", "count: tfrecord, csv or text");
ABSL_FLAG(std::string, features, "",
          "head: the feature spec (JSON, as a job file's \"features\") to parse the records with");
ABSL_FLAG(int, n, 5, "head: how many examples to print");

namespace stratum {
namespace {

constexpr char kUsage[] =
    "stratum-data COMMAND [flags]\n"
    "  convert  write an IDX or CSV data set as TFRecord shards of tf.train.Example, e.g.\n"
    "           stratum-data convert --images=/usr/share/datasets/fashion-mnist/"
    "train-images-idx3-ubyte.gz \\\n"
    "             --labels=/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz "
    "--out=data/train --shards=8\n"
    "  count    count the examples of TFRecord, CSV or text-line files (--format, --files)\n"
    "  head     print the first --n examples of TFRecord files parsed with --features, one\n"
    "           JSON object per example";

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "stratum-data: %s\n", std::string(status.message()).c_str());
  return ExitCodeFor(status);
}

absl::StatusOr<std::vector<std::string>> FilesFlag() {
  std::vector<std::string> entries =
      absl::StrSplit(absl::GetFlag(FLAGS_files), ',', absl::SkipEmpty());
  return ResolveDataFiles(entries, "", "--files");
}

// --compression_type, shared by every command.
absl::StatusOr<Compression> CompressionFlag() {
  absl::StatusOr<Compression> compression =
      CompressionFromName(absl::GetFlag(FLAGS_compression_type));
  if (!compression.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--compression_type \"", absl::GetFlag(FLAGS_compression_type),
                     "\" is not a compression: use \"\" (none), GZIP or ZLIB"));
  }
  return compression;
}

int Convert() {
  ConvertOptions options;
  options.out_prefix = absl::GetFlag(FLAGS_out);
  options.shards = absl::GetFlag(FLAGS_shards);
  absl::StatusOr<Compression> compression = CompressionFlag();
  if (!compression.ok()) return Fail(compression.status());
  options.compression = *compression;
  if (options.out_prefix.empty()) {
    return Fail(absl::InvalidArgumentError(
        "no --out given: pass the output prefix, e.g. --out=data/fashion-mnist/train"));
  }
  if (options.shards < 1 || options.shards > 100000) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--shards ", options.shards, " is out of range: use 1 to 100000")));
  }
  Dataset examples;
  int64_t count = 0;
  nlohmann::json source = {{"format", "tfrecord"}};
  const std::string from = absl::GetFlag(FLAGS_from);
  if (from == "idx") {
    if (absl::GetFlag(FLAGS_images).empty() || absl::GetFlag(FLAGS_labels).empty()) {
      return Fail(absl::InvalidArgumentError(
          "--from=idx needs --images and --labels, the IDX files of one data set"));
    }
    absl::StatusOr<Tensor> images = ReadIdxFile(absl::GetFlag(FLAGS_images));
    if (!images.ok()) return Fail(images.status());
    absl::StatusOr<Tensor> labels = ReadIdxFile(absl::GetFlag(FLAGS_labels));
    if (!labels.ok()) return Fail(labels.status());
    if (images->shape().rank() < 1 || labels->rows() != images->rows()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(absl::GetFlag(FLAGS_images), " has ", images->rows(), " images but ",
                       absl::GetFlag(FLAGS_labels), " has ", labels->rows(),
                       " labels: give the labels of these images")));
    }
    count = images->rows();
    examples = Dataset::FromTensorSlices({*std::move(images), *std::move(labels)});
  } else if (from == "csv") {
    absl::StatusOr<std::vector<std::string>> files = FilesFlag();
    if (!files.ok()) return Fail(files.status());
    CsvOptions csv;
    csv.label_name = absl::GetFlag(FLAGS_label_name);
    if (csv.label_name.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--from=csv needs --label_name, the column that holds the labels"));
    }
    absl::StatusOr<std::shared_ptr<const RecordFormat>> format = CsvFormat(files->front(), csv);
    if (!format.ok()) return Fail(format.status());
    absl::StatusOr<std::vector<int64_t>> counts = CountRecords(*files, **format);
    if (!counts.ok()) return Fail(counts.status());
    for (int64_t c : *counts) count += c;
    examples = RecordFilesDataset(*files, *format);
    options.input_key = "features";
    options.label_key = csv.label_name;
  } else {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--from=", from, " is not a format stratum-data converts: use idx or csv")));
  }
  if (count == 0) return Fail(absl::InvalidArgumentError("the input holds no examples"));
  absl::StatusOr<std::optional<Element>> first = examples.MakeIterator()->GetNext();
  if (!first.ok()) return Fail(first.status());
  absl::StatusOr<std::vector<std::string>> written = WriteTFRecordShards(examples, count, options);
  if (!written.ok()) return Fail(written.status());
  for (const std::string& file : *written) std::printf("wrote %s\n", file.c_str());
  source["files"] = {
      absl::StrCat(options.out_prefix, "-*-of-", absl::StrFormat("%05d", options.shards), "*")};
  if (options.compression != Compression::kNone) {
    source["compression_type"] = CompressionName(options.compression);
  }
  source["features"] = FeatureSpecsFor(**first, options);
  source["label_key"] = options.label_key;
  std::printf("%lld examples in %d files; a job reads them with:\n%s\n",
              static_cast<long long>(count), options.shards, source.dump(2).c_str());
  return kExitSuccess;
}

int Count() {
  absl::StatusOr<std::vector<std::string>> files = FilesFlag();
  if (!files.ok()) return Fail(files.status());
  absl::StatusOr<Compression> compression = CompressionFlag();
  if (!compression.ok()) return Fail(compression.status());
  const std::string kind = absl::GetFlag(FLAGS_format);
  std::vector<int64_t> counts;
  if (kind == "tfrecord") {
    absl::StatusOr<std::vector<int64_t>> counted =
        CountRecords(*files, *TFRecordExamples(*compression, {}));
    if (!counted.ok()) return Fail(counted.status());
    counts = *std::move(counted);
  } else if (kind == "csv") {
    CsvOptions csv;  // a header line per file; no column is looked at
    csv.compression = *compression;
    for (const std::string& file : *files) {
      absl::StatusOr<int64_t> rows = CountCsvRows(file, csv);
      if (!rows.ok()) return Fail(rows.status());
      counts.push_back(*rows);
    }
  } else if (kind == "text") {
    for (const std::string& file : *files) {
      absl::StatusOr<int64_t> lines = CountTextLines(file, *compression);
      if (!lines.ok()) return Fail(lines.status());
      counts.push_back(*lines);
    }
  } else {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--format=", kind, " is not one stratum-data counts: use tfrecord, csv or text")));
  }
  int64_t total = 0;
  for (size_t i = 0; i < files->size(); ++i) {
    std::printf("%lld\t%s\n", static_cast<long long>(counts[i]), (*files)[i].c_str());
    total += counts[i];
  }
  std::printf("%lld\ttotal\n", static_cast<long long>(total));
  return kExitSuccess;
}

nlohmann::json Values(const Tensor& t) {
  nlohmann::json values = nlohmann::json::array();
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    switch (t.dtype()) {
      case DType::kFloat32:
        values.push_back(t.data<float>()[i]);
        break;
      case DType::kInt32:
        values.push_back(t.data<int32_t>()[i]);
        break;
      case DType::kInt64:
        values.push_back(t.data<int64_t>()[i]);
        break;
      case DType::kUInt8:
        values.push_back(t.data<uint8_t>()[i]);
        break;
    }
  }
  return values;
}

int Head() {
  absl::StatusOr<std::vector<std::string>> files = FilesFlag();
  if (!files.ok()) return Fail(files.status());
  absl::StatusOr<Compression> compression = CompressionFlag();
  if (!compression.ok()) return Fail(compression.status());
  const nlohmann::json spec =
      nlohmann::json::parse(absl::GetFlag(FLAGS_features), nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<std::vector<FeatureSpec>> features = ParseFeatureSpecs(spec, "--features");
  if (!features.ok()) return Fail(features.status());
  auto iterator =
      RecordFilesDataset(*files, TFRecordExamples(*compression, *features)).MakeIterator();
  for (int i = 0; i < absl::GetFlag(FLAGS_n); ++i) {
    absl::StatusOr<std::optional<Element>> next = iterator->GetNext();
    if (!next.ok()) return Fail(next.status());
    if (!*next) break;
    nlohmann::json line;
    for (size_t f = 0; f < features->size(); ++f) {
      line[(*features)[f].key] = Values((**next)[f]);
    }
    std::printf("%s\n", line.dump().c_str());
  }
  return kExitSuccess;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  using namespace stratum;
  std::string command;
  if (argc > 1 && argv[1][0] != '-') {
    command = argv[1];
    for (int i = 1; i + 1 < argc; ++i) argv[i] = argv[i + 1];
    --argc;
  }
  ParseFlagsOrExit(argc, argv, kUsage);
  if (command == "convert") return Convert();
  if (command == "count") return Count();
  if (command == "head") return Head();
  std::fprintf(stderr, "stratum-data: %s: give a command, convert, count or head\n%s\n",
               command.empty() ? "no command" : ("unknown command \"" + command + "\"").c_str(),
               kUsage);
  return kExitUsage;
}
