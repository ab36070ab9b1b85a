#include "stratum/util/clock.h"

#include "absl/time/clock.h"

namespace stratum {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex& mutex, const absl::Condition& condition,
                         absl::Time deadline) const override {
    return mutex.AwaitWithDeadline(condition, deadline);
  }
};

}  // namespace

const Clock& Clock::Real() {
  static const RealClock* const clock = new RealClock();
  return *clock;
}

}  // namespace stratum
