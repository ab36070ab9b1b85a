// stratum-launch as a user runs it: the whole cluster from one command, its exit code,
// Ctrl-C / SIGTERM, a child that dies, and never a process left behind.
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

// Where the launchers of this test process keep their tasks' logs; removed at its end.
const std::string& LogDir() {
  static const std::string dir =
      ::testing::TempDir() + "/launch_test_logs_" + std::to_string(getpid());
  return dir;
}
struct RemoveLogDir : ::testing::Environment {
  void TearDown() override { testing::RemoveFolder(LogDir()); }
};
const auto* const kRemoveLogDir = ::testing::AddGlobalTestEnvironment(new RemoveLogDir);

// The launcher on `args`; `verbose` (most tests read the tasks' own lines) shows every
// task's output on its console.
std::unique_ptr<Subprocess> Launch(std::vector<std::string> args, bool verbose = true) {
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/stratum-launch", "--log_dir=" + LogDir()};
  if (verbose) options.argv.push_back("--verbose");
  for (std::string& arg : args) options.argv.push_back(std::move(arg));
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

// Waits until the launcher's output contains `text` `count` times.
bool WaitForOutput(Subprocess& launcher, const std::string& text, int count = 1,
                   absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const std::string output = launcher.output();
    int found = 0;
    for (size_t at = output.find(text); at != std::string::npos; at = output.find(text, at + 1)) {
      ++found;
    }
    if (found >= count) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// task name -> pid, from the launcher's "[launch] started worker:1 on ... (pid N)" lines.
std::map<std::string, pid_t> ChildPids(const std::string& output) {
  std::map<std::string, pid_t> pids;
  static const std::regex kStarted(R"(\[launch\] started (\S+) on \S+ \(pid (\d+)\))");
  for (std::sregex_iterator it(output.begin(), output.end(), kStarted), end; it != end; ++it) {
    pids[(*it)[1]] = std::stoi((*it)[2]);
  }
  return pids;
}

bool ProcessGone(pid_t pid) {
  if (kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, name, state;
  stat >> pid_field >> name >> state;
  return state == "Z";  // a zombie has exited; only its parent's reaping is left
}

bool AllGone(const std::map<std::string, pid_t>& pids, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    bool gone = true;
    for (const auto& [task, pid] : pids) gone = gone && ProcessGone(pid);
    if (gone) return true;
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// The example job `example` (the parameter_server one unless named), `epochs` of 100
// steps, checkpointing every `every_steps` (0: at each epoch's end) into a fresh folder;
// both removed at the end.
struct JobFile {
  JobFile(const std::string& name, int epochs, int every_steps,
          const std::string& example = "fashion_mnist_ps.json")
      : checkpoints(::testing::TempDir() + "/" + name + "_ckpt_" + std::to_string(getpid())),
        path(checkpoints + ".json") {
    std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/" + example);
    nlohmann::json job = nlohmann::json::parse(file);
    job["fit"]["epochs"] = epochs;
    job["fit"]["steps_per_epoch"] = 100;
    testing::RemoveFolder(checkpoints);
    job["checkpoint"] = {{"dir", checkpoints}, {"every_steps", every_steps}};
    std::ofstream(path) << job.dump();
  }
  ~JobFile() {
    testing::RemoveFolder(checkpoints);
    std::filesystem::remove(path);
  }
  const std::string checkpoints;
  const std::string path;
};

TEST(LaunchTest, MainJobComesUpHealthyAndExitsZeroLeavingNothing) {
  auto launcher = Launch({"--chief", "--workers=2", "--ps=2"});
  auto exit = launcher->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = launcher->output();
  EXPECT_EQ(exit->exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("[chief:0] TASK"));
  for (const char* task : {"chief:0", "worker:0", "worker:1", "ps:0", "ps:1"}) {
    EXPECT_THAT(output, HasSubstr(std::string("[chief:0] ") + task)) << output;
  }
  EXPECT_THAT(output, HasSubstr("[worker:1] "));
  EXPECT_THAT(output, HasSubstr("cluster healthy: 5 tasks answered"));
  EXPECT_THAT(output, HasSubstr("[launch] chief:0 exited with code 0; stopping the others"));
  const auto pids = ChildPids(output);
  EXPECT_EQ(pids.size(), 5u);
  EXPECT_TRUE(AllGone(pids, absl::Seconds(1)));
}

TEST(LaunchTest, TheConsoleShowsTheTrainingAndEachTasksWholeLogIsInTheLogFolder) {
  JobFile job("quiet", 2, 0);
  const std::string logs = LogDir() + "/quiet";
  auto launcher = Launch({"--job=" + job.path, "--log_dir=" + logs}, /*verbose=*/false);
  auto exit = launcher->Wait(absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = launcher->output();
  EXPECT_EQ(exit->exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("[launch] logs of every task: " + logs +
                                " (here: the training progress, warnings and errors; --verbose "
                                "shows every line)"));
  EXPECT_THAT(output, HasSubstr("[chief:0] Epoch 2/2 - 100 steps on 2 workers"));
  EXPECT_THAT(output, ::testing::ContainsRegex("\\[chief:0\\] test accuracy [0-9.]+"));
  // Nothing of the other tasks' routine, nor the chief's log lines, nor the launcher's.
  EXPECT_THAT(output, ::testing::Not(HasSubstr("[worker:0]")));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("[ps:1]")));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("checkpoint at step 100 written")));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("[launch] started")));
  // The last lines: where things are.
  EXPECT_THAT(output, HasSubstr("[launch] checkpoints: " + job.checkpoints +
                                " (the same command again resumes from the last one"));
  EXPECT_THAT(output, ::testing::EndsWith("[launch] logs of every task: " + logs + "\n"));
  auto read = [&](const std::string& name) {
    std::ifstream file(logs + "/" + name);
    return std::string(std::istreambuf_iterator<char>(file), {});
  };
  EXPECT_THAT(read("worker-1.log"), HasSubstr("I worker:1] stratum-worker"));
  EXPECT_THAT(read("ps-0.log"), HasSubstr("serving on"));
  EXPECT_THAT(read("chief-0.log"), HasSubstr("checkpoint at step 100 written"));
  EXPECT_THAT(read("chief-0.log"), HasSubstr("Epoch 2/2"));
  EXPECT_THAT(read("launch.log"), HasSubstr("[launch] started worker:1 on"));
}

