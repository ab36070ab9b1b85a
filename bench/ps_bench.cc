// Parameter-server throughput: W worker processes push a gradient of one variable and pull
// it back (one Push with pull_after per update) to one real stratum-ps, for 4 KiB to
// 16 MiB and 1 to 4 workers: updates/s and push+pull GB/s, against PyTorch's RPC
// parameter server (shared/peers/ps_torch_rpc.py) run side by side.
//
//   build/bin/ps_bench [--seconds=2] [--peers_dir=../shared/peers]
#include <unistd.h>

#include <cstdio>
#include <regex>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"
#include "stratum/ps/ps_client.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/util/flags.h"
#include "stratum/util/subprocess.h"

ABSL_FLAG(double, seconds, 2, "Seconds per measurement");
ABSL_FLAG(std::string, peers_dir, STRATUM_SOURCE_DIR "/../shared/peers", "Anchor programs");
ABSL_FLAG(std::string, worker_address, "", "Internal: run as one pushing worker against this PS");
ABSL_FLAG(int64_t, worker_bytes, 0, "Internal: gradient size of a worker");

namespace stratum {
namespace {

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.01}})");

std::string VariableName(int64_t bytes) { return absl::StrCat("v", bytes); }

// One worker process: push + pull for `seconds`, print {"updates": n, "seconds": t}.
int RunWorker(const std::string& address, int64_t bytes, double seconds) {
  PsClient client("ps:0", address);
  const std::string name = VariableName(bytes);
  Tensor gradient(DType::kFloat32, {bytes / 4});
  gradient.Flat().setConstant(1);
  std::vector<Tensor> pulled;
  if (!client.Push({{name, gradient}}, &pulled).ok()) return 1;  // warm-up
  int64_t updates = 0;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(seconds)) {
    absl::Status status = client.Push({{name, gradient}}, &pulled);
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
      return 1;
    }
    ++updates;
  }
  std::printf("{\"updates\": %lld, \"seconds\": %f}\n", static_cast<long long>(updates),
              absl::ToDoubleSeconds(absl::Now() - start));
  return 0;
}

// Starts W worker processes at once and sums their rates.
absl::StatusOr<double> MeasureUpdatesPerSec(const std::string& self, const std::string& address,
                                            int workers, int64_t bytes, double seconds) {
  std::vector<std::unique_ptr<Subprocess>> processes;
  for (int w = 0; w < workers; ++w) {
    SubprocessOptions options;
    options.argv = {self, "--worker_address=" + address, absl::StrCat("--worker_bytes=", bytes),
                    absl::StrCat("--seconds=", seconds)};
    options.forward_fd = -1;
    options.capture_output = true;
    auto process = Subprocess::Spawn(std::move(options));
    if (!process.ok()) return process.status();
    processes.push_back(*std::move(process));
  }
  double rate = 0;
  for (auto& process : processes) {
    auto exit = process->Wait(absl::Seconds(seconds + 60));
    if (!exit.ok() || !exit->success()) {
      return absl::InternalError(absl::StrCat("a worker failed: ", process->output()));
    }
    const nlohmann::json result = nlohmann::json::parse(process->output());
    rate += result["updates"].get<double>() / result["seconds"].get<double>();
  }
  return rate;
}

double TorchAnchor(int workers, int64_t bytes, double seconds) {
  absl::StatusOr<std::string> output =
      bench::RunProgram({"/usr/bin/python3", absl::GetFlag(FLAGS_peers_dir) + "/ps_torch_rpc.py",
                         std::to_string(workers), std::to_string(bytes), absl::StrCat(seconds)},
                        absl::Minutes(3));
  if (!output.ok()) return -1;
  static const std::regex kRate(R"(updates_per_s=([0-9.]+))");
  std::smatch match;
  if (!std::regex_search(*output, match, kRate)) return -1;
  return std::stod(match[1]);
}

std::string SelfPath() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return std::string(path, static_cast<size_t>(std::max<ssize_t>(length, 0)));
}

int Run() {
  const double seconds = absl::GetFlag(FLAGS_seconds);
  auto cluster = testing::LocalCluster::Start(
      {.num_workers = 1, .num_ps = 1, .not_started = {{"worker", 0}}, .forward_output = false});
  if (!cluster.ok()) {
    std::fprintf(stderr, "ps_bench: %s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  const std::string address = (*cluster)->Address({"ps", 0});
  PsClient client("ps:0", address);
  const std::vector<int64_t> sizes = {4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20};
  for (int64_t bytes : sizes) {
    if (!client.CreateVariables({{VariableName(bytes), Tensor(DType::kFloat32, {bytes / 4})}}, kSgd)
             .ok()) {
      return 1;
    }
  }
  const std::string self = SelfPath();
  std::map<std::pair<int, int64_t>, double> rates;
  for (int workers : {1, 2, 4}) {
    for (int64_t bytes : sizes) {
      auto rate = MeasureUpdatesPerSec(self, address, workers, bytes, seconds);
      if (!rate.ok()) {
        std::fprintf(stderr, "ps_bench: %s\n", std::string(rate.status().message()).c_str());
        return 1;
      }
      rates[{workers, bytes}] = *rate;
      std::printf("%s\n", nlohmann::json({{"benchmark", "ps_push_pull"},
                                          {"workers", workers},
                                          {"bytes", bytes},
                                          {"updates_per_sec", *rate},
                                          {"gb_per_sec", *rate * 2 * bytes / 1e9},
                                          {"unit", "updates/s"}})
                              .dump()
                              .c_str());
      std::fflush(stdout);
    }
  }
  // The two anchor configurations, PyTorch measured now, beside ours.
  struct Anchor {
    int workers;
    int64_t bytes;
    double factor;
    double seen;
  };
  for (const Anchor& anchor : {Anchor{1, 4 << 20, 2, 168}, Anchor{2, 4 << 10, 5, 1270}}) {
    const double torch = TorchAnchor(anchor.workers, anchor.bytes, seconds);
    const double ours = rates[{anchor.workers, anchor.bytes}];
    const double reference = torch > 0 ? torch : anchor.seen;
    std::printf("%s\n",
                nlohmann::json({{"benchmark", absl::StrCat("ps_vs_torch_rpc_", anchor.workers, "w_",
                                                           anchor.bytes, "B")},
                                {"value", ours / reference},
                                {"unit", "x PyTorch RPC"},
                                {"goal", anchor.factor},
                                {"goal_is", "at_least"},
                                {"met", ours / reference >= anchor.factor},
                                {"stratum_updates_per_sec", ours},
                                {"torch_updates_per_sec_now", torch},
                                {"torch_updates_per_sec_seen_before", anchor.seen}})
                    .dump()
                    .c_str());
  }
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv, "ps_bench: parameter-server push+pull throughput, as JSON");
  if (!absl::GetFlag(FLAGS_worker_address).empty()) {
    return stratum::RunWorker(absl::GetFlag(FLAGS_worker_address),
                              absl::GetFlag(FLAGS_worker_bytes), absl::GetFlag(FLAGS_seconds));
  }
  return stratum::Run();
}
