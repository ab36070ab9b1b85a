// The convolutional network of TensorFlow's "Custom training with tf.distribute.Strategy"
// tutorial (Conv2D 32 3x3 relu, MaxPooling2D, Conv2D 64 3x3 relu, MaxPooling2D, Flatten,
// Dense 64 relu, Dense 10; Adam 1e-3; batch 64; without the tutorial's L2 regularizers, as
// the anchor has none) on Fashion-MNIST: stratum-train against the PyTorch anchor
// (shared/peers/fmnist_cnn_torch.py, Keras' initialisers), side by side, with the same
// threads each: one replica whose convolutions use --threads (strategy.
// intra_op_parallelism_threads) against torch.set_num_threads(--threads).
//
//   build/bin/cnn_bench [--epochs=1] [--threads=1] [--peers_dir=../shared/peers]
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, epochs, 1, "Epochs of each run (the speed figure is the best epoch's)");
ABSL_FLAG(int, threads, 1, "Intra-op threads of each side");
ABSL_FLAG(std::string, peers_dir, STRATUM_SOURCE_DIR "/../shared/peers",
          "Folder of the anchor programs (fmnist_cnn_torch.py)");

namespace stratum {
namespace {

nlohmann::json Layer(const char* class_name, nlohmann::json config) {
  return {{"class_name", class_name}, {"config", std::move(config)}};
}

nlohmann::json Job(int epochs, int threads) {
  std::ifstream example(STRATUM_SOURCE_DIR "/examples/fashion_mnist.json");
  nlohmann::json job = nlohmann::json::parse(example);
  const nlohmann::json conv = {{"kernel_size", 3}, {"activation", "relu"}};
  nlohmann::json conv32 = conv, conv64 = conv;
  conv32["filters"] = 32;
  conv64["filters"] = 64;
  job["model"] = {{"class_name", "Sequential"},
                  {"config",
                   {{"name", "cnn"},
                    {"layers",
                     {Layer("InputLayer", {{"batch_input_shape", {nullptr, 28, 28}}}),
                      Layer("Reshape", {{"target_shape", {28, 28, 1}}}), Layer("Conv2D", conv32),
                      Layer("MaxPooling2D", nlohmann::json::object()), Layer("Conv2D", conv64),
                      Layer("MaxPooling2D", nlohmann::json::object()),
                      Layer("Flatten", nlohmann::json::object()),
                      Layer("Dense", {{"units", 64}, {"activation", "relu"}}),
                      Layer("Dense", {{"units", 10}})}}}}};
  job["compile"]["loss"] = {{"class_name", "SparseCategoricalCrossentropy"},
                            {"config", {{"from_logits", true}}}};
  job["fit"]["epochs"] = epochs;
  job["strategy"] = {{"type", "default"}, {"intra_op_parallelism_threads", threads}};
  return job;
}

int Run() {
  const int epochs = absl::GetFlag(FLAGS_epochs);
  const int threads = absl::GetFlag(FLAGS_threads);
  const std::string per_threads = threads == 1 ? "one_thread" : absl::StrCat(threads, "_threads");
  const std::string job_path = "/tmp/cnn_bench_job.json";
  const std::string summary_path = "/tmp/cnn_bench_summary.json";
  std::ofstream(job_path) << Job(epochs, threads).dump();
  auto ours =
      bench::RunProgram({std::string(STRATUM_BIN_DIR) + "/stratum-train", "--job=" + job_path,
                         "--progress=none", "--summary-json=" + summary_path});
  if (!ours.ok()) {
    std::fprintf(stderr, "cnn_bench: %s\n", std::string(ours.status().message()).c_str());
    return 1;
  }
  std::ifstream summary_file(summary_path);
  const nlohmann::json summary = nlohmann::json::parse(summary_file);
  double best = 0;
  for (const nlohmann::json& epoch : summary["history"]) {
    best = std::max(best, epoch["examples_per_sec"].get<double>());
  }
  const std::string setup = absl::StrCat("the custom-training tutorial's CNN, batch 64, ", epochs,
                                         " epoch(s), best epoch, ", threads, " thread(s)");
  bench::PrintFigure("cnn_stratum_train_examples_per_sec_" + per_threads, best, "examples/s",
                     nullptr, "report", "stratum-train, " + setup);
  bench::PrintFigure("cnn_stratum_test_accuracy", summary["test_accuracy"].get<double>(),
                     "fraction", nullptr, "report", "stratum-train, " + setup);
  auto anchor = bench::RunProgram({"/usr/bin/python3",
                                   absl::GetFlag(FLAGS_peers_dir) + "/fmnist_cnn_torch.py",
                                   std::to_string(epochs), std::to_string(threads)});
  if (!anchor.ok()) {
    std::fprintf(stderr, "cnn_bench: PyTorch anchor not run (%s); install python3-torch\n",
                 std::string(anchor.status().message()).c_str());
    return 0;
  }
  static const std::regex kEpoch(R"(samples_per_s ([0-9.]+) test_acc ([0-9.]+))");
  double theirs = 0, their_accuracy = 0;
  for (std::sregex_iterator it(anchor->begin(), anchor->end(), kEpoch), end; it != end; ++it) {
    theirs = std::max(theirs, std::stod((*it)[1]));
    their_accuracy = std::stod((*it)[2]);
  }
  bench::PrintFigure("cnn_pytorch_examples_per_sec_" + per_threads, theirs, "examples/s", nullptr,
                     "anchor (2,083 on one thread, 2,714 on two, seen on an idle machine)",
                     "shared/peers/fmnist_cnn_torch.py, " + setup);
  bench::PrintFigure("cnn_pytorch_test_accuracy", their_accuracy, "fraction", nullptr, "anchor",
                     "shared/peers/fmnist_cnn_torch.py, " + setup);
  bench::PrintFigure("cnn_speedup_vs_pytorch_" + per_threads, best / theirs, "x", 2.0, "at_least",
                     "stratum-train / PyTorch, measured side by side");
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return stratum::Run();
}
