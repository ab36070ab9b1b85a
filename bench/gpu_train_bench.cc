// Training speed on one GPU through Fit, side by side with PyTorch on the same GPU in the
// same run (data resident on the GPU), in four cases that --cases picks from:
//   mlp: the reference model (Flatten 28x28 -> Dense 128 relu -> Dense 10 softmax, Adam 1e-3;
//        examples/fashion_mnist.json) at batch 64 and 1024, against
//        shared/peers/fmnist_torch_gpu.py; goal 1.5x PyTorch;
//   cnn: the tutorial CNN (Conv2D 32 3x3 relu -> MaxPool 2 -> Dense 64 relu -> Dense 10;
//        examples/fashion_mnist_cnn.json) at batch 64 and 512, against
//        bench/fmnist_cnn_torch_gpu.py; goal 3x PyTorch at batch 64, 1.5x at 512;
//   embedding: each pixel's intensity as an id (int32 input -> Embedding 256x4 -> Flatten ->
//        Dense 64 relu -> Dense 10; examples/fashion_mnist_embedding.json) at batch 64 and 512,
//        against bench/fmnist_embedding_torch_gpu.py; goal 2x PyTorch at both;
//   mirrored: the reference model under MirroredStrategy over 2 logical GPUs of one GPU, its
//        overhead per step against one device at the same global batch;
//   mixed: the tutorial CNN in Keras' mixed_bfloat16 and mixed_float16 policies against our
//        own float32 at batch 64 and 512, in the same run; goal bf16 1.5x float32 at 512.
// examples/s are the median of epochs 2..N, as the anchors'. A case whose model the GPU path
// refuses (cuda::SupportsOnGpu, or a Fit whose FitSummary::on_gpus is false: it trained on
// the CPU) prints no GPU figures: its ratio to PyTorch is null and unmet, the reason goes to
// stderr and the exit code is 1. One JSON object per figure.
//
//   gpu_train_bench --data_dir=DIR [--epochs=5] [--cases=mlp,cnn,embedding,mirrored]
//       [--job=PATH] [--torch_script=PATH] [--cnn_job=PATH] [--cnn_torch_script=PATH]
//       [--embedding_job=PATH] [--embedding_torch_script=PATH]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/bench_util.h"
#include "stratum/cuda/replica.h"
#include "stratum/util/devices.h"
#include "stratum/util/flags.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/fit.h"
#include "stratum/worker/mirrored_strategy.h"
#include "stratum/worker/training_job.h"

ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Folder of the four Fashion-MNIST .gz files");
ABSL_FLAG(std::vector<std::string>, cases,
          std::vector<std::string>({"mlp", "cnn", "embedding", "mirrored"}),
          "The cases to run: a comma list of mlp, cnn, embedding, mirrored and mixed");
ABSL_FLAG(std::string, job, STRATUM_SOURCE_DIR "/examples/fashion_mnist.json",
          "The reference job (its model and optimizer), of the mlp and mirrored cases");
ABSL_FLAG(std::string, torch_script, STRATUM_SOURCE_DIR "/../shared/peers/fmnist_torch_gpu.py",
          "The PyTorch anchor of the mlp case; empty skips it");
ABSL_FLAG(std::string, cnn_job, STRATUM_SOURCE_DIR "/examples/fashion_mnist_cnn.json",
          "The tutorial CNN's job (its model and optimizer), of the cnn case");
ABSL_FLAG(std::string, cnn_torch_script, STRATUM_SOURCE_DIR "/bench/fmnist_cnn_torch_gpu.py",
          "The PyTorch anchor of the cnn case; empty skips it");
ABSL_FLAG(std::string, embedding_job, STRATUM_SOURCE_DIR "/examples/fashion_mnist_embedding.json",
          "The pixel-id Embedding model's job (its model and optimizer), of the embedding case");
ABSL_FLAG(std::string, embedding_torch_script,
          STRATUM_SOURCE_DIR "/bench/fmnist_embedding_torch_gpu.py",
          "The PyTorch anchor of the embedding case; empty skips it");
ABSL_FLAG(int, epochs, 5, "Epochs per figure (examples/s: the median of epochs 2..N)");

