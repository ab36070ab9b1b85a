// MultiWorkerMirrored training of the reference model on a local cluster: examples/s and
// test accuracy with 1, 2 and 4 workers (synchronous, all-reduce over loopback TCP), plus
// the accuracy goal's run (2 workers, 10 epochs). Each run starts from scratch through
// stratum-launch --job; one JSON object per figure. With --model_from (an example job, such
// as examples/fashion_mnist_cnn_mwms.json), its model and compile settings replace the
// reference model's, and 2 workers' speed over 1 worker's is held to issue 30's scaling
// goal for the CNN (1.6x).
//
//   build/bin/mwms_train_bench [--epochs=3] [--workers=1,2,4] [--accuracy_epochs=10]
//                              [--model_from=examples/fashion_mnist_cnn_mwms.json]
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"
#include "stratum/util/flags.h"

ABSL_FLAG(int, epochs, 3, "Epochs of data for the examples/s runs (short, to keep it quick)");
ABSL_FLAG(std::string, workers, "1,2,4", "Worker counts for the examples/s runs");
ABSL_FLAG(std::string, model_from, "",
          "An example job (path from the source folder) whose model and compile replace the "
          "reference model's");
ABSL_FLAG(int, accuracy_epochs, 10,
          "Epochs of the 2-worker run held to the accuracy goal; 0 skips it");

namespace stratum {
namespace {

constexpr double kAccuracyGoal = 0.875;

absl::StatusOr<nlohmann::json> RunForSummary(std::vector<std::string> argv,
                                             const std::string& summary) {
  std::remove(summary.c_str());
  absl::StatusOr<std::string> output = bench::RunProgram(std::move(argv), absl::Minutes(30));
  if (!output.ok()) return output.status();
  std::ifstream file(summary);
  if (!file) return absl::NotFoundError(absl::StrCat("the chief wrote no summary at ", summary));
  return nlohmann::json::parse(file);
}

// Trains `epochs` with `workers`; the chief's summary.
absl::StatusOr<nlohmann::json> Train(nlohmann::json job, int workers, int epochs) {
  const std::string bin = STRATUM_BIN_DIR;
  job["fit"]["epochs"] = epochs;
  const std::string job_path = "/tmp/mwms_train_bench_job.json";
  std::ofstream(job_path) << job.dump();
  const std::string summary = "/tmp/mwms_train_bench_summary.json";
  return RunForSummary(
      {bin + "/stratum-launch", "--job=" + job_path, absl::StrCat("--workers=", workers),
       "--log_level=warn", "--summary-json=" + summary},
      summary);
}

// Prints the run's examples/s and test accuracy; accuracy is held to the goal when `goal`.
void Report(const nlohmann::json& summary, int workers, int epochs, bool goal) {
  const std::string setup =
      absl::StrCat(workers, " worker(s), MultiWorkerMirrored, RING over loopback TCP, ", epochs,
                   " epochs, batch 64 per replica, examples/s over all workers, the model of ",
                   absl::GetFlag(FLAGS_model_from).empty() ? "examples/fashion_mnist_mwms.json"
                                                           : absl::GetFlag(FLAGS_model_from));
  const std::string suffix = absl::StrCat(workers, "_workers_", epochs, "_epochs");
  bench::PrintFigure(absl::StrCat("mwms_training_examples_per_sec_", suffix),
                     summary.value("examples_per_sec", 0.0), "examples/s", nlohmann::json(),
                     "reported", setup);
  bench::PrintFigure(absl::StrCat("mwms_training_test_accuracy_", suffix),
                     summary.value("test_accuracy", 0.0), "fraction",
                     goal ? nlohmann::json(kAccuracyGoal) : nlohmann::json(),
                     goal ? "at_least" : "reported", setup);
}

int Run() {
  std::ifstream in(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_mwms.json");
  nlohmann::json job = nlohmann::json::parse(in);
  job.erase("checkpoint");  // measure training from scratch, never resume an old run
  const std::string model_from = absl::GetFlag(FLAGS_model_from);
  if (!model_from.empty()) {
    bench::UseModelOf(std::string(STRATUM_SOURCE_DIR) + "/" + model_from, job);
  }

  std::vector<std::pair<int, int>> runs;  // (workers, epochs)
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',')) {
    runs.emplace_back(std::stoi(std::string(part)), absl::GetFlag(FLAGS_epochs));
  }
  if (absl::GetFlag(FLAGS_accuracy_epochs) > 0) {
    runs.emplace_back(2, absl::GetFlag(FLAGS_accuracy_epochs));
  }
  std::map<int, double> rates;  // of the examples/s runs, by workers
  for (const auto& [workers, epochs] : runs) {
    absl::StatusOr<nlohmann::json> summary = Train(job, workers, epochs);
    if (!summary.ok()) {
      std::fprintf(stderr, "mwms_train_bench: %d workers: %s\n", workers,
                   std::string(summary.status().message()).c_str());
      return 1;
    }
    Report(*summary, workers, epochs, workers == 2 && epochs >= 10 && model_from.empty());
    if (epochs == absl::GetFlag(FLAGS_epochs))
      rates[workers] = summary->value("examples_per_sec", 0.0);
  }
  if (rates.count(1) > 0 && rates.count(2) > 0) {
    bench::PrintFigure("mwms_training_2_vs_1_workers", rates[2] / rates[1], "x",
                       model_from.empty() ? nlohmann::json() : nlohmann::json(1.6),
                       model_from.empty() ? "reported" : "at_least",
                       absl::StrCat("examples/s of 2 workers over 1, ",
                                    model_from.empty() ? "the reference model" : model_from));
  }
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv,
                            "mwms_train_bench: MultiWorkerMirrored training speed and accuracy");
  return stratum::Run();
}
