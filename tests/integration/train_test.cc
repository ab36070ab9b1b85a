// stratum-train as a user runs it: a real (short) Fashion-MNIST job, its summary, and the
// errors a broken job gets.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "stratum/testing/independent_readers.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct TrainRun {
  ExitInfo exit;
  std::string output;
};

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
}

// Runs `binary` (of the build's bin folder) with `args` to its end (100 s at most).
TrainRun RunBinary(const std::string& binary, const std::vector<std::string>& args,
                   std::vector<std::pair<std::string, std::string>> env = {}) {
  SubprocessOptions options;
  options.env = std::move(env);
  options.argv = {std::string(STRATUM_BIN_DIR) + "/" + binary};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  auto exit = (*process)->Wait(absl::Seconds(100));
  EXPECT_TRUE(exit.ok()) << exit.status();
  return {exit.ok() ? *exit : ExitInfo{}, (*process)->output()};
}

TrainRun RunTrain(const std::vector<std::string>& args,
                  std::vector<std::pair<std::string, std::string>> env = {}) {
  return RunBinary("stratum-train", args, std::move(env));
}

nlohmann::json ExampleJob() {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist.json");
  return nlohmann::json::parse(file);
}

// Removes its path (a file or a folder) when the test ends, however it ends.
struct RemovedAtEnd {
  std::string path;
  ~RemovedAtEnd() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

std::string WriteJob(const nlohmann::json& job, const std::string& name) {
  const std::string path = TempPath(name + ".json");
  std::ofstream(path) << job.dump();
  return path;
}

TEST(StratumTrainTest, MirroredShortRunOnFashionMnistWritesItsSummary) {
  nlohmann::json job = ExampleJob();
  job["strategy"] = {{"type", "mirrored"}, {"devices", {"CPU:0", "CPU:1"}}};
  job["fit"]["epochs"] = 2;
  job["fit"]["steps_per_epoch"] = 150;
  const std::string summary_path = TempPath("summary.json");
  TrainRun run = RunTrain(
      {"--job=" + WriteJob(job, "mirrored"), "--summary-json=" + summary_path, "--progress=lines"});
  ASSERT_EQ(run.exit.exit_code, 0) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("MirroredStrategy on 2 replica(s) (CPU:0, CPU:1), global batch 128"));
  EXPECT_THAT(run.output, HasSubstr("Epoch 2/2 - 150 steps - loss "));
  std::ifstream file(summary_path);
  const nlohmann::json summary = nlohmann::json::parse(file);
  EXPECT_EQ(summary["strategy"], "MirroredStrategy");
  EXPECT_EQ(summary["num_replicas_in_sync"], 2);
  EXPECT_EQ(summary["steps"], 300);
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.78);  // 300 steps of 128 examples
  EXPECT_GT(summary["examples_per_sec"].get<double>(), 0);
  std::remove(summary_path.c_str());
}

// A GPU split where there is no GPU trains on the CPU, and says so (CUDA_VISIBLE_DEVICES
// hides any GPU of the machine).
TEST(StratumTrainTest, ALogicalGpuSplitWithoutAGpuSaysTheReplicasTrainOnTheCpu) {
  nlohmann::json job = ExampleJob();
  job["strategy"] = {{"type", "mirrored"}, {"logical_gpus_per_gpu", 2}};
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 5;
  job["data"].erase("test");
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "split_without_gpu"), "--progress=none"},
                          {{"CUDA_VISIBLE_DEVICES", ""}});
  ASSERT_EQ(run.exit.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("strategy.logical_gpus_per_gpu is 2, but this process sees "
                                    "no GPU to split: the replicas train on the CPU devices"));
  EXPECT_THAT(run.output, HasSubstr("MirroredStrategy on 1 replica(s) (CPU:0)"));
}

