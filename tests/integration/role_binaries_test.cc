// The role binaries as a user runs them: broken configuration exits 2 at once with one
// sentence, SIGTERM stops them cleanly, the coordinator waits for the cluster and names
// the tasks that never came up.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/net/free_port.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using ::testing::StartsWith;

struct BinaryRun {
  ExitInfo exit;
  std::string output;
  absl::Duration took;
};

BinaryRun RunBinary(const std::string& binary, std::vector<std::string> args,
                    std::vector<std::pair<std::string, std::string>> env) {
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/" + binary};
  for (std::string& arg : args) options.argv.push_back(std::move(arg));
  options.env = std::move(env);
  options.forward_fd = -1;
  options.capture_output = true;
  const absl::Time start = absl::Now();
  auto process = Subprocess::Spawn(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return {};
  auto exit = (*process)->Wait(absl::Seconds(20));
  EXPECT_TRUE(exit.ok()) << binary << " did not exit: " << exit.status();
  if (!exit.ok()) return {};
  return {*exit, (*process)->output(), absl::Now() - start};
}

struct BrokenConfig {
  std::string name;
  std::string tf_config;
  std::string message;  // the sentence's start, after "<binary>: "
};

void PrintTo(const BrokenConfig& config, std::ostream* out) { *out << config.name; }

std::vector<BrokenConfig> BrokenConfigs() {
  const std::string cluster =
      R"("cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:4"]})";
  return {
      {"NotJson", "{\"cluster\": ", "TF_CONFIG is not valid JSON (error at byte 13)"},
      {"UnknownTaskType", "{" + cluster + R"(, "task": {"type": "master", "index": 0}})",
       "TF_CONFIG task.type \"master\" is not a task type: use chief, worker, ps or evaluator"},
      {"IndexOutOfRange", "{" + cluster + R"(, "task": {"type": "worker", "index": 7}})",
       "TF_CONFIG task.index 7 is out of range: job \"worker\" has 2 tasks (0..1)"},
      {"TwoChiefs",
       R"({"cluster": {"chief": ["127.0.0.1:1", "127.0.0.1:5"], "worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}})",
       "TF_CONFIG cluster.chief has 2 tasks, but a cluster has at most one chief"},
      {"TaskTypeAbsentFromCluster",
       R"({"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}})",
       "TF_CONFIG task.type \"ps\" is not a job of the cluster (jobs: chief)"},
      {"BadAddress",
       R"({"cluster": {"worker": ["127.0.0.1"], "ps": ["127.0.0.1:4"], "chief": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}})",
       "TF_CONFIG cluster address \"127.0.0.1\" of worker:0 is not valid because it has no port"},
      {"EmptyCluster", R"({"cluster": {}, "task": {"type": "worker", "index": 0}})",
       "TF_CONFIG cluster is empty"},
  };
}

class BrokenTfConfigTest : public ::testing::TestWithParam<std::tuple<BrokenConfig, std::string>> {
};

TEST_P(BrokenTfConfigTest, ExitsTwoWithOneSentence) {
  const auto& [config, binary] = GetParam();
  BinaryRun run = RunBinary(binary, {}, {{"TF_CONFIG", config.tf_config}});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_EQ(run.exit.signal, 0);
  EXPECT_THAT(run.output, StartsWith(binary + ": " + config.message));
  // Exactly one line: the sentence, nothing else (no log noise, no stack trace).
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
  EXPECT_LT(run.took, absl::Seconds(5));
}

INSTANTIATE_TEST_SUITE_P(AllBinaries, BrokenTfConfigTest,
                         ::testing::Combine(::testing::ValuesIn(BrokenConfigs()),
                                            ::testing::Values("stratum-coordinator",
                                                              "stratum-worker", "stratum-ps")),
                         [](const auto& info) {
                           std::string binary = std::get<1>(info.param);
                           binary.erase(std::remove(binary.begin(), binary.end(), '-'),
                                        binary.end());
                           return std::get<0>(info.param).name + "_" + binary;
                         });

TEST(RoleBinariesTest, MissingTfConfigIsAUsageError) {
  BinaryRun run = RunBinary("stratum-worker", {}, {{"TF_CONFIG", ""}});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, StartsWith("stratum-worker: TF_CONFIG is not set: set it to"));
}

