// Training speed of the reference model (Flatten 28x28 -> Dense 128 relu -> Dense 10
// softmax, Adam 1e-3; examples/fashion_mnist.json) on one GPU through Fit, at batch 64 and
// 1024, side by side with PyTorch on the same GPU (shared/peers/fmnist_torch_gpu.py, data
// resident on the GPU) in the same run; and MirroredStrategy over 2 logical GPUs of one GPU,
// its overhead per step against one device at the same global batch. examples/s are the
// median of epochs 2..N, as the anchor's. One JSON object per figure.
//
//   gpu_train_bench --data_dir=DIR [--epochs=5] [--torch_script=PATH] [--job=PATH]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "stratum/util/devices.h"
#include "stratum/util/flags.h"
#include "stratum/worker/fit.h"
#include "stratum/worker/mirrored_strategy.h"
#include "stratum/worker/training_job.h"

ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Folder of the four Fashion-MNIST .gz files");
ABSL_FLAG(std::string, job, STRATUM_SOURCE_DIR "/examples/fashion_mnist.json",
          "The reference job (its model and optimizer)");
ABSL_FLAG(std::string, torch_script, STRATUM_SOURCE_DIR "/../shared/peers/fmnist_torch_gpu.py",
          "The PyTorch anchor; empty skips it");
ABSL_FLAG(int, epochs, 5, "Epochs per figure (examples/s: the median of epochs 2..N)");

namespace stratum {
namespace {

double MedianRate(const FitSummary& summary) {
  std::vector<double> rates;
  for (size_t i = summary.history.size() > 1 ? 1 : 0; i < summary.history.size(); ++i) {
    rates.push_back(summary.history[i].examples_per_sec);
  }
  std::sort(rates.begin(), rates.end());
  return rates.empty() ? 0 : rates[rates.size() / 2];
}

struct Job {
  Model model;
  Loss loss;
  std::unique_ptr<Optimizer> optimizer;
  FitData data;
};

absl::StatusOr<FitSummary> Train(Job& job, Strategy& strategy, int64_t per_replica, int epochs) {
  FitOptions options;
  options.epochs = epochs;
  options.batch_size_per_replica = per_replica;
  options.validate = false;
  options.progress = ProgressStyle::kNone;
  return Fit(strategy, job.model, job.loss, *job.optimizer, job.data, options);
}

int Run() {
  const int epochs = std::max(absl::GetFlag(FLAGS_epochs), 2);
  if (VisibleGpuCount() == 0) {
    std::fprintf(stderr, "gpu_train_bench: no GPU is visible: run it on a machine with one\n");
    return 2;
  }
  absl::StatusOr<JobSpec> spec = LoadJobSpec(absl::GetFlag(FLAGS_job));
  if (!spec.ok()) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  const std::string dir = absl::GetFlag(FLAGS_data_dir) + "/";
  spec->data.train.images = dir + "train-images-idx3-ubyte.gz";
  spec->data.train.labels = dir + "train-labels-idx1-ubyte.gz";
  spec->data.test.images = dir + "t10k-images-idx3-ubyte.gz";
  spec->data.test.labels = dir + "t10k-labels-idx1-ubyte.gz";
  absl::StatusOr<FitData> data = LoadFitData(spec->data, *Model::FromKerasJson(spec->model));
  if (!data.ok()) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", std::string(data.status().message()).c_str());
    return 2;
  }
  Job job{*Model::FromKerasJson(spec->model), *Loss::FromKeras(spec->loss),
          *Optimizer::FromKeras(spec->optimizer), *std::move(data)};

