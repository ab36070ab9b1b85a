// MultiWorkerMirrored training with real processes: workers on loopback that train
// Fashion-MNIST in lock-step over the TCP collectives, a worker killed in the middle (the
// others stop with an error naming it, within seconds, not hanging), and the job started
// again resuming from its last checkpoint to the very same result.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "stratum/net/free_port.h"
#include "stratum/testing/ids_beyond_2_to_24.h"
#include "stratum/testing/independent_readers.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/status_macros.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using testing::RemoveFolder;
using testing::TempPath;

std::string WriteJob(const std::string& name, int epochs, int steps_per_epoch,
                     const std::string& checkpoint_dir = "", int every_steps = 0) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_mwms.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["fit"]["epochs"] = epochs;
  job["fit"]["steps_per_epoch"] = steps_per_epoch;
  job["strategy"]["communication"]["timeout_seconds"] = 20;
  job.erase("checkpoint");
  if (!checkpoint_dir.empty()) {
    job["checkpoint"] = {{"dir", checkpoint_dir}, {"every_steps", every_steps}, {"max_to_keep", 2}};
  }
  const std::string path = TempPath(name + ".json");
  std::ofstream(path) << job.dump();
  return path;
}

// Starts `workers` MultiWorkerMirrored workers on `job`; worker:0 writes `summary`.
absl::StatusOr<std::unique_ptr<LocalCluster>> StartJob(int workers, const std::string& job,
                                                       const std::string& summary) {
  return LocalCluster::Start(
      {.num_workers = workers,
       .args_by_type = {{"worker",
                         {"--job=" + job, "--summary_json=" + summary, "--cluster_timeout=30s"}}},
       .forward_output = false});
}

// Waits up to 2 minutes for each of the first `workers` workers to exit, expecting success.
void ExpectWorkersFinish(LocalCluster& cluster, int workers) {
  for (int w = 0; w < workers; ++w) {
    auto exit = cluster.WaitForExit({"worker", w}, absl::Seconds(120));
    EXPECT_TRUE(exit.ok()) << exit.status();
    if (exit.ok()) {
      EXPECT_TRUE(exit->success()) << cluster.Output({"worker", w});
    }
  }
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
}

// The summary of a 2-worker run of the example job, uninterrupted, without checkpoints
// (null when it failed: the test's ASSERT on is_object() says so).
nlohmann::json TrainUninterrupted(const std::string& name, int epochs, int steps_per_epoch) {
  const std::string summary = TempPath(name + "_summary.json");
  auto cluster = StartJob(2, WriteJob(name, epochs, steps_per_epoch), summary);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return nullptr;
  auto exit = (*cluster)->WaitForExit({"worker", 0}, absl::Seconds(120));
  EXPECT_TRUE(exit.ok() && exit->success()) << (*cluster)->Output({"worker", 0});
  return ReadJson(summary);
}

TEST(MwmsTrainingTest, TwoWorkersTrainInLockStepAndAgree) {
  const std::string summary = TempPath("mwms_summary.json");
  auto cluster = StartJob(2, WriteJob("mwms_job", 1, 0), summary);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ExpectWorkersFinish(**cluster, 2);
  const nlohmann::json result = ReadJson(summary);
  ASSERT_TRUE(result.is_object()) << "no summary at " << summary;
  EXPECT_EQ(result["strategy"], "MultiWorkerMirroredStrategy");
  EXPECT_EQ(result["num_workers"], 2);
  EXPECT_EQ(result["num_replicas_in_sync"], 2);
  // One epoch: each worker trains its half of the data in full batches of 64.
  EXPECT_EQ(result["steps"], 60000 / 2 / 64);
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.8);
  // Both workers hold the same variables, so they report the same test figures.
  const absl::Status agree =
      (*cluster)->OutputsAgree({{"worker", 0}, {"worker", 1}}, testing::kTestFigures);
  EXPECT_TRUE(agree.ok()) << agree;
}

