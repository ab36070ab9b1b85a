// Reading TFRecord shards of tf.train.Example (issue "Real input"): Fashion-MNIST written
// by the converter as uint8 images in bytes features and int64 labels.
//   1. read + parse, one thread, uncompressed and GZIP: MB/s of records (goal >= 400);
//   2. training throughput of the reference model (stratum-train, default strategy) from
//      TFRecord shards against the same job from IDX, alternating in one run (goal >= 0.9);
//   3. peak RSS of stratum-train training from about 2 GB of TFRecord shards (goal < 300 MiB).
//
//   build/bin/tfrecord_bench [--dir=/tmp/stratum_tfrecord_bench] [--rounds=3] [--big_gb=2]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "stratum/data/convert.h"
#include "stratum/data/idx.h"
#include "stratum/data/record_files.h"
#include "stratum/util/flags.h"
#include "stratum/util/status_macros.h"

ABSL_FLAG(std::string, dir, "/tmp/stratum_tfrecord_bench", "Where the shards are written");
ABSL_FLAG(int, rounds, 3, "Rounds of the side-by-side training runs");
ABSL_FLAG(double, big_gb, 2.0, "Size of the data set of the memory figure (0 skips it)");
ABSL_FLAG(int, epochs, 2, "Epochs of each training run");

