// The parameter server's Prometheus series, shared by its gRPC service and its raw data path
// (label path="grpc" or "data"): requests' latency by kind, and (in the variable store) the
// bytes pulled and pushed and the updates applied. Thread-safe.
#pragma once

#include <string>

#include "absl/time/clock.h"
#include "stratum/util/metrics.h"

namespace stratum {

// stratum_ps_request_seconds{kind="pull"|"push", path=...}.
inline Histogram& PsRequestSeconds(const std::string& kind, const std::string& path) {
  return MetricsRegistry::Global().GetHistogram(
      "stratum_ps_request_seconds", "Time a parameter server took to answer a pull or a push.",
      SecondsBuckets(), {{"kind", kind}, {"path", path}});
}

// Observes the time from its making to its end in `histogram` (null: nothing).
class ScopedTimer {
 public:
  explicit ScopedTimer(Histogram* histogram) : histogram_(histogram), began_(absl::Now()) {}
  ~ScopedTimer() {
    if (histogram_ != nullptr) histogram_->Observe(absl::ToDoubleSeconds(absl::Now() - began_));
  }
  void Retarget(Histogram* histogram) { histogram_ = histogram; }

 private:
  Histogram* histogram_;
  absl::Time began_;
};

}  // namespace stratum
