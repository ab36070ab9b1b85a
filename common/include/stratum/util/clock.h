// Clock: where code whose decisions hang on time (leases, heartbeats, recovery deadlines)
// reads the time and waits for it, so that its tests drive time instead of sleeping
// (stratum/testing/fake_clock.h). Production code passes Clock::Real().
//
// Thread safety: implementations are safe to call from any thread.
#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stratum {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // With `mutex` held: waits, releasing it meanwhile, until `condition` holds or Now()
  // reaches `deadline`, and holds it again. True when `condition` holds.
  virtual bool AwaitWithDeadline(absl::Mutex& mutex, const absl::Condition& condition,
                                 absl::Time deadline) const = 0;

  // The system's clock (absl::Now, absl::Mutex's own timed waits).
  static const Clock& Real();
};

}  // namespace stratum