// Nothing measured is reported as measured: without a test set there is no test accuracy
// (null in the summary, not 0), and an epoch not validated has no val_ figures (as Keras'
// History); with validate false the model is still tested once, at the end.
TEST(StratumTrainTest, FiguresThatWereNotMeasuredAreNotReported) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 20;
  job["data"].erase("test");
  const std::string summary_path = TempPath("untested_summary.json");
  TrainRun run = RunTrain(
      {"--job=" + WriteJob(job, "untested"), "--summary-json=" + summary_path, "--progress=lines"});
  ASSERT_EQ(run.exit.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("no test accuracy (the job has no data.test), "));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("val_")));
  std::ifstream file(summary_path);
  nlohmann::json summary = nlohmann::json::parse(file);
  EXPECT_TRUE(summary["test_accuracy"].is_null()) << summary;
  EXPECT_TRUE(summary["test_loss"].is_null()) << summary;
  EXPECT_FALSE(summary["history"][0].contains("val_accuracy")) << summary;

  job = ExampleJob();
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 20;
  job["fit"]["validate"] = false;
  run = RunTrain({"--job=" + WriteJob(job, "unvalidated"), "--summary-json=" + summary_path,
                  "--progress=lines"});
  ASSERT_EQ(run.exit.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("val_")));
  EXPECT_THAT(run.output, HasSubstr("test accuracy 0."));
  std::ifstream again(summary_path);
  summary = nlohmann::json::parse(again);
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.5) << summary;
  EXPECT_FALSE(summary["history"][0].contains("val_accuracy")) << summary;
  std::remove(summary_path.c_str());
}

TEST(StratumTrainTest, DrawsAProgressBarOnATerminal) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 40;
  job["fit"]["validate"] = false;
  // script(1) gives the program a pseudo-terminal, as a user's shell would.
  const std::string command =
      std::string(STRATUM_BIN_DIR) + "/stratum-train --job=" + WriteJob(job, "bar");
  SubprocessOptions options;
  options.argv = {"/usr/bin/script", "-qec", command, "/dev/null"};
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  ASSERT_TRUE(process.ok()) << process.status();
  auto exit = (*process)->Wait(absl::Seconds(60));
  ASSERT_OK(exit);
  const std::string output = (*process)->output();
  EXPECT_EQ(exit->exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("Epoch 1/1"));
  EXPECT_THAT(output, HasSubstr("    40/40 [==============================] - loss: "));
  EXPECT_THAT(output, HasSubstr("\r"));
}

TEST(StratumTrainTest, UnsupportedLayerIsRefusedByName) {
  nlohmann::json job = ExampleJob();
  job["model"]["config"]["layers"][2]["class_name"] = "LSTM";
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "lstm")});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, StartsWith("stratum-train: "));
  EXPECT_THAT(run.output, HasSubstr("has class \"LSTM\", which Stratum does not support"));
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
}

TEST(StratumTrainTest, MissingDataNamesThePackage) {
  nlohmann::json job = ExampleJob();
  job["data"]["train"]["images"] = "/nonexistent/train-images-idx3-ubyte.gz";
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "missing")});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("/nonexistent/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(run.output, HasSubstr("dataset-fashion-mnist"));
}

// Pixels scaled past float32's range make the first step's loss NaN: training stops there
// with the fix, exit 2 (running it again would diverge again), instead of 10 epochs of NaN.
TEST(StratumTrainTest, ALossThatIsNotFiniteStopsTrainingWithTheFix) {
  nlohmann::json job = ExampleJob();
  job["data"]["rescale"] = 1e38;
  job["fit"]["steps_per_epoch"] = 20;
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "diverging")});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("stratum-train: training diverged: the loss is nan after step "
                                    "1 (epoch 1, step 1 of 20)"));
  EXPECT_THAT(run.output, HasSubstr("check data.rescale"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("Epoch 1/10")));
}

// from_logits true on a softmax output would train as if it were false: refused, exit 2.
// Hardening case 8: a model that cannot fit is refused at once with the estimate, exit 2
// (Dense(2,000,000) aborted with std::bad_alloc, rc 134, after 17 s).
TEST(StratumTrainTest, AModelThatCannotFitInMemoryIsRefusedBeforeTraining) {
  nlohmann::json job = ExampleJob();
  // 2.1e9 parameters (just under Stratum's 2^31) and batches of 16384: about 34 GB for the
  // variables with their gradients and Adam's slots, and 350 GB of activations.
  job["model"]["config"]["layers"][2]["config"]["units"] = 2700000;
  job["fit"]["batch_size_per_replica"] = 16384;
  const absl::Time start = absl::Now();
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "huge")});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("the model does not fit in memory: training it needs about "));
  EXPECT_THAT(run.output, HasSubstr("is available: make the model's largest layers smaller"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(StratumTrainTest, FromLogitsOnASoftmaxOutputIsRefusedWithTheFix) {
  nlohmann::json job = ExampleJob();
  job["compile"]["loss"] = {{"class_name", "SparseCategoricalCrossentropy"},
                            {"config", {{"from_logits", true}}}};
  job["fit"]["steps_per_epoch"] = 5;
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "from_logits")});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("stratum-train: loss sparse_categorical_crossentropy has "
                                    "from_logits true, but the model's output (layer \"dense_1\") "
                                    "is a softmax"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("Epoch")));
}

