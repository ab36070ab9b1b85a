// Models beyond a Sequential MLP trained on Fashion-MNIST by the real binaries: a Keras
// functional model (examples/fashion_mnist_functional.json: two inputs, the top and bottom
// halves of each image, and a residual Add) under every strategy: Default and Mirrored (2
// CPU replicas) in stratum-train, MultiWorkerMirrored (2 workers) and ParameterServer (2
// workers, 2 ps) in stratum-launch; and the convolutional network of TensorFlow's "Distributed
// training with Keras" tutorial (examples/fashion_mnist_cnn.json) under every strategy too
// (OneDevice and CentralStorage besides); and a small residual network with
// BatchNormalization (examples/fashion_mnist_resnet.json), whose test accuracy needs the
// moving statistics right: per replica under Default and ParameterServer (the statistics
// held by the PSs), synchronized over the replicas under Mirrored and MultiWorkerMirrored;
// and an embedding model (examples/fashion_mnist_embedding.json) with learning-rate
// schedules and gradient clipping under ParameterServer and MultiWorkerMirrored.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
}

struct Strategy {
  std::string label;
  std::string example;      // the job file under examples/
  nlohmann::json strategy;  // the job's strategy.type (and devices)
  std::string binary;       // stratum-train, or stratum-launch for a cluster
  std::vector<std::string> flags;
  int replicas;
  int workers;
  int ps;
  bool sync_batch_norm = false;  // every BatchNormalization layer gets synchronized: true
  // One short epoch: the MLP and the CNN reach about 0.8, the residual network (slower to
  // start) 0.65 to 0.75, asynchronous PS training less at times; chance is 0.1, and wrong
  // moving statistics give about that (test loss near 5).
  double min_accuracy = 0.75;
  double max_loss = 0.7;
  nlohmann::json learning_rate = nullptr;      // set: the optimizer's learning_rate (a schedule)
  nlohmann::json optimizer_options = nullptr;  // set: added to the optimizer's config
};

class FunctionalTrainingTest : public ::testing::TestWithParam<Strategy> {};

TEST_P(FunctionalTrainingTest, TheModelLearnsFashionMnist) {
  const Strategy& s = GetParam();
  std::ifstream example(std::string(STRATUM_SOURCE_DIR) + "/examples/" + s.example);
  nlohmann::json job = nlohmann::json::parse(example);
  job["strategy"] = s.strategy;
  for (nlohmann::json& layer : job["model"]["config"]["layers"]) {
    if (layer["class_name"] == "BatchNormalization") {
      layer["config"]["synchronized"] = s.sync_batch_norm;
    }
  }
  if (!s.learning_rate.is_null()) {
    job["compile"]["optimizer"]["config"]["learning_rate"] = s.learning_rate;
  }
  if (!s.optimizer_options.is_null()) {
    job["compile"]["optimizer"]["config"].update(s.optimizer_options);
  }
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 400;
  // The test set in full takes the CNN longer than its training steps here.
  job["fit"]["validate"] = false;
  const std::string checkpoints = TempPath(s.label + "_ckpt");
  if (s.ps > 0) job["checkpoint"] = {{"dir", checkpoints}, {"every_steps", 200}};
  const std::string job_path = TempPath(s.label + "_job.json");
  std::ofstream(job_path) << job.dump();
  const std::string summary_path = TempPath(s.label + "_summary.json");

  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/" + s.binary, "--job=" + job_path,
                  "--summary_json=" + summary_path};
  options.argv.insert(options.argv.end(), s.flags.begin(), s.flags.end());
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  ASSERT_TRUE(process.ok()) << process.status();
  // The destructor stops the process group, should the wait end first.
  auto exit = (*process)->Wait(absl::Seconds(150));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << (*process)->output();
  ASSERT_EQ(exit->exit_code, 0) << (*process)->output();

  std::ifstream file(summary_path);
  const nlohmann::json summary = nlohmann::json::parse(file, nullptr, false);
  ASSERT_TRUE(summary.is_object()) << (*process)->output();
  EXPECT_EQ(summary["num_replicas_in_sync"], s.replicas);
  EXPECT_EQ(summary["num_workers"], s.workers);
  EXPECT_EQ(summary["num_ps"], s.ps);
  EXPECT_GT(summary["test_accuracy"].get<double>(), s.min_accuracy) << (*process)->output();
  EXPECT_LT(summary["test_loss"].get<double>(), s.max_loss) << (*process)->output();
  std::error_code ignored;
  std::filesystem::remove_all(checkpoints, ignored);
}

