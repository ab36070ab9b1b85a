#include "stratum/net/health.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <grpcpp/create_channel.h>

#include "proto/health.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "stratum/net/channel.h"
#include "stratum/net/free_port.h"
#include "stratum/net/task_server.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/process_info.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

std::string FreeAddress() {
  absl::StatusOr<int> port = PickFreePort();
  EXPECT_TRUE(port.ok()) << port.status();
  return "127.0.0.1:" + std::to_string(*port);
}

TaskServerOptions ServerOptions(const TaskKey& task, const std::string& address) {
  TaskServerOptions options;
  options.task = task;
  options.binary = "health_test";
  options.listen_address = address;
  return options;
}

std::unique_ptr<TaskServer> Serve(const TaskKey& task, const std::string& address) {
  auto server = TaskServer::Start(ServerOptions(task, address));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(FreePortTest, PicksDifferentPortsThatCanBeBound) {
  // Many at once, so that single random picks would collide now and then.
  absl::StatusOr<std::vector<int>> ports = PickFreePorts(300);
  ASSERT_TRUE(ports.ok()) << ports.status();
  std::vector<int> sorted = *ports;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  EXPECT_EQ(sorted.size(), 300u);
  EXPECT_FALSE(PickFreePorts(1, "not-an-address").ok());
  EXPECT_OK(PickFreePort("localhost"));  // the loopback, as TF_CONFIG may name it
  EXPECT_THAT(std::string(PickFreePort("not-an-address").status().message()),
              ::testing::HasSubstr("give an IP address such as 127.0.0.1 or ::1, or localhost"));
}

// util-linux's flock(1) holding the claim file of `port`, as another process's ClaimPort
// would; "held" is printed once it holds it.
std::unique_ptr<Subprocess> HoldClaimElsewhere(int port) {
  SubprocessOptions options;
  options.argv = {"/usr/bin/flock", "-n", "/tmp/stratum-port-claims/" + std::to_string(port), "-c",
                  "echo held; exec sleep 60"};
  options.forward_fd = -1;
  options.capture_output = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> holder = Subprocess::Spawn(options);
  EXPECT_TRUE(holder.ok()) << holder.status();
  return holder.ok() ? *std::move(holder) : nullptr;
}

TEST(FreePortTest, APortClaimedByAnotherLiveProcessIsNotClaimedAgain) {
  ASSERT_OK(PickFreePort());  // makes the claim folder
  // Below the range PickFreePort draws from, so no test beside this one claims it; another
  // each run (--gtest_repeat), as this process keeps what it claimed.
  static int runs = 0;
  const int port = 10000 + (getpid() + 7919 * runs++) % 10000;
  std::unique_ptr<Subprocess> holder = HoldClaimElsewhere(port);
  ASSERT_NE(holder, nullptr);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (holder->output().find("held") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));  // flock(1) is a real process: its output is polled
  }
  ASSERT_THAT(holder->output(), HasSubstr("held"));
  EXPECT_FALSE(ClaimPort(port));

  // The kernel drops the claim with its process, however it ends.
  holder->Signal(SIGKILL);
  ASSERT_OK(holder->Wait(absl::Seconds(10)));
  EXPECT_TRUE(ClaimPort(port));
  EXPECT_FALSE(ClaimPort(port)) << "a claim is held once, also within one process";
  std::unique_ptr<Subprocess> refused = HoldClaimElsewhere(port);
  ASSERT_NE(refused, nullptr);
  absl::StatusOr<ExitInfo> exit = refused->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 1) << "flock(1) took a port this process claimed";
}

TEST(TaskServerTest, ServesHealthAndTaskStatus) {
  const std::string address = FreeAddress();
  auto server = Serve({"worker", 3}, address);
  EXPECT_OK(CheckHealth(address, absl::Seconds(5)));
  auto report = GetTaskReport(address, absl::Seconds(5));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->task, (TaskKey{"worker", 3}));
  EXPECT_EQ(report->binary, "health_test");
  EXPECT_EQ(report->incarnation, ProcessIncarnation());
  EXPECT_EQ(report->pid, getpid());
  EXPECT_EQ(report->version, StratumVersion());
  EXPECT_GE(report->uptime_seconds, 0);
}