// A labels file of the wrong rank (here the test images) is refused before training, naming
// the field, instead of failing at the end of the first epoch with checkpoints written.
TEST(StratumTrainTest, ALabelsFileOfTheWrongRankIsRefusedBeforeTraining) {
  nlohmann::json job = ExampleJob();
  job["data"]["test"]["labels"] = job["data"]["test"]["images"];
  job["fit"]["steps_per_epoch"] = 5;
  const std::string checkpoints = TempPath("wrong_rank_ckpt");
  std::filesystem::remove_all(checkpoints);
  job["checkpoint"] = {{"dir", checkpoints}};
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "wrong_rank")});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("stratum-train: data.test.labels "
                        "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz is "
                        "uint8[10000, 28, 28], but sparse_categorical_crossentropy takes one class "
                        "id per example"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("Epoch")));
  EXPECT_FALSE(std::filesystem::exists(checkpoints + "/checkpoint"));
  std::filesystem::remove_all(checkpoints);
}

TEST(StratumTrainTest, ClusterStrategiesPointToTheLauncher) {
  nlohmann::json job = ExampleJob();
  job["strategy"] = {{"type", "parameter_server"}};
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "ps")});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("run the job with stratum-launch --job"));
}

// one_device trains on one device: a second one listed is not silently dropped.
TEST(StratumTrainTest, OneDeviceWithSeveralDevicesIsRefusedWithTheFix) {
  nlohmann::json job = ExampleJob();
  job["strategy"] = {{"type", "one_device"}, {"devices", {"CPU:0", "CPU:1"}}};
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "one_device")});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("strategy.devices lists 2 devices (CPU:0, CPU:1), but "
                                    "one_device trains on one: list one, or use \"mirrored\""));
}

TEST(StratumTrainTest, ADamagedLatestCheckpointFallsBackToTheOneBeforeIt) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 2;
  job["fit"]["steps_per_epoch"] = 50;
  const std::string checkpoints = TempPath("damaged_ckpt");
  std::filesystem::remove_all(checkpoints);
  job["checkpoint"] = {{"dir", checkpoints}};
  const std::string path = WriteJob(job, "damaged");
  TrainRun first = RunTrain({"--job=" + path, "--progress=lines"});
  ASSERT_EQ(first.exit.exit_code, 0) << first.output;
  // Flip a byte in the middle of the latest (step 100) state file.
  const std::string latest = checkpoints + "/ckpt-000000000100/state.safetensors";
  ASSERT_TRUE(std::filesystem::exists(latest));
  {
    std::fstream file(latest, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(std::filesystem::file_size(latest) / 2));
    const char byte = static_cast<char>(file.peek() ^ 0x5a);
    file.seekp(file.tellg());
    file.put(byte);
  }
  TrainRun again = RunTrain({"--job=" + path, "--progress=lines", "--epochs=3"});
  EXPECT_EQ(again.exit.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("ckpt-000000000050 instead of the latest checkpoint, which "
                                      "is damaged"));
  EXPECT_THAT(again.output, HasSubstr("resumed from checkpoint step 50 (epoch 2, step 0)"));
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/ckpt-000000000100.damaged"));
  // Trained on, it saved epochs 2 and 3 anew; pruning (3 kept) leaves the damaged one be.
  for (const char* kept : {"/ckpt-000000000050", "/ckpt-000000000100", "/ckpt-000000000150"}) {
    EXPECT_TRUE(std::filesystem::exists(checkpoints + kept)) << kept;
  }
  // Run once more, the job is complete: it says so and evaluates the model it holds.
  TrainRun done = RunTrain({"--job=" + path, "--progress=lines", "--epochs=3"});
  EXPECT_EQ(done.exit.exit_code, 0) << done.output;
  EXPECT_THAT(done.output, HasSubstr("the checkpoint at step 150 in " + checkpoints +
                                     " already completes this job's 3 epochs: evaluating its "
                                     "model on data.test"));
  // A run that trained nothing has no speed to report (it said "0 examples/s").
  EXPECT_THAT(done.output, HasSubstr(", nothing left to train, "));
  EXPECT_THAT(done.output, ::testing::Not(HasSubstr(" examples/s")));
  // Evaluated anew, not the figures saved: with data.test changed (to the training set
  // here) the accuracy is the model's on it (QA: the saved test figures were printed).
  const std::regex accuracy("test accuracy ([0-9.]+)");
  std::smatch saved, anew;
  ASSERT_TRUE(std::regex_search(done.output, saved, accuracy)) << done.output;
  job["data"]["test"] = job["data"]["train"];
  TrainRun on_train =
      RunTrain({"--job=" + WriteJob(job, "damaged_on_train"), "--progress=lines", "--epochs=3"});
  EXPECT_EQ(on_train.exit.exit_code, 0) << on_train.output;
  ASSERT_TRUE(std::regex_search(on_train.output, anew, accuracy)) << on_train.output;
  EXPECT_NE(saved[1].str(), anew[1].str());
  std::filesystem::remove_all(checkpoints);
}