TEST(LaunchTest, ATaskThatFailsHasTheEndOfItsLogShownWithItsPath) {
  JobFile job("failing", 1, 0);
  // A job whose training data is gone: the chief refuses it once the cluster is up.
  nlohmann::json spec = nlohmann::json::parse(std::ifstream(job.path));
  spec["data"]["train"]["images"] = "/nonexistent/train-images-idx3-ubyte.gz";
  std::ofstream(job.path) << spec.dump();
  const std::string logs = LogDir() + "/failing";
  auto launcher = Launch({"--job=" + job.path, "--log_dir=" + logs}, /*verbose=*/false);
  auto exit = launcher->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = launcher->output();
  EXPECT_EQ(exit->exit_code, 2) << output;
  EXPECT_THAT(output, HasSubstr("[launch] the last lines of chief:0's log (all of it: " + logs +
                                "/chief-0.log):"));
  EXPECT_THAT(output, HasSubstr("/nonexistent/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(output, HasSubstr("[launch] chief:0 exited with code 2; stopping the others"));
}

TEST(LaunchTest, ParameterServerSettingsAndTlsFilesReachTheTasks) {
  JobFile job("ps_flags", 1, 0);
  auto launcher = Launch({"--dry-run", "--job=" + job.path, "--placement=round_robin",
                          "--closures_per_worker=2", "--tls_ca=ca.pem", "--tls_cert=/c.pem",
                          "--tls_key=/k.pem"});
  ASSERT_OK(launcher->Wait(absl::Seconds(10)));
  const std::string output = launcher->output();
  EXPECT_THAT(output, HasSubstr("--placement=round_robin --closures_per_worker=2"));
  EXPECT_THAT(output, HasSubstr("STRATUM_TLS_CERT=/c.pem STRATUM_TLS_KEY=/k.pem STRATUM_TLS_CA=" +
                                std::filesystem::current_path().string() + "/ca.pem TF_CONFIG="));
  launcher = Launch({"--dry-run", "--chief", "--placement=round_robin"});
  ASSERT_OK(launcher->Wait(absl::Seconds(10)));
  EXPECT_THAT(launcher->output(),
              HasSubstr("--placement and --closures_per_worker are the chief's settings for a "
                        "parameter_server job: pass them with --job of such a job"));
}

TEST(LaunchTest, DryRunPrintsEveryTaskAndStartsNothing) {
  auto launcher = Launch({"--dry-run", "--chief", "--workers", "2", "--ps", "2"});
  auto exit = launcher->Wait(absl::Seconds(10));
  ASSERT_OK(exit);
  EXPECT_EQ(exit->exit_code, 0);
  const std::string output = launcher->output();
  for (const char* task : {"# chief:0 on 127.0.0.1:", "# worker:1 on 127.0.0.1:", "# ps:1 on"}) {
    EXPECT_THAT(output, HasSubstr(task));
  }
  EXPECT_THAT(output, HasSubstr(R"(TF_CONFIG='{"cluster":{"chief":["127.0.0.1:)"));
  EXPECT_THAT(output, HasSubstr(R"("task":{"type":"worker","index":1}}' )"));
  EXPECT_THAT(output, HasSubstr("/stratum-coordinator --log_level=info --cluster_timeout=2m"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("[launch] started")));
}

TEST(LaunchTest, SigtermStopsEveryChild) {
  auto launcher = Launch({"--workers=2", "--ps=1", "--evaluator"});
  ASSERT_TRUE(WaitForOutput(*launcher, "serving on", 4)) << launcher->output();
  const auto pids = ChildPids(launcher->output());
  ASSERT_EQ(pids.size(), 4u);
  launcher->Signal(SIGTERM);
  auto exit = launcher->Wait(absl::Seconds(10));
  ASSERT_OK(exit);
  EXPECT_EQ(exit->exit_code, 128 + SIGTERM);
  EXPECT_THAT(launcher->output(), HasSubstr("[launch] signal 15: stopping 4 tasks"));
  EXPECT_TRUE(AllGone(pids, absl::Seconds(1)));
}

// A server task that dies is reported and started again on its address, as a cluster
// manager would, up to --max_restarts times.
TEST(LaunchTest, RestartsAServerThatDiesReportsItAndStopsOnCtrlC) {
  auto launcher = Launch({"--workers=2", "--ps=1", "--max_restarts=1"});
  ASSERT_TRUE(WaitForOutput(*launcher, "serving on", 3)) << launcher->output();
  const auto pids = ChildPids(launcher->output());
  ASSERT_EQ(kill(pids.at("worker:1"), SIGKILL), 0);
  ASSERT_TRUE(
      WaitForOutput(*launcher, "[launch] worker:1 (pid " + std::to_string(pids.at("worker:1")) +
                                   ") stopped unexpectedly: it was killed by signal 9 (SIGKILL); "
                                   "starting it again in 1s (restart 1 of 1)"))
      << launcher->output();
  ASSERT_TRUE(WaitForOutput(*launcher, "serving on", 4)) << launcher->output();
  const auto restarted = ChildPids(launcher->output());
  ASSERT_NE(restarted.at("worker:1"), pids.at("worker:1"));
  std::smatch address;
  const std::string output = launcher->output();
  ASSERT_TRUE(std::regex_search(output, address, std::regex(R"(started worker:1 on (\S+))")));
  EXPECT_THAT(output, HasSubstr("[launch] started worker:1 on " + address[1].str() + " (pid " +
                                std::to_string(restarted.at("worker:1")) + ") again"));
  ASSERT_EQ(kill(restarted.at("worker:1"), SIGKILL), 0);
  ASSERT_TRUE(WaitForOutput(*launcher, "not started again: it failed 2 times"))
      << launcher->output();
  launcher->Signal(SIGINT);
  auto exit = launcher->Wait(absl::Seconds(10));
  ASSERT_OK(exit);
  EXPECT_EQ(exit->exit_code, 128 + SIGINT);
  EXPECT_TRUE(AllGone(pids, absl::Seconds(1)));
  EXPECT_TRUE(AllGone(restarted, absl::Seconds(1)));
}

// Under the launcher, a parameter server that dies mid-job is started again and the chief
// re-seeds it from the last checkpoint: the job ends as if nothing happened.
TEST(LaunchTest, APsJobOutlivesAKilledParameterServer) {
  const JobFile job("launch_ps", 4, 50);
  auto launcher = Launch({"--job=" + job.path, "--workers=2", "--ps=2"});
  ASSERT_TRUE(WaitForOutput(*launcher, "Epoch 1/4", 1, absl::Seconds(60))) << launcher->output();
  ASSERT_EQ(kill(ChildPids(launcher->output()).at("ps:1"), SIGKILL), 0);
  auto exit = launcher->Wait(absl::Seconds(90));
  ASSERT_OK(exit);
  const std::string output = launcher->output();
  EXPECT_EQ(exit->exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("[launch] started ps:1 on "));
  EXPECT_THAT(output, HasSubstr(") again"));
  EXPECT_THAT(output, HasSubstr("the parameter servers are back: restored the checkpoint at step"));
  EXPECT_THAT(output, HasSubstr("Epoch 4/4"));
  EXPECT_TRUE(AllGone(ChildPids(output), absl::Seconds(1)));
}

// A parameter server stopped from outside the launcher (a SIGTERM, as an evicted pod gets)
// waits for the chief's save and exits cleanly; the launcher starts it again, since the job
// needs it, and the chief restores that save: the job ends as if nothing happened.
TEST(LaunchTest, APsJobOutlivesAParameterServerStoppedFromOutside) {
  const JobFile job("launch_ps_term", 4, 50);
  auto launcher = Launch({"--job=" + job.path, "--workers=2", "--ps=2"});
  ASSERT_TRUE(WaitForOutput(*launcher, "Epoch 1/4", 1, absl::Seconds(60))) << launcher->output();
  const int ps = ChildPids(launcher->output()).at("ps:1");
  ASSERT_EQ(kill(ps, SIGTERM), 0);
  auto exit = launcher->Wait(absl::Seconds(90));
  ASSERT_OK(exit);
  const std::string output = launcher->output();
  EXPECT_EQ(exit->exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("ps:1 is stopping (it got a signal): saved the state at step"));
  EXPECT_THAT(output, HasSubstr(absl::StrCat("[launch] ps:1 (pid ", ps,
                                             ") stopped unexpectedly: it exited with code 0 (it "
                                             "was stopped from outside this launcher, and the job "
                                             "needs it); starting it again in 1s")));
  EXPECT_THAT(output, HasSubstr("the parameter servers are back: restored the checkpoint at step"));
  EXPECT_THAT(output, HasSubstr("Epoch 4/4"));
  EXPECT_TRUE(AllGone(ChildPids(output), absl::Seconds(1)));
}

// Under the launcher, a multi_worker_mirrored job whose worker dies is started again as a
// whole (its workers train in lock-step) and resumes from its last checkpoint. The killed
// worker is named, not the one that failed for want of it.
TEST(LaunchTest, AMultiWorkerJobOutlivesAKilledWorker) {
  const JobFile job("launch_mwms", 4, 50, "fashion_mnist_mwms.json");
  auto launcher = Launch({"--job=" + job.path, "--workers=2"});
  ASSERT_TRUE(WaitForOutput(*launcher, "Epoch 1/4", 1, absl::Seconds(60))) << launcher->output();
  ASSERT_EQ(kill(ChildPids(launcher->output()).at("worker:1"), SIGKILL), 0);
  auto exit = launcher->Wait(absl::Seconds(120));
  ASSERT_OK(exit);
  const std::string output = launcher->output();
  EXPECT_EQ(exit->exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("[launch] worker:1 (pid"));
  EXPECT_THAT(output, HasSubstr("stopped unexpectedly: it was killed by signal 9 (SIGKILL); the "
                                "workers train in lock-step, so every one is stopped and the "
                                "job starts again 1s after they have stopped (restart 1 of 3)"));
  EXPECT_TRUE(std::regex_search(output, std::regex(R"(started worker:0 on \S+ \(pid \d+\) again)")))
      << output;
  EXPECT_THAT(output, HasSubstr("resumed from checkpoint step "));
  EXPECT_THAT(output, HasSubstr("Epoch 4/4"));
  EXPECT_TRUE(AllGone(ChildPids(output), absl::Seconds(1)));
}

// Without restarts the job fails, and the launcher's exit code is worker:0's (the one
// --help promises), not that of the worker that was killed.
TEST(LaunchTest, AFailedMultiWorkerJobExitsWithWorkerZerosCode) {
  const JobFile job("launch_mwms_fail", 40, 0, "fashion_mnist_mwms.json");
  auto launcher = Launch({"--job=" + job.path, "--workers=2", "--max_restarts=0"});
  ASSERT_TRUE(WaitForOutput(*launcher, "Epoch 1/40", 1, absl::Seconds(60))) << launcher->output();
  ASSERT_EQ(kill(ChildPids(launcher->output()).at("worker:1"), SIGKILL), 0);
  auto exit = launcher->Wait(absl::Seconds(60));
  ASSERT_OK(exit);
  const std::string output = launcher->output();
  EXPECT_THAT(output, HasSubstr("the job is not started again (it failed 1 time)"));
  // worker:0 notices its peer is gone and fails on its own (1), before the launcher would
  // stop it (143 would read as "stopped by SIGTERM, state saved").
  EXPECT_EQ(exit->exit_code, 1) << output;
}

TEST(LaunchTest, CtrlCStopsTheChiefFirstSoThatItSavesTheJobWhileTheServersAreUp) {
  const JobFile job("launch_stop", 50, 0);
  auto launcher = Launch({"--job=" + job.path, "--workers=2", "--ps=2"});
  ASSERT_TRUE(WaitForOutput(*launcher, "Epoch 1/50", 1, absl::Seconds(60))) << launcher->output();
  launcher->Signal(SIGINT);
  auto exit = launcher->Wait(absl::Seconds(30));
  ASSERT_OK(exit);
  const std::string output = launcher->output();
  EXPECT_EQ(exit->exit_code, 128 + SIGINT) << output;
  // The chief saved what it trained: the parameter servers were still up.
  EXPECT_THAT(output, HasSubstr("this process was stopped by a signal; the state at step "));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("a parameter server is unavailable")));
  EXPECT_TRUE(std::filesystem::exists(job.checkpoints + "/checkpoint")) << output;
  EXPECT_TRUE(AllGone(ChildPids(output), absl::Seconds(1)));
}

// The evaluator side-car, stopped with the cluster once the job is done, evaluates the
// final checkpoint first (it is written just before the end, within the evaluator's poll
// interval): evaluation.json is the trained model's.
TEST(LaunchTest, TheEvaluatorEvaluatesTheFinalCheckpointBeforeItStops) {
  const JobFile job("launch_eval", 2, 0);
  auto launcher = Launch({"--job=" + job.path, "--workers=1", "--ps=1", "--evaluator"});
  auto exit = launcher->Wait(absl::Seconds(90));
  ASSERT_OK(exit);
  const std::string output = launcher->output();
  EXPECT_EQ(exit->exit_code, 0) << output;
  std::ifstream file(job.checkpoints + "/evaluation.json");
  const nlohmann::json evaluation = nlohmann::json::parse(file, nullptr, false);
  ASSERT_TRUE(evaluation.is_object()) << output;
  EXPECT_EQ(evaluation["step"], 200) << output;
  EXPECT_GT(evaluation["val_accuracy"].get<double>(), 0.6);
}

TEST(LaunchTest, ChildrenDieWithAKilledLauncher) {
  auto launcher = Launch({"--workers=1", "--ps=1"});
  ASSERT_TRUE(WaitForOutput(*launcher, "serving on", 2)) << launcher->output();
  const auto pids = ChildPids(launcher->output());
  launcher->Signal(SIGKILL);
  ASSERT_OK(launcher->Wait(absl::Seconds(5)));
  EXPECT_TRUE(AllGone(pids, absl::Seconds(10)));
}

// The launcher's own logic (exit code, stopping the rest) with stand-in binaries whose
// behaviour the test controls.
class LaunchExitCodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/stratum-launch-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  void WriteScript(const std::string& name, const std::string& body) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    chmod(path.c_str(), 0755);
  }

  std::string dir_;
};

