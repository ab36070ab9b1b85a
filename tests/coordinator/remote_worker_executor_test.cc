// RemoteWorkerExecutor's logic against a fake worker connection, without a process or a
// socket: the job set up once and again after the worker lost it, a worker that cannot set
// the job up left out until it restarts, one held by another coordinator ending the job, a
// down worker, a cancel, and the leave at the end.
#include "coordinator/remote_worker_executor.h"

#include <atomic>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "stratum/tensor/tensor_proto.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/error_kind.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

// A worker that answers as a test scripts it: RunClosure returns its argument plus one.
class FakeConnection : public WorkerConnection {
 public:
  absl::StatusOr<proto::SetupJobResponse> SetupJob(const proto::SetupJobRequest&,
                                                   absl::Duration) override {
    absl::MutexLock lock(&mutex_);
    ++setups_;
    if (!setup_answer_.ok()) return setup_answer_;
    return proto::SetupJobResponse();
  }
  absl::StatusOr<proto::RunClosureResponse> RunClosure(const proto::RunClosureRequest& request,
                                                       absl::Duration) override {
    absl::MutexLock lock(&mutex_);
    if (hang_) {
      running_.Notify();
      mutex_.Await(absl::Condition(&cancelled_));
      return absl::CancelledError("cancelled");
    }
    if (!run_answer_.ok()) return std::exchange(run_answer_, absl::OkStatus());
    absl::StatusOr<Tensor> in = TensorFromProto(request.args(0).tensor());
    if (!in.ok()) return in.status();
    Tensor out = in->Clone();
    out.Flat() += 1.0f;
    proto::RunClosureResponse response;
    TensorToProto(out, response.add_outputs());
    return response;
  }
  void Leave(const proto::LeaveRequest&, absl::Duration) override { ++*leaves_; }
  absl::StatusOr<TaskReport> Report(absl::Duration) override {
    absl::MutexLock lock(&mutex_);
    TaskReport report;
    report.incarnation = incarnation_;
    return report;
  }
  absl::Status Health(absl::Duration) override { return absl::OkStatus(); }
  void CancelAll() override {
    absl::MutexLock lock(&mutex_);
    cancelled_ = true;
  }

  absl::Mutex mutex_;
  int setups_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status setup_answer_ ABSL_GUARDED_BY(mutex_);
  absl::Status run_answer_ ABSL_GUARDED_BY(mutex_);  // the next RunClosure's, once
  uint64_t incarnation_ ABSL_GUARDED_BY(mutex_) = 7;
  bool hang_ ABSL_GUARDED_BY(mutex_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Notification running_;
  std::shared_ptr<std::atomic<int>> leaves_ = std::make_shared<std::atomic<int>>(0);
};

struct Fixture {
  Fixture() {
    auto owned = std::make_unique<FakeConnection>();
    fake = owned.get();
    leaves = fake->leaves_;
    executor = std::make_unique<RemoteWorkerExecutor>(
        "worker:1", "10.0.0.7:2222", proto::SetupJobRequest(), absl::Seconds(5), std::move(owned),
        [this] { return may_set_up_again; });
  }
  absl::StatusOr<float> Run(float x) {
    Closure closure;
    closure.function = "step";
    closure.args.emplace_back(Tensor::Scalar(x));
    absl::StatusOr<ClosureOutputs> outputs = executor->Execute(closure);
    if (!outputs.ok()) return outputs.status();
    return (*outputs)[0].data<float>()[0];
  }
  int Setups() {
    absl::MutexLock lock(&fake->mutex_);
    return fake->setups_;
  }