TEST(TaskServerTest, HealthFailsAfterShutdown) {
  const std::string address = FreeAddress();
  auto server = Serve({"ps", 0}, address);
  ASSERT_OK(CheckHealth(address, absl::Seconds(5)));
  server->Shutdown(absl::Seconds(1));
  EXPECT_EQ(CheckHealth(address, absl::Seconds(1)).code(), absl::StatusCode::kUnavailable);
}

TEST(TaskServerTest, PortInUseIsAClearError) {
  const std::string address = FreeAddress();
  auto first = Serve({"ps", 0}, address);
  auto second = TaskServer::Start(ServerOptions({"ps", 1}, address));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("ps:1 cannot listen on " + address + ": the port is in use"));
}

// An address that is not this machine's cannot come free: INVALID_ARGUMENT, so that the
// process exits as misconfigured (2) and no launcher restarts it in vain. 192.0.2.1 is a
// documentation address (RFC 5737): binding it fails here, and nothing is sent.
TEST(TaskServerTest, AnAddressThatIsNotThisMachinesIsAConfigurationError) {
  auto server = TaskServer::Start(ServerOptions({"ps", 0}, "192.0.2.1:7000"));
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("ps:0 cannot listen on 192.0.2.1:7000: 192.0.2.1 is not an address of "
                        "this machine; fix the task's address in TF_CONFIG"));
}

TEST(WaitForClusterHealthyTest, ReportsEveryTask) {
  ClusterSpec spec;
  const std::string worker = FreeAddress();
  const std::string ps = FreeAddress();
  spec.SetTask("worker", 0, worker);
  spec.SetTask("ps", 0, ps);
  auto worker_server = Serve({"worker", 0}, worker);
  auto ps_server = Serve({"ps", 0}, ps);
  auto reports = WaitForClusterHealthy(spec, {.timeout = absl::Seconds(10)});
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 2u);
  EXPECT_EQ((*reports)[0].task, (TaskKey{"worker", 0}));
  EXPECT_TRUE((*reports)[0].healthy);
  const std::string table = FormatClusterTable(*reports);
  EXPECT_THAT(table, HasSubstr("TASK"));
  EXPECT_THAT(table, HasSubstr("worker:0  " + worker));
  EXPECT_THAT(table, HasSubstr("SERVING"));
}

// TF_CONFIG that gives a task another's address (ps:1 at ps:0's port under another name, ps
// at a worker's port) is refused with both tasks named, not trained on.
TEST(WaitForClusterHealthyTest, AnAddressThatLeadsToAnotherTaskIsNamed) {
  ClusterSpec spec;
  const std::string worker = FreeAddress();
  const std::string ps = FreeAddress();
  spec.SetTask("worker", 0, worker);
  spec.SetTask("ps", 0, ps);
  spec.SetTask("ps", 1, "localhost" + ps.substr(ps.find(':')));
  auto worker_server = Serve({"worker", 0}, worker);
  auto ps_server = Serve({"ps", 0}, ps);
  auto reports = WaitForClusterHealthy(spec, {.timeout = absl::Seconds(10)});
  EXPECT_EQ(reports.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(reports.status().message()),
              HasSubstr("ps:1 at localhost" + ps.substr(ps.find(':')) +
                        " answers as ps:0 (health_test, pid " + std::to_string(getpid()) + ")"));
  EXPECT_THAT(std::string(reports.status().message()), HasSubstr("give each task its own address"));

  ClusterSpec swapped;
  swapped.SetTask("worker", 0, ps);
  swapped.SetTask("ps", 0, worker);
  reports = WaitForClusterHealthy(swapped, {.timeout = absl::Seconds(10)});
  EXPECT_THAT(std::string(reports.status().message()),
              HasSubstr("worker:0 at " + ps + " answers as ps:0 (health_test, pid "));
  EXPECT_THAT(std::string(reports.status().message()),
              HasSubstr("ps:0 at " + worker + " answers as worker:0"));
}

TEST(WaitForClusterHealthyTest, NamesTasksThatNeverAnswerWithinTheDeadline) {
  ClusterSpec spec;
  const std::string worker = FreeAddress();
  const std::string missing = FreeAddress();
  spec.SetTask("worker", 0, worker);
  spec.SetTask("ps", 1, missing);
  auto worker_server = Serve({"worker", 0}, worker);
  const absl::Time start = absl::Now();
  auto reports = WaitForClusterHealthy(spec, {.timeout = absl::Seconds(1)});
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(reports.ok());
  EXPECT_EQ(reports.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(reports.status().message()),
              HasSubstr("1 task never answered within 1s: ps:1 at " + missing));
  EXPECT_THAT(std::string(reports.status().message()), ::testing::Not(HasSubstr("worker:0")));
  EXPECT_LT(took, absl::Seconds(4));
}

