// Parameter-server training with real processes: a coordinator, workers and parameter
// servers on loopback training Fashion-MNIST, and a worker killed in the middle of it.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/net/free_port.h"
#include "stratum/testing/ids_beyond_2_to_24.h"
#include "stratum/testing/independent_readers.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using ::testing::Not;
using testing::RemoveFolder;
using testing::TempPath;

std::string WriteJob(int epochs, int steps_per_epoch, const std::string& name,
                     const std::string& checkpoint_dir = "", int every_steps = 0) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_ps.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["fit"]["epochs"] = epochs;
  job["fit"]["steps_per_epoch"] = steps_per_epoch;
  job.erase("checkpoint");
  if (!checkpoint_dir.empty()) {
    job["checkpoint"] = {{"dir", checkpoint_dir}, {"every_steps", every_steps}, {"max_to_keep", 2}};
  }
  const std::string path = TempPath(name + ".json");
  std::ofstream(path) << job.dump();
  return path;
}

// A chief training the job file `job` of `epochs` epochs (with `chief_args` besides
// --job) on `workers` workers and 2 PS (with `ps_args`), once its first epoch is done;
// null, with the failure added, otherwise.
std::unique_ptr<LocalCluster> PsJobPastItsFirstEpoch(const std::string& job, int epochs,
                                                     std::vector<std::string> chief_args = {},
                                                     int workers = 2,
                                                     std::vector<std::string> ps_args = {}) {
  chief_args.insert(chief_args.begin(), "--job=" + job);
  auto cluster = LocalCluster::Start({.num_workers = workers,
                                      .num_ps = 2,
                                      .chief = true,
                                      .args_by_type = {{"chief", chief_args}, {"ps", ps_args}},
                                      .forward_output = false});
  if (!cluster.ok()) {
    ADD_FAILURE() << cluster.status();
    return nullptr;
  }
  if (!(*cluster)->WaitForOutput({"chief", 0}, absl::StrCat("Epoch 1/", epochs),
                                 absl::Seconds(60))) {
    ADD_FAILURE() << (*cluster)->Output({"chief", 0});
    return nullptr;
  }
  return *std::move(cluster);
}

// A job of 50 epochs of 100 steps on 2 workers and 2 PS whose only checkpoints are those
// a stop asks for (every_steps is past its end), once its first epoch is done; null, with
// the failure added, otherwise.
std::unique_ptr<LocalCluster> LongJobPastItsFirstEpoch(const std::string& name,
                                                       const std::string& checkpoints,
                                                       int every_steps = 1000000) {
  RemoveFolder(checkpoints);
  return PsJobPastItsFirstEpoch(WriteJob(50, 100, name, checkpoints, every_steps), 50);
}

// A coordinator process of its own (not the cluster's chief) with `tf_config`, training `job`.
std::unique_ptr<Subprocess> SpawnCoordinator(const std::string& tf_config, const std::string& job,
                                             const std::vector<std::string>& args = {}) {
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/stratum-coordinator", "--job=" + job};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.env = {{"TF_CONFIG", tf_config}};
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

// The cluster's chief stopped (SIGSTOP) while a second coordinator with `tf_config` trains
// `job` (of 2 epochs): the second takes over once the chief has been silent past the lease,
// and finishes; the chief, continued, stops rather than train against it. Returns the
// chief's output.
std::string ExpectATakeoverOfTheSilentChief(LocalCluster& cluster, const std::string& tf_config,
                                            const std::string& job) {
  EXPECT_OK(cluster.Signal({"chief", 0}, SIGSTOP));
  auto takeover = SpawnCoordinator(tf_config, job);
  std::string output = "(not started)";
  bool succeeded = false;
  if (takeover != nullptr) {
    absl::StatusOr<ExitInfo> exit = takeover->Wait(absl::Seconds(60));
    output = exit.ok() ? takeover->output() : exit.status().ToString();
    succeeded = exit.ok() && exit->success();
  }
  EXPECT_OK(cluster.Signal({"chief", 0}, SIGCONT));
  EXPECT_TRUE(succeeded) << output;
  EXPECT_THAT(output, HasSubstr("Epoch 2/2"));
  auto first_exit = cluster.WaitForExit({"chief", 0}, absl::Seconds(60));
  EXPECT_TRUE(first_exit.ok() && !first_exit->success());
  const std::string first = cluster.Output({"chief", 0});
  EXPECT_THAT(first, HasSubstr("took it over after this coordinator was silent for "));
  EXPECT_THAT(first, HasSubstr("; this coordinator stops and leaves the job to it"));
  return first;
}

// The last match of the regular expression `pattern` in `text`; "" if none.
std::string LastMatch(const std::string& text, const std::string& pattern) {
  const std::regex regex(pattern);
  std::string last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), regex);
       it != std::sregex_iterator(); ++it) {
    last = it->str();
  }
  return last;
}

// The step at the end of `found` ("... step 2814").
int64_t StepAtTheEnd(const std::string& found) {
  return std::stoll(found.substr(found.rfind(' ') + 1));
}

TEST(PsTrainingTest, TrainsFashionMnistOnTwoWorkersAndTwoPs) {
  const std::string checkpoints = TempPath("ckpt_ps_job");
  RemoveFolder(checkpoints);
  const std::string summary = TempPath("ps_summary.json");
  auto cluster =
      LocalCluster::Start({.num_workers = 2,
                           .num_ps = 2,
                           .chief = true,
                           .args_by_type = {{"chief",
                                             {"--job=" + WriteJob(2, 100, "ps_job", checkpoints, 0),
                                              "--summary_json=" + summary}}},
                           .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = (*cluster)->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("Epoch 2/2 - 100 steps on 2 workers"));
  // every_steps 0: a checkpoint at each epoch's end.
  EXPECT_THAT(output, HasSubstr("checkpoint at step 100 written"));
  EXPECT_THAT(output, HasSubstr("checkpoint at step 200 written"));
  RemoveFolder(checkpoints);
  std::ifstream file(summary);
  const nlohmann::json result = nlohmann::json::parse(file);
  EXPECT_EQ(result["strategy"], "ParameterServerStrategy");
  EXPECT_EQ(result["num_workers"], 2);
  EXPECT_EQ(result["num_ps"], 2);
  EXPECT_EQ(result["steps"], 200);
  // 200 asynchronous steps of 64 examples: well above chance (0.1), seen 0.71 to 0.80.
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.6);
  // Both workers were set up and trained.
  for (int w = 0; w < 2; ++w) {
    EXPECT_THAT((*cluster)->Output({"worker", w}), HasSubstr("job set up by coordinator"));
  }
}

