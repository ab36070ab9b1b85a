#include "stratum/coordinator/cluster_coordinator.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "stratum/testing/fake_clock.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using testing::FakeClock;
using ::testing::HasSubstr;
using testing::StatusIs;

// A worker that adds 1 to its argument, and can be told to fail, to hold its closures
// until the test lets them go on, or to be down until restarted. Its Await* methods let a
// test wait for what the coordinator's threads did to it instead of sleeping.
class FakeWorker : public WorkerExecutor {
 public:
  explicit FakeWorker(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }

  absl::StatusOr<ClosureOutputs> Execute(const Closure& closure) override {
    {
      absl::MutexLock lock(&mutex_);
      ++started_;
      auto may_go_on = [this]()
                           ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return !paused_ || cancelled_; };
      mutex_.Await(absl::Condition(&may_go_on));
      if (paused_) return absl::CancelledError(name_ + ": the closure was cancelled");
      if (hang_next_) {
        hang_next_ = false;
        auto cancelled = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return cancelled_; };
        mutex_.AwaitWithTimeout(absl::Condition(&cancelled), absl::Seconds(20));
        return absl::CancelledError(name_ + ": the closure was cancelled");
      }
      if (down_) return absl::UnavailableError(name_ + " is down");
      if (fail_next_unavailable_ > 0) {
        --fail_next_unavailable_;
        down_ = true;
        return absl::UnavailableError(name_ + " died");
      }
      ++executed_;
    }
    if (closure.function == "raise") return absl::InvalidArgumentError("the step raised");
    Tensor out = closure.args[0].tensor()->Clone();
    out.Flat() += 1.0f;
    return ClosureOutputs{out};
  }

  absl::Status WaitUntilAvailable(const std::atomic<bool>& stop) override {
    absl::MutexLock lock(&mutex_);
    ++waiting_;
    // The coordinator sets `stop` and then calls Cancel, which wakes this wait.
    auto back_or_stopped = [this, &stop]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
      return !down_ || stop.load() || cancelled_;
    };
    mutex_.Await(absl::Condition(&back_or_stopped));
    --waiting_;
    return down_ ? absl::CancelledError("stopping") : absl::OkStatus();
  }

  void Cancel() override {
    absl::MutexLock lock(&mutex_);
    cancelled_ = true;
  }

  // The next closure hangs, as on a worker blocked by a frozen PS, until Cancel (or 20 s).
  void HangOnNextCall() {
    absl::MutexLock lock(&mutex_);
    hang_next_ = true;
  }
  // Closures that start from now on wait in Execute (in flight) until Resume.
  void Pause() {
    absl::MutexLock lock(&mutex_);
    paused_ = true;
  }
  void Resume() {
    absl::MutexLock lock(&mutex_);
    paused_ = false;
  }

  void Restart() {
    absl::MutexLock lock(&mutex_);
    down_ = false;
  }
  void DieOnNextCall() {
    absl::MutexLock lock(&mutex_);
    fail_next_unavailable_ = 1;
  }
  int executed() {
    absl::MutexLock lock(&mutex_);
    return executed_;
  }

  // Each waits up to 10 s, and is true once its count is reached: calls of Execute begun,
  // closures run to the end, coordinator threads blocked in WaitUntilAvailable.
  bool AwaitStarted(int count) { return AwaitAtLeast(started_, count); }
  bool AwaitExecuted(int count) { return AwaitAtLeast(executed_, count); }
  bool AwaitWaiting(int count) { return AwaitAtLeast(waiting_, count); }

 private:
  bool AwaitAtLeast(const int& counter, int count) {
    absl::MutexLock lock(&mutex_);
    auto reached = [&counter, count]() { return counter >= count; };
    return mutex_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }

  std::string name_;
  absl::Mutex mutex_;
  bool down_ = false;
  bool paused_ = false;
  bool hang_next_ = false;
  bool cancelled_ = false;
  int fail_next_unavailable_ = 0;
  int started_ = 0;
  int executed_ = 0;
  int waiting_ = 0;
};

struct Fixture {
  explicit Fixture(int workers, ClusterCoordinatorOptions options = {}) {
    std::vector<std::unique_ptr<WorkerExecutor>> executors;
    for (int i = 0; i < workers; ++i) {
      auto worker = std::make_unique<FakeWorker>("worker:" + std::to_string(i));
      fakes.push_back(worker.get());
      executors.push_back(std::move(worker));
    }
    coordinator = std::make_unique<ClusterCoordinator>(std::move(executors), options);
  }
  std::vector<FakeWorker*> fakes;
  std::unique_ptr<ClusterCoordinator> coordinator;
};

float Output(const std::shared_ptr<RemoteValue>& value) {
  auto outputs = value->Fetch(absl::Seconds(10));
  EXPECT_TRUE(outputs.ok()) << outputs.status();
  return outputs.ok() ? *(*outputs)[0].data<float>() : -1;
}