namespace stratum {
namespace {

constexpr char kData[] = "/usr/share/datasets/fashion-mnist/";

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::StatusOr<std::vector<std::string>> WriteFashionMnist(const std::string& prefix, int shards,
                                                           Compression compression, int copies) {
  STRATUM_ASSIGN_OR_RETURN(Tensor images,
                           ReadIdxFile(absl::StrCat(kData, "train-images-idx3-ubyte.gz")));
  STRATUM_ASSIGN_OR_RETURN(Tensor labels,
                           ReadIdxFile(absl::StrCat(kData, "train-labels-idx1-ubyte.gz")));
  Dataset examples = Dataset::FromTensorSlices({images, labels}).Repeat(copies);
  ConvertOptions options{.out_prefix = prefix, .shards = shards, .compression = compression};
  return WriteTFRecordShards(examples, images.rows() * copies, options);
}

std::vector<FeatureSpec> ImageSpecs() {
  return *ParseFeatureSpecs(
      {{"image", {{"dtype", "string"}, {"decode_raw", "uint8"}, {"shape", {28, 28}}}},
       {"label", {{"dtype", "int64"}, {"shape", nlohmann::json::array()}}}},
      "features");
}

int64_t Bytes(const std::vector<std::string>& files) {
  int64_t total = 0;
  for (const std::string& f : files) total += static_cast<int64_t>(std::filesystem::file_size(f));
  return total;
}

// MB/s of records (uncompressed bytes of the TFRecord stream) read and parsed on one thread.
absl::StatusOr<double> ReadRate(const std::vector<std::string>& files, Compression compression,
                                int64_t stream_bytes) {
  const auto format = TFRecordExamples(compression, ImageSpecs());
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const double start = Now();
    auto iterator = RecordFilesDataset(files, format).MakeIterator();
    int64_t n = 0;
    while (true) {
      STRATUM_ASSIGN_OR_RETURN(std::optional<Element> next, iterator->GetNext());
      if (!next) break;
      ++n;
    }
    const double seconds = Now() - start;
    if (n != 60000) return absl::InternalError(absl::StrCat("read ", n, " examples"));
    best = std::max(best, static_cast<double>(stream_bytes) / 1e6 / seconds);
  }
  return best;
}

nlohmann::json ReferenceJob() {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["fit"]["epochs"] = absl::GetFlag(FLAGS_epochs);
  job["fit"]["shuffle_buffer"] = 10000;
  return job;
}

nlohmann::json TFRecordSource(const std::string& pattern) {
  return {
      {"format", "tfrecord"},
      {"files", {pattern}},
      {"features",
       {{"image",
         {{"type", "FixedLenFeature"},
          {"dtype", "string"},
          {"decode_raw", "uint8"},
          {"shape", {28, 28}}}},
        {"label",
         {{"type", "FixedLenFeature"}, {"dtype", "int64"}, {"shape", nlohmann::json::array()}}}}},
      {"label_key", "label"},
      {"interleave", {{"cycle_length", 4}, {"block_length", 16}}}};
}

struct TrainResult {
  double examples_per_sec = 0;
  double peak_rss_mib = 0;
};

// stratum-train on `job`, its examples/s from the summary and its peak RSS (VmHWM, polled).
absl::StatusOr<TrainResult> Train(const nlohmann::json& job, const std::string& dir) {
  const std::string job_path = dir + "/job.json";
  const std::string summary = dir + "/summary.json";
  std::ofstream(job_path) << job.dump();
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/stratum-train", "--job=" + job_path,
                  "--summary_json=" + summary, "--progress=none"};
  options.forward_fd = -1;
  options.capture_output = true;
  STRATUM_ASSIGN_OR_RETURN(auto process, Subprocess::Spawn(std::move(options)));
  double peak_kib = 0;
  std::optional<ExitInfo> exit;
  while (!(exit = process->Poll())) {
    std::ifstream status(absl::StrCat("/proc/", process->pid(), "/status"));
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmHWM:", 0) == 0) peak_kib = std::max(peak_kib, std::stod(line.substr(6)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!exit->success()) return absl::InternalError(process->output());
  std::ifstream file(summary);
  const nlohmann::json result = nlohmann::json::parse(file);
  return TrainResult{result["examples_per_sec"].get<double>(), peak_kib / 1024};
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "tfrecord_bench: %s\n", std::string(s.message()).c_str());
    std::filesystem::remove_all(dir);
    return 1;
  };
  absl::StatusOr<std::vector<std::string>> plain =
      WriteFashionMnist(dir + "/train", 8, Compression::kNone, 1);
  if (!plain.ok()) return fail(plain.status());
  absl::StatusOr<std::vector<std::string>> gzip =
      WriteFashionMnist(dir + "/gz", 8, Compression::kGzip, 1);
  if (!gzip.ok()) return fail(gzip.status());
  const int64_t stream = Bytes(*plain);
  const std::string setup = absl::StrCat("Fashion-MNIST train, 60000 tf.Examples in 8 shards (",
                                         stream / 1000000, " MB of records), one thread");
  absl::StatusOr<double> rate = ReadRate(*plain, Compression::kNone, stream);
  if (!rate.ok()) return fail(rate.status());
  bench::PrintFigure("tfrecord_read_parse_mb_per_s", *rate, "MB/s", 400, "at_least", setup);
  absl::StatusOr<double> gz_rate = ReadRate(*gzip, Compression::kGzip, stream);
  if (!gz_rate.ok()) return fail(gz_rate.status());
  bench::PrintFigure("tfrecord_gzip_read_parse_mb_per_s", *gz_rate, "MB/s of records", nullptr,
                     "at_least",
                     absl::StrCat(setup, ", GZIP (", Bytes(*gzip) / 1000000, " MB on disk)"));

  nlohmann::json idx_job = ReferenceJob();
  nlohmann::json tfrecord_job = ReferenceJob();
  tfrecord_job["data"]["train"] = TFRecordSource(dir + "/train-*.tfrecord");
  tfrecord_job["data"].erase("rescale");
  std::vector<double> idx_rates, tfrecord_rates;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    absl::StatusOr<TrainResult> a = Train(idx_job, dir);
    if (!a.ok()) return fail(a.status());
    absl::StatusOr<TrainResult> b = Train(tfrecord_job, dir);
    if (!b.ok()) return fail(b.status());
    idx_rates.push_back(a->examples_per_sec);
    tfrecord_rates.push_back(b->examples_per_sec);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const std::string train_setup = absl::StrCat(
      "stratum-train, reference model (Dense 128, Adam, batch 64), ", absl::GetFlag(FLAGS_epochs),
      " epochs, shuffle_buffer 10000, medians of ", idx_rates.size(),
      " alternating runs; TFRecord: 8 shards, interleave cycle 4 block 16");
  bench::PrintFigure("train_examples_per_s_idx", median(idx_rates), "examples/s", nullptr,
                     "at_least", train_setup);
  bench::PrintFigure("train_examples_per_s_tfrecord", median(tfrecord_rates), "examples/s", nullptr,
                     "at_least", train_setup);
  bench::PrintFigure("train_tfrecord_over_idx", median(tfrecord_rates) / median(idx_rates), "x",
                     0.9, "at_least", train_setup);

  const double big_gb = absl::GetFlag(FLAGS_big_gb);
  if (big_gb > 0) {
    const int copies = std::max(1, static_cast<int>(big_gb * 1e9 / static_cast<double>(stream)));
    std::filesystem::remove_all(dir + "/gz-00000-of-00008.tfrecord.gz");
    absl::StatusOr<std::vector<std::string>> big =
        WriteFashionMnist(dir + "/big", 4 * copies, Compression::kNone, copies);
    if (!big.ok()) return fail(big.status());
    nlohmann::json big_job = tfrecord_job;
    big_job["data"]["train"]["files"] = {dir + "/big-*.tfrecord"};
    big_job["fit"]["epochs"] = 1;
    big_job["fit"]["steps_per_epoch"] = 3000;
    absl::StatusOr<TrainResult> run = Train(big_job, dir);
    if (!run.ok()) return fail(run.status());
    bench::PrintFigure(
        "train_peak_rss_mib_2gb_tfrecord", run->peak_rss_mib, "MiB", 300, "at_most",
        absl::StrCat("stratum-train on ", Bytes(*big) / 1000000, " MB of TFRecord shards (",
                     big->size(), " files, ", 60000 * copies,
                     " examples), 3000 steps, shuffle_buffer 10000; peak RSS (VmHWM)"));
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv,
                            "tfrecord_bench: TFRecord read/parse speed, training from TFRecord "
                            "against IDX, and memory on 2 GB of shards");
  return stratum::Main();
}