// The CSV rows (after the header) of a CSVLogger file.
std::vector<std::vector<std::string>> CsvRows(const std::string& path) {
  std::ifstream file(path);
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(file, line);) {
    std::vector<std::string> cells;
    std::stringstream cells_of(line);
    for (std::string cell; std::getline(cells_of, cell, ',');) cells.push_back(cell);
    rows.push_back(cells);
  }
  return rows;
}

TEST(StratumTrainTest, CallbacksStopRestoreReduceAndLogAsKerasDoes) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 6;
  job["fit"]["steps_per_epoch"] = 40;
  const std::string dir = TempPath("callbacks");
  RemovedAtEnd cleanup{dir};
  // min_delta 10: no epoch after the first improves, so EarlyStopping (patience 1) stops after
  // epoch 2 and restores epoch 1's weights; ReduceLROnPlateau (patience 0) cuts the rate
  // tenfold after each epoch from the second on.
  job["fit"]["callbacks"] = {
      {{"class_name", "EarlyStopping"},
       {"config",
        {{"patience", 1}, {"min_delta", 10}, {"restore_best_weights", true}, {"verbose", 1}}}},
      {{"class_name", "ReduceLROnPlateau"},
       {"config", {{"patience", 0}, {"min_delta", 10}, {"verbose", 1}}}},
      {{"class_name", "CSVLogger"}, {"config", {{"filename", dir + "/log.csv"}}}},
      {{"class_name", "TensorBoard"}, {"config", {{"log_dir", dir + "/tb"}}}},
      {{"class_name", "BackupAndRestore"},
       {"config", {{"backup_dir", dir + "/backup"}, {"delete_checkpoint", false}}}}};
  const std::string summary_path = TempPath("callbacks_summary.json");
  const std::string path = WriteJob(job, "callbacks");
  TrainRun run = RunTrain({"--job=" + path, "--progress=lines", "--summary_json=" + summary_path});
  ASSERT_EQ(run.exit.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("Epoch 2: ReduceLROnPlateau reducing learning rate to "
                                    "0.00010000000474974513."));
  EXPECT_THAT(run.output, HasSubstr("Epoch 2: early stopping"));
  EXPECT_THAT(run.output, HasSubstr("Restoring model weights from the end of the best epoch: 1."));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("Epoch 3/6")));
  std::ifstream summary_file(summary_path);
  const nlohmann::json summary = nlohmann::json::parse(summary_file);
  EXPECT_EQ(summary["epochs"], 2);
  EXPECT_EQ(summary["steps"], 80);
  EXPECT_EQ(summary["stopped_by"], "EarlyStopping");
  const nlohmann::json& history = summary["history"];
  // The model evaluated at the end is epoch 1's, restored: its test figures are epoch 1's.
  EXPECT_DOUBLE_EQ(summary["test_accuracy"].get<double>(),
                   history[0]["val_accuracy"].get<double>());
  EXPECT_DOUBLE_EQ(summary["test_loss"].get<double>(), history[0]["val_loss"].get<double>());

  const auto rows = CsvRows(dir + "/log.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"epoch", "accuracy", "learning_rate", "loss",
                                               "val_accuracy", "val_loss"}));
  EXPECT_EQ(rows[1][0], "0");
  EXPECT_EQ(rows[1][2], "0.0010000000474974513");
  EXPECT_EQ(rows[2][2], "0.0010000000474974513");  // the rate epoch 2 trained with
  EXPECT_DOUBLE_EQ(std::stod(rows[2][3]), history[1]["loss"].get<double>());

  auto scalars = testing::ReadTensorBoardScalars(dir + "/tb");
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  std::map<std::string, std::vector<double>> curves;
  for (const nlohmann::json& scalar : *scalars) {
    curves[scalar["run"].get<std::string>() + "/" + scalar["tag"].get<std::string>()].push_back(
        scalar["value"]);
  }
  ASSERT_EQ(curves["train/epoch_loss"].size(), 2u);
  ASSERT_EQ(curves["validation/epoch_accuracy"].size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_FLOAT_EQ(static_cast<float>(curves["train/epoch_loss"][e]),
                    static_cast<float>(history[e]["loss"].get<double>()));
    EXPECT_FLOAT_EQ(static_cast<float>(curves["validation/epoch_accuracy"][e]),
                    static_cast<float>(history[e]["val_accuracy"].get<double>()));
  }
  EXPECT_EQ(curves["train/epoch_examples_per_second"].size(), 2u);

  // Run again: the backup's last epoch records the stop, so the job is complete.
  TrainRun again = RunTrain({"--job=" + path, "--progress=lines"});
  ASSERT_EQ(again.exit.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("the checkpoint at step 80 completes this job: "
                                      "EarlyStopping stopped its training after epoch 2"));
  // The checkpoint was saved again with the restored weights: the model evaluated anew is
  // epoch 1's, as the first run reported.
  EXPECT_THAT(again.output, HasSubstr(absl::StrFormat("test accuracy %.4f, test loss %.4f",
                                                      summary["test_accuracy"].get<double>(),
                                                      summary["test_loss"].get<double>())));
  EXPECT_THAT(again.output, ::testing::Not(HasSubstr("Epoch 3/6")));
}