namespace stratum {
namespace {

constexpr int kMirroredBatches[] = {64, 1024};

// The median of epochs 2..N's examples/s, the mean of the middle two for an even count, as
// Python's statistics.median in the anchors.
double MedianRate(const FitSummary& summary) {
  std::vector<double> rates;
  for (size_t i = summary.history.size() > 1 ? 1 : 0; i < summary.history.size(); ++i) {
    rates.push_back(summary.history[i].examples_per_sec);
  }
  std::sort(rates.begin(), rates.end());
  if (rates.empty()) return 0;
  const size_t half = rates.size() / 2;
  return rates.size() % 2 == 1 ? rates[half] : (rates[half - 1] + rates[half]) / 2;
}

struct Job {
  Model model;
  Loss loss;
  std::unique_ptr<Optimizer> optimizer;
  FitData data;
};

// The model, loss and optimizer of the job file at `path`, with the Fashion-MNIST files of
// `data_dir` for its data; `policy` set as every layer's dtype policy unless empty.
absl::StatusOr<Job> LoadJob(const std::string& path, const std::string& data_dir,
                            const std::string& policy = "") {
  STRATUM_ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(path));
  if (!policy.empty() && spec.model.contains("config") && spec.model["config"].contains("layers")) {
    for (nlohmann::json& layer : spec.model["config"]["layers"]) {
      if (layer.value("class_name", "") != "InputLayer") layer["config"]["dtype"] = policy;
    }
  }
  const std::string dir = data_dir + "/";
  spec.data.train.images = dir + "train-images-idx3-ubyte.gz";
  spec.data.train.labels = dir + "train-labels-idx1-ubyte.gz";
  spec.data.test.images = dir + "t10k-images-idx3-ubyte.gz";
  spec.data.test.labels = dir + "t10k-labels-idx1-ubyte.gz";
  STRATUM_ASSIGN_OR_RETURN(Model model, Model::FromKerasJson(spec.model));
  STRATUM_ASSIGN_OR_RETURN(FitData data, LoadFitData(spec.data, model));
  STRATUM_ASSIGN_OR_RETURN(Loss loss, Loss::FromKeras(spec.loss));
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                           Optimizer::FromKeras(spec.optimizer));
  return Job{std::move(model), std::move(loss), std::move(optimizer), std::move(data)};
}

// Fit on `strategy`, whose replicas are all on GPUs. Fit trains a job that the GPU path
// cannot train on the CPU instead: UNIMPLEMENTED then (as the GPU path's own refusals), so
// that a CPU figure never passes for a GPU one.
absl::StatusOr<FitSummary> TrainOnGpus(const Job& job, Strategy& strategy, int64_t per_replica,
                                       int epochs) {
  FitOptions options;
  options.epochs = epochs;
  options.batch_size_per_replica = per_replica;
  options.validate = false;
  options.progress = ProgressStyle::kNone;
  STRATUM_ASSIGN_OR_RETURN(FitSummary summary,
                           Fit(strategy, job.model, job.loss, *job.optimizer, job.data, options));
  if (!summary.on_gpus) {
    return absl::UnimplementedError(
        "Fit trained on the CPU, not on the GPU, though the GPU path's check of the model "
        "passed: stratum-train on the job says why in its line \"training on the CPU: ...\"");
  }
  return summary;
}

struct AnchorFigures {
  double examples_per_sec = 0;
  double test_accuracy = 0;
};

// Runs a PyTorch anchor (`script` DATA_DIR EPOCHS BATCH...) and reads its figures per batch
// from its lines "torch_gpu [model=NAME ]batch=B examples_per_s=R test_acc=A device=..." whose
// NAME is `model` (a line without model= is the reference model's, "mlp", as
// shared/peers/fmnist_torch_gpu.py prints it), so that a script of another model passed by
// mistake gives no figures rather than wrong ones; lines of other tags (torch_gpu_bf16) are not
// the anchor's either. Empty when it fails.
std::map<int, AnchorFigures> RunAnchor(const std::string& script, const std::string& model,
                                       const std::string& data_dir, int epochs,
                                       const std::vector<int>& batches) {
  std::vector<std::string> argv = {"/usr/bin/env", "python3", script, data_dir,
                                   std::to_string(epochs)};
  for (int batch : batches) argv.push_back(std::to_string(batch));
  // RunProgram does not search PATH: env finds python3 there.
  absl::StatusOr<std::string> output = bench::RunProgram(argv);
  if (!output.ok()) {
    std::fprintf(stderr, "gpu_train_bench: the anchor %s failed: %s\n", script.c_str(),
                 std::string(output.status().message()).c_str());
    return {};
  }
  std::fputs(output->c_str(), stderr);
  const std::regex figures(
      R"(^torch_gpu (?:model=(\S+) )?batch=(\d+) examples_per_s=([0-9.]+) test_acc=([0-9.]+))");
  std::map<int, AnchorFigures> anchor;
  std::istringstream lines(*output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (!std::regex_search(line, match, figures)) continue;
    if ((match[1].matched ? match[1].str() : "mlp") != model) continue;
    anchor[std::stoi(match[2])] = {std::stod(match[3]), std::stod(match[4])};
  }
  if (anchor.empty()) {
    std::fprintf(stderr, "gpu_train_bench: the anchor %s printed no line of model=%s\n",
                 script.c_str(), model.c_str());
  }
  return anchor;
}

