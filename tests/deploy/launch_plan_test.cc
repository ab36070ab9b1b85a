#include "stratum/launch/launch_plan.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "stratum/cluster/cluster_resolver.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

TEST(LaunchPlanTest, PlansEveryTaskWithItsOwnPortAndTfConfig) {
  LaunchOptions options{.num_workers = 2, .num_ps = 2, .chief = true, .evaluator = true};
  options.bin_dir = "/opt/stratum/bin";
  auto plan = PlanLocalCluster(options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->tasks.size(), 6u);
  EXPECT_EQ(plan->main_task, (TaskKey{"chief", 0}));
  EXPECT_EQ(plan->tasks.back().task, (TaskKey{"chief", 0}));  // servers start first
  std::set<std::string> addresses;
  for (const PlannedTask& task : plan->tasks) {
    addresses.insert(task.address);
    auto resolver = TFConfigClusterResolver::Create(task.tf_config);
    ASSERT_TRUE(resolver.ok()) << resolver.status();
    EXPECT_EQ(resolver->task(), task.task);
    EXPECT_EQ(resolver->cluster_spec(), plan->spec);
    EXPECT_EQ(task.argv.front(), "/opt/stratum/bin/" + BinaryFor(task.task.type));
  }
  EXPECT_EQ(addresses.size(), 6u);
}

TEST(LaunchPlanTest, WithMetricsEveryTaskServesThemOnAPortOfItsOwn) {
  LaunchOptions options{.num_workers = 2, .num_ps = 1, .chief = true};
  options.metrics = true;
  auto plan = PlanLocalCluster(options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::set<std::string> ports;
  for (const PlannedTask& task : plan->tasks) {
    ports.insert(task.address.substr(task.address.rfind(':') + 1));
    ASSERT_FALSE(task.metrics_address.empty()) << task.task.ToString();
    const std::string port = task.metrics_address.substr(task.metrics_address.rfind(':') + 1);
    ports.insert(port);
    EXPECT_THAT(task.argv, ::testing::Contains("--metrics_port=" + port));
  }
  EXPECT_EQ(ports.size(), 8u);  // 4 gRPC ports and 4 metrics ports, all different
  auto plain = PlanLocalCluster({.num_workers = 1, .num_ps = 0});
  ASSERT_OK(plain);
  EXPECT_TRUE(plain->tasks.front().metrics_address.empty());
}

TEST(LaunchPlanTest, BinariesFollowTheRoles) {
  EXPECT_EQ(BinaryFor("chief"), "stratum-coordinator");
  EXPECT_EQ(BinaryFor("worker"), "stratum-worker");
  EXPECT_EQ(BinaryFor("evaluator"), "stratum-worker");
  EXPECT_EQ(BinaryFor("ps"), "stratum-ps");
  auto plan = PlanLocalCluster({.num_workers = 1, .num_ps = 0, .evaluator = true});
  ASSERT_OK(plan);
  EXPECT_THAT(plan->tasks.back().argv, ::testing::Contains("--evaluator"));
  EXPECT_EQ(plan->main_task, (TaskKey{"worker", 0}));
}

TEST(LaunchPlanTest, AddsArgumentsByType) {
  LaunchOptions options{.num_workers = 1, .num_ps = 1, .chief = true};
  options.all_args = {"--log_level=debug"};
  options.args_by_type = {{"chief", {"--cluster_timeout=5s"}}};
  auto plan = PlanLocalCluster(options);
  ASSERT_OK(plan);
  for (const PlannedTask& task : plan->tasks) {
    EXPECT_THAT(task.argv, ::testing::Contains("--log_level=debug"));
    EXPECT_EQ(std::count(task.argv.begin(), task.argv.end(), "--cluster_timeout=5s"),
              task.task.type == "chief" ? 1 : 0);
  }
}

TEST(LaunchPlanTest, RefusesCountsThatMakeNoCluster) {
  EXPECT_THAT(std::string(PlanLocalCluster({.num_workers = 0, .num_ps = 0}).status().message()),
              HasSubstr("a cluster needs a chief or at least one worker"));
  EXPECT_THAT(
      std::string(
          PlanLocalCluster({.num_workers = 0, .num_ps = 1, .chief = true}).status().message()),
      HasSubstr("a parameter-server cluster needs at least one worker"));
  EXPECT_THAT(std::string(PlanLocalCluster({.num_workers = -1}).status().message()),
              HasSubstr("--workers is -1, which must not be negative"));
  EXPECT_THAT(std::string(PlanLocalCluster({.num_workers = 1, .num_ps = -2}).status().message()),
              HasSubstr("--ps is -2, which must not be negative"));
  // A count no machine runs is a usage error, not a long search for free ports.
  EXPECT_THAT(std::string(PlanLocalCluster({.num_workers = 100000}).status().message()),
              HasSubstr("--workers is 100000, more than the 256 tasks of a type"));
  // An address that is not this machine's is named as such.
  auto elsewhere = PlanLocalCluster({.num_workers = 1, .host = "192.0.2.1"});
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(elsewhere.status().message()),
              HasSubstr("cannot listen on 192.0.2.1: it is not an address of this machine"));
}

bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return bound;
}

// --host ::1: the tasks' addresses bracket it, as host:port needs (QA: it was refused).
TEST(LaunchPlanTest, AnIpv6LoopbackHostGivesBracketedAddresses) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "this machine has no IPv6 loopback";
  auto plan = PlanLocalCluster({.num_workers = 2, .host = "::1"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const PlannedTask& task : plan->tasks) {
    EXPECT_THAT(task.address, ::testing::StartsWith("[::1]:"));
    EXPECT_TRUE(TFConfigClusterResolver::Create(task.tf_config).ok()) << task.tf_config;
  }
}

TEST(LaunchPlanTest, DryRunPrintsCopyableShellLines) {
  auto plan = PlanLocalCluster({.num_workers = 1, .num_ps = 1, .chief = true, .bin_dir = "/b"});
  ASSERT_OK(plan);
  const std::string text = FormatDryRun(*plan);
  EXPECT_THAT(text, HasSubstr("# ps:0 on " + plan->tasks[0].address + "\n"));
  EXPECT_THAT(text, HasSubstr("TF_CONFIG='" + plan->tasks[0].tf_config + "' /b/stratum-ps"));
  EXPECT_THAT(text, HasSubstr("/b/stratum-coordinator"));
}

}  // namespace
}  // namespace stratum