TEST(StratumTrainTest, ExportsTheModelInKerasFormatsThatReadBackAsTrained) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 200;
  const std::string dir = TempPath("export");
  RemovedAtEnd cleanup{dir};
  const std::string summary_path = TempPath("export_summary.json");
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "export"), "--progress=lines",
                           "--export=" + dir, "--summary_json=" + summary_path});
  ASSERT_EQ(run.exit.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("exported the model into " + dir +
                                    ": model.json, model.weights.h5, model.safetensors"));
  std::ifstream summary_file(summary_path);
  const nlohmann::json summary = nlohmann::json::parse(summary_file);
  // h5py finds Keras 3's layout, and a NumPy forward pass of the exported weights gives the
  // test accuracy stratum-train reported.
  absl::StatusOr<nlohmann::json> checked =
      testing::CheckKerasExport(dir, summary["test_accuracy"].get<double>());
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ((*checked)["layers"], 3);     // flatten, dense, dense_1
  EXPECT_EQ((*checked)["variables"], 4);  // two kernels, two biases
}

TEST(StratumTrainTest, AFunctionalModelExportsEveryLayerUnderKerasPaths) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_resnet.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 3;
  job["fit"]["validate"] = false;
  job.erase("checkpoint");
  const std::string dir = TempPath("export_functional");
  RemovedAtEnd cleanup{dir};
  TrainRun run = RunTrain(
      {"--job=" + WriteJob(job, "export_functional"), "--progress=none", "--export=" + dir});
  ASSERT_EQ(run.exit.exit_code, 0) << run.output;
  absl::StatusOr<nlohmann::json> checked = testing::CheckKerasExport(dir);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_GT((*checked)["variables"].get<int>(), 4) << checked->dump();
}

TrainRun RunPredict(const std::vector<std::string>& args) {
  return RunBinary("stratum-predict", args);
}

TEST(StratumPredictTest, AnExportedModelPredictsAndEvaluatesAsItTrained) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 150;
  const std::string dir = TempPath("predict_export");
  RemovedAtEnd cleanup{dir};
  const std::string job_path = WriteJob(job, "predict");
  TrainRun trained = RunTrain({"--job=" + job_path, "--progress=none", "--export=" + dir});
  ASSERT_EQ(trained.exit.exit_code, 0) << trained.output;
  std::smatch figures;
  ASSERT_TRUE(std::regex_search(trained.output, figures,
                                std::regex("test accuracy ([0-9.]+), test loss ([0-9.]+)")))
      << trained.output;
  // The job's data.test, and the same IDX files given directly: the figures of training.
  const std::string npy = dir + "/predictions.npy";
  TrainRun from_job = RunPredict({"--model=" + dir, "--job=" + job_path, "--output=" + npy});
  ASSERT_EQ(from_job.exit.exit_code, 0) << from_job.output;
  const std::string said =
      "10000 examples: accuracy " + figures[1].str() + ", loss " + figures[2].str();
  EXPECT_THAT(from_job.output, HasSubstr(said));
  const std::string csv = dir + "/predictions.csv";
  TrainRun from_idx = RunPredict(
      {"--model=" + dir, "--images=/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz",
       "--labels=/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", "--output=" + csv});
  ASSERT_EQ(from_idx.exit.exit_code, 0) << from_idx.output;
  EXPECT_THAT(from_idx.output, HasSubstr(said));
  // NumPy reads the .npy: 10000 x 10 probabilities whose argmax agrees with the CSV's
  // predicted column, row by row.
  const std::string check =
      std::string("/usr/bin/python3 -c \"import numpy as np, csv; a = np.load('") + npy +
      "'); rows = list(csv.reader(open('" + csv +
      "')))[1:]; assert a.shape == (10000, 10) and a.dtype == np.float32; "
      "assert [int(r[0]) for r in rows] == list(a.argmax(1)); "
      "assert np.allclose(a.sum(1), 1, atol=1e-5)\"";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
  TrainRun no_data = RunPredict({"--model=" + dir});
  EXPECT_EQ(no_data.exit.exit_code, 2) << no_data.output;
  EXPECT_THAT(no_data.output,
              HasSubstr("give the examples with --job (its data.test) or --images"));
}