TEST_F(LaunchExitCodeTest, ExitCodeIsTheChiefsAndTheRestAreStopped) {
  WriteScript("stratum-coordinator", "sleep 0.3; echo failing; exit 7");
  WriteScript("stratum-worker", "exec sleep 60");
  WriteScript("stratum-ps", "exec sleep 60");
  auto launcher = Launch({"--chief", "--workers=2", "--ps=1", "--bin_dir=" + dir_});
  auto exit = launcher->Wait(absl::Seconds(20));
  ASSERT_OK(exit);
  EXPECT_EQ(exit->exit_code, 7) << launcher->output();
  EXPECT_THAT(launcher->output(), HasSubstr("[chief:0] failing"));
  EXPECT_TRUE(AllGone(ChildPids(launcher->output()), absl::Seconds(1)));
}

TEST_F(LaunchExitCodeTest, WithoutAChiefTheExitCodeIsWorkerZeros) {
  WriteScript("stratum-worker",
              "case \"$TF_CONFIG\" in *'\"index\":0}'*) exit 3;; esac; exec sleep 60");
  WriteScript("stratum-ps", "exec sleep 60");
  auto launcher = Launch({"--workers=2", "--ps=1", "--bin_dir=" + dir_});
  auto exit = launcher->Wait(absl::Seconds(20));
  ASSERT_OK(exit);
  EXPECT_EQ(exit->exit_code, 3) << launcher->output();
}

