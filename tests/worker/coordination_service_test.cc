// CoordinationService logic, in-process: registration and restarts, the key-value store,
// barriers, error propagation, the heartbeat watchdog (on a fake clock) and shutdown.
#include "stratum/worker/coordination_service.h"

#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/testing/status_matchers.h"
#include "stratum/worker/coordination_client.h"

namespace stratum {
namespace {

using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

using testing::StatusIs;

const TaskKey kW0{"worker", 0};
const TaskKey kW1{"worker", 1};
const TaskKey kW2{"worker", 2};

absl::Time In(absl::Duration d) { return absl::Now() + d; }

class CoordinationServiceTest : public ::testing::Test {
 protected:
  CoordinationServiceTest()
      : service_({.tasks = {kW0, kW1, kW2}, .heartbeat_timeout = absl::Seconds(10)},
                 [this] { return Now(); }) {}

  absl::Time Now() {
    absl::MutexLock lock(&clock_mutex_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&clock_mutex_);
    now_ += d;
  }
  void RegisterAll() {
    for (int i = 0; i < 3; ++i) ASSERT_OK(service_.RegisterTask({"worker", i}, 100 + i));
  }

  absl::Mutex clock_mutex_;
  absl::Time now_ = absl::FromUnixSeconds(1000000);
  CoordinationService service_;
};

TEST_F(CoordinationServiceTest, RegistrationIsIdempotentAndUnknownTasksAreNamed) {
  EXPECT_OK(service_.RegisterTask(kW1, 7));
  EXPECT_OK(service_.RegisterTask(kW1, 7));
  EXPECT_OK(service_.cluster_error());
  EXPECT_THAT(service_.RegisterTask({"worker", 5}, 7),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown task worker:5: the coordination service on worker:0 "
                                 "coordinates worker:0, worker:1, worker:2")));
  EXPECT_THAT(service_.RegisterTask(kW2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("incarnation 0")));
}

TEST_F(CoordinationServiceTest, ANewIncarnationIsARestartThatFailsTheCluster) {
  RegisterAll();
  EXPECT_THAT(service_.RegisterTask(kW1, 0xbeef),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("worker:1 restarted (incarnation 0x65 -> 0xbeef)")));
  const auto restarted =
      StatusIs(absl::StatusCode::kAborted, HasSubstr("resumes from the last checkpoint"));
  EXPECT_THAT(service_.Heartbeat(kW0, 100), restarted);
  EXPECT_THAT(service_.SetKeyValue("k", "v"), restarted);
  EXPECT_THAT(service_.WaitAtBarrier("b", kW2, In(absl::Seconds(5))), restarted);
}

TEST_F(CoordinationServiceTest, AfterAFailureTheLeaderWaitsForTheOthersToReportOrGoSilent) {
  RegisterAll();
  ASSERT_OK(service_.ReportError(kW0, absl::UnavailableError("worker:2 closed")));
  EXPECT_FALSE(service_.AwaitEveryTaskTold(absl::Milliseconds(20)));
  std::thread reporter([this] {
    // During the wait below: the report wakes it, and it waits on for worker:2.
    EXPECT_TRUE(service_.AwaitBlockedCallers(1, absl::Seconds(10)));
    (void)service_.ReportError(kW1, absl::UnavailableError("worker:0 closed"));
  });
  EXPECT_FALSE(service_.AwaitEveryTaskTold(absl::Milliseconds(200)));  // worker:2 is silent
  reporter.join();
  Advance(absl::Seconds(11));  // worker:2 died: its heartbeats stopped
  service_.CheckHeartbeats();
  EXPECT_TRUE(service_.AwaitEveryTaskTold(absl::Seconds(10)));
  // The first failure stays the cluster error.
  EXPECT_THAT(std::string(service_.cluster_error().message()), HasSubstr("worker:0 failed"));
}

// A task told of the failure by a heartbeat's answer, or one that left, is not waited for.
TEST_F(CoordinationServiceTest, AfterAFailureTheLeaderStopsWaitingOnceEveryTaskWasToldOrLeft) {
  RegisterAll();
  ASSERT_OK(service_.ReportError(kW0, absl::AbortedError("stopped by signal 15")));
  EXPECT_FALSE(service_.AwaitEveryTaskTold(absl::Milliseconds(20)));
  EXPECT_THAT(service_.Heartbeat(kW1, 101),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("worker:0 failed: stopped")));
  EXPECT_FALSE(service_.AwaitEveryTaskTold(absl::Milliseconds(20)));  // worker:2 was not told
  // worker:2 learnt it another way (the answer to a wait) and leaves.
  EXPECT_EQ(service_.DisconnectTask(kW2, 102).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(service_.AwaitEveryTaskTold(absl::Milliseconds(20)));
}