TEST(StratumPredictTest, BadInputIsRefusedNamingTheFix) {
  TrainRun no_model = RunPredict({"--model=/nonexistent", "--images=x"});
  EXPECT_EQ(no_model.exit.exit_code, 2) << no_model.output;
  EXPECT_THAT(no_model.output, HasSubstr("/nonexistent/model.json"));
  TrainRun bad_output = RunPredict({"--model=/tmp", "--images=x", "--output=out.txt"});
  EXPECT_EQ(bad_output.exit.exit_code, 2);
  EXPECT_THAT(bad_output.output, HasSubstr("--output out.txt is neither .csv nor .npy"));
}

TEST(StratumTrainTest, AnExportFolderItCannotWriteIsRefusedBeforeTraining) {
  nlohmann::json job = ExampleJob();
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "export_refused"), "--export=/proc/nope"});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--export"));
  EXPECT_THAT(run.output, HasSubstr("/proc/nope"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("Epoch 1/")));
}

TEST(StratumTrainTest, BackupAndRestoreDeletesItsBackupOnceTheJobIsComplete) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 20;
  const std::string backup = TempPath("backup_deleted");
  RemovedAtEnd cleanup{backup};
  job["fit"]["callbacks"] = {
      {{"class_name", "BackupAndRestore"}, {"config", {{"backup_dir", backup}}}}};
  TrainRun run = RunTrain({"--job=" + WriteJob(job, "backup_deleted"), "--progress=lines"});
  ASSERT_EQ(run.exit.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("checkpoint at step 20 written"));
  EXPECT_THAT(run.output, HasSubstr("BackupAndRestore: the job is complete, so its backup in " +
                                    backup + " is deleted (delete_checkpoint)"));
  EXPECT_FALSE(std::filesystem::exists(backup + "/checkpoint"));
  EXPECT_FALSE(std::filesystem::exists(backup + "/ckpt-000000000020"));
}

// Its output's reader gone (`| head`, or the launcher that collects it killed): the run
// goes on and writes its checkpoints, instead of dying of SIGPIPE at its next line.
TEST(StratumTrainTest, AClosedOutputDoesNotEndTheRun) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 2;
  job["fit"]["steps_per_epoch"] = 50;
  const std::string checkpoints = TempPath("closed_output_ckpt");
  std::filesystem::remove_all(checkpoints);
  job["checkpoint"] = {{"dir", checkpoints}};
  const std::string status_file = TempPath("closed_output_status");
  // `true` exits at once, so stratum-train writes into a pipe that no one reads.
  const std::string command = "bash -c '" + std::string(STRATUM_BIN_DIR) +
                              "/stratum-train --job=" + WriteJob(job, "closed_output") +
                              " --progress=lines 2>&1 | true; echo ${PIPESTATUS[0]} > " +
                              status_file + "'";
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::ifstream status(status_file);
  int exit_code = -1;
  status >> exit_code;
  EXPECT_EQ(exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/ckpt-000000000100"));
  std::filesystem::remove_all(checkpoints);
}