TEST(WaitForClusterHealthyTest, PicksUpATaskThatStartsLate) {
  ClusterSpec spec;
  const std::string late = FreeAddress();
  spec.SetTask("worker", 0, late);
  std::unique_ptr<TaskServer> server;
  std::thread starter([&] {
    // Real time: the wait's gRPC channels fail and back off meanwhile (the test's point).
    absl::SleepFor(absl::Milliseconds(1500));
    server = Serve({"worker", 0}, late);
  });
  const absl::Time start = absl::Now();
  auto reports = WaitForClusterHealthy(spec, {.timeout = absl::Seconds(20)});
  starter.join();
  ASSERT_TRUE(reports.ok()) << reports.status();
  // Fast reconnect back-off: noticed well within gRPC's default back-off.
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

TEST(WaitForClusterHealthyTest, MissingEvaluatorDoesNotHoldUpTheCluster) {
  ClusterSpec spec;
  const std::string worker = FreeAddress();
  spec.SetTask("worker", 0, worker);
  spec.SetTask("evaluator", 0, FreeAddress());
  auto worker_server = Serve({"worker", 0}, worker);
  auto reports = WaitForClusterHealthy(spec, {.timeout = absl::Milliseconds(500)});
  ASSERT_TRUE(reports.ok()) << reports.status();
  EXPECT_FALSE((*reports)[1].healthy);
  EXPECT_THAT(FormatClusterTable(*reports), HasSubstr("NOT ANSWERING"));
}

TEST(WaitForClusterHealthyTest, CancelStopsTheWait) {
  ClusterSpec spec;
  spec.SetTask("worker", 0, FreeAddress());
  absl::Notification cancel;
  std::thread canceller([&] {
    // Mid-wait, which is in a real gRPC health check against a closed port: nothing tells
    // when it started, and any moment of it will do.
    absl::SleepFor(absl::Milliseconds(200));
    cancel.Notify();
  });
  const absl::Time start = absl::Now();
  auto reports = WaitForClusterHealthy(spec, {.timeout = absl::Seconds(30), .cancel = &cancel});
  canceller.join();
  EXPECT_EQ(reports.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ListenAddressTest, KeepsLiteralsAndBindsAllInterfacesForNames) {
  EXPECT_EQ(*ListenAddressFor("127.0.0.1:2222"), "127.0.0.1:2222");
  EXPECT_EQ(*ListenAddressFor("localhost:2222"), "localhost:2222");
  EXPECT_EQ(*ListenAddressFor("[::1]:2222"), "[::1]:2222");
  EXPECT_EQ(*ListenAddressFor("worker-0.worker.default.svc:2222"), "[::]:2222");
  EXPECT_FALSE(ListenAddressFor("nohost").ok());
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// The health service's answer for `service` on `address`: "SERVING", "NOT_SERVING", or the
// gRPC error code's name.
std::string HealthOf(const std::string& address, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok())
    return status.error_code() == grpc::StatusCode::NOT_FOUND ? "NOT_FOUND" : "ERROR";
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

TEST(TaskServerTest, TheHealthServiceAnswersForEachServiceTheTaskServesByName) {
  proto::ParameterServer::Service ps;  // its methods unimplemented: only its name counts
  TaskServerOptions options = ServerOptions({"ps", 0}, FreeAddress());
  options.health_listen_address = FreeAddress();
  auto server = TaskServer::Start(options, {&ps});
  ASSERT_TRUE(server.ok()) << server.status();
  for (const std::string& address : {options.listen_address, options.health_listen_address}) {
    EXPECT_EQ(HealthOf(address, ""), "SERVING") << address;
    EXPECT_EQ(HealthOf(address, "stratum.proto.ParameterServer"), "SERVING") << address;
    EXPECT_EQ(HealthOf(address, "stratum.proto.TaskService"), "SERVING") << address;
    EXPECT_EQ(HealthOf(address, "stratum.proto.WorkerService"), "NOT_FOUND") << address;
  }
  (*server)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace stratum