INSTANTIATE_TEST_SUITE_P(
    EveryStrategy, FunctionalTrainingTest,
    ::testing::Values(
        Strategy{"Default",
                 "fashion_mnist_functional.json",
                 {{"type", "default"}},
                 "stratum-train",
                 {},
                 1,
                 1,
                 0},
        Strategy{"Mirrored",
                 "fashion_mnist_functional.json",
                 {{"type", "mirrored"}, {"devices", {"CPU:0", "CPU:1"}}},
                 "stratum-train",
                 {},
                 2,
                 1,
                 0},
        Strategy{"MultiWorkerMirrored",
                 "fashion_mnist_functional.json",
                 {{"type", "multi_worker_mirrored"}},
                 "stratum-launch",
                 {"--workers=2", "--ps=0"},
                 2,
                 2,
                 0},
        Strategy{"ParameterServer",
                 "fashion_mnist_functional.json",
                 {{"type", "parameter_server"}},
                 "stratum-launch",
                 {"--workers=2", "--ps=2", "--chief"},
                 1,
                 2,
                 2},
        Strategy{"CnnDefault",
                 "fashion_mnist_cnn.json",
                 {{"type", "default"}},
                 "stratum-train",
                 {},
                 1,
                 1,
                 0},
        Strategy{"CnnOneDevice",
                 "fashion_mnist_cnn.json",
                 {{"type", "one_device"}, {"devices", {"CPU:0"}}},
                 "stratum-train",
                 {},
                 1,
                 1,
                 0},
        Strategy{"CnnMirrored",
                 "fashion_mnist_cnn.json",
                 {{"type", "mirrored"}, {"devices", {"CPU:0", "CPU:1"}}},
                 "stratum-train",
                 {},
                 2,
                 1,
                 0},
        Strategy{"CnnCentralStorage",
                 "fashion_mnist_cnn.json",
                 {{"type", "central_storage"}, {"devices", {"CPU:0", "CPU:1"}}},
                 "stratum-train",
                 {},
                 2,
                 1,
                 0},
        Strategy{"CnnParameterServer",
                 "fashion_mnist_cnn.json",
                 {{"type", "parameter_server"}},
                 "stratum-launch",
                 {"--workers=2", "--ps=2", "--chief"},
                 1,
                 2,
                 2},
        Strategy{"CnnMultiWorkerMirrored",
                 "fashion_mnist_cnn.json",
                 {{"type", "multi_worker_mirrored"}},
                 "stratum-launch",
                 {"--workers=2", "--ps=0"},
                 2,
                 2,
                 0},
        Strategy{"ResNetDefault",
                 "fashion_mnist_resnet.json",
                 {{"type", "default"}},
                 "stratum-train",
                 {},
                 1,
                 1,
                 0,
                 false,
                 0.5,
                 1.5},
        Strategy{"ResNetMirroredSyncBatchNorm",
                 "fashion_mnist_resnet.json",
                 {{"type", "mirrored"}, {"devices", {"CPU:0", "CPU:1"}}},
                 "stratum-train",
                 {},
                 2,
                 1,
                 0,
                 true,
                 0.5,
                 1.5},
        Strategy{"ResNetMultiWorkerMirroredSyncBatchNorm",
                 "fashion_mnist_resnet.json",
                 {{"type", "multi_worker_mirrored"}},
                 "stratum-launch",
                 {"--workers=2", "--ps=0"},
                 2,
                 2,
                 0,
                 true,
                 0.5,
                 1.5},
        Strategy{"ResNetParameterServer",
                 "fashion_mnist_resnet.json",
                 {{"type", "parameter_server"}},
                 "stratum-launch",
                 {"--workers=2", "--ps=2", "--chief"},
                 1,
                 2,
                 2,
                 false,
                 0.5,
                 1.5},
        // Embeddings (ids unscaled), learning-rate schedules, clipping and weight decay, on
        // the PSs (stepped by each variable's update count) and in lock step.
        Strategy{"EmbeddingScheduleParameterServer",
                 "fashion_mnist_embedding.json",
                 {{"type", "parameter_server"}},
                 "stratum-launch",
                 {"--workers=2", "--ps=2", "--chief"},
                 1,
                 2,
                 2,
                 false,
                 0.7,
                 0.9,
                 {{"class_name", "ExponentialDecay"},
                  {"config",
                   {{"initial_learning_rate", 0.002}, {"decay_steps", 100}, {"decay_rate", 0.9}}}},
                 {{"clipnorm", 1.0}, {"weight_decay", 0.004}}},
        Strategy{"EmbeddingScheduleMultiWorkerMirrored",
                 "fashion_mnist_embedding.json",
                 {{"type", "multi_worker_mirrored"}},
                 "stratum-launch",
                 {"--workers=2", "--ps=0"},
                 2,
                 2,
                 0,
                 false,
                 0.7,
                 0.9,
                 {{"module", "keras.optimizers.schedules"},
                  {"class_name", "CosineDecay"},
                  {"config",
                   {{"initial_learning_rate", 0.0},
                    {"decay_steps", 400},
                    {"warmup_target", 0.002},
                    {"warmup_steps", 50}}},
                  {"registered_name", nullptr}},
                 {{"global_clipnorm", 1.0}, {"clipvalue", 0.5}, {"weight_decay", 0.004}}}),
    [](const ::testing::TestParamInfo<Strategy>& info) { return info.param.label; });

}  // namespace
}  // namespace stratum
