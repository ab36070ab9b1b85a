// Every task's /metrics as a real Prometheus (Debian's package, installed by the test's
// set-up fixture) scrapes it: a parameter-server cluster and a MultiWorkerMirrored cluster
// train on loopback, Prometheus scrapes all their tasks every second, and its HTTP API is
// asked for the series each role exports while the job trains.
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "stratum/net/free_port.h"
#include "stratum/net/http_server.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using testing::LocalCluster;
using testing::LocalClusterOptions;
using testing::RemoveFolder;
using testing::TempPath;

// A Prometheus server scraping `targets` ("127.0.0.1:port") every second, with its data in
// a temporary folder; stopped with the object.
class PrometheusServer {
 public:
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::vector<std::string>& targets) {
    auto server = std::unique_ptr<PrometheusServer>(new PrometheusServer());
    server->dir_ = TempPath("prometheus");
    RemoveFolder(server->dir_);
    std::filesystem::create_directories(server->dir_);
    std::vector<std::string> quoted;
    for (const std::string& target : targets) quoted.push_back("'" + target + "'");
    std::ofstream(server->dir_ + "/prometheus.yml")
        << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
        << "  - job_name: stratum\n    static_configs:\n      - targets: ["
        << absl::StrJoin(quoted, ", ") << "]\n";
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    server->port_ = *port;
    SubprocessOptions options;
    options.argv = {"/usr/bin/prometheus", "--config.file=" + server->dir_ + "/prometheus.yml",
                    "--storage.tsdb.path=" + server->dir_ + "/data",
                    "--web.listen-address=127.0.0.1:" + std::to_string(*port), "--log.level=warn"};
    options.forward_fd = -1;
    options.capture_output = true;
    absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Spawn(std::move(options));
    if (!process.ok()) return process.status();
    server->process_ = *std::move(process);
    for (const absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(200))) {
      absl::StatusOr<HttpResponse> ready = HttpGet("127.0.0.1", *port, "/-/ready");
      if (ready.ok() && ready->status == 200) return server;
    }
    return absl::DeadlineExceededError("Prometheus was not ready within 30 s: " +
                                       server->process_->output());
  }
  ~PrometheusServer() {
    process_.reset();  // stops it
    RemoveFolder(dir_);
  }

  // The samples of `query` now: {labels, value} per series.
  std::vector<std::pair<nlohmann::json, double>> Query(const std::string& query) const {
    std::string escaped;
    for (char c : query) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
        escaped += c;
      } else {
        escaped += absl::StrFormat("%%%02X", static_cast<unsigned char>(c));
      }
    }
    absl::StatusOr<HttpResponse> got =
        HttpGet("127.0.0.1", port_, "/api/v1/query?query=" + escaped);
    std::vector<std::pair<nlohmann::json, double>> samples;
    if (!got.ok() || got->status != 200) return samples;
    const nlohmann::json answer = nlohmann::json::parse(got->body, nullptr, false);
    if (answer.is_discarded() || answer["status"] != "success") return samples;
    for (const nlohmann::json& series : answer["data"]["result"]) {
      samples.emplace_back(series["metric"], std::stod(series["value"][1].get<std::string>()));
    }
    return samples;
  }

  // Waits up to `timeout` until every query of `wanted` has `count` series or more, each
  // above 0; the queries still short when it gives up (empty: all seen).
  std::vector<std::string> WaitFor(const std::vector<std::pair<std::string, size_t>>& wanted,
                                   absl::Duration timeout) const {
    std::vector<std::string> missing;
    for (const absl::Time deadline = absl::Now() + timeout;;
         absl::SleepFor(absl::Milliseconds(500))) {
      missing.clear();
      for (const auto& [query, count] : wanted) {
        const auto samples = Query(query);
        size_t above = 0;
        for (const auto& [labels, value] : samples) above += value > 0;
        if (above < count) missing.push_back(absl::StrCat(query, " (", above, " of ", count, ")"));
      }
      if (missing.empty() || absl::Now() > deadline) return missing;
    }
  }

 private:
  PrometheusServer() = default;
  std::string dir_;
  int port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

// Free ports for the metrics of `tasks`, set through STRATUM_METRICS_PORT; their targets.
std::vector<std::string> MetricsPorts(const std::vector<TaskKey>& tasks,
                                      LocalClusterOptions& options) {
  absl::StatusOr<std::vector<int>> ports = PickFreePorts(static_cast<int>(tasks.size()));
  EXPECT_TRUE(ports.ok()) << ports.status();
  std::vector<std::string> targets;
  for (size_t t = 0; t < tasks.size() && ports.ok(); ++t) {
    options.env_by_task.push_back(
        {tasks[t], {{"STRATUM_METRICS_PORT", std::to_string((*ports)[t])}}});
    targets.push_back("127.0.0.1:" + std::to_string((*ports)[t]));
  }
  return targets;
}

