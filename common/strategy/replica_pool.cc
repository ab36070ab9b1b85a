#include "common/strategy/replica_pool.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stratum {
namespace {

// The pool whose replica function the current thread runs, if any.
thread_local const ReplicaPool* current_pool = nullptr;

}  // namespace

bool ReplicaPool::InReplica() const { return current_pool == this; }

ReplicaPool::ReplicaPool(int num_replicas, absl::Duration meet_timeout)
    : num_replicas_(num_replicas),
      meet_timeout_(meet_timeout),
      meet_values_(static_cast<size_t>(num_replicas)),
      arrived_(static_cast<size_t>(num_replicas), false),
      finished_(static_cast<size_t>(num_replicas), false) {
  for (int replica = 1; replica < num_replicas; ++replica) {
    threads_.emplace_back([this, replica] { WorkerLoop(replica); });
  }
}

ReplicaPool::~ReplicaPool() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void ReplicaPool::WorkerLoop(int replica) {
  uint64_t seen = 0;
  while (true) {
    const std::function<absl::Status(int)>* work;
    {
      absl::MutexLock lock(&mutex_);
      struct Wake {
        ReplicaPool* pool;
        uint64_t seen;
      } wake{this, seen};
      mutex_.Await(absl::Condition(
          +[](Wake* w) {
            w->pool->mutex_.AssertHeld();
            return w->pool->stopping_ || w->pool->generation_ != w->seen;
          },
          &wake));
      if (stopping_) return;
      seen = generation_;
      work = work_;
    }
    current_pool = this;
    absl::Status status = (*work)(replica);
    current_pool = nullptr;
    Finish(replica, std::move(status));
  }
}

void ReplicaPool::Finish(int replica, absl::Status status) {
  absl::MutexLock lock(&mutex_);
  finished_[static_cast<size_t>(replica)] = true;
  if (!status.ok() && first_error_.ok()) first_error_ = status;
  // Replicas waiting at a meeting this one never joined would wait for nothing: release
  // them now rather than at the deadline.
  const bool meeting_pending = meet_arrivals_ > 0 && !arrived_[static_cast<size_t>(replica)];
  if (meet_status_.ok() && (!status.ok() || meeting_pending)) {
    meet_status_ =
        status.ok()
            ? absl::FailedPreconditionError(absl::StrCat(
                  "replica ", replica,
                  " finished without joining the all-reduce the others wait at: every replica "
                  "must make the same collective calls"))
            : absl::AbortedError(absl::StrCat(
                  "replica ", replica,
                  " failed, so the others stopped waiting for it: ", status.message()));
  }
  --running_;
}

absl::Status ReplicaPool::RunAll(const std::function<absl::Status(int)>& fn) {
  if (current_pool == this) {
    return absl::FailedPreconditionError(
        "a replica function called Run (or ApplyGradients) of its own strategy: inside a "
        "replica, use its ReplicaContext (AllReduce) instead");
  }
  {
    absl::MutexLock lock(&mutex_);
    work_ = &fn;
    running_ = num_replicas_;
    first_error_ = absl::OkStatus();
    // A meeting left half-done by a failed RunAll starts over.
    meet_status_ = absl::OkStatus();
    meet_arrivals_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), false);
    std::fill(finished_.begin(), finished_.end(), false);
    ++meet_generation_;
    ++generation_;
  }
  current_pool = this;
  absl::Status status = fn(0);
  current_pool = nullptr;
  Finish(0, std::move(status));
  absl::MutexLock lock(&mutex_);
  mutex_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_));
  work_ = nullptr;
  return first_error_;
}

absl::Status ReplicaPool::Meet(int replica, const std::string& key, void* value,
                               const std::function<absl::Status(std::vector<void*>&)>& combine) {
  absl::MutexLock lock(&mutex_);
  if (!meet_status_.ok()) return meet_status_;
  for (int r = 0; r < num_replicas_; ++r) {
    if (finished_[static_cast<size_t>(r)]) {
      meet_status_ = absl::FailedPreconditionError(absl::StrCat(
          "replica ", replica, " all-reduces but replica ", r,
          " already finished without doing so: every replica must make the same collective "
          "calls"));
      return meet_status_;
    }
  }
  if (meet_arrivals_ == 0) {
    meet_key_ = key;
    meet_first_replica_ = replica;
  } else if (key != meet_key_) {
    meet_status_ = absl::InvalidArgumentError(
        absl::StrCat("replica ", replica, " all-reduces ", key, " while replica ",
                     meet_first_replica_, " all-reduces ", meet_key_,
                     ": every replica must make the same collective calls in the same order"));
    return meet_status_;
  }
  const uint64_t generation = meet_generation_;
  meet_values_[static_cast<size_t>(replica)] = value;
  arrived_[static_cast<size_t>(replica)] = true;
  if (++meet_arrivals_ == num_replicas_) {
    absl::Status result = combine(meet_values_);
    if (!result.ok()) {
      meet_status_ = result;  // wakes the waiters with the error
      return result;
    }
    meet_arrivals_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), false);
    ++meet_generation_;
    return result;
  }
  struct Wait {
    ReplicaPool* pool;
    uint64_t generation;
  } wait{this, generation};
  const bool done = mutex_.AwaitWithTimeout(
      absl::Condition(
          +[](Wait* w) {
            w->pool->mutex_.AssertHeld();
            return w->pool->meet_generation_ != w->generation || !w->pool->meet_status_.ok();
          },
          &wait),
      meet_timeout_);
  if (meet_generation_ != generation) return absl::OkStatus();  // combined: our value is set
  if (!meet_status_.ok()) return meet_status_;
  if (!done) {
    std::vector<int> missing;
    for (int r = 0; r < num_replicas_; ++r) {
      if (!arrived_[static_cast<size_t>(r)]) missing.push_back(r);
    }
    meet_status_ = absl::DeadlineExceededError(
        absl::StrCat("replica ", replica, " waited ", absl::FormatDuration(meet_timeout_),
                     " at an all-reduce for replicas ", absl::StrJoin(missing, ", "),
                     ", which never arrived: every replica must make the same collective calls"));
  }
  return meet_status_;
}

}  // namespace stratum