// An embedding table of 2^22 rows (64 MiB) in lock step: the workers exchange only the rows
// their batches read (gathered from both, then their gradients summed), update only those,
// and still hold bit-identical variables, so they report the same test figures.
TEST(MwmsTrainingTest, AnEmbeddingTableTravelsByRowsAndTheWorkersAgree) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_embedding.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["strategy"] = {{"type", "multi_worker_mirrored"}, {"devices", {"CPU:0", "CPU:1"}}};
  job["model"]["config"]["layers"][1]["config"]["input_dim"] = 1 << 22;
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 150;
  job["fit"]["validate"] = false;
  const std::string path = TempPath("mwms_embedding_job.json");
  std::ofstream(path) << job.dump();
  const std::string summary = TempPath("mwms_embedding_summary.json");
  auto cluster = StartJob(2, path, summary);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ExpectWorkersFinish(**cluster, 2);
  const std::string log = (*cluster)->Output({"worker", 0});
  EXPECT_THAT(log, HasSubstr("embedding tables intensity/embeddings travel by rows"));
  // What the exchange moved, beside the dense all-reduce of the 64 MiB table.
  std::smatch exchange;
  ASSERT_TRUE(std::regex_search(
      log, exchange,
      std::regex("exchange all-reduced ([0-9]+) bytes per step .* would move ([0-9]+) "
                 "\\(.*\\), over 150 steps")))
      << log;
  EXPECT_GT(std::stod(exchange[1]), 0);
  EXPECT_EQ(std::stod(exchange[2]), 4.0 * (1 << 22) * 4);  // float32 rows of 4
  EXPECT_LT(std::stod(exchange[1]) * 100, std::stod(exchange[2]));
  const nlohmann::json result = ReadJson(summary);
  ASSERT_TRUE(result.is_object()) << "no summary at " << summary;
  EXPECT_EQ(result["num_replicas_in_sync"], 4);
  EXPECT_EQ(result["steps"], 150);
  // Seen 0.82; chance is 0.1.
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.7);
  const absl::Status agree =
      (*cluster)->OutputsAgree({{"worker", 0}, {"worker", 1}}, testing::kTestFigures);
  EXPECT_TRUE(agree.ok()) << agree;
}

// A table of more than 2^25 rows under MultiWorkerMirrored: the workers exchange the rows
// their batches read exactly (two floats a row above 2^24), so each id reaches its own row on
// both workers (stratum/testing/ids_beyond_2_to_24.h: about 0.5 at best as float32 values).
TEST(MwmsTrainingTest, IdsBeyond2To24ReachTheirOwnRowsOnEveryWorker) {
  const std::string path = TempPath("mwms_big_ids_job.json");
  std::ofstream(path) << testing::IdsBeyond2To24Job({{"type", "multi_worker_mirrored"}}).dump();
  const std::string summary = TempPath("mwms_big_ids_summary.json");
  auto cluster = StartJob(2, path, summary);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ExpectWorkersFinish(**cluster, 2);
  EXPECT_THAT((*cluster)->Output({"worker", 0}),
              HasSubstr("embedding tables table/embeddings travel by rows"));
  const nlohmann::json result = ReadJson(summary);
  ASSERT_TRUE(result.is_object()) << "no summary at " << summary;
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.95) << (*cluster)->Output({"worker", 0});
  const absl::Status agree =
      (*cluster)->OutputsAgree({{"worker", 0}, {"worker", 1}}, testing::kTestFigures);
  EXPECT_TRUE(agree.ok()) << agree;
}

