// Jobs whose tasks run on separate simulated hosts (network namespaces joined by a
// switch; see NetworkHosts): the collectives and RPCs cross a real network path with no
// loopback and no same-host Unix sockets, and a host whose cable is pulled drops every
// packet without a reset, the partition that makes TensorFlow's collectives and RPCs hang.
// Needs root (CI runs as root); elsewhere these tests skip, saying why.
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/network_hosts.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/testing/test_certificates.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using testing::NetworkHosts;
using testing::TempPath;

// Makes `count` hosts, or skips the test where hosts cannot be made (never under CI).
#define MAKE_HOSTS_OR_SKIP(hosts, count)                                    \
  if (std::string why = NetworkHosts::Unsupported(); !why.empty()) {        \
    if (std::getenv("CI") != nullptr) FAIL() << why << " (required in CI)"; \
    GTEST_SKIP() << why;                                                    \
  }                                                                         \
  auto hosts = NetworkHosts::Create(count);                                 \
  ASSERT_TRUE(hosts.ok()) << hosts.status()

std::string WriteJob(const std::string& example, const std::string& name, int epochs,
                     int steps_per_epoch, int collective_timeout_s = 5) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/" + example);
  nlohmann::json job = nlohmann::json::parse(file);
  job["fit"]["epochs"] = epochs;
  job["fit"]["steps_per_epoch"] = steps_per_epoch;
  if (job["strategy"].contains("communication")) {
    job["strategy"]["communication"]["timeout_seconds"] = collective_timeout_s;
  }
  job.erase("checkpoint");
  const std::string path = TempPath(name + ".json");
  std::ofstream(path) << job.dump();
  return path;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> StartMwms(const NetworkHosts& hosts,
                                                        const std::string& job) {
  return LocalCluster::Start(
      {.num_workers = 2,
       .args_by_type = {{"worker", {"--job=" + job, "--cluster_timeout=30s"}}},
       .forward_output = false,
       .hosts = &hosts});
}

TEST(MultiHostTest, MwmsWorkersOnTwoHostsTrainOverTcpAndAgree) {
  MAKE_HOSTS_OR_SKIP(hosts, 2);
  auto cluster = StartMwms(**hosts, WriteJob("fashion_mnist_mwms.json", "hosts_mwms", 1, 60));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (int w = 0; w < 2; ++w) {
    auto exit = (*cluster)->WaitForExit({"worker", w}, absl::Seconds(90));
    ASSERT_TRUE(exit.ok()) << exit.status() << (*cluster)->Output({"worker", w});
    EXPECT_TRUE(exit->success()) << (*cluster)->Output({"worker", w});
  }
  // Another host's abstract Unix socket is out of reach: the peers found that and took TCP.
  EXPECT_THAT((*cluster)->Output({"worker", 0}), HasSubstr("collective links: TCP to worker:1"));
  EXPECT_THAT((*cluster)->Output({"worker", 1}), HasSubstr("collective links: TCP to worker:0"));
  const absl::Status agree =
      (*cluster)->OutputsAgree({{"worker", 0}, {"worker", 1}}, testing::kTestFigures);
  EXPECT_TRUE(agree.ok()) << agree;
}

TEST(MultiHostTest, MwmsWorkersSplitByTheNetworkBothStopWithinSecondsNamingTheOther) {
  MAKE_HOSTS_OR_SKIP(hosts, 2);
  // The collectives' own timeout is far away (120 s): the heartbeats must end the wait.
  auto cluster =
      StartMwms(**hosts, WriteJob("fashion_mnist_mwms.json", "hosts_split", 50, 100, 120));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForOutput({"worker", 0}, "Epoch 1/50", absl::Seconds(60)))
      << (*cluster)->Output({"worker", 0});
  ASSERT_OK((*hosts)->Disconnect(1));
  // Nothing arrives and nothing is refused. worker:0's coordination service finds worker:1
  // silent, worker:1 finds the service silent (10 s of missed heartbeats each), and each
  // stops its all-reduce with an error naming the worker it lost.
  const absl::Time cut = absl::Now();
  for (int w = 0; w < 2; ++w) {
    auto exit = (*cluster)->WaitForExit({"worker", w}, absl::Seconds(150));
    ASSERT_TRUE(exit.ok()) << "worker:" << w << " still runs after the network split: "
                           << (*cluster)->Output({"worker", w});
    EXPECT_FALSE(exit->success());
    EXPECT_THAT((*cluster)->Output({"worker", w}), HasSubstr(absl::StrCat("worker:", 1 - w)));
  }
  // Seen about 15 s (heartbeat timeout + reporting + shutdown); 120 s without the check.
  EXPECT_LT(absl::Now() - cut, absl::Seconds(40))
      << (*cluster)->Output({"worker", 0}) << (*cluster)->Output({"worker", 1});
}

TEST(MultiHostTest, PsJobFinishesWhenAWorkersHostIsCutOffAndTakesItBackWhenReconnected) {
  // Plan order: ps:0 on host 0, worker:0 on 1, worker:1 on 2, the chief on 3.
  MAKE_HOSTS_OR_SKIP(hosts, 4);
  constexpr int kWorker1Host = 2;
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 1,
       .chief = true,
       .args_by_type = {{"chief",
                         {"--job=" + WriteJob("fashion_mnist_ps.json", "hosts_ps", 30, 100)}}},
       .forward_output = false,
       .hosts = &**hosts});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForOutput({"chief", 0}, "Epoch 1/30", absl::Seconds(60)))
      << (*cluster)->Output({"chief", 0});
  ASSERT_OK((*hosts)->Disconnect(kWorker1Host));
  // The closure in flight on worker:1 gets no answer and no reset; the coordinator notices
  // the silent connection and runs it on worker:0, which trains on meanwhile.
  const std::string down = "worker:1 at " + (*cluster)->Address({"worker", 1}) + " is down";
  ASSERT_TRUE((*cluster)->WaitForOutput({"chief", 0}, down, absl::Seconds(40)))
      << (*cluster)->Output({"chief", 0});
  ASSERT_OK((*hosts)->Reconnect(kWorker1Host));
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(120));
  ASSERT_TRUE(exit.ok()) << exit.status() << (*cluster)->Output({"chief", 0});
  const std::string output = (*cluster)->Output({"chief", 0});
  EXPECT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("Epoch 30/30"));
  EXPECT_THAT(output, HasSubstr("answers again; it will be set up anew"));
}

