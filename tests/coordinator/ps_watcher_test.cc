// PsWatcher against a real stratum-ps process: which stops it asks the training loop to
// save for. Its heartbeats run only when the test asks (CheckHold; the interval is longer
// than the test), so that what each one sees is under the test's control.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/coordinator/ps_watcher.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using testing::TempPath;

class PsWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = LocalCluster::Start({.num_workers = 1,
                                        .num_ps = 1,
                                        .not_started = {{"worker", 0}},
                                        .args_by_type = {{"ps", {"--stop_timeout=10s"}}},
                                        .forward_output = false});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    std::vector<std::unique_ptr<PsClient>> clients;
    PsClientOptions options;
    options.timeout = absl::Seconds(5);
    // The checkpoint folder this coordinator declares: where TempPath puts file_.
    options.checkpoint_dir = std::filesystem::path(file_).parent_path().string();
    clients.push_back(std::make_unique<PsClient>("ps:0", cluster_->Address({"ps", 0}), options));
    variables_ =
        std::make_unique<ShardedVariables>(std::vector<std::string>{}, std::vector<Shape>{},
                                           std::vector<ShardSpec>{}, std::move(clients));
    watcher_ = std::make_unique<PsWatcher>(
        *variables_, PsWatcherOptions{.saves_checkpoints = true, .interval = absl::Hours(1)});
    ASSERT_OK(watcher_->Claim());
  }
  void TearDown() override { std::remove(file_.c_str()); }

  // SIGTERMs ps:0 and waits until it says it is stopping (asked by another client of this
  // process, so that the watcher hears nothing meanwhile).
  void StopPs() {
    PsClient other("ps:0", cluster_->Address({"ps", 0}), {.timeout = absl::Seconds(5)});
    ASSERT_OK(other.Watch(/*saves_checkpoints=*/true));  // it waits for a save
    ASSERT_OK(cluster_->Signal({"ps", 0}, SIGTERM));
    for (int i = 0; i < 100; ++i) {
      auto answer = other.Watch(true);
      ASSERT_TRUE(answer.ok()) << answer.status();
      if (answer->stopping()) return;
      absl::SleepFor(absl::Milliseconds(20));  // the stratum-ps process handles SIGTERM in its time
    }
    FAIL() << "ps:0 did not say it is stopping within 2 s of SIGTERM";
  }

  // The stops the watcher asks a save for, after heartbeats until it names one (2 s at most:
  // a channel to a restarted PS may take a moment to connect again).
  std::string Stopping() {
    std::string stopping;
    for (int i = 0; i < 40 && stopping.empty(); ++i) {
      EXPECT_OK(watcher_->CheckHold());
      stopping = watcher_->TakeStopping();
      // A real channel to a restarted stratum-ps process connects again in gRPC's time.
      if (stopping.empty()) absl::SleepFor(absl::Milliseconds(50));
    }
    return stopping;
  }

  // Saves ps:0 and commits the save, as CheckpointManager and the training loop do; ps:0
  // exits then.
  void SaveAndCommit() {
    auto saved = variables_->client(0).Save(file_);
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_TRUE(saved->stopping());
    watcher_->Committed({saved->save_id()}, {"ps:0"});
    auto exit = cluster_->WaitForExit({"ps", 0}, absl::Seconds(5));
    ASSERT_TRUE(exit.ok()) << exit.status() << cluster_->Output({"ps", 0});
    EXPECT_EQ(exit->exit_code, 0);
    EXPECT_THAT(cluster_->Output({"ps", 0}), HasSubstr("the coordinator saved the job's state"));
  }

  const std::string file_ = TempPath("ps_watcher_test.safetensors");
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<ShardedVariables> variables_;
  std::unique_ptr<PsWatcher> watcher_;
};

// A PS restarted and signalled again before any heartbeat saw it serving: a new stop that
// needs a save of its own (it used to count as the stop already saved for, so the PS waited
// for a periodic save or its --stop_timeout).
TEST_F(PsWatcherTest, APsRestartedAndSignalledAgainBeforeAHeartbeatSawItServingIsANewStop) {
  ASSERT_NO_FATAL_FAILURE(StopPs());
  EXPECT_EQ(Stopping(), "ps:0");
  ASSERT_OK(watcher_->CheckHold());
  EXPECT_EQ(watcher_->TakeStopping(), "");  // asked once per stop
  ASSERT_NO_FATAL_FAILURE(SaveAndCommit());

  ASSERT_OK(cluster_->Restart({"ps", 0}));
  // The coordinator's recovery claims a restarted PS again before it saves there.
  ASSERT_OK(watcher_->Claim());
  ASSERT_NO_FATAL_FAILURE(StopPs());
  EXPECT_EQ(Stopping(), "ps:0");
  ASSERT_NO_FATAL_FAILURE(SaveAndCommit());
}

// A save asked for a stop that failed (a PS failure the coordinator then recovers from) is
// asked for again; once a committed one is, no more.
TEST_F(PsWatcherTest, AStopIsAskedASaveAgainAfterTheSaveFailed) {
  ASSERT_NO_FATAL_FAILURE(StopPs());
  EXPECT_EQ(Stopping(), "ps:0");
  watcher_->SaveFailed("ps:0");
  ASSERT_OK(watcher_->CheckHold());
  EXPECT_EQ(watcher_->TakeStopping(), "ps:0");
  watcher_->SaveFailed("ps:0");
  ASSERT_NO_FATAL_FAILURE(SaveAndCommit());
  EXPECT_EQ(watcher_->TakeStopping(), "");
}

}  // namespace
}  // namespace stratum