// Callbacks in lock step: every worker decides alike from the same logs (sums over both),
// so both stop after the same epoch and restore the same weights; ReduceLROnPlateau
// changes the rate on both; only the chief writes the CSV and the event files.
TEST(MwmsTrainingTest, CallbacksDecideAlikeOnEveryWorkerAndOnlyTheChiefWrites) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_mwms.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job.erase("checkpoint");
  job["fit"]["epochs"] = 5;
  job["fit"]["steps_per_epoch"] = 40;
  job["strategy"]["communication"]["timeout_seconds"] = 20;
  const std::string dir = TempPath("mwms_callbacks");
  RemoveFolder(dir);
  job["fit"]["callbacks"] = {
      {{"class_name", "EarlyStopping"},
       {"config",
        {{"patience", 1}, {"min_delta", 10}, {"restore_best_weights", true}, {"verbose", 1}}}},
      {{"class_name", "ReduceLROnPlateau"}, {"config", {{"patience", 0}, {"min_delta", 10}}}},
      {{"class_name", "CSVLogger"}, {"config", {{"filename", dir + "/log.csv"}}}},
      {{"class_name", "TensorBoard"}, {"config", {{"log_dir", dir + "/tb"}, {"update_freq", 20}}}},
      {{"class_name", "ModelCheckpoint"},
       {"config",
        {{"filepath", dir + "/epoch-{epoch:02d}.weights.h5"}, {"save_weights_only", true}}}}};
  const std::string path = TempPath("mwms_callbacks.json");
  std::ofstream(path) << job.dump();
  const std::string summary = TempPath("mwms_callbacks_summary.json");
  const std::string exported = dir + "/export";
  auto cluster =
      LocalCluster::Start({.num_workers = 2,
                           .args_by_type = {{"worker",
                                             {"--job=" + path, "--summary_json=" + summary,
                                              "--cluster_timeout=30s", "--export=" + exported}}},
                           .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (int w = 0; w < 2; ++w) {
    auto exit = (*cluster)->WaitForExit({"worker", w}, absl::Seconds(120));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_TRUE(exit->success()) << (*cluster)->Output({"worker", w});
    EXPECT_THAT((*cluster)->Output({"worker", w}), HasSubstr("Epoch 2: early stopping"));
  }
  const nlohmann::json result = ReadJson(summary);
  ASSERT_TRUE(result.is_object()) << "no summary at " << summary;
  EXPECT_EQ(result["epochs"], 2);
  EXPECT_EQ(result["stopped_by"], "EarlyStopping");
  // Restored to epoch 1's weights on both: the test figures are epoch 1's, and agree.
  EXPECT_DOUBLE_EQ(result["test_accuracy"].get<double>(),
                   result["history"][0]["val_accuracy"].get<double>());
  const absl::Status agree =
      (*cluster)->OutputsAgree({{"worker", 0}, {"worker", 1}}, testing::kTestFigures);
  EXPECT_TRUE(agree.ok()) << agree;
  std::ifstream csv(dir + "/log.csv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "epoch,accuracy,learning_rate,loss,val_accuracy,val_loss");
  int event_files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir + "/tb")) {
    event_files += entry.is_regular_file();
  }
  EXPECT_EQ(event_files, 2);  // train and validation, of the chief alone
  auto scalars = testing::ReadTensorBoardScalars(dir + "/tb");
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  std::vector<std::pair<int64_t, double>> rates;
  int batch_losses = 0;
  for (const nlohmann::json& scalar : *scalars) {
    if (scalar["tag"] == "epoch_learning_rate") rates.emplace_back(scalar["step"], scalar["value"]);
    batch_losses += scalar["tag"] == "batch_loss";
  }
  EXPECT_EQ(batch_losses, 4);  // steps 20, 40, 60 and 80
  // Epoch 1's rate, then epoch 2's (logged before ReduceLROnPlateau lowered it).
  ASSERT_EQ(rates.size(), 2u);
  EXPECT_FLOAT_EQ(static_cast<float>(rates[1].second), 0.001f);
  // The chief's export holds the restored weights: they give epoch 1's test accuracy.
  const absl::Status checked =
      testing::CheckKerasExport(exported, result["test_accuracy"].get<double>()).status();
  EXPECT_TRUE(checked.ok()) << checked;
  // ModelCheckpoint wrote one weights file per epoch, from the chief alone.
  EXPECT_TRUE(std::filesystem::exists(dir + "/epoch-01.weights.h5"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/epoch-02.weights.h5"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/epoch-03.weights.h5"));
  RemoveFolder(dir);
}

