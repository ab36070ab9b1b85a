// How a worker of a failed multi-worker job words its error: its own when it failed first
// or found what the first failure found, else the first failure leading.
#include "stratum/worker/multi_worker_job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum {
namespace {

const absl::Status kClosed = absl::UnavailableError(
    "all-reduce of 4096 bytes over 3 workers: worker:1 at 127.0.0.1:5 closed the connection");

TEST(AsSeenByThisWorkerTest, AWorkerThatFailedFirstOrAloneReportsItsOwnError) {
  EXPECT_EQ(AsSeenByThisWorker(absl::OkStatus(), "worker:0", kClosed), kClosed);
  const absl::Status mine = absl::UnavailableError("worker:0 failed: disk full");
  EXPECT_EQ(AsSeenByThisWorker(mine, "worker:0", kClosed), kClosed);
}

TEST(AsSeenByThisWorkerTest, AFailureThatFollowedAnotherNamesTheFirstOneFirst) {
  const absl::Status first = absl::InternalError("worker:2 failed: out of memory");
  EXPECT_EQ(AsSeenByThisWorker(first, "worker:0", kClosed),
            absl::InternalError("worker:2 failed: out of memory; worker:0 stopped as a result: "
                                "all-reduce of 4096 bytes over 3 workers: worker:1 at 127.0.0.1:5 "
                                "closed the connection"));
}

// Every worker checks the job alike: the same refusal is said once, not once per worker.
TEST(AsSeenByThisWorkerTest, TheSameErrorAsTheFirstFailureIsSaidOnce) {
  const absl::Status refusal = absl::FailedPreconditionError("NCCL needs a GPU of its own");
  const absl::Status first =
      absl::FailedPreconditionError("worker:0 failed: NCCL needs a GPU of its own");
  EXPECT_EQ(AsSeenByThisWorker(first, "worker:1", refusal), refusal);
}

// A sparse worker job trains like a dense one: its workers in index order, the first leading.
TEST(MultiWorkerTasksTest, ASparseWorkerJobKeepsItsIndicesInRankOrder) {
  ClusterSpec sparse;
  sparse.SetTask(kWorker, 2, "w:2");
  sparse.SetTask(kWorker, 5, "w:5");
  EXPECT_EQ(MultiWorkerTasks(sparse), (std::vector<TaskKey>{{kWorker, 2}, {kWorker, 5}}));
  EXPECT_EQ(MultiWorkerLeader(sparse), (TaskKey{kWorker, 2}));
  sparse.SetTask(kChief, 0, "c:0");
  EXPECT_EQ(MultiWorkerLeader(sparse), (TaskKey{kChief, 0}));
}

}  // namespace
}  // namespace stratum