TEST(RoleBinariesTest, WrongRoleForTheBinaryIsAUsageError) {
  BinaryRun run = RunBinary(
      "stratum-ps", {},
      {{"TF_CONFIG",
        R"({"cluster": {"worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}})"}});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output,
              HasSubstr("TF_CONFIG task.type \"worker\" is not a task stratum-ps runs"));
  // The evaluator's binary is stratum-worker, with a flag: the fix names it.
  BinaryRun evaluator = RunBinary(
      "stratum-worker",
      {"--job=" + std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_mwms.json"},
      {{"TF_CONFIG", R"({"cluster": {"worker": ["127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]},)"
                     R"( "task": {"type": "evaluator", "index": 0}})"}});
  EXPECT_EQ(evaluator.exit.exit_code, 2);
  EXPECT_THAT(evaluator.output, ::testing::EndsWith(": pass --evaluator to run the evaluator\n"));
}

// --evaluator names the task TF_CONFIG describes; it used to turn worker:0 into an evaluator
// without a word.
TEST(RoleBinariesTest, TheEvaluatorFlagWithAWorkersTfConfigIsAUsageError) {
  BinaryRun run = RunBinary(
      "stratum-worker", {"--evaluator"},
      {{"TF_CONFIG",
        R"({"cluster": {"worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}})"}});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("this run is the evaluator task, but TF_CONFIG's task is worker:0: set "
                        "TF_CONFIG's task.type to \"evaluator\""));
}

TEST(RoleBinariesTest, CoordinatorNeedsPsAndWorkers) {
  BinaryRun run = RunBinary(
      "stratum-coordinator", {},
      {{"TF_CONFIG",
        R"({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, "task": {"type": "chief", "index": 0}})"}});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("TF_CONFIG cluster has no \"ps\" job, but a parameter-server "
                                    "cluster needs at least one ps and one worker"));
}

TEST(RoleBinariesTest, UnknownFlagIsAUsageErrorAndHelpIsNot) {
  const std::vector<std::pair<std::string, std::string>> env = {{"TF_CONFIG", ""}};
  EXPECT_EQ(RunBinary("stratum-worker", {"--no_such_flag=1"}, env).exit.exit_code, 2);
  EXPECT_EQ(RunBinary("stratum-worker", {"stray"}, env).exit.exit_code, 2);
  EXPECT_EQ(RunBinary("stratum-ps", {"--task_index=abc"}, env).exit.exit_code, 2);
  BinaryRun help = RunBinary("stratum-coordinator", {"--help"}, env);
  EXPECT_EQ(help.exit.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("--cluster_timeout"));
}

TEST(RoleBinariesTest, ANegativeDurationIsAUsageErrorNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> env = {{"TF_CONFIG", ""}};
  BinaryRun run = RunBinary("stratum-worker", {"--shutdown_grace=-5s"}, env);
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("stratum-worker: --shutdown_grace is -5s: a duration cannot "
                                    "be negative; write 0 or more, e.g. 3s"));
  run = RunBinary("stratum-launch", {"--grace-period=-1s", "--dry-run"}, env);
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("--grace_period is -1s"));
}

TEST(RoleBinariesTest, AListenAddressThatIsNotHostPortIsAUsageError) {
  const std::vector<std::pair<std::string, std::string>> env = {
      {"TF_CONFIG",
       R"({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}})"}};
  for (const char* listen : {"garbage", "127.0.0.1:99999", ":80"}) {
    BinaryRun run = RunBinary("stratum-worker", {std::string("--listen_address=") + listen}, env);
    EXPECT_EQ(run.exit.exit_code, 2) << listen;
    EXPECT_THAT(run.output,
                HasSubstr(absl::StrCat("--listen_address \"", listen,
                                       "\" is not host:port: write e.g. 0.0.0.0:2222")));
  }
}

TEST(RoleBinariesTest, ADataPortThatIsNotAPortIsAUsageError) {
  const std::vector<std::pair<std::string, std::string>> env = {
      {"TF_CONFIG", R"({"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}})"}};
  BinaryRun run = RunBinary("stratum-ps", {"--data_port=-3"}, env);
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("--data_port -3 is not a port"));
}

// An evaluator that looks for new checkpoints without pause would spin a core.
TEST(RoleBinariesTest, AnEvalIntervalUnderATenthOfASecondIsAUsageError) {
  const std::vector<std::pair<std::string, std::string>> env = {
      {"TF_CONFIG", R"({"cluster": {"worker": ["127.0.0.1:1"], "evaluator": ["127.0.0.1:2"]}, )"
                    R"("task": {"type": "evaluator", "index": 0}})"}};
  BinaryRun run =
      RunBinary("stratum-worker",
                {"--evaluator", "--eval_interval=0s",
                 "--job=" + std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_ps.json"},
                env);
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--eval_interval is 0: the evaluator would look for new "
                                    "checkpoints without pause; use 100ms or more, e.g. 2s"));
}