// Runs stratum-worker alone on `job` with `tf_config` until it exits (20 s at most).
struct WorkerRun {
  int shell_code = -1;
  std::string output;
};
absl::StatusOr<WorkerRun> RunWorker(const nlohmann::json& job, const std::string& tf_config) {
  const std::string path = TempPath("lone_worker_job.json");
  std::ofstream(path) << job.dump();
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/stratum-worker", "--job=" + path};
  options.env = {{"TF_CONFIG", tf_config}};
  options.forward_fd = -1;
  options.capture_output = true;
  STRATUM_ASSIGN_OR_RETURN(auto process, Subprocess::Spawn(std::move(options)));
  STRATUM_ASSIGN_OR_RETURN(ExitInfo exit, process->Wait(absl::Seconds(20)));
  return WorkerRun{exit.ShellCode(), process->output()};
}

TEST(MwmsTrainingTest, AJobOfAnotherStrategyIsRefusedWithTheFix) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_ps.json");
  auto run = RunWorker(
      nlohmann::json::parse(file),
      R"({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}})");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->shell_code, 2);
  EXPECT_THAT(run->output, HasSubstr("\"parameter_server\": start a parameter_server "
                                     "job with stratum-launch --job"));
}

TEST(MwmsTrainingTest, NcclOnCpuDevicesIsRefusedBeforeTrainingWithTheFix) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_mwms.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["strategy"]["devices"] = {"CPU:0"};
  job["strategy"]["communication"]["implementation"] = "NCCL";
  // worker:0 never starts: the refusal comes before any peer is waited for.
  auto port = PickFreePorts(1);
  ASSERT_TRUE(port.ok()) << port.status();
  auto run =
      RunWorker(job, absl::StrCat(R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:)",
                                  (*port)[0], R"("]}, "task": {"type": "worker", "index": 1}})"));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NE(run->shell_code, 0);
  EXPECT_THAT(run->output, HasSubstr("communication implementation NCCL"));
  EXPECT_THAT(run->output, HasSubstr("use strategy.communication.implementation RING or AUTO"));
}

