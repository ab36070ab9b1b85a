// The LocalCluster fixture itself: it starts real binaries, exposes addresses and
// TF_CONFIGs, kills and restarts tasks, and always tears everything down.
#include "stratum/testing/local_cluster.h"

#include <signal.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/cluster/cluster_resolver.h"
#include "stratum/net/health.h"
#include "stratum/testing/status_matchers.h"

namespace stratum::testing {
namespace {

using ::testing::HasSubstr;

TEST(LocalClusterTest, StartsHealthyTasksWithTheirTfConfig) {
  auto cluster = LocalCluster::Start({.num_workers = 2, .num_ps = 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (const TaskKey& task : (*cluster)->spec().AllTasks()) {
    const std::string address = (*cluster)->Address(task);
    EXPECT_THAT(address, ::testing::StartsWith("127.0.0.1:"));
    EXPECT_TRUE(CheckHealth(address, absl::Seconds(5)).ok()) << task.ToString();
    auto report = GetTaskReport(address, absl::Seconds(5));
    ASSERT_OK(report);
    EXPECT_EQ(report->task, task);
    EXPECT_EQ(report->pid, (*cluster)->Pid(task));
    auto resolver = TFConfigClusterResolver::Create((*cluster)->TfConfig(task));
    ASSERT_TRUE(resolver.ok()) << resolver.status();
    EXPECT_EQ(resolver->task(), task);
    EXPECT_EQ(resolver->cluster_spec(), (*cluster)->spec());
  }
}

TEST(LocalClusterTest, KillAndRestartGiveANewIncarnationOnTheSameAddress) {
  auto cluster = LocalCluster::Start({.num_workers = 2, .num_ps = 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const TaskKey worker{"worker", 1};
  const std::string address = (*cluster)->Address(worker);
  auto before = GetTaskReport(address, absl::Seconds(5));
  ASSERT_OK(before);

  ASSERT_OK((*cluster)->Kill(worker));
  EXPECT_EQ((*cluster)->Pid(worker), 0);
  EXPECT_FALSE(CheckHealth(address, absl::Seconds(1)).ok());

  ASSERT_OK((*cluster)->Restart(worker));
  auto after = GetTaskReport(address, absl::Seconds(5));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NE(after->incarnation, before->incarnation);
  EXPECT_NE(after->pid, before->pid);
  EXPECT_OK((*cluster)->WaitHealthy(absl::Seconds(10)));
}

TEST(LocalClusterTest, NotStartedTasksCanBeStartedLater) {
  auto cluster = LocalCluster::Start({.num_workers = 1, .num_ps = 1, .not_started = {{"ps", 0}}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string ps = (*cluster)->Address({"ps", 0});
  EXPECT_FALSE(ps.empty());
  EXPECT_FALSE(CheckHealth(ps, absl::Milliseconds(500)).ok());
  ASSERT_OK((*cluster)->Restart({"ps", 0}));
  EXPECT_OK(CheckHealth(ps, absl::Seconds(5)));
}

TEST(LocalClusterTest, DestructionLeavesNoProcess) {
  std::vector<int> pids;
  {
    auto cluster = LocalCluster::Start({.num_workers = 2, .num_ps = 2});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    for (const TaskKey& task : (*cluster)->spec().AllTasks()) pids.push_back((*cluster)->Pid(task));
  }
  for (int pid : pids) {
    EXPECT_GT(pid, 0);
    EXPECT_EQ(kill(pid, 0), -1) << "pid " << pid << " survived";
  }
}

TEST(LocalClusterTest, StartFailsClearlyWhenABinaryIsMissing) {
  auto cluster = LocalCluster::Start({.num_workers = 1, .bin_dir = "/nonexistent"});
  ASSERT_FALSE(cluster.ok());
  EXPECT_THAT(cluster.status().message(), HasSubstr("cannot run /nonexistent/stratum-worker"));
}

// A task that refuses its configuration exits at once: the wait for the cluster ends then,
// naming it and showing its output, not at healthy_timeout.
TEST(LocalClusterTest, ATaskThatExitsWhileWaitedForEndsTheWaitAtOnce) {
  const absl::Time start = absl::Now();
  auto cluster = LocalCluster::Start({.num_workers = 2,
                                      .args_by_type = {{"worker", {"--job=/nonexistent/job.json"}}},
                                      .healthy_timeout = absl::Seconds(60),
                                      .forward_output = false});
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  ASSERT_FALSE(cluster.ok());
  EXPECT_THAT(cluster.status().message(), HasSubstr("exited before the cluster was healthy"));
  EXPECT_THAT(cluster.status().message(), HasSubstr("/nonexistent/job.json"));
}

TEST(LocalClusterTest, OutputsAgreeNamesTheTaskThatDiffers) {
  auto cluster = LocalCluster::Start({.num_workers = 2, .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_OK((*cluster)->OutputsAgree({{"worker", 0}, {"worker", 1}}, "serving on"));
  // Every process draws its own incarnation.
  const absl::Status differ =
      (*cluster)->OutputsAgree({{"worker", 0}, {"worker", 1}}, "incarnation [0-9a-f]+");
  EXPECT_THAT(differ.message(), HasSubstr("worker:1 printed \"incarnation "));
  const absl::Status missing = (*cluster)->OutputsAgree({{"worker", 0}}, "test accuracy");
  EXPECT_THAT(missing.message(), HasSubstr("worker:0 printed nothing matching test accuracy"));
}

}  // namespace
}  // namespace stratum::testing