TEST(PsTrainingTest, SeveralClosuresInFlightPerWorkerSetEachWorkerUpOnce) {
  // Two closures in flight per worker: the first two race to set the worker up; exactly one
  // SetupJob reaches each worker, and every step is trained.
  const std::string summary = TempPath("ps_inflight_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 1,
       .chief = true,
       .args_by_type = {{"chief",
                         {"--job=" + WriteJob(1, 60, "ps_inflight_job"), "--closures_per_worker=2",
                          "--summary_json=" + summary}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_TRUE(exit->success()) << (*cluster)->Output({"chief", 0});
  std::ifstream file(summary);
  EXPECT_EQ(nlohmann::json::parse(file)["steps"], 60);
  for (int w = 0; w < 2; ++w) {
    const std::string output = (*cluster)->Output({"worker", w});
    size_t setups = 0;
    for (size_t at = output.find("job set up by coordinator"); at != std::string::npos;
         at = output.find("job set up by coordinator", at + 1)) {
      ++setups;
    }
    EXPECT_EQ(setups, 1u) << output;
  }
}

// Refused at once, before the cluster is waited for (here it never comes up).
TEST(PsTrainingTest, ASingleProcessJobIsRefusedWithTheFix) {
  auto cluster = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 1,
       .chief = true,
       .not_started = {{"worker", 0}, {"ps", 0}},
       .args_by_type = {{"chief",
                         {"--cluster_timeout=5m", "--job=" + std::string(STRATUM_SOURCE_DIR) +
                                                      "/examples/fashion_mnist.json"}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 2);
  EXPECT_THAT((*cluster)->Output({"chief", 0}),
              HasSubstr("strategy.type is \"default\", but the coordinator trains "
                        "parameter_server jobs"));
}

TEST(PsTrainingTest, CallbacksStopTheJobAndLogItsEpochsOnTheCoordinator) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_ps.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job.erase("checkpoint");
  job["fit"]["epochs"] = 5;
  job["fit"]["steps_per_epoch"] = 40;
  const std::string dir = TempPath("ps_callbacks");
  RemoveFolder(dir);
  // min_delta 10: no epoch after the first improves: EarlyStopping stops after epoch 2, and
  // ReduceLROnPlateau (patience 0) halves the PSs' rate after it.
  job["checkpoint"] = {{"dir", dir + "/ckpt"}};
  job["fit"]["callbacks"] = {
      {{"class_name", "ReduceLROnPlateau"},
       {"config", {{"patience", 0}, {"min_delta", 10}, {"factor", 0.5}, {"verbose", 1}}}},
      {{"class_name", "EarlyStopping"},
       {"config",
        {{"monitor", "val_loss"},
         {"patience", 1},
         {"min_delta", 10},
         {"verbose", 1},
         {"restore_best_weights", true}}}},
      {{"class_name", "CSVLogger"}, {"config", {{"filename", dir + "/log.csv"}}}},
      {{"class_name", "TensorBoard"}, {"config", {{"log_dir", dir + "/tb"}, {"update_freq", 10}}}},
      {{"class_name", "ModelCheckpoint"},
       {"config", {{"filepath", dir + "/best"}, {"save_best_only", true}, {"verbose", 1}}}},
      "TerminateOnNaN"};
  const std::string path = TempPath("ps_callbacks.json");
  std::ofstream(path) << job.dump();
  const std::string summary = TempPath("ps_callbacks_summary.json");
  const std::string exported = dir + "/export";
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 2,
       .chief = true,
       .args_by_type = {{"chief",
                         {"--job=" + path, "--summary_json=" + summary, "--export=" + exported}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = (*cluster)->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("Epoch 2: early stopping"));
  EXPECT_THAT(output, Not(HasSubstr("Epoch 3/5")));
  // Closures report at the epoch's end: update_freq's step scalars are said to be absent.
  EXPECT_THAT(output, HasSubstr("update_freq 10 writes the epochs' scalars only"));
  std::ifstream summary_file(summary);
  const nlohmann::json result = nlohmann::json::parse(summary_file);
  EXPECT_EQ(result["epochs"], 2);
  EXPECT_EQ(result["steps"], 80);
  EXPECT_EQ(result["stopped_by"], "EarlyStopping");
  // The PSs took epoch 1's variables back: the job's test figures are epoch 1's.
  EXPECT_THAT(output, HasSubstr("Restoring model weights from the end of the best epoch: 1."));
  EXPECT_DOUBLE_EQ(result["test_accuracy"].get<double>(),
                   result["history"][0]["val_accuracy"].get<double>());
  std::ifstream csv(dir + "/log.csv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "epoch,accuracy,learning_rate,loss,val_accuracy,val_loss");
  // The PSs took the rate: the checkpoint after epoch 2 saves their optimizer with it.
  EXPECT_THAT(
      output,
      HasSubstr("Epoch 2: ReduceLROnPlateau reducing learning rate to 0.0005000000237487257."));
  int optimizers_seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt/ckpt-000000000080")) {
    if (entry.path().extension() != ".safetensors") continue;
    absl::StatusOr<TensorFile> file = ReadSafetensors(entry.path().string());
    ASSERT_TRUE(file.ok()) << file.status();
    for (const auto& [key, value] : file->metadata) {
      if (!absl::EndsWith(key, "kernel.optimizer") &&
          !absl::EndsWith(key, "kernel/part_0.optimizer")) {
        continue;
      }
      EXPECT_FLOAT_EQ(nlohmann::json::parse(value)["config"]["learning_rate"].get<float>(), 0.0005f)
          << key << ": " << value;
      ++optimizers_seen;
    }
  }
  EXPECT_GT(optimizers_seen, 0);
  auto scalars = testing::ReadTensorBoardScalars(dir + "/tb");
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  std::vector<double> val_loss;
  for (const nlohmann::json& scalar : *scalars) {
    if (scalar["run"] == "validation" && scalar["tag"] == "epoch_loss") {
      val_loss.push_back(scalar["value"]);
    }
  }
  ASSERT_EQ(val_loss.size(), 2u);
  EXPECT_FLOAT_EQ(static_cast<float>(val_loss[1]),
                  static_cast<float>(result["history"][1]["val_loss"].get<double>()));
  // The export, pulled from the PSs at the end, reads back in Keras' layout and gives the
  // test accuracy the job reported.
  EXPECT_THAT(output, HasSubstr("exported the model into " + exported));
  const absl::Status checked =
      testing::CheckKerasExport(exported, result["test_accuracy"].get<double>()).status();
  EXPECT_TRUE(checked.ok()) << checked;
  // ModelCheckpoint kept the epoch of the lowest val_loss, pulled from the PSs then.
  EXPECT_THAT(output, HasSubstr("Epoch 1: val_loss improved from inf to "));
  const nlohmann::json& history = result["history"];
  const nlohmann::json& best =
      history[0]["val_loss"] <= history[1]["val_loss"] ? history[0] : history[1];
  const absl::Status best_checked =
      testing::CheckKerasExport(dir + "/best", best["val_accuracy"].get<double>()).status();
  EXPECT_TRUE(best_checked.ok()) << best_checked;
  RemoveFolder(dir);
}

// The embedding example with a table whose one shard is larger than a message (2^22 x 18,
// 288 MiB, on one PS: the tutorial's partitioner with one ps task): the steps move its rows;
// EarlyStopping puts it back whole and the export pulls it whole (as ModelCheckpoint does),
// each in pieces of rows. The export reads back in Keras' layout, table included, and gives
// the test accuracy the job reported (the weights of its best epoch).
TEST(PsTrainingTest, AShardLargerThanAMessageTrainsAndTravelsWholeInPieces) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_embedding.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["strategy"] = {{"type", "parameter_server"}};
  job["model"]["config"]["layers"][1]["config"]["input_dim"] = 1 << 22;
  job["model"]["config"]["layers"][1]["config"]["output_dim"] = 18;
  job["compile"]["optimizer"] = {{"class_name", "SGD"}, {"config", {{"learning_rate", 0.2}}}};
  job["fit"]["epochs"] = 3;
  job["fit"]["steps_per_epoch"] = 20;
  const std::string dir = TempPath("ps_large_shard");
  RemoveFolder(dir);
  // min_delta 10: no epoch after the first improves; EarlyStopping stops after epoch 2 and
  // restores epoch 1's weights.
  job["fit"]["callbacks"] = {{{"class_name", "EarlyStopping"},
                              {"config",
                               {{"monitor", "val_loss"},
                                {"patience", 1},
                                {"min_delta", 10},
                                {"verbose", 1},
                                {"restore_best_weights", true}}}}};
  const std::string path = TempPath("ps_large_shard.json");
  std::ofstream(path) << job.dump();
  const std::string summary = TempPath("ps_large_shard_summary.json");
  const std::string exported = dir + "/export";
  auto cluster = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 1,
       .chief = true,
       .args_by_type = {{"chief",
                         {"--job=" + path, "--summary_json=" + summary, "--export=" + exported}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(120));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = (*cluster)->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("Restoring model weights from the end of the best epoch: 1."));
  std::ifstream summary_file(summary);
  const nlohmann::json result = nlohmann::json::parse(summary_file);
  EXPECT_DOUBLE_EQ(result["test_accuracy"].get<double>(),
                   result["history"][0]["val_accuracy"].get<double>());
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.2);  // chance is 0.1
  absl::StatusOr<nlohmann::json> checked =
      testing::CheckKerasExport(exported, result["test_accuracy"].get<double>());
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ((*checked)["variables"], 5);  // the table, two kernels, two biases
  RemoveFolder(dir);
}

// A dense variable whose shard would not fit one message (a 256 MiB kernel, unsplit)
// travels whole with every step: refused before any task is waited for, naming the
// partitioner that splits it.
TEST(PsTrainingTest, ADenseShardLargerThanAMessageIsRefusedWithThePartitionerThatSplitsIt) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_embedding.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["strategy"] = {{"type", "parameter_server"}};
  job["model"]["config"]["layers"][3]["config"]["units"] = 21400;  // 3136 x 21400 floats
  const std::string path = TempPath("ps_huge_shard.json");
  std::ofstream(path) << job.dump();
  auto cluster = LocalCluster::Start({.num_workers = 1,
                                      .num_ps = 1,
                                      .chief = true,
                                      .not_started = {{"worker", 0}, {"ps", 0}},
                                      .args_by_type = {{"chief", {"--job=" + path}}},
                                      .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 2);
  const std::string output = (*cluster)->Output({"chief", 0});
  EXPECT_THAT(output, HasSubstr("has a shard of 268441600 bytes, more than one message carries"));
  EXPECT_THAT(output, HasSubstr("a dense variable's shard travels whole with every step"));
  EXPECT_THAT(output, HasSubstr("\"max_shard_bytes\": 134217728"));
}

TEST(PsTrainingTest, AKilledWorkerIsRetriedAroundAndTakesClosuresAgainAfterItsRestart) {
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 1,
       .chief = true,
       // Enough steps after the kill that the restarted worker is back before the job ends,
       // also on a loaded machine (4 epochs were not: seen once in CI).
       .args_by_type = {{"chief", {"--job=" + WriteJob(8, 150, "ps_fault_job")}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForOutput({"chief", 0}, "Epoch 1/8", absl::Seconds(60)))
      << (*cluster)->Output({"chief", 0});
  ASSERT_OK((*cluster)->Kill({"worker", 1}));
  ASSERT_TRUE((*cluster)->WaitForOutput({"chief", 0}, "worker:1 at", absl::Seconds(30)))
      << (*cluster)->Output({"chief", 0});
  const absl::Status restarted = (*cluster)->Restart({"worker", 1});
  ASSERT_TRUE(restarted.ok()) << restarted;
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(120));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = (*cluster)->Output({"chief", 0});
  EXPECT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("Epoch 8/8"));
  EXPECT_THAT(output, HasSubstr("worker:1 at " + (*cluster)->Address({"worker", 1}) + " is down"));
  EXPECT_THAT(output, HasSubstr("answers again; it will be set up anew"));
  // The restarted worker (a new process) was set up again and ran closures.
  EXPECT_THAT((*cluster)->Output({"worker", 1}), HasSubstr("job set up by coordinator"));
}

// Words that start a task in a mount namespace of its own where Fashion-MNIST's folder is
// an empty tmpfs: it cannot read the job's data, as a worker on a machine without the data
// set (or with a broken mount) would. Empty (the test skips) where that cannot be made.
std::vector<std::string> WithoutTheDataSet() {
  const std::string hide =
      "mount -t tmpfs none /usr/share/datasets/fashion-mnist && exec \"$0\" \"$@\"";
  const std::vector<std::string> words = {"/usr/bin/unshare", "--mount", "--",
                                          "/bin/sh",          "-c",      hide};
  std::vector<std::string> probe = words;
  probe.insert(probe.end(), {"/bin/sh", "-c",
                             "test ! -e /usr/share/datasets/fashion-mnist/"
                             "train-images-idx3-ubyte.gz"});
  absl::StatusOr<std::unique_ptr<Subprocess>> run =
      Subprocess::Spawn({.argv = probe, .forward_fd = -1});
  if (!run.ok()) return {};
  absl::StatusOr<ExitInfo> exit = (*run)->Wait(absl::Seconds(10));
  if (!exit.ok() || !exit->success()) return {};
  return words;
}

// Hardening case 9: a worker that cannot set the job up (its data cannot be read) is left
// out, named with the reason, and the job trains on the others; it fails, with the
// workers' reasons, only when no worker can.
TEST(PsTrainingTest, AWorkerThatCannotSetTheJobUpIsLeftOutAndTheOthersTrain) {
  const std::vector<std::string> hidden = WithoutTheDataSet();
  if (hidden.empty()) GTEST_SKIP() << "no mount namespace can be made here (needs root)";
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 1,
       .chief = true,
       .args_by_type = {{"chief", {"--job=" + WriteJob(2, 100, "ps_left_out_job")}}},
       .wrapper_by_task = {{{"worker", 1}, hidden}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(120));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = (*cluster)->Output({"chief", 0});
  EXPECT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("Epoch 2/2"));
  EXPECT_THAT(output, HasSubstr("worker:1 at " + (*cluster)->Address({"worker", 1}) +
                                " cannot set the job up, so it is left out until it restarts"));
  EXPECT_THAT(output, HasSubstr("train-images-idx3-ubyte.gz"));
  EXPECT_THAT(output, ::testing::ContainsRegex(testing::kTestFigures));

  auto none = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 1,
       .chief = true,
       .args_by_type = {{"chief", {"--job=" + WriteJob(2, 100, "ps_no_worker_job")}}},
       .wrapper_by_task = {{{"worker", 0}, hidden}},
       .forward_output = false});
  ASSERT_TRUE(none.ok()) << none.status();
  const absl::Time start = absl::Now();
  auto failed = (*none)->WaitForExit({"chief", 0}, absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_FALSE(failed->success());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // not the recovery timeout
  EXPECT_THAT((*none)->Output({"chief", 0}),
              HasSubstr("no worker can set the job up, so no closure can run: worker:0 at"));
  // Not said to be waited for: it never is.
  EXPECT_THAT((*none)->Output({"chief", 0}), Not(HasSubstr("every worker is down")));
}