TEST(MultiHostTest, APsWhoseHostIsCutOffIsReportedByNameNotWaitedFor) {
  // Plan order: ps:0 on host 0, ps:1 on host 1, worker:0 on 2, the chief on 3.
  MAKE_HOSTS_OR_SKIP(hosts, 4);
  auto cluster = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 2,
       .chief = true,
       .args_by_type = {{"chief",
                         {"--job=" + WriteJob("fashion_mnist_ps.json", "hosts_ps_cut", 50, 100)}}},
       .forward_output = false,
       .hosts = &**hosts});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForOutput({"chief", 0}, "Epoch 1/50", absl::Seconds(60)))
      << (*cluster)->Output({"chief", 0});
  ASSERT_OK((*hosts)->Disconnect(1));
  const absl::Time cut = absl::Now();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status() << (*cluster)->Output({"chief", 0});
  EXPECT_EQ(exit->exit_code, 1);
  // No reset comes: the data path's TCP liveness (about 8 s) ends the wait, not the 30 s
  // deadline of a push (seen 8.5 s; 30.5 s without it).
  EXPECT_LT(absl::Now() - cut, absl::Seconds(20)) << (*cluster)->Output({"chief", 0});
  EXPECT_THAT(
      (*cluster)->Output({"chief", 0}),
      HasSubstr("a parameter server is unavailable: ps:1 at " + (*cluster)->Address({"ps", 1})));
}

// The flags of a mutual-TLS cluster whose one certificate is for the name "stratum" (the
// hosts' addresses are not in it), made by deploy/make_tls_certs.sh.
std::vector<std::string> TlsFlags(const std::string& name) {
  const std::string dir = TempPath(name);
  absl::StatusOr<TlsCredentials> made = testing::MakeTestCertificates(dir);
  EXPECT_TRUE(made.ok()) << made.status();
  return {"--tls_cert=" + dir + "/tls.crt", "--tls_key=" + dir + "/tls.key",
          "--tls_ca=" + dir + "/ca.crt", "--tls_server_name=stratum"};
}

// Under mutual TLS the gradients between hosts travel on the collectives' TCP links with
// TLS (not gRPC, not plaintext), and the workers still agree bit for bit.
TEST(MultiHostTest, MwmsWorkersOnTwoHostsTrainOverTlsAndAgree) {
  MAKE_HOSTS_OR_SKIP(hosts, 2);
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .all_args = TlsFlags("hosts_mwms_certs"),
       .args_by_type = {{"worker",
                         {"--job=" + WriteJob("fashion_mnist_mwms.json", "hosts_mwms_tls", 1, 30),
                          "--cluster_timeout=30s"}}},
       .forward_output = false,
       .hosts = &**hosts});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (int w = 0; w < 2; ++w) {
    auto exit = (*cluster)->WaitForExit({"worker", w}, absl::Seconds(90));
    ASSERT_TRUE(exit.ok()) << exit.status() << (*cluster)->Output({"worker", w});
    EXPECT_TRUE(exit->success()) << (*cluster)->Output({"worker", w});
  }
  EXPECT_THAT((*cluster)->Output({"worker", 0}),
              HasSubstr("collective links: TCP with mutual TLS to worker:1"));
  EXPECT_THAT((*cluster)->Output({"worker", 1}),
              HasSubstr("collective links: TCP with mutual TLS to worker:0"));
  const absl::Status agree =
      (*cluster)->OutputsAgree({{"worker", 0}, {"worker", 1}}, testing::kTestFigures);
  EXPECT_TRUE(agree.ok()) << agree;
}

// A PS job under mutual TLS keeps its raw data path: the worker on another host pushes and
// pulls over TCP with TLS instead of falling back to gRPC.
TEST(MultiHostTest, APsJobOverTlsKeepsItsDataPathAcrossHosts) {
  // Plan order: ps:0 on host 0, worker:0 on 1, the chief on 2.
  MAKE_HOSTS_OR_SKIP(hosts, 3);
  auto cluster = LocalCluster::Start(
      {.num_workers = 1,
       .num_ps = 1,
       .chief = true,
       .all_args = TlsFlags("hosts_ps_certs"),
       .args_by_type = {{"chief",
                         {"--job=" + WriteJob("fashion_mnist_ps.json", "hosts_ps_tls", 1, 30),
                          "--cluster_timeout=30s"}}},
       .forward_output = false,
       .hosts = &**hosts});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status() << (*cluster)->Output({"chief", 0});
  EXPECT_TRUE(exit->success()) << (*cluster)->Output({"chief", 0});
  EXPECT_THAT((*cluster)->Output({"chief", 0}), HasSubstr("Epoch 1/1 - 30 steps on 1 worker"));
  EXPECT_THAT((*cluster)->Output({"ps", 0}), HasSubstr("with mutual TLS"));
  EXPECT_THAT((*cluster)->Output({"worker", 0}), HasSubstr("data path over tcp+tls"))
      << (*cluster)->Output({"worker", 0});
}

}  // namespace
}  // namespace stratum
