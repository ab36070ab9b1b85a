// The metrics registry against Prometheus' text exposition format (0.0.4): HELP and TYPE
// lines, escaped label values, cumulative histogram buckets with +Inf, _sum and _count, and
// the process series every client library exports.
#include "stratum/util/metrics.h"

#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, RendersCountersGaugesAndHistogramsInTheTextFormat) {
  MetricsRegistry registry;
  registry.GetCounter("test_requests_total", "Requests.", {{"kind", "pull"}}).Add(3);
  registry.GetCounter("test_requests_total", "Requests.", {{"kind", "push"}}).Add();
  registry.GetGauge("test_depth", "Depth.").Set(2.5);
  Histogram& seconds = registry.GetHistogram("test_seconds", "Seconds.", {0.1, 1});
  seconds.Observe(0.05);
  seconds.Observe(0.1);  // at a bound: in that bucket, as Prometheus' le (less or equal)
  seconds.Observe(7);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP test_requests_total Requests.\n"
                              "# TYPE test_requests_total counter\n"
                              "test_requests_total{kind=\"pull\"} 3.0\n"
                              "test_requests_total{kind=\"push\"} 1.0\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE test_depth gauge\ntest_depth 2.5\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE test_seconds histogram\n"
                              "test_seconds_bucket{le=\"0.1\"} 2\n"
                              "test_seconds_bucket{le=\"1.0\"} 2\n"
                              "test_seconds_bucket{le=\"+Inf\"} 3\n"
                              "test_seconds_sum 7.15\n"
                              "test_seconds_count 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_resident_memory_bytes gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter\n"));
}

TEST(MetricsTest, TheSameSeriesIsReturnedAndLabelValuesAreEscaped) {
  MetricsRegistry registry;
  Counter& first = registry.GetCounter("test_total", "T.", {{"path", "a\"b\\c\nd"}});
  Counter& again = registry.GetCounter("test_total", "T.", {{"path", "a\"b\\c\nd"}});
  EXPECT_EQ(&first, &again);
  first.Add(2);
  EXPECT_THAT(registry.Render(), HasSubstr("test_total{path=\"a\\\"b\\\\c\\nd\"} 2.0\n"));
}

TEST(MetricsTest, AFamilyAskedForAsAnotherTypeIsNotExportedTwice) {
  MetricsRegistry registry;
  registry.GetCounter("test_mixed", "M.").Add();
  registry.GetGauge("test_mixed", "M.").Set(9);  // a programming error: not exported
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE test_mixed counter\ntest_mixed 1.0\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("test_mixed 9")));
}

TEST(MetricsTest, UpdatesFromManyThreadsAllCount) {
  MetricsRegistry registry;
  Counter& counter = registry.GetCounter("test_concurrent_total", "C.");
  Histogram& histogram = registry.GetHistogram("test_concurrent_seconds", "S.", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        counter.Add();
        histogram.Observe(0.5);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(counter.value(), 80000);
  EXPECT_EQ(histogram.CumulativeCounts().back(), 80000u);
}

}  // namespace
}  // namespace stratum
