// Parameter-server training of the reference model on a local cluster (2 ps, 1 or 2
// workers, asynchronous): examples/s and test accuracy after 10 epochs of data, beside
// stratum-train in one process on the same machine. One JSON object per figure. With
// --model_from (an example job, such as examples/fashion_mnist_cnn.json), its model and
// compile settings replace the reference model's, and the 2-worker run's speed over the
// 1-worker run's is held to issue 30's scaling goal for the CNN (1.5x). With --tls, the
// same job (1 worker, 2 ps) in plaintext and under mutual TLS (certificates from
// deploy/make_tls_certs.sh), taking turns, and TLS's examples/s over plaintext's, held to
// issue 36's goal (0.75x).
//
//   build/bin/ps_train_bench [--epochs=10] [--model_from=examples/fashion_mnist_cnn.json]
//   build/bin/ps_train_bench --tls [--epochs=3]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"
#include "stratum/util/flags.h"

ABSL_FLAG(int, epochs, 10, "Epochs of data");
ABSL_FLAG(bool, tls, false,
          "Compare the PS job in plaintext and under mutual TLS instead (1 worker, 2 ps)");
ABSL_FLAG(std::string, model_from, "",
          "An example job (path from the source folder) whose model and compile replace the "
          "reference model's");

namespace stratum {
namespace {

absl::StatusOr<nlohmann::json> RunForSummary(std::vector<std::string> argv,
                                             const std::string& summary) {
  absl::StatusOr<std::string> output = bench::RunProgram(std::move(argv), absl::Minutes(15));
  if (!output.ok()) return output.status();
  std::ifstream file(summary);
  return nlohmann::json::parse(file);
}

void Print(const std::string& name, double value, const std::string& unit, double goal,
           const std::string& setup) {
  bench::PrintFigure(name, value, unit, goal > 0 ? nlohmann::json(goal) : nlohmann::json(),
                     goal > 0 ? "at_least" : "reported", setup);
}

// The job with 1 worker and 2 ps, in plaintext and under mutual TLS, in turns (plaintext,
// TLS, TLS, plaintext): each mode's best examples/s, and TLS's over plaintext's.
int CompareTls(const std::string& job_path, const std::string& summary, int epochs) {
  const std::string bin = STRATUM_BIN_DIR;
  const std::string certs = "/tmp/ps_train_bench_certs";
  if (const absl::Status made = bench::MakeCertificates(STRATUM_SOURCE_DIR, certs); !made.ok()) {
    std::fprintf(stderr, "ps_train_bench: %s\n", std::string(made.message()).c_str());
    return 1;
  }
  double best[2] = {0, 0};  // plaintext, TLS
  for (const bool tls : {false, true, true, false}) {
    std::vector<std::string> argv = {bin + "/stratum-launch", "--job=" + job_path,
                                     "--workers=1",           "--ps=2",
                                     "--log_level=warn",      "--summary-json=" + summary};
    if (tls) {
      argv.insert(argv.end(), {"--tls_cert=" + certs + "/tls.crt",
                               "--tls_key=" + certs + "/tls.key", "--tls_ca=" + certs + "/ca.crt"});
    }
    auto result = RunForSummary(std::move(argv), summary);
    if (!result.ok()) {
      std::fprintf(stderr, "ps_train_bench: %s\n", std::string(result.status().message()).c_str());
      return 1;
    }
    best[tls] = std::max(best[tls], (*result)["examples_per_sec"].get<double>());
  }
  const std::string setup =
      absl::StrCat("1 worker, 2 ps on this host, ", epochs,
                   " epochs of examples/fashion_mnist_ps.json; best of 2 runs each, taking turns");
  Print("ps_training_plaintext_examples_per_sec", best[0], "examples/s", 0, setup);
  Print("ps_training_tls_examples_per_sec", best[1], "examples/s", 0, setup);
  Print("ps_training_tls_vs_plaintext", best[1] / best[0], "x", 0.75, setup);
  return 0;
}

int Run() {
  const std::string bin = STRATUM_BIN_DIR;
  const int epochs = absl::GetFlag(FLAGS_epochs);
  std::ifstream in(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_ps.json");
  nlohmann::json job = nlohmann::json::parse(in);
  job.erase("checkpoint");  // measure training, from scratch
  const std::string model_from = absl::GetFlag(FLAGS_model_from);
  if (!model_from.empty()) {
    bench::UseModelOf(std::string(STRATUM_SOURCE_DIR) + "/" + model_from, job);
  }
  const std::string job_path = "/tmp/ps_train_bench_job.json";
  std::ofstream(job_path) << job.dump();
  const std::string summary = "/tmp/ps_train_bench_summary.json";
  if (absl::GetFlag(FLAGS_tls)) {
    job["fit"]["epochs"] = epochs;
    std::ofstream(job_path) << job.dump();
    return CompareTls(job_path, summary, epochs);
  }

  nlohmann::json single_job = job;  // the same job, in one process with the Default strategy
  single_job["strategy"] = {{"type", "default"}};
  const std::string single_path = "/tmp/ps_train_bench_single.json";
  std::ofstream(single_path) << single_job.dump();
  auto single = RunForSummary(
      {bin + "/stratum-train", "--job=" + single_path, absl::StrCat("--epochs=", epochs),
       "--progress=none", "--summary-json=" + summary},
      summary);
  if (!single.ok()) {
    std::fprintf(stderr, "ps_train_bench: %s\n", std::string(single.status().message()).c_str());
    return 1;
  }
  const double single_rate = (*single)["examples_per_sec"];
  Print("stratum_train_examples_per_sec", single_rate, "examples/s", 0,
        "one process, Default strategy, same model, batch and data");
  double one_worker_rate = 0, last_rate = 0;
  for (int workers : {1, 2}) {
    job["fit"]["epochs"] = epochs;
    std::ofstream(job_path) << job.dump();
    auto result = RunForSummary(
        {bin + "/stratum-launch", "--job=" + job_path, absl::StrCat("--workers=", workers),
         "--ps=2", "--log_level=warn", "--summary-json=" + summary},
        summary);
    if (!result.ok()) {
      std::fprintf(stderr, "ps_train_bench: %s\n", std::string(result.status().message()).c_str());
      return 1;
    }
    const double rate = (*result)["examples_per_sec"];
    last_rate = rate;
    const std::string setup =
        absl::StrCat(workers, " worker(s), 2 ps, async, ", epochs,
                     " epochs of data, batch 64, one step per closure, the model of ",
                     model_from.empty() ? "examples/fashion_mnist_ps.json" : model_from);
    Print(absl::StrCat("ps_training_examples_per_sec_", workers, "_workers"), rate, "examples/s", 0,
          setup);
    Print(absl::StrCat("ps_training_vs_stratum_train_", workers, "_workers"), rate / single_rate,
          "x", 0, setup);
    Print(absl::StrCat("ps_training_test_accuracy_", workers, "_workers"),
          (*result)["test_accuracy"], "fraction", workers == 2 && model_from.empty() ? 0.875 : 0,
          setup);
    if (workers == 1) one_worker_rate = rate;
  }
  Print("ps_training_2_vs_1_workers", last_rate / one_worker_rate, "x",
        model_from.empty() ? 0 : 1.5,
        absl::StrCat("examples/s of 2 workers over 1, ",
                     model_from.empty() ? "the reference model" : model_from));
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv, "ps_train_bench: PS training speed and accuracy, as JSON");
  return stratum::Run();
}