TEST(PsTrainingTest, AKilledPsIsReportedByNameNotWaitedFor) {
  auto cluster = PsJobPastItsFirstEpoch(WriteJob(50, 100, "ps_dies_job"), 50, {}, 1);
  ASSERT_NE(cluster, nullptr);
  ASSERT_OK(cluster->Kill({"ps", 1}));
  const absl::Time killed = absl::Now();
  auto exit = cluster->WaitForExit({"chief", 0}, absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 1);
  EXPECT_LT(absl::Now() - killed, absl::Seconds(30));
  EXPECT_THAT(
      cluster->Output({"chief", 0}),
      HasSubstr("a parameter server is unavailable: ps:1 at " + cluster->Address({"ps", 1})));
  EXPECT_THAT(cluster->Output({"chief", 0}),
              HasSubstr("; the job has no checkpoint.dir to re-seed a parameter server from, so "
                        "training does not wait for it: set checkpoint.dir"));
}

// Every epoch of a job's summary covers the whole epoch once, with its steps before a
// resume or a rollback (the checkpoint keeps the epochs' record), whatever was restarted.
void ExpectThreeWholeEpochs(const std::string& summary_path, const std::string& output) {
  std::ifstream file(summary_path);
  const nlohmann::json summary = nlohmann::json::parse(file, nullptr, false);
  ASSERT_TRUE(summary.is_object()) << output;
  ASSERT_EQ(summary["history"].size(), 3u) << summary.dump();
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(summary["history"][e]["epoch"], e + 1);
    EXPECT_EQ(summary["history"][e]["steps"], 100) << summary.dump();
  }
  EXPECT_EQ(summary["steps"], 300);
}