// A model trained on one GPU beside its PyTorch anchor. Figures are named
// gpu<tag>_examples_per_sec_batchN, gpu<tag>_test_accuracy_batchN,
// torch_gpu<tag>_examples_per_sec_batchN and gpu<tag>_vs_torch_batchN.
struct OneGpuCase {
  std::string tag;          // "" (mlp), "_cnn" or "_embedding"
  std::string description;  // "reference model, Adam 1e-3"
  std::string job;
  std::string torch_script;             // empty: no anchor
  std::string anchor_model;             // the model= of the anchor's lines: "mlp", "cnn"...
  std::map<int, double> goal_vs_torch;  // per batch, the goal of gpu<tag>_vs_torch_batchN
};

// Runs `c` and answers its examples/s per batch. UNIMPLEMENTED when the GPU path refuses
// the model: the anchor's figures are printed, and the ratios as null (unmet).
absl::StatusOr<std::map<int, double>> RunOneGpuCase(const OneGpuCase& c,
                                                    const std::string& data_dir, int epochs) {
  STRATUM_ASSIGN_OR_RETURN(const Job job, LoadJob(c.job, data_dir));
  std::vector<int> batches;
  for (const auto& [batch, goal] : c.goal_vs_torch) batches.push_back(batch);
  // The GPU path's own test, before minutes of training would go to the CPU.
  const absl::Status on_gpu = cuda::SupportsOnGpu(job.model, job.loss, *job.optimizer);
  // The anchor first, in the same device session.
  const std::map<int, AnchorFigures> anchor =
      c.torch_script.empty() ? std::map<int, AnchorFigures>{}
                             : RunAnchor(c.torch_script, c.anchor_model, data_dir, epochs, batches);
  auto one = OneDeviceStrategy::Create("GPU:0");
  if (!one.ok()) return one.status();
  std::map<int, double> rates;
  absl::Status refused = on_gpu;
  for (const auto& [batch, goal] : c.goal_vs_torch) {
    const std::string setup =
        absl::StrCat(c.description, ", batch ", batch, ", ", epochs, " epochs, one GPU, Fit");
    const auto torch = anchor.find(batch);
    if (torch != anchor.end()) {
      bench::PrintFigure(absl::StrCat("torch_gpu", c.tag, "_examples_per_sec_batch", batch),
                         torch->second.examples_per_sec, "examples/s", nullptr, "at_least",
                         absl::StrCat("PyTorch, same model and batch, data on the GPU; test "
                                      "accuracy ",
                                      torch->second.test_accuracy));
    }
    absl::StatusOr<FitSummary> summary =
        refused.ok() ? TrainOnGpus(job, **one, batch, epochs) : absl::StatusOr<FitSummary>(refused);
    if (absl::IsUnimplemented(summary.status())) {
      refused = summary.status();
      bench::PrintFigure(absl::StrCat("gpu", c.tag, "_vs_torch_batch", batch), std::nan(""), "x",
                         goal, "at_least",
                         absl::StrCat(setup, ": not measured, the GPU path refused the model (",
                                      refused.message(), ")"));
      continue;
    }
    if (!summary.ok()) return summary.status();
    const double rate = MedianRate(*summary);
    rates[batch] = rate;
    bench::PrintFigure(absl::StrCat("gpu", c.tag, "_examples_per_sec_batch", batch), rate,
                       "examples/s", nullptr, "at_least", setup);
    bench::PrintFigure(absl::StrCat("gpu", c.tag, "_test_accuracy_batch", batch),
                       summary->test_accuracy, "fraction", nullptr, "at_least", setup);
    if (torch != anchor.end()) {
      bench::PrintFigure(absl::StrCat("gpu", c.tag, "_vs_torch_batch", batch),
                         rate / torch->second.examples_per_sec, "x", goal, "at_least",
                         setup + " over PyTorch's examples/s");
    }
  }
  if (!refused.ok()) {
    return absl::UnimplementedError(
        absl::StrCat("the GPU path does not train ", c.job, ": ", refused.message()));
  }
  return rates;
}