// A second Ctrl-C while the launcher waits for a child that does not stop ends it at once,
// saying so (QA: the output just stopped), and the children go with it.
TEST_F(LaunchExitCodeTest, ASecondSignalWhileStoppingExitsAtOnceAndSaysSo) {
  WriteScript("stratum-worker", "trap '' TERM; echo up; while true; do sleep 1; done");
  WriteScript("stratum-ps", "exec sleep 60");
  auto launcher = Launch({"--workers=1", "--ps=1", "--bin_dir=" + dir_});
  ASSERT_TRUE(WaitForOutput(*launcher, "[worker:0] up")) << launcher->output();
  const auto pids = ChildPids(launcher->output());
  launcher->Signal(SIGTERM);
  ASSERT_TRUE(WaitForOutput(*launcher, "[launch] signal 15: stopping 2 tasks"));
  launcher->Signal(SIGTERM);  // worker:0 ignores the first: the launcher would wait 30 s
  auto exit = launcher->Wait(absl::Seconds(5));
  ASSERT_TRUE(exit.ok()) << launcher->output();
  EXPECT_EQ(exit->exit_code, 128 + SIGTERM);
  EXPECT_THAT(launcher->output(),
              HasSubstr("stratum-launch: second signal 15 while stopping: exiting at once"));
  for (const auto& [task, pid] : pids) kill(pid, SIGKILL);  // its trap outlives the launcher
}