TEST_F(CoordinationServiceTest, HeartbeatChecksRegistrationAndIncarnation) {
  EXPECT_THAT(service_.Heartbeat(kW1, 7), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                   HasSubstr("worker:1 is not registered")));
  ASSERT_OK(service_.RegisterTask(kW1, 7));
  EXPECT_OK(service_.Heartbeat(kW1, 7));
  EXPECT_THAT(service_.Heartbeat(kW1, 8),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("incarnation 0x8")));
}

TEST_F(CoordinationServiceTest, GetKeyValueWaitsForTheKey) {
  std::thread setter([&] {
    EXPECT_TRUE(service_.AwaitBlockedCallers(1, absl::Seconds(10)));  // GetKeyValue waits
    ASSERT_OK(service_.SetKeyValue("nccl/id", "first"));
  });
  absl::StatusOr<std::string> value = service_.GetKeyValue("nccl/id", In(absl::Seconds(10)));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "first");
  ASSERT_OK(service_.SetKeyValue("nccl/id", "second"));
  EXPECT_EQ(*service_.TryGetKeyValue("nccl/id"), "second");
  EXPECT_THAT(service_.TryGetKeyValue("nope").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("key \"nope\" is not set")));
}

TEST_F(CoordinationServiceTest, GetKeyValueDeadlineNamesTheKeyAndUnregisteredTasks) {
  ASSERT_OK(service_.RegisterTask(kW0, 1));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = service_.GetKeyValue("addr/1", In(absl::Milliseconds(100)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_THAT(value.status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(ContainsRegex("key \"addr/1\" was not set within (9|10)[0-9]ms"),
                             HasSubstr("; tasks not registered yet: worker:1, worker:2"))));
}

TEST_F(CoordinationServiceTest, BarrierReleasesEveryTaskWhenAllArrive) {
  RegisterAll();
  std::vector<absl::Status> results(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      // One after the other: worker:i arrives once the i before it wait at the barrier.
      EXPECT_TRUE(service_.AwaitBlockedCallers(i, absl::Seconds(10)));
      results[i] = service_.WaitAtBarrier("init", {"worker", i}, In(absl::Seconds(10)));
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : results) EXPECT_TRUE(status.ok()) << status;
  // A retry of a task that already passed.
  EXPECT_OK(service_.WaitAtBarrier("init", kW1, In(absl::Seconds(1))));
}

TEST_F(CoordinationServiceTest, BarrierTimeoutNamesTheTasksThatDidNotArrive) {
  ASSERT_OK(service_.RegisterTask(kW0, 1));
  ASSERT_OK(service_.RegisterTask(kW1, 2));
  absl::Status other;
  std::thread waiter([&] { other = service_.WaitAtBarrier("init", kW1, In(absl::Seconds(10))); });
  EXPECT_TRUE(service_.AwaitBlockedCallers(1, absl::Seconds(10)));  // worker:1 has arrived
  const absl::Status status = service_.WaitAtBarrier("init", kW0, In(absl::Milliseconds(200)));
  waiter.join();
  const auto timed_out =
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               AllOf(ContainsRegex("barrier \"init\" timed out after (19|20)[0-9]ms"),
                     HasSubstr("ms: 1 of 3 tasks did not arrive: worker:2 (never registered")));
  EXPECT_THAT(status, timed_out);
  // The barrier failed for everyone at the first deadline, and stays failed.
  EXPECT_THAT(other, timed_out);
  ASSERT_OK(service_.RegisterTask(kW2, 3));
  EXPECT_THAT(service_.WaitAtBarrier("init", kW2, In(absl::Seconds(1))), timed_out);
}

TEST_F(CoordinationServiceTest, BarrierTimeoutSaysWhichTaskStoppedItsHeartbeats) {
  RegisterAll();
  Advance(absl::Seconds(6));
  ASSERT_OK(service_.Heartbeat(kW0, 100));
  ASSERT_OK(service_.Heartbeat(kW1, 101));
  EXPECT_THAT(
      service_.WaitAtBarrier("step", kW0, In(absl::Milliseconds(50))),
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               HasSubstr("2 of 3 tasks did not arrive: worker:1 (alive, but busy elsewhere), "
                         "worker:2 (no heartbeat for 6s: it died or hangs)")));
}