TEST(PsTrainingTest, ARestartedCoordinatorResumesFromTheLastCheckpoint) {
  const std::string checkpoints = TempPath("ckpt");
  RemoveFolder(checkpoints);
  const std::string summary = TempPath("resume_summary.json");
  const std::string job = WriteJob(3, 100, "resume_job", checkpoints, 50);
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 2,
       .chief = true,
       .args_by_type = {{"chief", {"--job=" + job, "--summary_json=" + summary}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForOutput({"chief", 0}, "Epoch 1/3", absl::Seconds(60)))
      << (*cluster)->Output({"chief", 0});
  ASSERT_OK((*cluster)->Kill({"chief", 0}));
  ASSERT_OK((*cluster)->Restart({"chief", 0}));
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = (*cluster)->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << output;
  // Resumed at a checkpoint of the first run (every 50 steps, so at least step 100), not 0.
  const size_t at = output.find("resumed from the checkpoint at step ");
  ASSERT_NE(at, std::string::npos) << output;
  EXPECT_GE(std::stoll(output.substr(at + 36)), 100);
  EXPECT_THAT(output, HasSubstr("Epoch 3/3"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("Epoch 1/3")));
  ExpectThreeWholeEpochs(summary, output);
  // Run once more, the checkpoint completes the job: it is evaluated, not trained again,
  // and its record of the epochs is the summary's.
  ASSERT_OK((*cluster)->Restart({"chief", 0}));
  exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string again = (*cluster)->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << again;
  EXPECT_THAT(again, HasSubstr("the checkpoint at step 300 already completes this job's 3 epochs"));
  ExpectThreeWholeEpochs(summary, again);
  std::ifstream final_file(summary);
  const nlohmann::json final_summary = nlohmann::json::parse(final_file, nullptr, false);
  ASSERT_TRUE(final_summary.is_object());
  EXPECT_GT(final_summary["test_accuracy"].get<double>(), 0.5);
  // It trained nothing, so it has no speed (its summary said 0.0).
  EXPECT_TRUE(final_summary["examples_per_sec"].is_null()) << final_summary;
  EXPECT_THAT(again, HasSubstr(", nothing left to train, "));
  // The final checkpoint is complete, readable, and only max_to_keep are kept.
  std::ifstream pointer(checkpoints + "/checkpoint");
  const nlohmann::json latest = nlohmann::json::parse(pointer);
  EXPECT_EQ(latest["step"], 300);
  int folders = 0;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    if (entry.is_directory()) ++folders;
  }
  EXPECT_EQ(folders, 2);
  std::ifstream manifest(checkpoints + "/" + latest["latest"].get<std::string>() +
                         "/manifest.json");
  const nlohmann::json parsed = nlohmann::json::parse(manifest);
  EXPECT_EQ(parsed["files"].size(), 2u);
  // Resumed with another kind of optimizer, whose slots the checkpoint lacks: refused as the
  // job's configuration (exit 2, which launchers do not restart), naming both.
  std::ifstream adam_file(job);
  nlohmann::json sgd_job = nlohmann::json::parse(adam_file);
  sgd_job["compile"]["optimizer"] = "sgd";
  std::ofstream(job) << sgd_job.dump();
  ASSERT_OK((*cluster)->Restart({"chief", 0}));
  exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 2) << (*cluster)->Output({"chief", 0});
  EXPECT_THAT((*cluster)->Output({"chief", 0}),
              HasSubstr("was trained with optimizer Adam, but the job uses SGD: use the job's "
                        "earlier optimizer, or another checkpoint.dir"));
  RemoveFolder(checkpoints);
}

// The test accuracy in the summary a finished `cluster`'s chief wrote to `summary`; -1 when
// it failed (the failure added).
double TestAccuracyOfFinishedJob(LocalCluster& cluster, const std::string& summary) {
  auto exit = cluster.WaitForExit({"chief", 0}, absl::Seconds(90));
  EXPECT_TRUE(exit.ok()) << exit.status();
  if (!exit.ok() || !exit->success()) {
    ADD_FAILURE() << cluster.Output({"chief", 0});
    return -1;
  }
  std::ifstream file(summary);
  const nlohmann::json result = nlohmann::json::parse(file, nullptr, false);
  EXPECT_TRUE(result.is_object()) << cluster.Output({"chief", 0});
  return result.is_object() ? result.value("test_accuracy", -1.0) : -1;
}

// A job saved on 2 PS, its variables whole, resumes on 3 PS with every variable in 3 shards
// (as TensorFlow restores a ShardedVariable): restored re-split, the model evaluates as it
// did when saved.
TEST(PsTrainingTest, ACheckpointOfTwoPsResumesOnThreeWithItsVariablesSplitAgain) {
  const std::string checkpoints = TempPath("ckpt_reshard");
  RemoveFolder(checkpoints);
  const std::string summary = TempPath("reshard_summary.json");
  const std::string job = WriteJob(1, 30, "reshard_job", checkpoints, 0);
  auto saved = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 2,
       .chief = true,
       .args_by_type = {{"chief", {"--job=" + job, "--summary_json=" + summary}}},
       .forward_output = false});
  ASSERT_TRUE(saved.ok()) << saved.status();
  const double accuracy = TestAccuracyOfFinishedJob(**saved, summary);
  ASSERT_GT(accuracy, 0.2);
  saved->reset();

  std::ifstream file(job);
  nlohmann::json resharded = nlohmann::json::parse(file);
  resharded["strategy"]["variable_partitioner"] = {{"type", "fixed_shards"}, {"num_shards", 3}};
  std::ofstream(job) << resharded.dump();
  auto resumed = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 3,
       .chief = true,
       .args_by_type = {{"chief", {"--job=" + job, "--summary_json=" + summary}}},
       .forward_output = false});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(TestAccuracyOfFinishedJob(**resumed, summary), accuracy);
  const std::string output = (*resumed)->Output({"chief", 0});
  EXPECT_THAT(output, HasSubstr("restoring its variables re-split into this job's 12 shards over "
                                "3 ps tasks"));
  EXPECT_THAT(output, HasSubstr("the checkpoint at step 30 already completes this job's 1 epochs"));
  RemoveFolder(checkpoints);
}