TEST_F(LaunchExitCodeTest, MissingBinaryIsAUsageError) {
  auto launcher = Launch({"--workers=1", "--ps=0", "--bin_dir=" + dir_});
  auto exit = launcher->Wait(absl::Seconds(20));
  ASSERT_OK(exit);
  EXPECT_EQ(exit->exit_code, 2);
  EXPECT_THAT(launcher->output(), HasSubstr("cannot start worker:0: cannot run " + dir_ +
                                            "/stratum-worker: No such file or directory"));
}

// The output of a launcher refused at once as a usage error (exit 2).
std::string RefusedOutput(const std::vector<std::string>& args) {
  auto launcher = Launch(args);
  auto exit = launcher->Wait(absl::Seconds(10));
  EXPECT_OK(exit);
  if (exit.ok()) {
    EXPECT_EQ(exit->exit_code, 2);
  }
  return launcher->output();
}

TEST(LaunchUsageTest, BadCountsAreUsageErrors) {
  EXPECT_THAT(RefusedOutput({"--workers=0", "--ps=2"}),
              HasSubstr("stratum-launch: a cluster needs a chief or at least one worker"));
}

TEST(LaunchUsageTest, ParameterServersForAMultiWorkerMirroredJobAreRefused) {
  const std::string job = std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_mwms.json";
  EXPECT_THAT(RefusedOutput({"--job=" + job, "--ps=2", "--dry-run"}),
              HasSubstr("is a multi_worker_mirrored job, which has no parameter servers, and "
                        "--ps 2 asks for some"));
  // Without --ps it starts none, and a parameter_server cluster still gets 2 by default.
  auto launcher = Launch({"--job=" + job, "--dry-run"});
  ASSERT_OK(launcher->Wait(absl::Seconds(10)));
  EXPECT_THAT(launcher->output(), ::testing::Not(HasSubstr("# ps:")));
  launcher = Launch({"--dry-run"});
  ASSERT_OK(launcher->Wait(absl::Seconds(10)));
  EXPECT_THAT(launcher->output(), HasSubstr("# ps:1 on"));
}