// A full disk: the save is refused as the machine's state (exit 2, so a launcher does not
// restart into the same failure), the error says what is intact, and nothing half-written
// stays. The disk is a 300 KiB tmpfs in a mount namespace of the test's own (root only).
TEST(StratumTrainTest, AFullDiskEndsTheRunWithTheFixAndTheCheckpointStillIntact) {
  const std::string disk = TempPath("full_disk");
  std::filesystem::create_directories(disk);
  const std::string probe =
      "unshare -m --propagation private mount -t tmpfs -o size=300k tmpfs " + disk + " 2>/dev/null";
  if (std::system(probe.c_str()) != 0) {
    std::filesystem::remove_all(disk);
    GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace here (needs root)";
  }
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 2;
  job["fit"]["steps_per_epoch"] = 20;
  job["checkpoint"] = {{"dir", disk + "/ckpt"}};
  const std::string path = WriteJob(job, "full_disk");
  const std::string output = TempPath("full_disk_output");
  // The first save (about 1.2 MB) does not fit.
  const std::string command =
      "unshare -m --propagation private sh -c 'mount -t tmpfs -o size=300k tmpfs " + disk + " && " +
      std::string(STRATUM_BIN_DIR) + "/stratum-train --job=" + path + " --progress=lines > " +
      output + " 2>&1; echo $? >> " + output + "; ls " + disk + "/ckpt >> " + output + "'";
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::stringstream text;
  text << std::ifstream(output).rdbuf();
  EXPECT_THAT(
      text.str(),
      HasSubstr("stratum-train: the checkpoint at step 20 was not saved: cannot write " + disk +
                "/ckpt/ckpt-000000000020/state.safetensors: No space left on "
                "device (free space on its disk, or write it to another one); " +
                disk + "/ckpt holds no earlier checkpoint\n2\n"));
  EXPECT_THAT(text.str(), ::testing::Not(HasSubstr("ckpt-000000000020\n")));  // not left
  std::filesystem::remove(output);
  std::filesystem::remove_all(disk);
}

// --progress none drops the epoch lines, not what happens: a resume is still said (QA: it
// was not). Log lines go to stderr, so stdout holds the results alone (QA: they were on
// stdout, as spdlog's default logger writes).
TEST(StratumTrainTest, WithoutProgressLinesAResumeIsStillSaidAndLogLinesGoToStderr) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 2;
  job["fit"]["steps_per_epoch"] = 20;
  const std::string checkpoints = TempPath("quiet_ckpt");
  std::filesystem::remove_all(checkpoints);
  job["checkpoint"] = {{"dir", checkpoints}};
  const std::string path = WriteJob(job, "quiet");
  const std::string stdout_file = TempPath("quiet_stdout");
  const std::string command = std::string(STRATUM_BIN_DIR) + "/stratum-train --job=" + path +
                              " --progress=none --epochs=1 2>/dev/null >" + stdout_file;
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::stringstream first;
  first << std::ifstream(stdout_file).rdbuf();
  EXPECT_THAT(first.str(), HasSubstr("test accuracy "));
  EXPECT_THAT(first.str(), ::testing::Not(HasSubstr("checkpoint at step 20 written")));
  EXPECT_THAT(first.str(), ::testing::Not(HasSubstr("Epoch 1/1")));
  TrainRun again = RunTrain({"--job=" + path, "--progress=none"});
  EXPECT_EQ(again.exit.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("resumed from checkpoint step 20 (epoch 2, step 0)"));
  EXPECT_THAT(again.output, HasSubstr(" I stratum-train] checkpoint at step 40 written"));
  std::filesystem::remove(stdout_file);
  std::filesystem::remove_all(checkpoints);
}

TEST(StratumTrainTest, HelpListsTheFlags) {
  TrainRun run = RunTrain({"--help"});
  EXPECT_EQ(run.exit.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, StartsWith("stratum-train: trains a job in one process"));
  EXPECT_THAT(run.output, HasSubstr("--job (The job file (JSON)"));
  EXPECT_THAT(run.output, HasSubstr("--summary_json ("));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("No flags matched")));
}

TEST(StratumTrainTest, BadFlagValuesAreRefusedBeforeTraining) {
  TrainRun run = RunTrain({"--job=" + WriteJob(ExampleJob(), "flags"), "--epochs=-1"});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--epochs -1 is negative"));
  run = RunTrain({"--job=" + WriteJob(ExampleJob(), "flags"), "--summary_json=/tmp"});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--summary_json /tmp is a folder: pass the path of a file"));
}

TEST(StratumTrainTest, NoJobIsAUsageError) {
  TrainRun run = RunTrain({});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("no job given: pass --job=FILE"));
  run = RunTrain({"--job=/nonexistent/job.json"});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("job file /nonexistent/job.json cannot be read"));
}

