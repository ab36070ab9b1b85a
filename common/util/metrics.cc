#include "stratum/util/metrics.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stratum/util/number_text.h"

namespace stratum {
namespace {

// {a="x",b="y"} with Prometheus' escapes, or empty.
std::string LabelText(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string text = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) text += ",";
    absl::StrAppend(&text, labels[i].first, "=\"");
    for (char c : labels[i].second) {
      if (c == '\\' || c == '"') text += '\\';
      text += c == '\n' ? std::string("\\n") : std::string(1, c);
    }
    text += "\"";
  }
  return text + "}";
}

std::string Number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return PythonFloat(value);
}

// The labels of `rendered` ({...}) with `extra` added (a histogram's le).
std::string WithLabel(const std::string& rendered, const std::string& extra) {
  if (rendered.empty()) return absl::StrCat("{", extra, "}");
  return absl::StrCat(rendered.substr(0, rendered.size() - 1), ",", extra, "}");
}

// The process's own series, from /proc: what every Prometheus client library exports.
std::string ProcessMetrics() {
  std::string text;
  long page = sysconf(_SC_PAGESIZE);
  std::ifstream statm("/proc/self/statm");
  int64_t pages_total = 0, pages_resident = 0;
  if (statm >> pages_total >> pages_resident) {
    absl::StrAppend(&text,
                    "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                    "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes ",
                    pages_resident * page, "\n",
                    "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                    "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes ",
                    pages_total * page, "\n");
  }
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
  if (const size_t paren = stat.rfind(')'); paren != std::string::npos) {
    std::istringstream fields(stat.substr(paren + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 1; i <= 13 && fields >> field; ++i) {
      if (i == 12) utime = std::stod(field);
      if (i == 13) stime = std::stod(field);
    }
    absl::StrAppend(
        &text,
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in "
        "seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ",
        Number((utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK))), "\n");
  }
  return text;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> cumulative;
  uint64_t total = 0;
  for (size_t b = 0; b <= bounds_.size(); ++b) {
    total += counts_[b].load(std::memory_order_relaxed);
    cumulative.push_back(total);
  }
  return cumulative;
}

std::vector<double> SecondsBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}

MetricsRegistry& MetricsRegistry::Global() {
  static auto* registry = new MetricsRegistry();  // never destroyed: threads may update late
  return *registry;
}

MetricsRegistry::Family* MetricsRegistry::FamilyOf(const std::string& name, const std::string& help,
                                                   Type type) {
  auto [found, made] = families_.try_emplace(name);
  if (made) {
    found->second.type = type;
    found->second.help = help;
  }
  if (found->second.type != type) {
    spdlog::error("metric {} is asked for as another type than it has: not exported", name);
    return &orphans_;
  }
  return &found->second;
}

Counter& MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  absl::MutexLock lock(&mutex_);
  auto& series = FamilyOf(name, help, Type::kCounter)->counters[LabelText(labels)];
  if (series == nullptr) series = std::make_unique<Counter>();
  return *series;
}

Gauge& MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  absl::MutexLock lock(&mutex_);
  auto& series = FamilyOf(name, help, Type::kGauge)->gauges[LabelText(labels)];
  if (series == nullptr) series = std::make_unique<Gauge>();
  return *series;
}

Histogram& MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const std::vector<double>& bounds,
                                         const MetricLabels& labels) {
  absl::MutexLock lock(&mutex_);
  auto& series = FamilyOf(name, help, Type::kHistogram)->histograms[LabelText(labels)];
  if (series == nullptr) series = std::make_unique<Histogram>(bounds);
  return *series;
}

std::string MetricsRegistry::Render() const {
  std::string text;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [name, family] : families_) {
      static const char* kTypes[] = {"counter", "gauge", "histogram"};
      absl::StrAppend(&text, "# HELP ", name, " ", family.help, "\n# TYPE ", name, " ",
                      kTypes[static_cast<int>(family.type)], "\n");
      for (const auto& [labels, counter] : family.counters) {
        absl::StrAppend(&text, name, labels, " ", Number(counter->value()), "\n");
      }
      for (const auto& [labels, gauge] : family.gauges) {
        absl::StrAppend(&text, name, labels, " ", Number(gauge->value()), "\n");
      }
      for (const auto& [labels, histogram] : family.histograms) {
        const std::vector<uint64_t> counts = histogram->CumulativeCounts();
        for (size_t b = 0; b < counts.size(); ++b) {
          const std::string le =
              b < histogram->bounds().size() ? Number(histogram->bounds()[b]) : "+Inf";
          absl::StrAppend(&text, name, "_bucket",
                          WithLabel(labels, absl::StrCat("le=\"", le, "\"")), " ", counts[b], "\n");
        }
        absl::StrAppend(&text, name, "_sum", labels, " ", Number(histogram->sum()), "\n", name,
                        "_count", labels, " ", counts.back(), "\n");
      }
    }
  }
  return text + ProcessMetrics();
}

}  // namespace stratum