TEST(LaunchUsageTest, NoParameterServersForAParameterServerJobAndNegativeRestartsAreRefused) {
  const std::string job = std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_ps.json";
  EXPECT_THAT(RefusedOutput({"--job=" + job, "--ps=0", "--dry-run"}),
              HasSubstr("is a parameter_server job, whose variables live on parameter servers, "
                        "and --ps 0 starts none"));
  EXPECT_THAT(RefusedOutput({"--max_restarts=-1", "--dry-run"}),
              HasSubstr("--max_restarts is -1, which must not be negative"));
  // Checked here, once, not by each task it would start.
  EXPECT_THAT(RefusedOutput({"--log_level=loud", "--dry-run"}),
              ::testing::StartsWith("stratum-launch: --log_level \"loud\" is not a log level"));
}

// Refused before anything starts (QA: --cluster_timeout=0s started the cluster and the chief
// refused it; --chief --ps 0 got the chief's TF_CONFIG advice instead of the flag to change).
TEST(LaunchUsageTest, DeadlinesTheChiefWouldRefuseAndAChiefWithoutParameterServersAreRefused) {
  EXPECT_THAT(RefusedOutput({"--cluster_timeout=0s", "--dry-run"}),
              HasSubstr("--cluster_timeout is 0: the tasks need time to answer; use 1s or more, "
                        "e.g. 2m"));
  EXPECT_THAT(RefusedOutput({"--grace_period=-1s", "--dry-run"}),
              HasSubstr("--grace_period is -1s"));
  EXPECT_THAT(RefusedOutput({"--chief", "--workers=1", "--ps=0", "--dry-run"}),
              HasSubstr("--chief starts stratum-coordinator, the chief of a parameter-server "
                        "cluster, which needs parameter servers, and --ps 0 starts none: pass "
                        "--ps 1 or more"));
}

}  // namespace
}  // namespace stratum
