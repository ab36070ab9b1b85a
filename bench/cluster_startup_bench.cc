// How fast a local cluster comes up and answers: the start-up a user waits for before any
// training step, and the cost of one health check (the coordinator's wait, Kubernetes'
// probes). Prints one JSON object per figure, beside its goal.
//
//   build/bin/cluster_startup_bench [--repeats=5] [--health_checks=2000]
#include <algorithm>
#include <cstdio>
#include <vector>

#include <grpcpp/client_context.h>
#include "absl/flags/flag.h"

#include "proto/health.grpc.pb.h"
#include "stratum/net/channel.h"
#include "stratum/net/health.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/util/flags.h"
#include "stratum/util/subprocess.h"

ABSL_FLAG(int, repeats, 5, "Cluster start-ups to time (the median is reported)");
ABSL_FLAG(int, health_checks, 2000, "Health checks to time on one warm channel");

namespace stratum {
namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double Percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(fraction * values.size()))];
}

void Print(const char* name, double value, const char* unit, double goal, const char* goal_is,
           const char* setup) {
  std::printf(
      "{\"benchmark\": \"%s\", \"value\": %.3f, \"unit\": \"%s\", \"goal\": %.3f, "
      "\"goal_is\": \"%s\", \"met\": %s, \"setup\": \"%s\"}\n",
      name, value, unit, goal, goal_is,
      (goal_is[0] == 'a' ? value <= goal : value >= goal) ? "true" : "false", setup);
  std::fflush(stdout);
}

int Run() {
  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::vector<double> start_ms;
  std::unique_ptr<testing::LocalCluster> cluster;
  for (int i = 0; i < repeats; ++i) {
    cluster.reset();
    const absl::Time start = absl::Now();
    auto started =
        testing::LocalCluster::Start({.num_workers = 2, .num_ps = 2, .forward_output = false});
    if (!started.ok()) {
      std::fprintf(stderr, "cluster_startup_bench: %s\n",
                   std::string(started.status().message()).c_str());
      return 1;
    }
    start_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    cluster = *std::move(started);
  }
  Print("local_cluster_start_to_healthy", Median(start_ms), "ms", 1000, "at_most",
        "2 workers + 2 ps, real binaries on loopback, median");

  const std::string address = cluster->Address({"worker", 0});
  const int checks = absl::GetFlag(FLAGS_health_checks);
  // Cold: a new channel per check, as a Kubernetes probe or a first contact does.
  std::vector<double> cold_us;
  for (int i = 0; i < checks / 4; ++i) {
    const absl::Time start = absl::Now();
    if (!CheckHealth(address, absl::Seconds(5)).ok()) return 1;
    cold_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  // Warm: one channel, as the coordinator's repeated checks of a peer.
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel(address));
  std::vector<double> warm_us;
  for (int i = 0; i < checks; ++i) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::health::v1::HealthCheckResponse response;
    const absl::Time start = absl::Now();
    if (!stub->Check(&context, {}, &response).ok()) return 1;
    warm_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  Print("health_check_cold_p50", Percentile(cold_us, 0.5), "us", 5000, "at_most",
        "grpc.health.v1 Check on a new channel (connect + call), loopback");
  Print("health_check_warm_p50", Percentile(warm_us, 0.5), "us", 200, "at_most",
        "grpc.health.v1 Check on a connected channel, loopback");
  Print("health_check_warm_p99", Percentile(warm_us, 0.99), "us", 1000, "at_most",
        "grpc.health.v1 Check on a connected channel, loopback");
  cluster.reset();

  std::vector<double> job_ms;
  for (int i = 0; i < repeats; ++i) {
    SubprocessOptions launch;
    launch.argv = {std::string(STRATUM_BIN_DIR) + "/stratum-launch", "--chief", "--workers=2",
                   "--ps=2"};
    launch.forward_fd = -1;
    const absl::Time start = absl::Now();
    auto process = Subprocess::Spawn(std::move(launch));
    if (!process.ok()) return 1;
    auto exit = (*process)->Wait(absl::Minutes(1));
    if (!exit.ok() || !exit->success()) return 1;
    job_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  Print("launch_main_job_wall", Median(job_ms), "ms", 2000, "at_most",
        "stratum-launch --chief --workers 2 --ps 2: start, check, stop; median");
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv, "cluster_startup_bench: local cluster start-up figures");
  return stratum::Run();
}