TEST(PsTrainingTest, ARestartedPsIsReseededFromTheLastCheckpointAndTrainingGoesOn) {
  const std::string checkpoints = TempPath("ckpt_ps");
  RemoveFolder(checkpoints);
  const std::string summary = TempPath("ps_back_summary.json");
  auto cluster = PsJobPastItsFirstEpoch(WriteJob(3, 100, "ps_back_job", checkpoints, 50), 3,
                                        {"--summary_json=" + summary});
  ASSERT_NE(cluster, nullptr);
  ASSERT_OK(cluster->Kill({"ps", 1}));
  ASSERT_TRUE(cluster->WaitForOutput({"chief", 0}, "for it to come back", absl::Seconds(30)))
      << cluster->Output({"chief", 0});
  ASSERT_OK(cluster->Restart({"ps", 1}));
  auto exit = cluster->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = cluster->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << output;
  // Found by a step or by a checkpoint's save (every 50 steps here), whichever came first.
  EXPECT_THAT(output, HasSubstr("a parameter server is unavailable: "));
  EXPECT_THAT(output, HasSubstr("ps:1 at " + cluster->Address({"ps", 1}) + ": "));
  EXPECT_THAT(output, HasSubstr("the parameter servers are back: restored the checkpoint at step"));
  // The workers reach the re-seeded PS at once: no closure fails on the old connection's
  // error, which the chief took for a PS failure in which none had restarted.
  EXPECT_THAT(output, Not(HasSubstr("none restarted")));
  EXPECT_THAT(output, HasSubstr("Epoch 3/3"));
  // An epoch trained again after the rollback is reported once, whole.
  ExpectThreeWholeEpochs(summary, output);
  RemoveFolder(checkpoints);
}

// Workers whose pushes to a PS failed while it was down (over gRPC: a PS without the data
// path, as with TLS) reach it as soon as it is back. They used to fail their first closures
// after the re-seed on gRPC's remembered "Connection refused" (its reconnect back-off), and
// the chief, finding every PS the process it had just re-seeded, said that none had
// restarted, again and again.
TEST(PsTrainingTest, WorkersThatFailedOnADownPsReachItAtOnceWhenItIsBack) {
  const std::string checkpoints = TempPath("ckpt_ps_grpc_back");
  RemoveFolder(checkpoints);
  auto cluster = PsJobPastItsFirstEpoch(WriteJob(3, 100, "ps_grpc_back_job", checkpoints, 50), 3,
                                        {}, 2, {"--data_path=false"});
  ASSERT_NE(cluster, nullptr);
  ASSERT_OK(cluster->Kill({"ps", 1}));
  ASSERT_TRUE(cluster->WaitForOutput({"chief", 0}, "for it to come back", absl::Seconds(30)))
      << cluster->Output({"chief", 0});
  absl::SleepFor(absl::Seconds(3));  // the back-off grows to its longest while the PS is down
  ASSERT_OK(cluster->Restart({"ps", 1}));
  auto exit = cluster->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = cluster->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("the parameter servers are back: restored the checkpoint at step"));
  EXPECT_THAT(output, Not(HasSubstr("none restarted")));
  EXPECT_THAT(output, HasSubstr("Epoch 3/3"));
  RemoveFolder(checkpoints);
}

// The peak resident memory of a running process, in MiB (VmHWM).
double PeakRssMib(int pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

// Trains the embedding example with a table of `rows` rows (split in four shards over two
// PSs) for 200 steps on two workers; returns the workers' peak RSS in MiB, and adds a
// failure if the job did not train or a worker did not take the table by rows.
std::vector<double> TrainEmbeddingByRows(int64_t rows) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_embedding.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["strategy"] = {{"type", "parameter_server"},
                     {"variable_partitioner", {{"type", "fixed_shards"}, {"num_shards", 4}}}};
  job["model"]["config"]["layers"][1]["config"]["input_dim"] = rows;
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 200;
  job["fit"]["validate"] = false;
  const std::string name = absl::StrCat("ps_embedding_rows_", rows);
  const std::string job_path = TempPath(name + ".json");
  std::ofstream(job_path) << job.dump();
  const std::string summary = TempPath(name + "_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 2,
       .chief = true,
       .args_by_type = {{"chief", {"--job=" + job_path, "--summary_json=" + summary}}},
       .forward_output = false});
  if (!cluster.ok()) {
    ADD_FAILURE() << cluster.status();
    return {};
  }
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(120));
  if (!exit.ok() || !exit->success()) {
    ADD_FAILURE() << (*cluster)->Output({"chief", 0});
    return {};
  }
  std::vector<double> peaks;
  for (int w = 0; w < 2; ++w) {
    EXPECT_THAT((*cluster)->Output({"worker", w}),
                HasSubstr("embedding tables intensity/embeddings travel by rows"));
    peaks.push_back(PeakRssMib((*cluster)->Pid({"worker", w})));
  }
  std::ifstream result_file(summary);
  const nlohmann::json result = nlohmann::json::parse(result_file);
  EXPECT_EQ(result["steps"], 200);
  // Seen 0.80 to 0.82; chance is 0.1.
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.6);
  return peaks;
}

// ParameterServerStrategy's workload: an embedding table of 2^24 rows (256 MiB) that the
// workers never hold. They pull only the rows their batches read and push row gradients, so
// a worker's peak memory is what it is with a table of 256 rows, within a few MiB; with the
// table whole (pulled, and its gradient) it would be 512 MiB more.
TEST(PsTrainingTest, AnEmbeddingTableTravelsByRowsAndNeverWholeToAWorker) {
  const std::vector<double> small = TrainEmbeddingByRows(256);
  const std::vector<double> large = TrainEmbeddingByRows(int64_t{1} << 24);
  ASSERT_EQ(small.size(), 2u);
  ASSERT_EQ(large.size(), 2u);
  for (int w = 0; w < 2; ++w) {
    std::printf(
        "worker:%d peak RSS %.1f MiB with a table of 256 rows, %.1f MiB with 2^24 rows "
        "(256 MiB)\n",
        w, small[w], large[w]);
    EXPECT_GT(small[w], 0);
    EXPECT_LT(large[w] - small[w], 32) << "worker " << w;
  }
}

// Ids travel as int32 from the data to the lookup: a table of more than 2^25 rows on a
// parameter server learns classes that only its ids' low bits tell apart
// (stratum/testing/ids_beyond_2_to_24.h).
TEST(PsTrainingTest, IdsBeyond2To24ReachTheirOwnRowsOfAParameterServersTable) {
  const nlohmann::json job = testing::IdsBeyond2To24Job(
      {{"type", "parameter_server"},
       {"variable_partitioner", {{"type", "fixed_shards"}, {"num_shards", 2}}}});
  const std::string job_path = TempPath("big_ids_job.json");
  std::ofstream(job_path) << job.dump();
  const std::string summary = TempPath("big_ids_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 1,
       .chief = true,
       .args_by_type = {{"chief", {"--job=" + job_path, "--summary_json=" + summary}}},
       .forward_output = false});
  ASSERT_OK(cluster);
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(120));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_TRUE(exit->success()) << (*cluster)->Output({"chief", 0});
  EXPECT_THAT((*cluster)->Output({"worker", 0}),
              HasSubstr("embedding tables table/embeddings travel by rows"));
  std::ifstream file(summary);
  const nlohmann::json result = nlohmann::json::parse(file);
  // Seen 1.0 (the job logs "variable table/embeddings/part_0 (134218752 bytes)").
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.95) << (*cluster)->Output({"chief", 0});
}

// A rollback to before the end of an epoch already reported trains its tail again; that
// epoch's second line says so.
TEST(PsTrainingTest, AnEpochTrainedAgainAfterARollbackSaysSo) {
  const std::string checkpoints = TempPath("ckpt_ps_again");
  auto cluster = LongJobPastItsFirstEpoch("ps_again_job", checkpoints);
  ASSERT_NE(cluster, nullptr);
  ASSERT_OK(cluster->Kill({"ps", 1}));
  ASSERT_TRUE(cluster->WaitForOutput({"chief", 0}, "for it to come back", absl::Seconds(30)))
      << cluster->Output({"chief", 0});
  ASSERT_OK(cluster->Restart({"ps", 1}));
  // No checkpoint yet (every_steps is past the end): training starts again from step 0.
  EXPECT_TRUE(cluster->WaitForOutput(
      {"chief", 0}, "Epoch 1/50 (trained again from step 0 after the rollback) - 100 steps",
      absl::Seconds(60)))
      << cluster->Output({"chief", 0});
  RemoveFolder(checkpoints);
}

