// FakeClock: a Clock (stratum/util/clock.h) whose time moves only when a test says so.
// A wait on it ends when its condition holds or when Advance() has moved the time past its
// deadline; the waiter looks again every millisecond of real time, so a test advances the
// clock from another thread and the wait notices at once.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stratum/util/clock.h"

namespace stratum::testing {

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 50))
      : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mutex_);
    return now_;
  }
  void Advance(absl::Duration by) {
    absl::MutexLock lock(&mutex_);
    now_ += by;
  }
  bool AwaitWithDeadline(absl::Mutex& mutex, const absl::Condition& condition,
                         absl::Time deadline) const override {
    while (!condition.Eval()) {
      if (Now() >= deadline) return false;
      mutex.AwaitWithTimeout(condition, absl::Milliseconds(1));
    }
    return true;
  }

 private:
  mutable absl::Mutex mutex_;
  absl::Time now_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace stratum::testing