  // The anchor first, in the same device session.
  std::map<int, double> torch_rate;
  std::map<int, double> torch_accuracy;
  const std::string script = absl::GetFlag(FLAGS_torch_script);
  if (!script.empty()) {
    // RunProgram does not search PATH: env finds python3 there.
    auto output =
        bench::RunProgram({"/usr/bin/env", "python3", script, absl::GetFlag(FLAGS_data_dir),
                           std::to_string(epochs), "64", "1024"});
    if (output.ok()) {
      std::fputs(output->c_str(), stderr);
      const std::regex line(R"(batch=(\d+) examples_per_s=([0-9.]+) test_acc=([0-9.]+))");
      for (std::sregex_iterator it(output->begin(), output->end(), line), end; it != end; ++it) {
        torch_rate[std::stoi((*it)[1])] = std::stod((*it)[2]);
        torch_accuracy[std::stoi((*it)[1])] = std::stod((*it)[3]);
      }
    } else {
      std::fprintf(stderr, "gpu_train_bench: the anchor failed: %s\n",
                   std::string(output.status().message()).c_str());
    }
  }

  auto one = *OneDeviceStrategy::Create("GPU:0");
  std::map<int, double> one_rate;
  for (int batch : {64, 1024}) {
    absl::StatusOr<FitSummary> summary = Train(job, *one, batch, epochs);
    if (!summary.ok()) {
      std::fprintf(stderr, "gpu_train_bench: %s\n",
                   std::string(summary.status().message()).c_str());
      return 1;
    }
    const double rate = MedianRate(*summary);
    one_rate[batch] = rate;
    const std::string setup = absl::StrCat("reference model, Adam 1e-3, batch ", batch, ", ",
                                           epochs, " epochs, one GPU, Fit");
    bench::PrintFigure(absl::StrCat("gpu_examples_per_sec_batch", batch), rate, "examples/s",
                       nullptr, "at_least", setup);
    bench::PrintFigure(absl::StrCat("gpu_test_accuracy_batch", batch), summary->test_accuracy,
                       "fraction", nullptr, "at_least", setup);
    if (torch_rate.count(batch) > 0) {
      bench::PrintFigure(absl::StrCat("torch_gpu_examples_per_sec_batch", batch), torch_rate[batch],
                         "examples/s", nullptr, "at_least",
                         absl::StrCat("PyTorch, same model and batch, data on the GPU; test "
                                      "accuracy ",
                                      torch_accuracy[batch]));
      bench::PrintFigure(absl::StrCat("gpu_vs_torch_batch", batch), rate / torch_rate[batch], "x",
                         1.5, "at_least", setup + " over PyTorch's examples/s");
    }
  }

  // MirroredStrategy over 2 logical GPUs of GPU:0, at the same global batches.
  SetLogicalGpusPerGpu(2);
  MirroredOptions mirrored_options;
  mirrored_options.devices = {"GPU:0", "GPU:1"};
  auto mirrored = MirroredStrategy::Create(mirrored_options);
  if (!mirrored.ok()) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", std::string(mirrored.status().message()).c_str());
    return 1;
  }
  for (int batch : {64, 1024}) {
    absl::StatusOr<FitSummary> summary = Train(job, **mirrored, batch / 2, epochs);
    if (!summary.ok()) {
      std::fprintf(stderr, "gpu_train_bench: %s\n",
                   std::string(summary.status().message()).c_str());
      return 1;
    }
    const double rate = MedianRate(*summary);
    const std::string setup = absl::StrCat("MirroredStrategy on 2 logical GPUs of one GPU (",
                                           (*mirrored)->cross_device_ops().name(),
                                           "), global batch ", batch, ", ", epochs, " epochs");
    bench::PrintFigure(absl::StrCat("mirrored2_examples_per_sec_batch", batch), rate, "examples/s",
                       nullptr, "at_least", setup);
    bench::PrintFigure(absl::StrCat("mirrored2_test_accuracy_batch", batch), summary->test_accuracy,
                       "fraction", nullptr, "at_least", setup);
    const double overhead_us = (batch / rate - batch / one_rate[batch]) * 1e6;
    bench::PrintFigure(absl::StrCat("mirrored2_overhead_per_step_batch", batch), overhead_us, "us",
                       nullptr, "at_most", setup + ", step time minus one device's");
  }
  SetLogicalGpusPerGpu(1);
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv,
                            "gpu_train_bench: the reference model on one GPU against PyTorch, "
                            "and mirrored over 2 logical GPUs.\n  gpu_train_bench "
                            "--data_dir=DIR [--epochs=5] [--torch_script=PATH]");
  return stratum::Run();
}