// A PS that stalls past the workers' --ps_timeout (SIGSTOP here; a long pause or a network
// split in a cluster) fails their closures, but it is the same process when it answers
// again: its variables are intact, so nothing is rolled back to the last checkpoint.
TEST(PsTrainingTest, AStalledPsThatAnswersAgainLosesNoTraining) {
  const std::string checkpoints = TempPath("ckpt_ps_stall");
  RemoveFolder(checkpoints);
  const std::string summary = TempPath("ps_stall_summary.json");
  auto cluster = PsJobPastItsFirstEpoch(WriteJob(20, 100, "ps_stall_job", checkpoints, 5000), 20,
                                        {"--summary_json=" + summary, "--ps_timeout=1s"});
  ASSERT_NE(cluster, nullptr);
  ASSERT_OK(cluster->Signal({"ps", 1}, SIGSTOP));
  const bool waited =
      cluster->WaitForOutput({"chief", 0}, "for it to come back", absl::Seconds(30));
  ASSERT_OK(cluster->Signal({"ps", 1}, SIGCONT));
  ASSERT_TRUE(waited) << cluster->Output({"chief", 0});
  auto exit = cluster->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = cluster->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("a parameter server is unavailable: ps:1 at " +
                                cluster->Address({"ps", 1})));
  EXPECT_THAT(output, HasSubstr("each the same process as before (none restarted): their "
                                "variables are intact, so training goes on from step"));
  // The first checkpoint would be at step 2000, the end: a rollback would start afresh.
  EXPECT_THAT(output, Not(HasSubstr("restored the checkpoint")));
  std::ifstream file(summary);
  const nlohmann::json result = nlohmann::json::parse(file, nullptr, false);
  ASSERT_TRUE(result.is_object()) << output;
  EXPECT_EQ(result["steps"], 2000);
  ASSERT_EQ(result["history"].size(), 20u) << result.dump();
  for (int e = 0; e < 20; ++e) {
    EXPECT_EQ(result["history"][e]["epoch"], e + 1);
    EXPECT_EQ(result["history"][e]["steps"], 100);  // the stalled epoch's line covers all of it
  }
  RemoveFolder(checkpoints);
}

// A PS that restarts while no worker calls it (here the workers are paused around it; in a
// cluster, steps that compute longer than the restart takes) is not seen down at all: the
// next push finds it without the job's variables. It is re-seeded all the same.
TEST(PsTrainingTest, APsThatRestartedBetweenTwoPushesIsReseededToo) {
  const std::string checkpoints = TempPath("ckpt_ps_quick");
  RemoveFolder(checkpoints);
  auto cluster = PsJobPastItsFirstEpoch(WriteJob(20, 100, "ps_quick_job", checkpoints, 50), 20);
  ASSERT_NE(cluster, nullptr);
  for (int w = 0; w < 2; ++w) ASSERT_OK(cluster->Signal({"worker", w}, SIGSTOP));
  const absl::Status killed = cluster->Kill({"ps", 1});
  const absl::Status restarted = killed.ok() ? cluster->Restart({"ps", 1}) : killed;
  for (int w = 0; w < 2; ++w) ASSERT_OK(cluster->Signal({"worker", w}, SIGCONT));
  ASSERT_TRUE(restarted.ok()) << restarted;
  auto exit = cluster->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = cluster->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("the parameter servers are back: restored the checkpoint at step"));
  EXPECT_THAT(output, HasSubstr("Epoch 20/20"));
  RemoveFolder(checkpoints);
}

// A second parameter server that fails while the first is being re-seeded is waited for
// the same way, not the end of the job.
TEST(PsTrainingTest, APsThatFailsWhileAnotherIsReseededIsWaitedForToo) {
  const std::string checkpoints = TempPath("ckpt_ps_twice");
  RemoveFolder(checkpoints);
  // Long enough that the job is still training when ps:0 dies: 3 epochs of 100 steps
  // could end in 0.2 s after the first, before the kill.
  auto cluster =
      PsJobPastItsFirstEpoch(WriteJob(20, 100, "ps_twice_job", checkpoints, 50), 20, {}, 1);
  ASSERT_NE(cluster, nullptr);
  ASSERT_OK(cluster->Kill({"ps", 0}));
  ASSERT_TRUE(cluster->WaitForOutput({"chief", 0}, "for it to come back", absl::Seconds(30)))
      << cluster->Output({"chief", 0});
  // ps:0 answers again, and ps:1 dies as the coordinator re-seeds them (or just before).
  ASSERT_OK(cluster->Restart({"ps", 0}));
  ASSERT_OK(cluster->Kill({"ps", 1}));
  absl::SleepFor(absl::Seconds(2));
  ASSERT_FALSE(cluster->WaitForExit({"chief", 0}, absl::ZeroDuration()).ok())
      << "the coordinator gave up: " << cluster->Output({"chief", 0});
  ASSERT_OK(cluster->Restart({"ps", 1}));
  auto exit = cluster->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = cluster->Output({"chief", 0});
  ASSERT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("the parameter servers are back"));
  EXPECT_THAT(output, HasSubstr("Epoch 20/20"));
  RemoveFolder(checkpoints);
}

// SIGTERM while every worker is down: the coordinator stops at once instead of waiting for
// a worker to come back.
TEST(PsTrainingTest, ASigtermStopsTheCoordinatorWhileNoWorkerIsUp) {
  auto cluster = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 1,
       .chief = true,
       .args_by_type = {{"chief", {"--job=" + WriteJob(50, 100, "no_worker_job")}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForOutput({"chief", 0}, "Epoch 1/50", absl::Seconds(60)))
      << (*cluster)->Output({"chief", 0});
  ASSERT_OK((*cluster)->Kill({"worker", 0}));
  ASSERT_TRUE((*cluster)->WaitForOutput({"chief", 0}, "is down", absl::Seconds(30)))
      << (*cluster)->Output({"chief", 0});
  ASSERT_OK((*cluster)->Signal({"chief", 0}, SIGTERM));
  const absl::Time signalled = absl::Now();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(10));
  EXPECT_EQ(exit->exit_code, 128 + SIGTERM);
  EXPECT_THAT((*cluster)->Output({"chief", 0}),
              HasSubstr("this process was stopped by a signal; the job has no checkpoint.dir"));
}

