// Process-wide metrics in Prometheus' text exposition format (version 0.0.4), which every
// task serves on /metrics (TaskServerOptions::metrics_listen_address): counters, gauges and
// histograms, a family per name with its help text, a series per set of label values, and
// the process's own (resident memory, CPU seconds, start time) read when scraped. Updating
// a series is a lock-free atomic after it is looked up once (keep the reference). Names
// follow Prometheus' conventions: stratum_<what>_<unit>, counters ending in _total.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace stratum {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Add(double amount = 1) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, ascending (+Inf is added).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  // Observations at or below each bound (cumulative, as Prometheus counts them), then all.
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, +Inf last
  std::atomic<double> sum_{0};
};

// Buckets for durations in seconds: 100 us to 60 s.
std::vector<double> SecondsBuckets();

class MetricsRegistry {
 public:
  // The process's registry, which /metrics serves.
  static MetricsRegistry& Global();

  // The series of family `name` with `labels`, made on first use (the same object ever
  // after). A family is of one type: asking for `name` as another type is a programming
  // error, answered with a series that is not exported.
  Counter& GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const MetricLabels& labels = {});

  // Every family, then the process's, in the text format.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::map<std::string, std::unique_ptr<Counter>> counters;  // by rendered labels
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  Family* FamilyOf(const std::string& name, const std::string& help, Type type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  mutable absl::Mutex mutex_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mutex_);
  Family orphans_ ABSL_GUARDED_BY(mutex_);  // series asked for with a family's wrong type
};

}  // namespace stratum
