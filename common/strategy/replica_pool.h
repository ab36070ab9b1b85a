// ReplicaPool: the threads a multi-replica strategy runs its replicas on, and the
// rendezvous their all-reduces meet at. Internal to common/strategy.
//
// RunAll runs fn(r) for every replica r at once (replica 0 on the caller's thread) and
// returns the first error. Meet() is where replicas exchange values: the last to arrive
// runs the combining function for all of them; the others wait, with a deadline, and
// are released with an error as soon as any replica of the same RunAll fails — a replica
// that dies never leaves the others hanging.
#pragma once

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stratum {

class ReplicaPool {
 public:
  ReplicaPool(int num_replicas, absl::Duration meet_timeout);
  ~ReplicaPool();

  absl::Status RunAll(const std::function<absl::Status(int replica)>& fn);

  // Called by every replica of the current RunAll with its `value`; the last arrival runs
  // `combine` on all values (indexed by replica) while the others wait.
  // `key` says what is being reduced (op and tensor count): every replica of one meeting
  // must pass the same key, or the meeting fails naming the replicas that disagree.
  absl::Status Meet(int replica, const std::string& key, void* value,
                    const std::function<absl::Status(std::vector<void*>&)>& combine);

  int size() const { return num_replicas_; }
  // Whether the calling thread is running a replica function of this pool.
  bool InReplica() const;

 private:
  void WorkerLoop(int replica);
  void Finish(int replica, absl::Status status);

  const int num_replicas_;
  const absl::Duration meet_timeout_;
  std::vector<std::thread> threads_;

  absl::Mutex mutex_;
  // Work dispatch.
  const std::function<absl::Status(int)>* work_ ABSL_GUARDED_BY(mutex_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mutex_) = 0;
  int running_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  // The current meeting.
  std::vector<void*> meet_values_ ABSL_GUARDED_BY(mutex_);
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mutex_);
  int meet_arrivals_ ABSL_GUARDED_BY(mutex_) = 0;
  int meet_first_replica_ ABSL_GUARDED_BY(mutex_) = -1;
  std::string meet_key_ ABSL_GUARDED_BY(mutex_);  // what the first arrival all-reduces
  std::vector<bool> finished_ ABSL_GUARDED_BY(mutex_);
  uint64_t meet_generation_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status meet_status_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace stratum