TEST_F(CoordinationServiceTest, ReportedErrorWakesWaitersAndIsReturnedByLaterCalls) {
  RegisterAll();
  absl::Status barrier;
  absl::Status get;
  std::thread barrier_waiter(
      [&] { barrier = service_.WaitAtBarrier("init", kW0, In(absl::Seconds(30))); });
  std::thread get_waiter(
      [&] { get = service_.GetKeyValue("never", In(absl::Seconds(30))).status(); });
  EXPECT_TRUE(service_.AwaitBlockedCallers(2, absl::Seconds(10)));
  const absl::Time reported = absl::Now();
  ASSERT_OK(service_.ReportError(kW1, absl::InternalError("NCCL error: unhandled")));
  barrier_waiter.join();
  get_waiter.join();
  EXPECT_LT(absl::Now() - reported, absl::Seconds(5));
  const auto failed =
      StatusIs(absl::StatusCode::kInternal, HasSubstr("worker:1 failed: NCCL error: unhandled"));
  EXPECT_THAT(barrier, failed);
  EXPECT_THAT(get, failed);
  // The first failure wins; every later call returns it.
  ASSERT_OK(service_.ReportError(kW2, absl::DataLossError("later")));
  EXPECT_THAT(service_.cluster_error(), failed);
  EXPECT_THAT(service_.Heartbeat(kW0, 100), failed);
  EXPECT_THAT(service_.SetKeyValue("k", "v"), failed);
  EXPECT_THAT(service_.ReportError(kW2, absl::OkStatus()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("status OK")));
}

TEST_F(CoordinationServiceTest, HeartbeatTimeoutNamesTheSilentTask) {
  RegisterAll();
  Advance(absl::Seconds(5));
  ASSERT_OK(service_.Heartbeat(kW0, 100));
  ASSERT_OK(service_.Heartbeat(kW1, 101));
  service_.CheckHeartbeats();
  EXPECT_OK(service_.cluster_error());
  Advance(absl::Seconds(6));
  service_.CheckHeartbeats();
  const auto dead =
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr("worker:2 sent no heartbeat for 11s (the timeout is 10s): it died or "
                         "hangs"));
  EXPECT_THAT(service_.cluster_error(), dead);
  EXPECT_THAT(service_.Heartbeat(kW0, 100), dead);
  EXPECT_THAT(service_.WaitAtBarrier("b", kW1, In(absl::Seconds(5))), dead);
}

TEST_F(CoordinationServiceTest, ADisconnectedTaskIsNotDeadButFailsBarriersAtOnce) {
  RegisterAll();
  ASSERT_OK(service_.DisconnectTask(kW2, 102));
  Advance(absl::Minutes(1));
  ASSERT_OK(service_.Heartbeat(kW0, 100));
  ASSERT_OK(service_.Heartbeat(kW1, 101));
  service_.CheckHeartbeats();
  EXPECT_TRUE(service_.cluster_error().ok()) << service_.cluster_error();
  const absl::Time start = absl::Now();
  EXPECT_THAT(service_.WaitAtBarrier("final", kW0, In(absl::Seconds(30))),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("barrier \"final\" cannot complete: worker:2 disconnected")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(CoordinationServiceTest, ShutdownWakesWaiters) {
  RegisterAll();
  absl::Status get;
  std::thread waiter([&] { get = service_.GetKeyValue("never", In(absl::Seconds(30))).status(); });
  EXPECT_TRUE(service_.AwaitBlockedCallers(1, absl::Seconds(10)));
  service_.Shutdown();
  waiter.join();
  const auto shutting_down =
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr("the coordination service on worker:0 is shutting down"));
  EXPECT_THAT(get, shutting_down);
  EXPECT_THAT(service_.SetKeyValue("k", "v"), shutting_down);
}

TEST(LocalCoordinationClientTest, TasksOnThreadsExchangeKeysAndMeetAtBarriers) {
  CoordinationService service({.tasks = {kW0, kW1, kW2}});
  std::vector<std::string> seen(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      LocalCoordinationClient client(service, {"worker", i});
      const int next = (i + 1) % 3;
      ASSERT_OK(client.SetKeyValue(absl::StrCat("addr/", i), absl::StrCat("host", i)));
      absl::StatusOr<std::string> value =
          client.GetKeyValue(absl::StrCat("addr/", next), absl::Seconds(10));
      ASSERT_TRUE(value.ok()) << value.status();
      seen[i] = *value;
      EXPECT_OK(client.WaitAtBarrier("done", absl::Seconds(10)));
      EXPECT_OK(client.cluster_error());
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(seen, ::testing::ElementsAre("host1", "host2", "host0"));
  EXPECT_OK(service.cluster_error());
}

}  // namespace
}  // namespace stratum