  FakeConnection* fake = nullptr;
  std::shared_ptr<std::atomic<int>> leaves;
  absl::Status may_set_up_again;
  std::unique_ptr<RemoteWorkerExecutor> executor;
};

TEST(RemoteWorkerExecutorTest, SetsTheJobUpOnceAndAgainAfterTheWorkerLostIt) {
  Fixture f;
  EXPECT_EQ(*f.Run(1), 2.0f);
  EXPECT_EQ(*f.Run(2), 3.0f);
  EXPECT_EQ(f.Setups(), 1);
  {
    absl::MutexLock lock(&f.fake->mutex_);  // the worker restarted: its job is gone
    f.fake->run_answer_ =
        WithErrorKind(absl::FailedPreconditionError("worker:1 at 10.0.0.7:2222: no job is set up"),
                      ErrorKind::kNotSetUp);
  }
  EXPECT_THAT(f.Run(3).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("no job is set up")));
  EXPECT_EQ(*f.Run(4), 5.0f);
  EXPECT_EQ(f.Setups(), 2);
  // Unless this coordinator has lost the cluster meanwhile: then the job ends.
  {
    absl::MutexLock lock(&f.fake->mutex_);
    f.fake->run_answer_ = absl::UnavailableError("worker:1 at 10.0.0.7:2222: connection reset");
  }
  EXPECT_THAT(f.Run(5).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection reset")));
  f.may_set_up_again = absl::FailedPreconditionError("another coordinator took the PSs over");
  EXPECT_THAT(f.Run(6).status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("another coordinator took the PSs over")));
  EXPECT_EQ(f.Setups(), 2);
  // Done with the worker: it is let go.
  f.executor.reset();
  EXPECT_EQ(*f.leaves, 1);
}

TEST(RemoteWorkerExecutorTest, AWorkerThatCannotSetTheJobUpIsLeftOutUntilItRestarts) {
  Fixture f;
  {
    absl::MutexLock lock(&f.fake->mutex_);
    f.fake->setup_answer_ = absl::NotFoundError(
        "worker:1 at 10.0.0.7:2222: IDX file \"/data/train.gz\" not found: check the path");
  }
  EXPECT_THAT(f.Run(1).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("worker:1 at 10.0.0.7:2222 is left out: it cannot set "
                                 "the job up: IDX file \"/data/train.gz\" not found")));
  EXPECT_THAT(f.executor->LeftOut(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot set the job up")));
  // The same process stays left out; its restart (another incarnation) is tried again.
  std::atomic<bool> stop = false;
  absl::Status available;
  absl::Notification returned;
  std::thread waiter([&] {
    available = f.executor->WaitUntilAvailable(stop);
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  {
    absl::MutexLock lock(&f.fake->mutex_);
    f.fake->incarnation_ = 8;
    f.fake->setup_answer_ = absl::OkStatus();
  }
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  stop = true;
  waiter.join();
  EXPECT_OK(available);
  EXPECT_OK(f.executor->LeftOut());
  EXPECT_EQ(*f.Run(1), 2.0f);
  // Never set up: nothing to leave.
  Fixture g;
  g.executor.reset();
  EXPECT_EQ(*g.leaves, 0);
}

TEST(RemoteWorkerExecutorTest, AWorkerHeldByAnotherCoordinatorEndsTheJob) {
  Fixture f;
  ASSERT_OK(f.Run(1));
  {
    absl::MutexLock lock(&f.fake->mutex_);
    f.fake->run_answer_ = WithErrorKind(
        absl::FailedPreconditionError("this worker is held by another coordinator (chief:0)"),
        ErrorKind::kHeldByAnotherCoordinator);
  }
  EXPECT_THAT(f.Run(2).status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("held by another coordinator (chief:0); this "
                                                    "coordinator stops and leaves the job to it")));
}

TEST(RemoteWorkerExecutorTest, ACancelEndsTheClosureInFlight) {
  Fixture f;
  ASSERT_OK(f.Run(1));
  {
    absl::MutexLock lock(&f.fake->mutex_);
    f.fake->hang_ = true;
  }
  absl::StatusOr<float> stuck;
  std::thread runner([&] { stuck = f.Run(2); });
  ASSERT_TRUE(f.fake->running_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  f.executor->Cancel();
  runner.join();
  EXPECT_THAT(stuck.status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("the coordinator shut down before the closure ended")));
  EXPECT_THAT(f.Run(3).status(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("shutting down")));
}

}  // namespace
}  // namespace stratum