std::string LongJob(const std::string& example, const std::string& name) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/" + example);
  nlohmann::json job = nlohmann::json::parse(file);
  job.erase("checkpoint");
  job["fit"]["epochs"] = 100000;  // stopped once Prometheus has seen what it should
  job["fit"]["steps_per_epoch"] = 50;
  job["fit"]["validate"] = false;
  const std::string path = TempPath(name + ".json");
  std::ofstream(path) << job.dump();
  return path;
}

// Starts Prometheus scraping the metrics of `tasks`, then the cluster of `options` (so that
// Prometheus is ready before the tasks), and expects every query of `wanted` to be seen
// within 60 s while the job trains, with the output of `main_task` when not. Both, still
// running, for more queries (nulls when one did not start).
struct Scraped {
  std::unique_ptr<PrometheusServer> prometheus;
  std::unique_ptr<LocalCluster> cluster;  // destroyed first: the tasks stop, then Prometheus
};
Scraped ExpectScrapedWhileTraining(LocalClusterOptions options, const std::vector<TaskKey>& tasks,
                                   const std::vector<std::pair<std::string, size_t>>& wanted,
                                   const TaskKey& main_task) {
  const std::vector<std::string> targets = MetricsPorts(tasks, options);
  auto prometheus = PrometheusServer::Start(targets);
  EXPECT_TRUE(prometheus.ok()) << prometheus.status();
  if (!prometheus.ok()) return {};
  auto cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return {};
  const std::vector<std::string> missing = (*prometheus)->WaitFor(wanted, absl::Seconds(60));
  EXPECT_TRUE(missing.empty()) << "Prometheus never saw: " << absl::StrJoin(missing, "; ") << "\n"
                               << (*cluster)->Output(main_task);
  return {*std::move(prometheus), *std::move(cluster)};
}

TEST(PrometheusTest, ScrapesEveryTaskOfAParameterServerClusterWhileItTrains) {
  LocalClusterOptions options{
      .num_workers = 2,
      .num_ps = 2,
      .chief = true,
      .args_by_type = {{"chief", {"--job=" + LongJob("fashion_mnist_ps.json", "prometheus_ps")}}},
      .forward_output = false};
  const Scraped scraped = ExpectScrapedWhileTraining(
      options, {{"chief", 0}, {"worker", 0}, {"worker", 1}, {"ps", 0}, {"ps", 1}},
      {{"up", 5},
       {"stratum_task_info", 5},
       {"process_resident_memory_bytes", 5},
       {"stratum_training_steps_total", 1},
       {"stratum_training_step_seconds_count", 2},  // the workers' closures
       {"stratum_worker_closure_steps_total", 2},
       {"stratum_coordinator_closures_total", 1},
       {"stratum_coordinator_closures_queued >= 0", 1},
       {"stratum_ps_updates_total", 2},
       {"stratum_ps_pushed_bytes_total", 2},
       {"stratum_ps_pulled_bytes_total", 2},
       {"stratum_ps_request_seconds_count", 2},
       {"stratum_training_epoch", 1}},
      {"chief", 0});
  ASSERT_NE(scraped.prometheus, nullptr);
  // The tasks are told apart by their own label, whatever the scrape config calls them.
  std::vector<std::string> tasks;
  for (const auto& [labels, value] : scraped.prometheus->Query("stratum_task_info")) {
    tasks.push_back(labels["task"]);
  }
  std::sort(tasks.begin(), tasks.end());
  EXPECT_EQ(tasks, (std::vector<std::string>{"chief:0", "ps:0", "ps:1", "worker:0", "worker:1"}));
}

TEST(PrometheusTest, ScrapesTheAllReduceOfMultiWorkerMirroredWorkers) {
  LocalClusterOptions options{
      .num_workers = 2,
      .args_by_type = {{"worker",
                        {"--job=" + LongJob("fashion_mnist_mwms.json", "prometheus_mwms"),
                         "--cluster_timeout=30s"}}},
      .forward_output = false};
  ExpectScrapedWhileTraining(options, {{"worker", 0}, {"worker", 1}},
                             {{"up", 2},
                              {"stratum_allreduce_bytes_total", 2},
                              {"stratum_allreduce_seconds_count", 2},
                              {"stratum_training_steps_total", 2},
                              {"stratum_training_step_seconds_count", 2},
                              {"rate(stratum_training_steps_total[5s])", 2}},
                             {"worker", 0});
}

}  // namespace
}  // namespace stratum
