// How a worker of a failed multi-worker job words its error: its own when it failed first
// or found what the first failure found, else the first failure leading.
#include "stratum/worker/multi_worker_job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/testing/status_matchers.h"
#include "stratum/util/error_kind.h"
#include "stratum/worker/coordination_service.h"

namespace stratum {
namespace {

const absl::Status kClosed = absl::UnavailableError(
    "all-reduce of 4096 bytes over 3 workers: worker:1 at 127.0.0.1:5 closed the connection");

// The first failure as the coordination service reports it.
absl::Status Failed(int worker, const absl::Status& cause) {
  CoordinationService service({.tasks = {{kWorker, 0}, {kWorker, 1}, {kWorker, 2}}});
  EXPECT_OK(service.ReportError({kWorker, worker}, cause));
  return service.cluster_error();
}

TEST(AsSeenByThisWorkerTest, AWorkerThatFailedFirstOrAloneReportsItsOwnError) {
  EXPECT_EQ(AsSeenByThisWorker(absl::OkStatus(), "worker:0", kClosed), kClosed);
  const absl::Status mine = Failed(0, absl::UnavailableError("disk full"));
  EXPECT_EQ(AsSeenByThisWorker(mine, "worker:0", kClosed), kClosed);
  // Words alone say nothing: a status without the service's payload is not a failure of
  // the job's.
  EXPECT_EQ(AsSeenByThisWorker(absl::InternalError("worker:2 failed: out of memory"), "worker:0",
                               kClosed),
            kClosed);
}

TEST(AsSeenByThisWorkerTest, AFailureThatFollowedAnotherNamesTheFirstOneFirst) {
  const absl::Status first = Failed(2, absl::InternalError("out of memory"));
  const absl::Status seen = AsSeenByThisWorker(first, "worker:0", kClosed);
  EXPECT_EQ(seen.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(seen.message(),
            "worker:2 failed: out of memory; worker:0 stopped as a result: all-reduce of 4096 "
            "bytes over 3 workers: worker:1 at 127.0.0.1:5 closed the connection");
  // It still says which task failed first.
  EXPECT_EQ(ErrorTaskOf(seen), "worker:2");
}

// Every worker checks the job alike: the same refusal is said once, not once per worker.
TEST(AsSeenByThisWorkerTest, TheSameErrorAsTheFirstFailureIsSaidOnce) {
  const absl::Status refusal = absl::FailedPreconditionError("NCCL needs a GPU of its own");
  const absl::Status first = Failed(0, refusal);
  EXPECT_EQ(AsSeenByThisWorker(first, "worker:1", refusal), refusal);
  // The first failure itself, as a wait on the service returned it: said once too.
  EXPECT_EQ(AsSeenByThisWorker(first, "worker:1", first), first);
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
