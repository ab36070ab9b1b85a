// The coordination service over real gRPC: a TaskServer on a free loopback port serves a
// GrpcCoordinationService, and CoordinationAgents on threads (one per task) exchange keys,
// meet at barriers and learn of each other's failures through their heartbeats.
#include <memory>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stratum/net/free_port.h"
#include "stratum/net/task_server.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/error_kind.h"
#include "stratum/worker/coordination_client.h"
#include "stratum/worker/coordination_grpc_service.h"
#include "stratum/worker/coordination_service.h"
#include "stratum/worker/multi_worker_job.h"

namespace stratum {
namespace {

using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::StatusIs;

constexpr int kTasks = 3;
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(1);
constexpr absl::Duration kHeartbeatInterval = absl::Milliseconds(100);

TaskKey Worker(int i) { return {"worker", i}; }

// Polls `agent.cluster_error()` until it is not OK or `timeout` passes.
absl::Status WaitForClusterError(const CoordinationClient& agent, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (agent.cluster_error().ok() && absl::Now() < deadline) {
    // Polled: the agent's heartbeat thread learns the error over real gRPC and signals nothing.
    absl::SleepFor(absl::Milliseconds(20));
  }
  return agent.cluster_error();
}

class CoordinationGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> port = PickFreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    address_ = absl::StrCat("127.0.0.1:", *port);
    service_ = std::make_unique<CoordinationService>(CoordinationServiceOptions{
        .tasks = {Worker(0), Worker(1), Worker(2)}, .heartbeat_timeout = kHeartbeatTimeout});
    grpc_service_ = std::make_unique<GrpcCoordinationService>(*service_, absl::Milliseconds(50));
    auto server = TaskServer::Start(
        {.task = Worker(0), .binary = "coordination_grpc_test", .listen_address = address_},
        {grpc_service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void TearDown() override {
    if (grpc_service_ != nullptr) grpc_service_->Shutdown();
    if (server_ != nullptr) server_->Shutdown(absl::ZeroDuration());
    agents_.clear();
  }

  CoordinationAgentOptions Options(int task) const {
    return {.leader_address = address_,
            .task = Worker(task),
            .connect_timeout = absl::Seconds(5),
            .heartbeat_interval = kHeartbeatInterval,
            .rpc_timeout = absl::Seconds(5)};
  }

  // Connects an agent for every task, in parallel.
  void ConnectAll() {
    agents_.resize(kTasks);
    std::vector<std::thread> threads;
    for (int i = 0; i < kTasks; ++i) {
      threads.emplace_back([this, i] {
        auto agent = CoordinationAgent::Connect(Options(i));
        ASSERT_TRUE(agent.ok()) << agent.status();
        agents_[i] = *std::move(agent);
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (const auto& agent : agents_) ASSERT_NE(agent, nullptr);
  }

  std::string address_;
  std::unique_ptr<CoordinationService> service_;
  std::unique_ptr<GrpcCoordinationService> grpc_service_;
  std::unique_ptr<TaskServer> server_;
  std::vector<std::unique_ptr<CoordinationAgent>> agents_;
};

TEST_F(CoordinationGrpcTest, AgentsExchangeKeysAndMeetAtABarrier) {
  ConnectAll();
  std::vector<std::string> seen(kTasks);
  std::vector<absl::Status> passed(kTasks);
  std::vector<std::thread> threads;
  for (int i = 0; i < kTasks; ++i) {
    threads.emplace_back([&, i] {
      CoordinationAgent& agent = *agents_[i];
      ASSERT_OK(agent.SetKeyValue(absl::StrCat("addr/", i), absl::StrCat("host", i)));
      absl::StatusOr<std::string> value =
          agent.GetKeyValue(absl::StrCat("addr/", (i + 1) % kTasks), absl::Seconds(5));
      ASSERT_TRUE(value.ok()) << value.status();
      seen[i] = *value;
      passed[i] = agent.WaitAtBarrier("exchanged", absl::Seconds(5));
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(seen, ::testing::ElementsAre("host1", "host2", "host0"));
  for (const absl::Status& status : passed) EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(*agents_[0]->TryGetKeyValue("addr/2"), "host2");
  EXPECT_THAT(agents_[0]->TryGetKeyValue("nope").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("key \"nope\" is not set")));
  EXPECT_NE(agents_[0]->incarnation(), agents_[1]->incarnation());
  for (const auto& agent : agents_) EXPECT_OK(agent->cluster_error());
}

TEST_F(CoordinationGrpcTest, BarrierTimeoutNamesTheMissingTaskAndTheLeader) {
  std::vector<std::unique_ptr<CoordinationAgent>> agents;
  for (int i = 0; i < 2; ++i) {
    auto agent = CoordinationAgent::Connect(Options(i));
    ASSERT_TRUE(agent.ok()) << agent.status();
    agents.push_back(*std::move(agent));
  }
  absl::Status other;
  std::thread waiter([&] { other = agents[1]->WaitAtBarrier("init", absl::Seconds(5)); });
  EXPECT_TRUE(service_->AwaitBlockedCallers(1, absl::Seconds(10)));  // worker:1 has arrived
  const absl::Status status = agents[0]->WaitAtBarrier("init", absl::Milliseconds(300));
  waiter.join();
  const auto timed_out = StatusIs(
      absl::StatusCode::kDeadlineExceeded,
      AllOf(
          HasSubstr("waiting at barrier \"init\": coordination service on worker:0 at " + address_),
          ContainsRegex("barrier \"init\" timed out after (29|30)[0-9]ms"),
          HasSubstr("ms: 1 of 3 tasks did not arrive: worker:2 (never registered")));
  EXPECT_THAT(status, timed_out);
  EXPECT_THAT(other, timed_out);
}

TEST_F(CoordinationGrpcTest, AReportedErrorReachesEveryAgent) {
  ConnectAll();
  absl::Status barrier;
  std::thread waiter([&] { barrier = agents_[0]->WaitAtBarrier("step/7", absl::Seconds(30)); });
  EXPECT_TRUE(service_->AwaitBlockedCallers(1, absl::Seconds(10)));  // the barrier waits
  ASSERT_OK(agents_[1]->ReportError(absl::InternalError("NCCL error: unhandled")));
  waiter.join();
  const auto failed =
      StatusIs(absl::StatusCode::kInternal, HasSubstr("worker:1 failed: NCCL error: unhandled"));
  EXPECT_THAT(barrier, failed);
  // What it is travels with it, whichever way it is learnt: the task that failed first
  // and its own error, so that a worker says the first failure once.
  for (const absl::Status& learnt :
       {barrier, WaitForClusterError(*agents_[0], 5 * kHeartbeatInterval),
        WaitForClusterError(*agents_[2], 5 * kHeartbeatInterval),
        agents_[2]->SetKeyValue("k", "v")}) {
    EXPECT_THAT(learnt, failed);
    EXPECT_EQ(ErrorKindOf(learnt), ErrorKind::kTaskFailed) << learnt;
    EXPECT_EQ(ErrorTaskOf(learnt), "worker:1") << learnt;
    EXPECT_EQ(ErrorCauseOf(learnt), "NCCL error: unhandled") << learnt;
  }
  EXPECT_EQ(AsSeenByThisWorker(agents_[0]->cluster_error(), "worker:0", barrier), barrier);
}

TEST_F(CoordinationGrpcTest, AStoppedAgentIsNamedAfterTheHeartbeatTimeout) {
  ConnectAll();
  // A wait in flight when the service finds worker:2 silent gets the service's answer
  // (before worker:1's own heartbeats learn of it).
  absl::Status waited;
  std::thread waiter([&] { waited = agents_[1]->WaitAtBarrier("before", 4 * kHeartbeatTimeout); });
  agents_[2].reset();
  const auto dead =
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("worker:2 sent no heartbeat for"));
  EXPECT_THAT(WaitForClusterError(*agents_[0], 2 * kHeartbeatTimeout), dead);
  EXPECT_THAT(service_->cluster_error(), dead);
  EXPECT_THAT(agents_[1]->WaitAtBarrier("after", absl::Seconds(5)), dead);
  waiter.join();
  // The service's answer, passed on: the leader, which gave it, is not lost.
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kUnavailable,
                               AllOf(HasSubstr("worker:2 sent no heartbeat for"),
                                     Not(HasSubstr("lost the coordination service")))));
}

TEST_F(CoordinationGrpcTest, ADisconnectedAgentIsNotReportedDead) {
  ConnectAll();
  ASSERT_OK(agents_[2]->Disconnect());
  // Real time: a fake clock past the timeout would make the live agents look silent too.
  absl::SleepFor(kHeartbeatTimeout + absl::Milliseconds(300));
  EXPECT_TRUE(service_->cluster_error().ok()) << service_->cluster_error();
  EXPECT_THAT(agents_[0]->WaitAtBarrier("final", absl::Seconds(5)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("worker:2 disconnected")));
}

TEST_F(CoordinationGrpcTest, AgentsNoticeALostLeader) {
  ConnectAll();
  // The leader's server goes away without a word (as when its process is killed).
  server_->Shutdown(absl::ZeroDuration());
  const auto lost = StatusIs(absl::StatusCode::kUnavailable,
                             HasSubstr("lost the coordination service on worker:0 at " + address_));
  // A call meanwhile says so at once, in the same words, not as a bare gRPC error.
  EXPECT_THAT(agents_[2]->SetKeyValue("k", "v"),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("worker:2 lost the coordination service on worker:0 at " +
                                       address_ + " while setting key \"k\""),
                             HasSubstr("the job cannot go on without it: restart the job"))));
  EXPECT_THAT(WaitForClusterError(*agents_[1], 3 * kHeartbeatTimeout), lost);
}

TEST_F(CoordinationGrpcTest, ARestartedTaskFailsTheCluster) {
  ConnectAll();
  CoordinationAgentOptions options = Options(1);
  options.incarnation = agents_[1]->incarnation() + 1;
  auto restarted = CoordinationAgent::Connect(options);
  EXPECT_THAT(restarted.status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("worker:1 restarted")));
  EXPECT_THAT(WaitForClusterError(*agents_[0], 5 * kHeartbeatInterval),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("worker:1 restarted")));
}

TEST(CoordinationAgentTest, ALeaderThatNeverStartsIsNamedWithinTheConnectTimeout) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  const absl::Time start = absl::Now();
  auto agent = CoordinationAgent::Connect({.leader_address = address,
                                           .leader_name = "chief:0",
                                           .task = Worker(1),
                                           .connect_timeout = absl::Seconds(1)});
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_THAT(agent.status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("worker:1 could not register with the coordination service on "
                                 "chief:0 at " +
                                 address + " within 1s")));
  EXPECT_GE(elapsed, absl::Milliseconds(900));
  EXPECT_LT(elapsed, absl::Seconds(3));
}

}  // namespace
}  // namespace stratum