TEST(PsTrainingTest, ASigtermedCoordinatorSavesTheStepsThatFinishedAndResumesThere) {
  const std::string checkpoints = TempPath("stop_ckpt");
  auto cluster = LongJobPastItsFirstEpoch("stop_job", checkpoints);
  ASSERT_NE(cluster, nullptr);
  ASSERT_OK(cluster->Signal({"chief", 0}, SIGTERM));
  auto exit = cluster->WaitForExit({"chief", 0}, absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = cluster->Output({"chief", 0});
  EXPECT_EQ(exit->exit_code, 128 + SIGTERM) << output;
  const std::string stopped = cluster->FindInOutput({"chief", 0}, "stopped after step [0-9]+");
  ASSERT_FALSE(stopped.empty()) << output;
  const int64_t step = StepAtTheEnd(stopped);
  EXPECT_GT(step, 100);
  EXPECT_THAT(output, HasSubstr(absl::StrCat("the state at step ", step, " is saved in ")));
  std::ifstream pointer(checkpoints + "/checkpoint");
  EXPECT_EQ(nlohmann::json::parse(pointer, nullptr, false)["step"], step);

  ASSERT_OK(cluster->Restart({"chief", 0}));
  ASSERT_TRUE(cluster->WaitForOutput({"chief", 0}, "resumed from the checkpoint at step",
                                     absl::Seconds(60)))
      << cluster->Output({"chief", 0});
  EXPECT_THAT(cluster->Output({"chief", 0}),
              HasSubstr(absl::StrCat("resumed from the checkpoint at step ", step, " ")));
  RemoveFolder(checkpoints);
}

// A parameter server that gets SIGTERM (an evicted pod) while a coordinator trains serves on
// until the coordinator has saved the job's state, so that when it is back the rollback
// to that checkpoint loses nothing; it exits cleanly right after the save. With
// `every_steps` small, a periodic save is often the one that ends its wait.
void ExpectASigtermedPsToLoseNothing(const std::string& name, int every_steps) {
  const std::string checkpoints = TempPath(name + "_ckpt");
  auto cluster = LongJobPastItsFirstEpoch(name, checkpoints, every_steps);
  ASSERT_NE(cluster, nullptr);
  ASSERT_OK(cluster->Signal({"ps", 1}, SIGTERM));
  auto ps_exit = cluster->WaitForExit({"ps", 1}, absl::Seconds(30));
  ASSERT_TRUE(ps_exit.ok()) << ps_exit.status();
  EXPECT_EQ(ps_exit->exit_code, 0) << cluster->Output({"ps", 1});
  EXPECT_THAT(cluster->Output({"ps", 1}), HasSubstr("the coordinator saved the job's state"));
  constexpr char kSaved[] = "ps:1 is stopping [^\n]*saved the state at step [0-9]+";
  ASSERT_FALSE(cluster->FindInOutput({"chief", 0}, kSaved).empty())
      << cluster->Output({"chief", 0});

  // Restarted once the chief waits for it, as an evicted pod comes back.
  ASSERT_TRUE(cluster->WaitForOutput({"chief", 0}, "for it to come back", absl::Seconds(30)))
      << cluster->Output({"chief", 0});
  ASSERT_OK(cluster->Restart({"ps", 1}));
  ASSERT_TRUE(
      cluster->WaitForOutput({"chief", 0}, "the parameter servers are back", absl::Seconds(60)))
      << cluster->Output({"chief", 0});
  // Every save the PS answered while it served on holds its state, and periodic ones may
  // follow the save that ended its wait before it has gone: the job resumes from the last.
  const std::string output = cluster->Output({"chief", 0});
  const int64_t step = StepAtTheEnd(LastMatch(output, kSaved));
  EXPECT_GT(step, 100);
  EXPECT_THAT(output, HasSubstr(absl::StrCat("restored the checkpoint at step ", step,
                                             " and training goes on")));
  cluster.reset();  // the chief trains (and saves) on until it is stopped
  RemoveFolder(checkpoints);
}

TEST(PsTrainingTest, ASigtermedPsWaitsForTheChiefToSaveSoThatItsRestartLosesNothing) {
  ExpectASigtermedPsToLoseNothing("ps_stop_job", 1000000);
}

// The PS's wait ends with whichever save comes first; the chief says so all the same (it
// used to stay silent, then took the PS's exit for a failure).
TEST(PsTrainingTest, ASigtermedPsIsReportedSavedWhenAPeriodicSaveEndsItsWait) {
  ExpectASigtermedPsToLoseNothing("ps_stop_periodic_job", 20);
}

// A PS's own file written is not the job's state saved: the chief commits the checkpoint
// (its manifest, then the "checkpoint" file) after every PS's file, and that can fail (a full
// disk, a chief that dies). Here every commit fails ("checkpoint" is a folder in the way): the
// SIGTERMed PS does not go as if saved (it used to, as soon as its own file was written), and
// the chief does not say it saved the state; the PS goes once the chief has left.
TEST(PsTrainingTest, ASigtermedPsIsNotReleasedByASaveWhoseCommitFailed) {
  const std::string checkpoints = TempPath("ps_commit_fails_ckpt");
  auto cluster = LongJobPastItsFirstEpoch("ps_commit_fails_job", checkpoints);
  ASSERT_NE(cluster, nullptr);
  std::filesystem::create_directories(checkpoints + "/checkpoint/in_the_way");
  ASSERT_OK(cluster->Signal({"ps", 1}, SIGTERM));
  auto chief_exit = cluster->WaitForExit({"chief", 0}, absl::Seconds(30));
  ASSERT_TRUE(chief_exit.ok()) << chief_exit.status();
  const std::string chief = cluster->Output({"chief", 0});
  EXPECT_NE(chief_exit->exit_code, 0) << chief;
  EXPECT_THAT(chief, HasSubstr("cannot write " + checkpoints + "/checkpoint"));
  EXPECT_THAT(chief, Not(HasSubstr("ps:1 is stopping (it got a signal): saved")));
  auto ps_exit = cluster->WaitForExit({"ps", 1}, absl::Seconds(10));
  ASSERT_TRUE(ps_exit.ok()) << ps_exit.status();
  EXPECT_EQ(ps_exit->exit_code, 0);
  const std::string ps = cluster->Output({"ps", 1});
  EXPECT_THAT(ps, HasSubstr("saved its state in " + checkpoints)) << ps;
  EXPECT_THAT(ps, Not(HasSubstr("the coordinator saved the job's state")));
  EXPECT_THAT(ps, HasSubstr("was not committed (the job resumes from its last committed "
                            "checkpoint): stopping"));
  RemoveFolder(checkpoints);
}

// Deleting a Kubernetes job signals every pod at once: the parameter servers wait for the
// coordinator's final save instead of taking the job's state with them.
TEST(PsTrainingTest, EveryTaskSigtermedAtOnceStillSavesTheJobsState) {
  const std::string checkpoints = TempPath("all_stop_ckpt");
  auto cluster = LongJobPastItsFirstEpoch("all_stop_job", checkpoints);
  ASSERT_NE(cluster, nullptr);
  const std::vector<TaskKey> tasks = {
      {"ps", 0}, {"ps", 1}, {"worker", 0}, {"worker", 1}, {"chief", 0}};
  for (const TaskKey& task : tasks) ASSERT_OK(cluster->Signal(task, SIGTERM));
  for (const TaskKey& task : tasks) {
    auto exit = cluster->WaitForExit(task, absl::Seconds(30));
    ASSERT_TRUE(exit.ok()) << task.ToString() << ": " << exit.status();
  }
  const std::string output = cluster->Output({"chief", 0});
  const std::string stopped = cluster->FindInOutput({"chief", 0}, "stopped after step [0-9]+");
  ASSERT_FALSE(stopped.empty()) << output;
  const int64_t step = StepAtTheEnd(stopped);
  EXPECT_THAT(output, HasSubstr(absl::StrCat("the state at step ", step, " is saved in ")));
  std::ifstream pointer(checkpoints + "/checkpoint");
  EXPECT_EQ(nlohmann::json::parse(pointer, nullptr, false)["step"], step);
  RemoveFolder(checkpoints);
}

// Long-lived parameter servers: a new job's coordinator starts from its own initial
// variables, not from what an earlier job trained on them.
TEST(PsTrainingTest, ANewJobOnLongLivedPsStartsFromItsOwnInitialVariables) {
  auto cluster = LocalCluster::Start({.num_workers = 1,
                                      .num_ps = 1,
                                      .chief = true,
                                      .not_started = {{"chief", 0}},
                                      .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (const std::string run : {"first", "second"}) {
    const std::string checkpoints = TempPath("ckpt_" + run);
    RemoveFolder(checkpoints);
    auto process = SpawnCoordinator((*cluster)->TfConfig({"chief", 0}),
                                    WriteJob(1, 60, "long_lived_" + run, checkpoints, 60));
    ASSERT_NE(process, nullptr);
    auto exit = process->Wait(absl::Seconds(60));
    ASSERT_TRUE(exit.ok() && exit->success()) << process->output();
    // Every variable of the second job has had its own 60 updates, not 120.
    std::ifstream pointer(checkpoints + "/checkpoint");
    const nlohmann::json latest = nlohmann::json::parse(pointer);
    std::ifstream file(checkpoints + "/" + latest["latest"].get<std::string>() + "/manifest.json");
    const nlohmann::json manifest = nlohmann::json::parse(file);
    for (const auto& variable : manifest["files"][0]["variables"]) {
      EXPECT_EQ(variable["updates"], 60) << run << ": " << variable.dump();
    }
    RemoveFolder(checkpoints);
  }
}

// A second coordinator on a cluster that another one trains on (started by mistake, or with
// another job) is refused by the parameter servers, naming the first. Once the first has
// been silent past the PS's lease (here: stopped), the second takes over; the first, when it
// comes back, stops rather than train against it.
TEST(PsTrainingTest, OneCoordinatorAtATimeTrainsOnAClusterAndOneTakenOverStops) {
  auto cluster = PsJobPastItsFirstEpoch(WriteJob(5000, 100, "fenced_first"), 5000);  // hours
  ASSERT_NE(cluster, nullptr);
  nlohmann::json tf_config = nlohmann::json::parse(cluster->TfConfig({"chief", 0}));
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  tf_config["cluster"]["chief"][0] = absl::StrCat("127.0.0.1:", *port);
  const std::string first =
      absl::StrCat("the coordinator chief:0 at ", cluster->Address({"chief", 0}), ", pid ",
                   cluster->Pid({"chief", 0}), " on ");
  const std::string second_job = WriteJob(2, 100, "fenced_second");

  // Given the first one's own TF_CONFIG but serving on another port, it is no restart of the
  // first (QA: the PSs took it for one and handed it the job, and the first stopped, saying
  // it had been restarted).
  absl::StatusOr<int> other_port = PickFreePort();
  ASSERT_TRUE(other_port.ok()) << other_port.status();
  auto same_config = SpawnCoordinator(cluster->TfConfig({"chief", 0}), second_job,
                                      {absl::StrCat("--listen_address=127.0.0.1:", *other_port)});
  ASSERT_NE(same_config, nullptr);
  auto same_exit = same_config->Wait(absl::Seconds(60));
  ASSERT_TRUE(same_exit.ok()) << same_exit.status();
  EXPECT_FALSE(same_exit->success()) << same_config->output();
  EXPECT_THAT(same_config->output(),
              HasSubstr("this parameter server is held by another coordinator (" + first));

  auto refused = SpawnCoordinator(tf_config.dump(), second_job);
  ASSERT_NE(refused, nullptr);
  auto exit = refused->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_FALSE(exit->success()) << refused->output();
  EXPECT_THAT(refused->output(),
              HasSubstr("this parameter server is held by another coordinator (" + first));

  ExpectATakeoverOfTheSilentChief(*cluster, tf_config.dump(), second_job);
}

// Two jobs that share a worker but not their parameter servers (a TF_CONFIG copied from
// another job, say): the worker serves one coordinator at a time. The second is refused,
// naming the first (the two used to take turns setting the worker up for their own jobs,
// each closure loading its job's data again, and neither said a word). Once the first has
// been silent past the worker's lease (here: stopped), the second takes the worker over,
// and the first, when it comes back, stops.
TEST(PsTrainingTest, AWorkerSharedByTwoJobsServesOneCoordinatorAtATime) {
  auto cluster = PsJobPastItsFirstEpoch(WriteJob(5000, 100, "shared_first"), 5000, {}, 1);
  ASSERT_NE(cluster, nullptr);
  // A parameter server of the second job's own (its cluster's other tasks not started).
  auto other_ps = LocalCluster::Start({.num_workers = 1,
                                       .num_ps = 1,
                                       .chief = true,
                                       .not_started = {{"chief", 0}, {"worker", 0}},
                                       .forward_output = false});
  ASSERT_TRUE(other_ps.ok()) << other_ps.status();
  nlohmann::json tf_config = nlohmann::json::parse(cluster->TfConfig({"chief", 0}));
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  tf_config["cluster"]["chief"][0] = absl::StrCat("127.0.0.1:", *port);
  tf_config["cluster"]["ps"] = {(*other_ps)->Address({"ps", 0})};
  const std::string second_job = WriteJob(2, 100, "shared_second");

  auto refused = SpawnCoordinator(tf_config.dump(), second_job);
  ASSERT_NE(refused, nullptr);
  auto exit = refused->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_FALSE(exit->success()) << refused->output();
  EXPECT_THAT(refused->output(),
              HasSubstr(absl::StrCat("this worker is held by another coordinator (the "
                                     "coordinator chief:0 at ",
                                     cluster->Address({"chief", 0}), ", pid ",
                                     cluster->Pid({"chief", 0}), " on ")));
  EXPECT_THAT(refused->output(), HasSubstr("give this job workers of its own"));
  EXPECT_THAT(cluster->Output({"chief", 0}), Not(HasSubstr("set up anew")));

  EXPECT_THAT(ExpectATakeoverOfTheSilentChief(*cluster, tf_config.dump(), second_job),
              HasSubstr("this worker is held by another coordinator: the coordinator chief:0 at "
                        "127.0.0.1:"));
}

TEST(PsTrainingTest, TheEvaluatorSideCarEvaluatesEveryNewCheckpoint) {
  const std::string checkpoints = TempPath("ckpt_eval");
  RemoveFolder(checkpoints);
  const std::string job = WriteJob(2, 100, "eval_job", checkpoints, 100);
  {  // No validation after each epoch: the chief tests the final model once.
    std::ifstream in(job);
    nlohmann::json unvalidated = nlohmann::json::parse(in);
    unvalidated["fit"]["validate"] = false;
    std::ofstream(job) << unvalidated.dump();
  }
  const std::string summary = TempPath("eval_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 1,
       .chief = true,
       .evaluator = true,
       .args_by_type = {{"chief", {"--job=" + job, "--summary_json=" + summary}},
                        {"evaluator", {"--job=" + job, "--eval_interval=100ms"}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok() && exit->success()) << (*cluster)->Output({"chief", 0});
  ASSERT_TRUE((*cluster)->WaitForOutput({"evaluator", 0}, "evaluated the checkpoint at step 200",
                                        absl::Seconds(30)))
      << (*cluster)->Output({"evaluator", 0});
  std::ifstream chief_summary(summary);
  const double trained = nlohmann::json::parse(chief_summary)["test_accuracy"];
  std::ifstream evaluation(checkpoints + "/evaluation.json");
  const nlohmann::json evaluated = nlohmann::json::parse(evaluation);
  EXPECT_EQ(evaluated["step"], 200);
  // The final checkpoint holds exactly the variables the coordinator evaluated last.
  EXPECT_NEAR(evaluated["val_accuracy"].get<double>(), trained, 1e-9);
  EXPECT_THAT((*cluster)->Output({"chief", 0}), ::testing::Not(HasSubstr("val_accuracy")));
  RemoveFolder(checkpoints);
}

}  // namespace
}  // namespace stratum