TEST(MwmsTrainingTest, AWorkerThatNeverStartsIsNamedWhenTheWaitEnds) {
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .not_started = {{"worker", 1}},
       .args_by_type = {{"worker",
                         {"--job=" + WriteJob("mwms_alone", 1, 10), "--cluster_timeout=2s"}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"worker", 0}, absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_FALSE(exit->success());
  EXPECT_THAT((*cluster)->Output({"worker", 0}), HasSubstr("worker:1"));
  EXPECT_THAT((*cluster)->Output({"worker", 0}), HasSubstr("is it running?"));
}

// Workers started with different jobs would otherwise train on and silently diverge (each
// applies its own optimizer to the summed gradients): both stop before training, naming
// what differs.
TEST(MwmsTrainingTest, WorkersWithDifferentJobsAreRefusedNamingWhatDiffers) {
  const std::string job = WriteJob("mwms_job_a", 1, 10);
  auto cluster =
      LocalCluster::Start({.num_workers = 2,
                           .not_started = {{"worker", 1}},
                           .args_by_type = {{"worker", {"--job=" + job, "--cluster_timeout=30s"}}},
                           .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::ifstream file(job);
  nlohmann::json other = nlohmann::json::parse(file);
  other["compile"]["optimizer"] = {{"class_name", "SGD"}, {"config", {{"learning_rate", 0.01}}}};
  other["fit"]["seed"] = 7;
  auto run = RunWorker(other, (*cluster)->TfConfig({"worker", 1}));
  ASSERT_TRUE(run.ok()) << run.status();
  // A configuration error on every worker (exit 2), which launchers do not retry.
  EXPECT_EQ(run->shell_code, 2) << run->output;
  EXPECT_THAT(run->output, HasSubstr("differs from the leader's (worker:0) in compile.optimizer"));
  EXPECT_THAT(run->output, HasSubstr("fit.seed (7 here, 1 on the leader)"));
  EXPECT_THAT(run->output, HasSubstr("start them all with the same ones"));
  // The leader stops too, and says why.
  auto exit = (*cluster)->WaitForExit({"worker", 0}, absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->ShellCode(), 2) << (*cluster)->Output({"worker", 0});
  EXPECT_THAT((*cluster)->Output({"worker", 0}), HasSubstr("worker:1 failed: this worker's job"));
  EXPECT_THAT((*cluster)->Output({"worker", 0}),
              ::testing::Not(HasSubstr("did not publish its collective address")));
  EXPECT_THAT((*cluster)->Output({"worker", 0}), ::testing::Not(HasSubstr("Epoch 1/1")));
}

// A worker stopped by a signal while the workers meet (worker:3 is not started, so they
// cannot finish meeting) exits at once; the others must stop within seconds naming it as
// the cause, as a failure a launcher retries (exit 1), not blame worker:3 for an address
// it "did not publish", nor the leader for a coordination service it did not lose.
TEST(MwmsTrainingTest, AWorkerStoppedDuringStartUpIsNamedByTheOthers) {
  // worker:2, then the leader, whose process serves the coordination service.
  for (const int stopped_index : {2, 0}) {
    auto cluster =
        LocalCluster::Start({.num_workers = 4,
                             .not_started = {{"worker", 3}},
                             .args_by_type = {{"worker",
                                               {"--job=" + WriteJob("mwms_stopped_early", 1, 10),
                                                "--cluster_timeout=60s"}}},
                             .forward_output = false});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    for (int w = 0; w < 3; ++w) {
      ASSERT_TRUE((*cluster)->WaitForOutput({"worker", w}, "joined the job", absl::Seconds(30)))
          << (*cluster)->Output({"worker", w});
    }
    const TaskKey stopped{"worker", stopped_index};
    const absl::Time stopped_at = absl::Now();
    ASSERT_OK((*cluster)->Signal(stopped, SIGTERM));
    auto exit = (*cluster)->WaitForExit(stopped, absl::Seconds(10));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_EQ(exit->ShellCode(), 128 + SIGTERM) << (*cluster)->Output(stopped);
    for (int w = 0; w < 3; ++w) {
      if (w == stopped_index) continue;
      const TaskKey survivor{"worker", w};
      auto exit = (*cluster)->WaitForExit(survivor, absl::Seconds(30));
      ASSERT_TRUE(exit.ok()) << exit.status();
      const std::string output = (*cluster)->Output(survivor);
      EXPECT_EQ(exit->ShellCode(), 1) << output;
      const size_t error = output.rfind("stratum-worker: ");
      ASSERT_NE(error, std::string::npos) << output;
      const std::string last = output.substr(error);
      EXPECT_THAT(last, HasSubstr(stopped.ToString() + " failed: stopped by signal 15"))
          << survivor.ToString();
      EXPECT_THAT(last, ::testing::Not(HasSubstr("did not publish"))) << survivor.ToString();
      EXPECT_THAT(last, ::testing::Not(HasSubstr("lost the coordination service")))
          << survivor.ToString();
    }
    // Told by the stopped worker itself, not learnt at the heartbeat timeout (10 s).
    EXPECT_LT(absl::Now() - stopped_at, absl::Seconds(8)) << stopped.ToString();
  }
}

// Of three workers in a ring, the one killed has a single neighbour that reads from it;
// the other survivor sees that neighbour close its connections as it exits. Every survivor
// must still name the worker that died, not the one that left because of it.
TEST(MwmsTrainingTest, EverySurvivorNamesTheWorkerThatDiedNotTheOnesThatLeftAfterIt) {
  // Long enough (about 20 s) to be killed in the middle.
  auto cluster = StartJob(3, WriteJob("mwms_three", 40, 300), TempPath("mwms_three.json"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForOutput({"worker", 0}, "Epoch 1/40", absl::Seconds(60)))
      << (*cluster)->Output({"worker", 0});
  ASSERT_OK((*cluster)->Kill({"worker", 2}));
  for (const TaskKey& survivor : {TaskKey{"worker", 0}, TaskKey{"worker", 1}}) {
    auto exit = (*cluster)->WaitForExit(survivor, absl::Seconds(30));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_FALSE(exit->success());
    const std::string output = (*cluster)->Output(survivor);
    // The error the binary exits with comes last.
    const size_t error = output.rfind("stratum-worker: ");
    ASSERT_NE(error, std::string::npos) << output;
    const std::string last = output.substr(error);
    // Its headline: the collective that failed when worker:2 left, maybe reported by the
    // survivor that saw it first.
    EXPECT_THAT(last, ::testing::ContainsRegex("^stratum-worker: (worker:[01] failed: )?all-reduce "
                                               "of [0-9]+ bytes over 3 workers: worker:2 at "))
        << survivor.ToString();
  }
}

// Runs the 2-worker `job` again to its end; worker:0's output (empty, with the failure
// added, when it did not succeed).
std::string RunAgainToTheEnd(const std::string& job, const std::string& summary) {
  auto cluster = StartJob(2, job, summary);
  if (!cluster.ok()) {
    ADD_FAILURE() << cluster.status();
    return "";
  }
  auto exit = (*cluster)->WaitForExit({"worker", 0}, absl::Seconds(120));
  const std::string output = (*cluster)->Output({"worker", 0});
  if (!exit.ok() || !exit->success()) {
    ADD_FAILURE() << (exit.ok() ? output : exit.status().ToString());
    return "";
  }
  return output;
}

// A resumed job ends as the uninterrupted one: the same steps and test figures.
void ExpectTheSameEnd(const nlohmann::json& resumed, const nlohmann::json& reference) {
  EXPECT_EQ(resumed["steps"], reference["steps"]);
  EXPECT_EQ(resumed["test_accuracy"], reference["test_accuracy"]);
  EXPECT_EQ(resumed["test_loss"], reference["test_loss"]);
}

TEST(MwmsTrainingTest, AKilledWorkerStopsTheOthersAndTheRestartedJobResumesToTheSameResult) {
  // The reference: the same job, uninterrupted.
  const nlohmann::json reference = TrainUninterrupted("mwms_reference", 3, 60);
  ASSERT_TRUE(reference.is_object());

  const std::string checkpoints = TempPath("mwms_ckpt");
  RemoveFolder(checkpoints);
  const std::string job = WriteJob("mwms_resume", 3, 60, checkpoints, 25);
  const std::string summary = TempPath("mwms_resumed.json");
  {
    auto cluster = StartJob(2, job, summary);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    ASSERT_TRUE((*cluster)->WaitForOutput({"worker", 0}, "Epoch 1/3", absl::Seconds(60)))
        << (*cluster)->Output({"worker", 0});
    ASSERT_OK((*cluster)->Kill({"worker", 1}));
    // worker:0 does not hang: it stops, naming the worker that is gone.
    const absl::Time killed = absl::Now();
    auto exit = (*cluster)->WaitForExit({"worker", 0}, absl::Seconds(30));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_LT(absl::Now() - killed, absl::Seconds(15));
    EXPECT_FALSE(exit->success());
    EXPECT_THAT((*cluster)->Output({"worker", 0}), HasSubstr("worker:1"));
  }
  // Started again, the job resumes from the last checkpoint and ends as if never stopped.
  const std::string output = RunAgainToTheEnd(job, summary);
  ASSERT_FALSE(output.empty());
  EXPECT_THAT(output, HasSubstr("resumed from checkpoint step "));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("Epoch 1/3")));
  const nlohmann::json resumed = ReadJson(summary);
  ASSERT_TRUE(resumed.is_object());
  EXPECT_GT(resumed["resumed_from_step"].get<int64_t>(), 0);
  ExpectTheSameEnd(resumed, reference);
  // The epoch the kill cut in two reports the figures of the whole epoch over both workers,
  // as the uninterrupted run does (the checkpoint holds them summed over the workers).
  ASSERT_EQ(resumed["history"].size(), reference["history"].size());
  for (size_t e = 0; e < reference["history"].size(); ++e) {
    EXPECT_NEAR(resumed["history"][e]["loss"].get<double>(),
                reference["history"][e]["loss"].get<double>(), 1e-4)
        << "epoch " << e + 1;
    EXPECT_NEAR(resumed["history"][e]["accuracy"].get<double>(),
                reference["history"][e]["accuracy"].get<double>(), 1e-4)
        << "epoch " << e + 1;
  }
  RemoveFolder(checkpoints);
}

TEST(MwmsTrainingTest, ASigtermStopsEveryWorkerAtOneStepWithTheStateSavedAndTheJobResumesThere) {
  const nlohmann::json reference = TrainUninterrupted("mwms_stop_reference", 6, 300);
  ASSERT_TRUE(reference.is_object());

  // No periodic checkpoints: the one the stop writes is the only one mid-epoch.
  const std::string checkpoints = TempPath("mwms_stop_ckpt");
  RemoveFolder(checkpoints);
  const std::string job = WriteJob("mwms_stop", 6, 300, checkpoints, 0);
  const std::string summary = TempPath("mwms_stop_resumed.json");
  // What a worker killed while saving leaves behind: the next backup removes it.
  pid_t dead = 0;
  {
    auto gone = Subprocess::Spawn({.argv = {"/bin/true"}});
    ASSERT_OK(gone);
    dead = (*gone)->pid();
    ASSERT_OK((*gone)->Wait(absl::Seconds(10)));
  }
  const std::string stale = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                         "/stratum-backup-worker-1-", dead);
  std::filesystem::create_directories(stale + "/ckpt-000000000025");
  std::string stopped_at;
  {
    auto cluster = StartJob(2, job, summary);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    ASSERT_TRUE((*cluster)->WaitForOutput({"worker", 0}, "Epoch 1/6", absl::Seconds(60)))
        << (*cluster)->Output({"worker", 0});
    // As Kubernetes evicts one pod: only worker:1 gets the signal.
    ASSERT_OK((*cluster)->Signal({"worker", 1}, SIGTERM));
    auto signalled = (*cluster)->WaitForExit({"worker", 1}, absl::Seconds(30));
    auto other = (*cluster)->WaitForExit({"worker", 0}, absl::Seconds(30));
    ASSERT_OK(signalled);
    ASSERT_OK(other);
    const std::string output0 = (*cluster)->Output({"worker", 0});
    const std::string output1 = (*cluster)->Output({"worker", 1});
    EXPECT_EQ(signalled->ShellCode(), 128 + SIGTERM) << output1;
    EXPECT_EQ(other->ShellCode(), 1) << output0;
    stopped_at = (*cluster)->FindInOutput({"worker", 1},
                                          "training stopped after step [0-9]+ \\(epoch [0-9]+, ");
    ASSERT_FALSE(stopped_at.empty()) << output1;
    EXPECT_THAT(output1, HasSubstr("this process was stopped by a signal"));
    // Both stopped after the same step, and the state there is the latest checkpoint.
    EXPECT_THAT(output0, HasSubstr(stopped_at));
    EXPECT_THAT(output0, HasSubstr("because another worker was stopped by a signal"));
    EXPECT_THAT(output0, HasSubstr("run the same job again to resume from it"));
  }
  const int64_t step =
      std::stoll(stopped_at.substr(std::string("training stopped after step ").size()));
  EXPECT_EQ(ReadJson(checkpoints + "/checkpoint")["step"], step);
  EXPECT_FALSE(std::filesystem::exists(stale));
  // The stop came within a fraction of a second: after epoch 1, well before the end.
  EXPECT_GT(step, 300);
  EXPECT_LT(step, 6 * 300);
  const std::string output = RunAgainToTheEnd(job, summary);
  ASSERT_FALSE(output.empty());
  EXPECT_THAT(output, HasSubstr(absl::StrCat("resumed from checkpoint step ", step, " ")));
  const nlohmann::json resumed = ReadJson(summary);
  ASSERT_TRUE(resumed.is_object());
  EXPECT_EQ(resumed["resumed_from_step"], step);
  ExpectTheSameEnd(resumed, reference);
  RemoveFolder(checkpoints);
}

}  // namespace
}  // namespace stratum