// A push needs time to reach a PS: at 0 every closure would fail at once.
TEST(RoleBinariesTest, APsTimeoutUnderATenthOfASecondIsAUsageError) {
  const std::vector<std::pair<std::string, std::string>> env = {
      {"TF_CONFIG", R"({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], )"
                    R"("ps": ["127.0.0.1:3"]}, "task": {"type": "chief", "index": 0}})"}};
  BinaryRun run = RunBinary("stratum-coordinator",
                            {"--ps_timeout=0s", "--job=" + std::string(STRATUM_SOURCE_DIR) +
                                                    "/examples/fashion_mnist_ps.json"},
                            env);
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--ps_timeout is 0: a push or pull needs time to reach a "
                                    "parameter server; use 100ms or more, e.g. 30s"));
}

// Runs `binary` with TF_CONFIG `tf_config` (a cluster none of whose other tasks is up) on
// the example job `example` as `change` leaves it. A job the binary cannot train must be
// refused before it waits for the cluster (which may take minutes to come up, or never),
// not once every task has answered: the run must exit 2 well inside the 10-minute wait.
BinaryRun RunChangedJobWithoutCluster(const std::string& binary, const std::string& tf_config,
                                      const std::string& example,
                                      const std::function<void(nlohmann::json&)>& change) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/" + example);
  nlohmann::json job = nlohmann::json::parse(file);
  change(job);
  const std::string path =
      ::testing::TempDir() + "/changed_job_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << job.dump();
  BinaryRun run = RunBinary(binary, {"--job=" + path}, {{"TF_CONFIG", tf_config}});
  std::remove(path.c_str());
  EXPECT_LT(run.took, absl::Seconds(20));
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  return run;
}

constexpr char kChiefOfAClusterThatIsDown[] =
    R"({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]},)"
    R"( "task": {"type": "chief", "index": 0}})";

// worker:1 of two multi-worker workers on free ports, worker:0 (the leader) not up.
std::string SecondOfTwoWorkers() {
  auto ports = PickFreePorts(2);
  EXPECT_TRUE(ports.ok()) << ports.status();
  if (!ports.ok()) return "";
  return absl::StrCat(R"({"cluster": {"worker": ["127.0.0.1:)", (*ports)[0], R"(", "127.0.0.1:)",
                      (*ports)[1], R"("]}, "task": {"type": "worker", "index": 1}})");
}

TEST(RoleBinariesTest, TheCoordinatorRefusesABadModelBeforeItWaitsForTheCluster) {
  BinaryRun run = RunChangedJobWithoutCluster(
      "stratum-coordinator", kChiefOfAClusterThatIsDown, "fashion_mnist_ps.json",
      [](nlohmann::json& job) { job["model"]["config"]["layers"][1]["class_name"] = "LSTM"; });
  EXPECT_THAT(run.output, HasSubstr("has class \"LSTM\", which Stratum does not support"));
}

TEST(RoleBinariesTest, TheCoordinatorRefusesAMissingDataFileBeforeItWaitsForTheCluster) {
  BinaryRun run = RunChangedJobWithoutCluster(
      "stratum-coordinator", kChiefOfAClusterThatIsDown, "fashion_mnist_ps.json",
      [](nlohmann::json& job) { job["data"]["test"]["labels"] = "/nonexistent/t10k-labels.gz"; });
  EXPECT_THAT(run.output, HasSubstr("IDX file \"/nonexistent/t10k-labels.gz\" not found"));
}