TEST(StratumTrainTest, ASigtermSavesTheStateAfterTheStepAndARunAgainResumesThere) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 50;  // far longer than the test waits
  const std::string checkpoints = TempPath("stopped_ckpt");
  std::filesystem::remove_all(checkpoints);
  job["checkpoint"] = {{"dir", checkpoints}};
  const std::string path = WriteJob(job, "stopped");
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/stratum-train", "--job=" + path,
                  "--progress=lines"};
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  ASSERT_TRUE(process.ok()) << process.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while ((*process)->output().find("Epoch 1/50") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  // A second run of the job meanwhile would resume and prune the first's checkpoints.
  TrainRun second = RunTrain({"--job=" + path, "--progress=lines"});
  EXPECT_EQ(second.exit.exit_code, 2) << second.output;
  EXPECT_THAT(second.output,
              HasSubstr("checkpoint.dir " + checkpoints + " is in use by another job (pid " +
                        std::to_string((*process)->pid()) + " on "));
  (*process)->Signal(SIGTERM);
  auto exit = (*process)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = (*process)->output();
  EXPECT_EQ(exit->exit_code, 128 + SIGTERM) << output;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(
      output, match, std::regex("training stopped after step ([0-9]+) \\(epoch ([0-9]+)")))
      << output;
  EXPECT_THAT(output, HasSubstr("this process was stopped by a signal; the state at step "));
  const int64_t step = std::stoll(match[1]);
  std::ifstream pointer(checkpoints + "/checkpoint");
  EXPECT_EQ(nlohmann::json::parse(pointer, nullptr, false)["step"], step);

  // Run again to the end of the epoch it stopped in: it resumes from that step.
  TrainRun resumed = RunTrain({"--job=" + path, "--progress=lines", "--epochs=" + match[2].str()});
  EXPECT_EQ(resumed.exit.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed from checkpoint step " + std::to_string(step)));
  std::filesystem::remove_all(checkpoints);
}

// QA's report: a manifest edited to "epoch": -1 and "step_in_epoch": 999 (its checksum
// removed, as a checkpoint written before checksums has none) was resumed from as it was.
// It is damage: the checkpoint before it is restored, the forged one kept as .damaged,
// and with no intact one left the run stops, naming the file, the field and the fix.
TEST(StratumTrainTest, AManifestEditedToAPlaceNoRunCanBeAtIsNotResumedFrom) {
  nlohmann::json job = ExampleJob();
  job["fit"]["epochs"] = 2;
  job["fit"]["steps_per_epoch"] = 50;
  const std::string checkpoints = TempPath("forged_ckpt");
  std::filesystem::remove_all(checkpoints);
  job["checkpoint"] = {{"dir", checkpoints}};
  const std::string path = WriteJob(job, "forged");
  const RemovedAtEnd removed[] = {{checkpoints}, {path}};
  TrainRun first = RunTrain({"--job=" + path, "--progress=lines"});
  ASSERT_EQ(first.exit.exit_code, 0) << first.output;
  auto forge = [&](const std::string& folder) {
    const std::string manifest = checkpoints + "/" + folder + "/manifest.json";
    std::ifstream in(manifest);
    nlohmann::json edited = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(edited.is_object()) << manifest;
    edited.erase("manifest_crc32");
    edited["epoch"] = -1;
    edited["step_in_epoch"] = 999;
    std::ofstream(manifest) << edited.dump(2);
  };
  forge("ckpt-000000000100");
  TrainRun again = RunTrain({"--job=" + path, "--progress=lines"});
  EXPECT_EQ(again.exit.exit_code, 0) << again.output;
  EXPECT_THAT(again.output,
              HasSubstr("ckpt-000000000050 instead of the latest checkpoint, which "
                        "is damaged (" +
                        checkpoints + "/ckpt-000000000100/manifest.json gives epoch -1"));
  EXPECT_THAT(again.output, HasSubstr("resumed from checkpoint step 50 (epoch 2, step 0)"));
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/ckpt-000000000100.damaged"));

  // Every checkpoint forged: nothing to resume from, and nothing renamed.
  forge("ckpt-000000000050");
  forge("ckpt-000000000100");
  TrainRun refused = RunTrain({"--job=" + path, "--progress=lines"});
  EXPECT_EQ(refused.exit.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output,
              ::testing::AllOf(HasSubstr("no checkpoint in " + checkpoints + " is intact"),
                               HasSubstr("ckpt-000000000050/manifest.json gives epoch -1"),
                               HasSubstr("to train from scratch, remove " + checkpoints)));
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/ckpt-000000000050"));
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/ckpt-000000000100"));
}

}  // namespace
}  // namespace stratum