// The reference model under MirroredStrategy over 2 logical GPUs of GPU:0, at the global
// batches of kMirroredBatches, against one device's examples/s (`one_rate`; those missing
// are measured here, without figures).
absl::Status RunMirroredCase(const std::string& job_path, const std::string& data_dir, int epochs,
                             std::map<int, double> one_rate) {
  STRATUM_ASSIGN_OR_RETURN(const Job job, LoadJob(job_path, data_dir));
  STRATUM_RETURN_IF_ERROR(cuda::SupportsOnGpu(job.model, job.loss, *job.optimizer));
  for (int batch : kMirroredBatches) {
    if (one_rate.count(batch) > 0) continue;
    STRATUM_ASSIGN_OR_RETURN(auto one, OneDeviceStrategy::Create("GPU:0"));
    STRATUM_ASSIGN_OR_RETURN(const FitSummary summary, TrainOnGpus(job, *one, batch, epochs));
    one_rate[batch] = MedianRate(summary);
  }
  SetLogicalGpusPerGpu(2);
  MirroredOptions mirrored_options;
  mirrored_options.devices = {"GPU:0", "GPU:1"};
  auto mirrored = MirroredStrategy::Create(mirrored_options);
  absl::Status status = mirrored.status();
  for (int batch : kMirroredBatches) {
    if (!status.ok()) break;
    absl::StatusOr<FitSummary> summary = TrainOnGpus(job, **mirrored, batch / 2, epochs);
    status = summary.status();
    if (!status.ok()) break;
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
  return status;
}

// The tutorial CNN in float32, mixed_bfloat16 and mixed_float16 on one GPU, one after the
// other at each batch: gpu_cnn_<policy>_examples_per_sec_batchN, their test accuracies, and
// gpu_cnn_<policy>_vs_f32_batchN (goal 1.5x for bf16 at batch 512).
absl::Status RunMixedCase(const std::string& job_path, const std::string& data_dir, int epochs) {
  struct Policy {
    const char* tag;
    const char* name;
  };
  const Policy policies[] = {{"f32", ""}, {"bf16", "mixed_bfloat16"}, {"f16", "mixed_float16"}};
  STRATUM_ASSIGN_OR_RETURN(auto one, OneDeviceStrategy::Create("GPU:0"));
  for (int batch : {64, 512}) {
    double f32_rate = 0;
    for (const Policy& policy : policies) {
      STRATUM_ASSIGN_OR_RETURN(const Job job, LoadJob(job_path, data_dir, policy.name));
      STRATUM_RETURN_IF_ERROR(cuda::SupportsOnGpu(job.model, job.loss, *job.optimizer));
      STRATUM_ASSIGN_OR_RETURN(const FitSummary summary, TrainOnGpus(job, *one, batch, epochs));
      const double rate = MedianRate(summary);
      const std::string setup =
          absl::StrCat("tutorial CNN, dtype policy ", *policy.name ? policy.name : "float32",
                       ", Adam 1e-3, batch ", batch, ", ", epochs, " epochs, one GPU, Fit");
      bench::PrintFigure(absl::StrCat("gpu_cnn_", policy.tag, "_examples_per_sec_batch", batch),
                         rate, "examples/s", nullptr, "at_least", setup);
      bench::PrintFigure(absl::StrCat("gpu_cnn_", policy.tag, "_test_accuracy_batch", batch),
                         summary.test_accuracy, "fraction", nullptr, "at_least", setup);
      if (*policy.name == '\0') {
        f32_rate = rate;
        continue;
      }
      const nlohmann::json goal = batch == 512 && std::string(policy.tag) == "bf16"
                                      ? nlohmann::json(1.5)
                                      : nlohmann::json(nullptr);
      bench::PrintFigure(absl::StrCat("gpu_cnn_", policy.tag, "_vs_f32_batch", batch),
                         rate / f32_rate, "x", goal, "at_least",
                         setup + " over float32's examples/s (same run)");
    }
  }
  return absl::OkStatus();
}

int Run() {
  const std::vector<std::string> known = {"mlp", "cnn", "embedding", "mirrored", "mixed"};
  const std::vector<std::string> cases = absl::GetFlag(FLAGS_cases);
  for (const std::string& name : cases) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::fprintf(stderr, "gpu_train_bench: --cases names \"%s\": use a comma list of %s\n",
                 name.c_str(), absl::StrJoin(known, ", ").c_str());
    return 2;
  }
  const auto wanted = [&](const std::string& name) {
    return std::find(cases.begin(), cases.end(), name) != cases.end();
  };
  const int epochs = std::max(absl::GetFlag(FLAGS_epochs), 2);
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  if (VisibleGpuCount() == 0) {
    std::fprintf(stderr, "gpu_train_bench: no GPU is visible: run it on a machine with one\n");
    return 2;
  }
  int exit_code = 0;
  const auto failed = [&](const char* name, const absl::Status& status) {
    std::fprintf(stderr, "gpu_train_bench: *** the %s case failed: %s\n", name,
                 std::string(status.message()).c_str());
    exit_code = 1;
  };
  std::map<int, double> mlp_rates;
  if (wanted("mlp")) {
    const OneGpuCase mlp{.tag = "",
                         .description = "reference model, Adam 1e-3",
                         .job = absl::GetFlag(FLAGS_job),
                         .torch_script = absl::GetFlag(FLAGS_torch_script),
                         .anchor_model = "mlp",
                         .goal_vs_torch = {{64, 1.5}, {1024, 1.5}}};
    absl::StatusOr<std::map<int, double>> rates = RunOneGpuCase(mlp, data_dir, epochs);
    if (rates.ok()) mlp_rates = *rates;
    if (!rates.ok()) failed("mlp", rates.status());
  }
  if (wanted("cnn")) {
    const OneGpuCase cnn{.tag = "_cnn",
                         .description = "tutorial CNN (Conv2D 32, MaxPool, Dense 64), Adam 1e-3",
                         .job = absl::GetFlag(FLAGS_cnn_job),
                         .torch_script = absl::GetFlag(FLAGS_cnn_torch_script),
                         .anchor_model = "cnn",
                         .goal_vs_torch = {{64, 3.0}, {512, 1.5}}};
    absl::StatusOr<std::map<int, double>> rates = RunOneGpuCase(cnn, data_dir, epochs);
    if (!rates.ok()) failed("cnn", rates.status());
  }
  if (wanted("embedding")) {
    const OneGpuCase embedding{
        .tag = "_embedding",
        .description = "pixel ids (Embedding 256x4, Flatten, Dense 64), Adam 1e-3",
        .job = absl::GetFlag(FLAGS_embedding_job),
        .torch_script = absl::GetFlag(FLAGS_embedding_torch_script),
        .anchor_model = "embedding",
        .goal_vs_torch = {{64, 2.0}, {512, 2.0}}};
    absl::StatusOr<std::map<int, double>> rates = RunOneGpuCase(embedding, data_dir, epochs);
    if (!rates.ok()) failed("embedding", rates.status());
  }
  if (wanted("mirrored")) {
    absl::Status status = RunMirroredCase(absl::GetFlag(FLAGS_job), data_dir, epochs, mlp_rates);
    if (!status.ok()) failed("mirrored", status);
  }
  if (wanted("mixed")) {
    absl::Status status = RunMixedCase(absl::GetFlag(FLAGS_cnn_job), data_dir, epochs);
    if (!status.ok()) failed("mixed", status);
  }
  return exit_code;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv,
                            "gpu_train_bench: the reference model, the tutorial CNN and the "
                            "pixel-id Embedding model on one GPU against PyTorch, and the "
                            "reference model mirrored over 2 logical GPUs.\n  gpu_train_bench "
                            "--data_dir=DIR [--epochs=5] [--cases=mlp,cnn,embedding,mirrored] "
                            "[--torch_script=PATH] [--cnn_torch_script=PATH] "
                            "[--embedding_torch_script=PATH]");
  return stratum::Run();
}