// A checkpoint.dir whose latest checkpoint is of another model (a narrower first layer):
// said at once, naming the variable, not once the whole cluster is up. One of the same
// model split over another number of ps tasks would be restored re-split.
TEST(RoleBinariesTest, TheCoordinatorRefusesACheckpointOfAnotherModelBeforeItWaitsForTheCluster) {
  const std::string dir = ::testing::TempDir() + "/other_model_ckpt_" + std::to_string(getpid());
  ASSERT_OK(CreateCheckpointFolder(dir, 100));
  const nlohmann::json shard = {{"variable", "dense/kernel"},
                                {"shard", "dense/kernel"},
                                {"ps_task", 0},
                                {"first_row", 0},
                                {"shape", {784, 64}}};
  const nlohmann::json manifest = {{"format", "stratum-checkpoint-1"},
                                   {"step", 100},
                                   {"files", nlohmann::json::array()},
                                   {"shards", nlohmann::json::array({shard})}};
  ASSERT_OK(CommitCheckpoint(dir, 100, manifest, 3));
  BinaryRun run = RunChangedJobWithoutCluster(
      "stratum-coordinator", kChiefOfAClusterThatIsDown, "fashion_mnist_ps.json",
      [&](nlohmann::json& job) { job["checkpoint"]["dir"] = dir; });
  EXPECT_THAT(run.output, HasSubstr("ckpt-000000000100 holds \"dense/kernel\" as [784, 64], but "
                                    "this job's model has [784, 128]"));
  std::filesystem::remove_all(dir);
}

TEST(RoleBinariesTest, AMultiWorkerWorkerRefusesABadJobBeforeItWaitsForTheLeader) {
  BinaryRun typo = RunChangedJobWithoutCluster(
      "stratum-worker", SecondOfTwoWorkers(), "fashion_mnist_mwms.json",
      [](nlohmann::json& job) { job["compile"]["optimizer"]["config"]["learning_rat"] = 0.01; });
  EXPECT_THAT(typo.output, HasSubstr("learning_rat"));
  BinaryRun not_idx = RunChangedJobWithoutCluster(
      "stratum-worker", SecondOfTwoWorkers(), "fashion_mnist_mwms.json", [](nlohmann::json& job) {
        job["data"]["train"]["images"] = STRATUM_SOURCE_DIR "/README.md";
      });
  EXPECT_THAT(not_idx.output, HasSubstr("README.md\" is not an IDX file"));
}

// A cluster wait of 0 would give up before any task could answer.
TEST(RoleBinariesTest, AClusterTimeoutUnderASecondIsAUsageError) {
  const std::vector<std::pair<std::string, std::string>> env = {
      {"TF_CONFIG", R"({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], )"
                    R"("ps": ["127.0.0.1:3"]}, "task": {"type": "chief", "index": 0}})"}};
  BinaryRun run = RunBinary("stratum-coordinator", {"--cluster_timeout=0"}, env);
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--cluster_timeout is 0: the tasks need time to answer; use "
                                    "1s or more, e.g. 10m"));
  const std::vector<std::pair<std::string, std::string>> worker_env = {
      {"TF_CONFIG", R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, )"
                    R"("task": {"type": "worker", "index": 0}})"}};
  run = RunBinary("stratum-worker",
                  {"--cluster_timeout=0s", "--job=" + std::string(STRATUM_SOURCE_DIR) +
                                               "/examples/fashion_mnist_mwms.json"},
                  worker_env);
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--cluster_timeout is 0: the workers need time to meet"));
}

TEST(RoleBinariesTest, FlagsOverrideTheTask) {
  auto port = PickFreePort();
  ASSERT_OK(port);
  const std::string address = "127.0.0.1:" + std::to_string(*port);
  // TF_CONFIG says worker:0, the flag says worker:5, which does not exist.
  BinaryRun run = RunBinary("stratum-worker", {"--task_index=5"},
                            {{"TF_CONFIG", R"({"cluster": {"worker": [")" + address +
                                               R"("]}, "task": {"type": "worker", "index": 0}})"}});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("task.index 5 is out of range"));
  // -1 is "not given"; below it is no index at all (it used to be ignored).
  run = RunBinary("stratum-worker", {"--task_index=-4"},
                  {{"TF_CONFIG", R"({"cluster": {"worker": [")" + address +
                                     R"("]}, "task": {"type": "worker", "index": 0}})"}});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("--task_index is -4: give a task index of 0 or more"));
}

TEST(RoleBinariesTest, PortInUseExitsOneNamingTheAddress) {
  auto cluster = LocalCluster::Start({.num_workers = 1, .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string taken = (*cluster)->Address({"worker", 0});
  BinaryRun run = RunBinary("stratum-ps", {},
                            {{"TF_CONFIG", R"({"cluster": {"ps": [")" + taken +
                                               R"("]}, "task": {"type": "ps", "index": 0}})"}});
  EXPECT_EQ(run.exit.exit_code, 1);
  EXPECT_THAT(run.output, HasSubstr("ps:0 cannot listen on " + taken));
}