// A program whose parameter servers another coordinator took over learns it at its next
// Schedule or Join, not after training the other job's variables on.
TEST(ClusterCoordinatorTest, ALostHoldEndsScheduleAndJoin) {
  std::atomic<bool> lost{false};
  ClusterCoordinatorOptions options;
  options.check_hold = [&lost]() -> absl::Status {
    if (!lost) return absl::OkStatus();
    return absl::FailedPreconditionError("ps:0 is held by another coordinator");
  };
  Fixture f(1, options);
  ASSERT_OK(f.coordinator->Schedule("step", {Tensor::Scalar(1.0f)}));
  ASSERT_OK(f.coordinator->Join(absl::Seconds(10)));
  lost = true;
  EXPECT_THAT(f.coordinator->Schedule("step", {Tensor::Scalar(1.0f)}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another coordinator")));
  EXPECT_THAT(f.coordinator->Join(absl::Seconds(10)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another coordinator")));
}

TEST(ClusterCoordinatorTest, ScheduleReturnsRemoteValuesThatBecomeReady) {
  Fixture f(2);
  std::vector<std::shared_ptr<RemoteValue>> values;
  for (int i = 0; i < 20; ++i) {
    auto value = f.coordinator->Schedule("train_step", {Tensor::Scalar(float(i))});
    ASSERT_OK(value);
    values.push_back(*value);
  }
  ASSERT_OK(f.coordinator->Join(absl::Seconds(10)));
  EXPECT_TRUE(*f.coordinator->Done());
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(values[i]->status(), RemoteValueStatus::kReady);
    EXPECT_EQ(Output(values[i]), i + 1);
  }
  EXPECT_EQ(f.fakes[0]->executed() + f.fakes[1]->executed(), 20);
}

TEST(ClusterCoordinatorTest, AClosureOnAWorkerThatDiesRunsElsewhereAndTheWorkerComesBack) {
  Fixture f(2);
  f.fakes[0]->DieOnNextCall();
  f.fakes[1]->Pause();  // so that worker:0 takes a closure, and dies of it
  std::vector<std::shared_ptr<RemoteValue>> values;
  for (int i = 0; i < 30; ++i)
    values.push_back(*f.coordinator->Schedule("step", {Tensor::Scalar(float(i))}));
  ASSERT_TRUE(f.fakes[0]->AwaitWaiting(1));  // worker:0 died; its thread waits for it
  // While worker:0 is down, worker:1 carries on.
  f.fakes[1]->Resume();
  ASSERT_TRUE(f.fakes[1]->AwaitExecuted(10));
  f.fakes[0]->Restart();
  ASSERT_OK(f.coordinator->Join(absl::Seconds(10)));
  for (int i = 0; i < 30; ++i) EXPECT_EQ(Output(values[i]), i + 1);  // every closure ran
  EXPECT_GE(f.coordinator->retried_closures(), 1);
  // worker:0 took closures again after its restart (worker:1 holds one meanwhile, so that
  // it cannot have run them all).
  const int before = f.fakes[0]->executed();
  f.fakes[1]->Pause();
  for (int i = 0; i < 30; ++i) ASSERT_OK(f.coordinator->Schedule("step", {Tensor::Scalar(0)}));
  EXPECT_TRUE(f.fakes[0]->AwaitExecuted(before + 1));
  f.fakes[1]->Resume();
  ASSERT_OK(f.coordinator->Join(absl::Seconds(10)));
  EXPECT_GT(f.fakes[0]->executed(), before);
}

TEST(ClusterCoordinatorTest, TheFirstErrorIsRaisedOnceAndTheQueueIsCancelled) {
  Fixture f(1);
  f.fakes[0]->Pause();  // the later closures are queued while "raise" runs
  auto bad = *f.coordinator->Schedule("raise", {Tensor::Scalar(0)});
  std::vector<std::shared_ptr<RemoteValue>> later;
  for (int i = 0; i < 10; ++i) {
    auto value = f.coordinator->Schedule("step", {Tensor::Scalar(0)});
    if (value.ok()) later.push_back(*value);
  }
  f.fakes[0]->Resume();
  absl::Status joined = f.coordinator->Join(absl::Seconds(10));
  EXPECT_EQ(joined.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(joined.message()),
              HasSubstr("closure \"raise\" on worker:0: the step raised"));
  EXPECT_EQ(bad->status(), RemoteValueStatus::kAborted);
  int cancelled = 0;
  for (auto& value : later) {
    if (value->Fetch().status().code() == absl::StatusCode::kCancelled) ++cancelled;
  }
  EXPECT_GE(cancelled, 1);
  // Raised once: the coordinator works again afterwards.
  EXPECT_OK(f.coordinator->Join(absl::Seconds(10)));
  auto value = f.coordinator->Schedule("step", {Tensor::Scalar(4)});
  ASSERT_OK(value);
  EXPECT_EQ(Output(*value), 5);
}

TEST(ClusterCoordinatorTest, ScheduleBlocksOnlyWhenTheQueueIsFull) {
  Fixture f(1, {.max_queue_size = 2});
  f.fakes[0]->Pause();  // no step finishes until Resume
  absl::Notification first_three, last_three;
  std::thread program([&] {
    for (int i = 0; i < 3; ++i) EXPECT_OK(f.coordinator->Schedule("step", {Tensor::Scalar(0)}));
    first_three.Notify();
    for (int i = 0; i < 3; ++i) EXPECT_OK(f.coordinator->Schedule("step", {Tensor::Scalar(0)}));
    last_three.Notify();
  });
  // Room (one in flight, two queued): no waiting for steps, none of which can finish.
  EXPECT_TRUE(first_three.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Full: the fourth waits for a slot.
  EXPECT_TRUE(f.coordinator->AwaitBlockedCallers(1, absl::Seconds(10)));
  EXPECT_FALSE(last_three.HasBeenNotified());
  f.fakes[0]->Resume();
  program.join();
  EXPECT_TRUE(last_three.HasBeenNotified());
  ASSERT_OK(f.coordinator->Join(absl::Seconds(10)));
}

TEST(ClusterCoordinatorTest, AClosureThatKillsEveryWorkerBecomesAnError) {
  Fixture f(2, {.max_attempts = 3});
  f.fakes[0]->DieOnNextCall();
  f.fakes[1]->DieOnNextCall();
  // Once the closure has killed both (two attempts), both come back, to be killed again.
  std::thread restarter([&] {
    for (FakeWorker* fake : f.fakes) EXPECT_TRUE(fake->AwaitWaiting(1));
    for (FakeWorker* fake : f.fakes) {
      fake->DieOnNextCall();  // before it is back: its thread may take the closure at once
      fake->Restart();
    }
  });
  auto value = *f.coordinator->Schedule("step", {Tensor::Scalar(0)});
  absl::Status joined = f.coordinator->Join(absl::Seconds(10));
  restarter.join();
  EXPECT_EQ(joined.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(joined.message()), HasSubstr("failed on 3 workers in a row"));
  EXPECT_EQ(value->status(), RemoteValueStatus::kAborted);
}

// SIGTERM while every worker is down: Join (and Schedule on a full queue) would otherwise
// wait for a worker to come back, however long that takes.
TEST(ClusterCoordinatorTest, ACancelEndsTheWaitsWhileEveryWorkerIsDown) {
  absl::Notification cancel;
  Fixture f(1, {.max_queue_size = 1, .cancel = &cancel});
  f.fakes[0]->DieOnNextCall();  // and never restarted
  ASSERT_OK(f.coordinator->Schedule("step", {Tensor::Scalar(0)}));
  std::thread signal([&] {
    // Once the worker is down and Join waits for it.
    EXPECT_TRUE(f.fakes[0]->AwaitWaiting(1));
    EXPECT_TRUE(f.coordinator->AwaitBlockedCallers(1, absl::Seconds(10)));
    cancel.Notify();
  });
  const absl::Time start = absl::Now();
  absl::Status joined = f.coordinator->Join();
  signal.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(joined.code(), absl::StatusCode::kCancelled) << joined;
  EXPECT_THAT(std::string(joined.message()), HasSubstr("stopped by a signal"));
  EXPECT_EQ(f.coordinator->Schedule("step", {Tensor::Scalar(0)}).status().code(),
            absl::StatusCode::kCancelled);
}

// Every worker down past worker_recovery_timeout ends Join with an error naming them (TF
// waits without end); a worker back in time resets the clock.
TEST(ClusterCoordinatorTest, EveryWorkerDownPastTheRecoveryTimeoutIsAnErrorNamingThem) {
  FakeClock clock;
  Fixture f(2, {.worker_recovery_timeout = absl::Milliseconds(300), .clock = &clock});
  for (FakeWorker* fake : f.fakes) fake->DieOnNextCall();  // and never restarted
  auto first = *f.coordinator->Schedule("step", {Tensor::Scalar(0)});
  auto second = *f.coordinator->Schedule("step", {Tensor::Scalar(0)});
  absl::Status joined;
  absl::Notification join_returned;
  std::thread join([&] {
    joined = f.coordinator->Join(absl::Seconds(10));
    join_returned.Notify();
  });
  // Not at the timeout: both workers must be down first, then 300 ms may pass.
  clock.Advance(absl::Milliseconds(299));
  EXPECT_FALSE(join_returned.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  while (!join_returned.HasBeenNotified()) {
    clock.Advance(absl::Milliseconds(100));
    join_returned.WaitForNotificationWithTimeout(absl::Milliseconds(10));
  }
  join.join();
  EXPECT_EQ(joined.code(), absl::StatusCode::kUnavailable) << joined;
  EXPECT_THAT(std::string(joined.message()),
              HasSubstr("every worker has been down for 300ms (worker:0, worker:1), so no "
                        "closure can run: start them again, or raise --worker_recovery_timeout"));
  EXPECT_EQ(first->status(), RemoteValueStatus::kAborted);

  // One worker back within the timeout: the closures run there and nothing fails, however
  // long the job then runs.
  Fixture g(2, {.worker_recovery_timeout = absl::Milliseconds(500), .clock = &clock});
  for (FakeWorker* fake : g.fakes) fake->DieOnNextCall();
  auto value = *g.coordinator->Schedule("step", {Tensor::Scalar(0)});
  // The closure kills both, in real time: then every worker is down, on the clock too.
  for (FakeWorker* fake : g.fakes) ASSERT_TRUE(fake->AwaitWaiting(1));
  clock.Advance(absl::Milliseconds(499));
  g.fakes[1]->Restart();
  (void)value->Fetch(absl::Seconds(10));  // the real thread that runs it
  clock.Advance(absl::Seconds(5));
  EXPECT_OK(g.coordinator->Join(absl::Seconds(10)));
  EXPECT_EQ(Output(value), 1.0f);
}

TEST(ClusterCoordinatorTest, DrainLetsTheRunningClosuresFinishAndDropsTheQueuedOnes) {
  Fixture f(2);
  for (FakeWorker* fake : f.fakes) fake->Pause();
  f.fakes[1]->DieOnNextCall();  // its closure is not run again while draining
  std::vector<std::shared_ptr<RemoteValue>> values;
  for (int i = 0; i < 10; ++i)
    values.push_back(*f.coordinator->Schedule("step", {Tensor::Scalar(float(i))}));
  // One closure in flight on each worker; they finish once Drain has dropped the queue.
  for (FakeWorker* fake : f.fakes) ASSERT_TRUE(fake->AwaitStarted(1));
  std::thread finish([&] {
    (void)values.back()->Fetch(absl::Seconds(10));  // queued: Drain cancels it
    for (FakeWorker* fake : f.fakes) fake->Resume();
  });
  const absl::Status drained = f.coordinator->Drain(absl::Seconds(10));
  finish.join();
  ASSERT_OK(drained);
  int ready = 0, cancelled = 0;
  for (const auto& value : values) {
    ASSERT_NE(value->status(), RemoteValueStatus::kNotReady);
    if (value->status() == RemoteValueStatus::kReady) ++ready;
    if (absl::IsCancelled(value->Fetch().status())) ++cancelled;
  }
  EXPECT_EQ(ready, 1);  // worker:0's closure in flight
  EXPECT_EQ(cancelled, 9);
  EXPECT_EQ(f.coordinator->retried_closures(), 0);
  EXPECT_EQ(f.fakes[0]->executed(), 1);
  // Nothing was raised to the program.
  EXPECT_OK(f.coordinator->Join(absl::Seconds(1)));
}

// A closure stuck on a worker (blocked by a frozen PS until its 30 s RPC deadline) does not
// hold the coordinator's exit after a SIGTERM: Drain gives up after its timeout, and the
// shutdown cancels the closure instead of waiting for it (it used to wait 20 s more, past
// Kubernetes' 30 s grace period).
TEST(ClusterCoordinatorTest, ShuttingDownCancelsAClosureStuckOnAWorker) {
  Fixture f(1);
  f.fakes[0]->HangOnNextCall();
  ASSERT_OK(f.coordinator->Schedule("step", {Tensor::Scalar(0)}));
  ASSERT_TRUE(f.fakes[0]->AwaitStarted(1));
  EXPECT_EQ(f.coordinator->Drain(absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
  const absl::Time start = absl::Now();
  f.coordinator.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(ClusterCoordinatorTest, JoinHasADeadlineThatSaysWhatIsPending) {
  Fixture f(1);
  f.fakes[0]->DieOnNextCall();  // and never restarted
  ASSERT_OK(f.coordinator->Schedule("step", {Tensor::Scalar(0)}));
  absl::Status joined = f.coordinator->Join(absl::Milliseconds(200));
  EXPECT_EQ(joined.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(joined.message()), HasSubstr("1 closures queued and 0 in flight"));
  EXPECT_FALSE(*f.coordinator->Done());
  auto value = f.coordinator->Schedule("step", {Tensor::Scalar(0)});
  ASSERT_OK(value);
  EXPECT_EQ((*value)->Fetch(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace stratum