// A listen address that is not this machine's is a configuration error (2), on the task
// port and on the PS data path alike: a restart cannot fix it. (192.0.2.1, RFC 5737: the
// bind fails here and nothing is sent.)
TEST(RoleBinariesTest, AnAddressThatIsNotThisMachinesExitsTwo) {
  const std::string tf_config =
      R"({"cluster": {"ps": ["192.0.2.1:7000"]}, "task": {"type": "ps", "index": 0}})";
  BinaryRun run = RunBinary("stratum-ps", {}, {{"TF_CONFIG", tf_config}});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("the parameter server's data path cannot listen"));
  run = RunBinary("stratum-ps", {"--data_path=false"}, {{"TF_CONFIG", tf_config}});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("ps:0 cannot listen on 192.0.2.1:7000: 192.0.2.1 is not an "
                                    "address of this machine"));
}

TEST(RoleBinariesTest, SigtermAndSigintStopEveryServerWithinFiveSeconds) {
  auto cluster = LocalCluster::Start({.num_workers = 1, .num_ps = 1, .evaluator = true});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<std::pair<TaskKey, int>> stops = {
      {{"worker", 0}, SIGTERM}, {{"ps", 0}, SIGINT}, {{"evaluator", 0}, SIGTERM}};
  for (const auto& [task, signal] : stops) {
    const absl::Time start = absl::Now();
    ASSERT_OK((*cluster)->Signal(task, signal));
    auto exit = (*cluster)->WaitForExit(task, absl::Seconds(5));
    ASSERT_TRUE(exit.ok()) << task.ToString() << ": " << exit.status();
    EXPECT_TRUE(exit->success()) << task.ToString() << " " << exit->ToString();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_THAT((*cluster)->Output(task),
                HasSubstr("signal " + std::to_string(signal) + " received: shutting down"));
    EXPECT_THAT((*cluster)->Output(task), HasSubstr("stopped"));
  }
}

TEST(RoleBinariesTest, SigtermStopsACoordinatorThatIsStillWaiting) {
  auto cluster = LocalCluster::Start({.num_workers = 1,
                                      .num_ps = 1,
                                      .chief = true,
                                      .not_started = {{"ps", 0}},
                                      .args_by_type = {{"chief", {"--cluster_timeout=10m"}}}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // Printed just before it starts waiting (its SIGTERM handler is set from the start).
  EXPECT_TRUE((*cluster)->WaitForOutput({"chief", 0}, "waiting up to 10m for", absl::Seconds(10)));
  const absl::Time start = absl::Now();
  ASSERT_OK((*cluster)->Signal({"chief", 0}, SIGTERM));
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(5));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT((*cluster)->Output({"chief", 0}),
              HasSubstr("stopped while waiting for the cluster to become healthy"));
}

TEST(RoleBinariesTest, LogLinesCarryTheTask) {
  auto cluster = LocalCluster::Start({.num_workers = 2, .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  (*cluster)->Stop();
  const std::string output = (*cluster)->Output({"worker", 1});
  ASSERT_FALSE(output.empty());
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    EXPECT_THAT(std::string(line), HasSubstr(" worker:1] "));
  }
}

TEST(CoordinatorTest, PrintsTheClusterOnceEveryTaskAnswers) {
  auto cluster = LocalCluster::Start({.num_workers = 2, .num_ps = 2, .chief = true});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->success()) << (*cluster)->Output({"chief", 0});
  const std::string output = (*cluster)->Output({"chief", 0});
  for (const TaskKey& task : (*cluster)->spec().AllTasks()) {
    EXPECT_THAT(output, HasSubstr(task.ToString() + std::string(10 - task.ToString().size(), ' ') +
                                  (*cluster)->Address(task) + "  SERVING"))
        << output;
  }
  EXPECT_THAT(output, HasSubstr("cluster healthy: 5 tasks answered"));
}

TEST(CoordinatorTest, NamesATaskThatNeverStartsWithinTheDeadline) {
  auto cluster = LocalCluster::Start({.num_workers = 2,
                                      .num_ps = 2,
                                      .chief = true,
                                      .not_started = {{"ps", 1}},
                                      .args_by_type = {{"chief", {"--cluster_timeout=2s"}}}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const absl::Time start = absl::Now();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  const std::string output = (*cluster)->Output({"chief", 0});
  EXPECT_THAT(output, HasSubstr("stratum-coordinator: 1 task never answered within 2s: ps:1 at " +
                                (*cluster)->Address({"ps", 1})));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("ps:0 at")));
}

}  // namespace
}  // namespace stratum
