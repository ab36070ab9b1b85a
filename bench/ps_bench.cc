// Parameter-server throughput: W worker processes push a gradient of one variable and pull
// it back (one Push with pull_after per update) to one real stratum-ps, for 4 KiB to
// 16 MiB and 1 to 4 workers: updates/s and push+pull GB/s, against PyTorch's RPC
// parameter server (shared/peers/ps_torch_rpc.py) run side by side. Workers here share
// the PS's host, so they take the data path's shared memory, as PyTorch's TensorPipe
// takes its shared-memory and cross-memory-attach channels; the data path's TCP and gRPC
// are measured too, at 4 MiB with one worker. With --network_hosts the PS and each worker
// (Stratum's and PyTorch's) run on simulated hosts of their own (tests' NetworkHosts: a
// network namespace per host, veth cables to one bridge), so every push crosses TCP as
// between machines. With --tls, last, a PS under mutual TLS (certificates from
// deploy/make_tls_certs.sh) and one worker on its data path's TCP with TLS at 4 MiB,
// against the plaintext TCP figure of the same run.
//
//   build/bin/ps_bench [--seconds=2] [--peers_dir=../shared/peers] [--sweep=false]
//                      [--transports=auto,tcp,grpc] [--anchors=false] [--network_hosts]
//                      [--tls]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"
#include "stratum/net/tls.h"
#include "stratum/ps/ps_client.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/network_hosts.h"
#include "stratum/util/flags.h"
#include "stratum/util/subprocess.h"

ABSL_FLAG(double, seconds, 2, "Seconds per measurement");
ABSL_FLAG(std::string, peers_dir, STRATUM_SOURCE_DIR "/../shared/peers", "Anchor programs");
ABSL_FLAG(bool, sweep, true, "Measure every size with 1, 2 and 4 workers");
ABSL_FLAG(std::vector<std::string>, transports, std::vector<std::string>({"tcp", "grpc"}),
          "Transports to measure at 4 MiB with one worker: auto, tcp, grpc");
ABSL_FLAG(bool, anchors, true, "Measure the PyTorch anchors and compare");
ABSL_FLAG(bool, network_hosts, false,
          "The PS and each worker on a simulated host of its own (a network namespace on a "
          "bridge), TCP between them; needs root and iproute2");
ABSL_FLAG(bool, tls, false,
          "Also measure the data path's TCP under mutual TLS (4 MiB, 1 worker), last");
ABSL_FLAG(std::string, worker_address, "", "Internal: run as one pushing worker against this PS");
ABSL_FLAG(std::string, worker_tls_dir, "",
          "Internal: the worker speaks mutual TLS with the certificates in this folder");
ABSL_FLAG(bool, worker_creates, false,
          "Internal: the worker creates the variable first (the parent cannot reach the PS)");
ABSL_FLAG(int64_t, worker_bytes, 0, "Internal: gradient size of a worker");
ABSL_FLAG(std::string, worker_transport, "auto",
          "Internal: auto (the data path, shared memory on this host), tcp (the data path "
          "without shared memory) or grpc");

namespace stratum {
namespace {

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.01}})");

std::string VariableName(int64_t bytes) { return absl::StrCat("v", bytes); }

// One worker process: push + pull for `seconds`, print {"updates": n, "seconds": t}.
int RunWorker(const std::string& address, int64_t bytes, double seconds,
              const std::string& transport) {
  PsClientOptions options;
  if (transport == "grpc") options.data_path_min_bytes = -1;
  if (transport == "tcp") options.shared_memory = false;
  if (const std::string dir = absl::GetFlag(FLAGS_worker_tls_dir); !dir.empty()) {
    absl::StatusOr<TlsCredentials> tls = bench::CertificatesIn(dir);
    if (!tls.ok()) {
      std::fprintf(stderr, "%s\n", std::string(tls.status().message()).c_str());
      return 1;
    }
    options.channel.tls = *tls;
  }
  PsClient client("ps:0", address, options);
  const std::string name = VariableName(bytes);
  if (absl::GetFlag(FLAGS_worker_creates)) {
    // Idempotent: the workers of one measurement create the same variable. The PS on its
    // host may still be starting (nobody health-checks it there): retried for a while.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    absl::Status created;
    do {
      created =
          client.CreateVariables({{name, Tensor(DType::kFloat32, {bytes / 4})}}, kSgd).status();
      if (!absl::IsUnavailable(created)) break;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", std::string(created.message()).c_str());
      return 1;
    }
  }
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
  std::printf("%s\n", nlohmann::json({{"updates", updates},
                                      {"seconds", absl::ToDoubleSeconds(absl::Now() - start)},
                                      {"transport", client.transport()}})
                          .dump()
                          .c_str());
  return 0;
}

struct Rate {
  double updates_per_sec = 0;
  std::string transport;  // what the workers' PsClient used
};

// Starts W worker processes at once (worker w on host w + 1 of `hosts` when given) and sums
// their rates.
absl::StatusOr<Rate> MeasureUpdatesPerSec(const std::string& self, const std::string& address,
                                          int workers, int64_t bytes, double seconds,
                                          const std::string& transport,
                                          const testing::NetworkHosts* hosts,
                                          const std::string& tls_dir = "") {
  std::vector<std::unique_ptr<Subprocess>> processes;
  for (int w = 0; w < workers; ++w) {
    SubprocessOptions options;
    options.argv = {self, "--worker_address=" + address, absl::StrCat("--worker_bytes=", bytes),
                    absl::StrCat("--seconds=", seconds), "--worker_transport=" + transport};
    if (!tls_dir.empty()) {
      options.argv.push_back("--worker_tls_dir=" + tls_dir);
      options.argv.push_back("--worker_creates");
    }
    if (hosts != nullptr) {
      options.argv.push_back("--worker_creates");
      options.argv = hosts->OnHost(w + 1, options.argv);
    }
    options.forward_fd = -1;
    options.capture_output = true;
    auto process = Subprocess::Spawn(std::move(options));
    if (!process.ok()) return process.status();
    processes.push_back(*std::move(process));
  }
  Rate rate;
  for (auto& process : processes) {
    auto exit = process->Wait(absl::Seconds(seconds + 60));
    if (!exit.ok() || !exit->success()) {
      return absl::InternalError(absl::StrCat("a worker failed: ", process->output()));
    }
    const nlohmann::json result = bench::LastJsonLine(process->output());
    if (!result.is_object()) {
      return absl::InternalError(absl::StrCat("a worker printed no result: ", process->output()));
    }
    rate.updates_per_sec += result["updates"].get<double>() / result["seconds"].get<double>();
    rate.transport = result["transport"].get<std::string>();
  }
  return rate;
}

void PrintRate(int workers, int64_t bytes, const Rate& rate) {
  std::printf("%s\n", nlohmann::json({{"benchmark", "ps_push_pull"},
                                      {"workers", workers},
                                      {"bytes", bytes},
                                      {"transport", rate.transport},
                                      {"updates_per_sec", rate.updates_per_sec},
                                      {"gb_per_sec", rate.updates_per_sec * 2 * bytes / 1e9},
                                      {"unit", "updates/s"}})
                          .dump()
                          .c_str());
  std::fflush(stdout);
}

// On simulated hosts: the anchor's PS (rank 0) on host 0 and worker w on host w, each
// running the anchor's own loop (bench/torch_rpc_rank.py); the sum of the workers' rates.
double TorchAnchorOnHosts(int workers, int64_t bytes, double seconds,
                          const testing::NetworkHosts& hosts) {
  std::vector<absl::StatusOr<std::string>> outputs(static_cast<size_t>(workers) + 1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank <= workers; ++rank) {
    threads.emplace_back([&, rank] {
      outputs[static_cast<size_t>(rank)] = bench::RunProgram(
          hosts.OnHost(rank,
                       {"/usr/bin/env", "MASTER_ADDR=" + hosts.Ip(0), "MASTER_PORT=29544",
                        "TP_SOCKET_IFNAME=eth0", "GLOO_SOCKET_IFNAME=eth0", "/usr/bin/python3",
                        std::string(STRATUM_SOURCE_DIR) + "/bench/torch_rpc_rank.py",
                        absl::GetFlag(FLAGS_peers_dir) + "/ps_torch_rpc.py", std::to_string(rank),
                        std::to_string(workers), std::to_string(bytes), absl::StrCat(seconds)}),
          absl::Minutes(3));
    });
  }
  for (auto& thread : threads) thread.join();
  static const std::regex kResult(R"(updates=(\d+) seconds=([0-9.]+))");
  double rate = 0;
  for (int rank = 1; rank <= workers; ++rank) {
    const absl::StatusOr<std::string>& output = outputs[static_cast<size_t>(rank)];
    std::smatch match;
    if (!output.ok() || !std::regex_search(*output, match, kResult)) {
      std::fprintf(stderr, "the PyTorch RPC anchor on hosts failed: %s\n",
                   output.ok() ? output->c_str() : std::string(output.status().message()).c_str());
      return -1;
    }
    rate += std::stod(match[1]) / std::stod(match[2]);
  }
  return rate;
}

double TorchAnchor(int workers, int64_t bytes, double seconds, const testing::NetworkHosts* hosts) {
  if (hosts != nullptr) return TorchAnchorOnHosts(workers, bytes, seconds, *hosts);
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

// A PS under mutual TLS and one worker on its data path's TCP, at 4 MiB: updates/s, and
// over `tcp_rate` (plaintext TCP in the same run) when measured.
int MeasureTls(const std::string& self, double seconds, double tcp_rate,
               const testing::NetworkHosts* hosts) {
  const std::string certs = "/tmp/ps_bench_certs";
  const absl::Status made = bench::MakeCertificates(STRATUM_SOURCE_DIR, certs);
  ChannelOptions channel;  // for the health checks on one host
  if (absl::StatusOr<TlsCredentials> tls = bench::CertificatesIn(certs); tls.ok()) {
    channel.tls = *std::move(tls);
  }
  auto cluster =
      made.ok()
          ? testing::LocalCluster::Start(
                {.num_workers = 1,
                 .num_ps = 1,
                 .not_started = {{"worker", 0}},
                 .all_args = {"--tls_cert=" + certs + "/tls.crt", "--tls_key=" + certs + "/tls.key",
                              "--tls_ca=" + certs + "/ca.crt", "--tls_server_name=stratum"},
                 .forward_output = false,
                 .channel = &channel,
                 .hosts = hosts})
          : absl::StatusOr<std::unique_ptr<testing::LocalCluster>>(made);
  absl::StatusOr<Rate> rate = cluster.ok()
                                  ? MeasureUpdatesPerSec(self, (*cluster)->Address({"ps", 0}), 1,
                                                         4 << 20, seconds, "tcp", hosts, certs)
                                  : absl::StatusOr<Rate>(cluster.status());
  if (!rate.ok()) {
    std::fprintf(stderr, "ps_bench: --tls: %s\n", std::string(rate.status().message()).c_str());
    return 1;
  }
  PrintRate(1, 4 << 20, *rate);
  if (tcp_rate > 0) {
    bench::PrintFigure("ps_tls_vs_plaintext_tcp_4MiB_1w", rate->updates_per_sec / tcp_rate, "x",
                       nlohmann::json(), "reported",
                       hosts != nullptr ? "TCP between network namespaces" : "loopback TCP");
  }
  return 0;
}

int Run() {
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::unique_ptr<testing::NetworkHosts> hosts;
  if (absl::GetFlag(FLAGS_network_hosts)) {
    // The PS, and up to 4 workers.
    absl::StatusOr<std::unique_ptr<testing::NetworkHosts>> made = testing::NetworkHosts::Create(5);
    if (!made.ok()) {
      std::fprintf(stderr, "ps_bench: --network_hosts: %s\n",
                   std::string(made.status().message()).c_str());
      return 2;
    }
    hosts = *std::move(made);
  }
  auto cluster = testing::LocalCluster::Start({.num_workers = 1,
                                               .num_ps = 1,
                                               .not_started = {{"worker", 0}},
                                               .forward_output = false,
                                               .hosts = hosts.get()});
  if (!cluster.ok()) {
    std::fprintf(stderr, "ps_bench: %s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  const std::string address = (*cluster)->Address({"ps", 0});
  const std::vector<int64_t> sizes = {4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20};
  if (hosts == nullptr) {  // on hosts, the workers create what they push
    PsClient client("ps:0", address);
    for (int64_t bytes : sizes) {
      if (!client
               .CreateVariables({{VariableName(bytes), Tensor(DType::kFloat32, {bytes / 4})}}, kSgd)
               .ok()) {
        return 1;
      }
    }
  }
  const std::string self = SelfPath();
  auto measure = [&](int workers, int64_t bytes, const std::string& transport) -> Rate {
    absl::StatusOr<Rate> rate =
        MeasureUpdatesPerSec(self, address, workers, bytes, seconds, transport, hosts.get());
    if (!rate.ok()) {
      std::fprintf(stderr, "ps_bench: %s\n", std::string(rate.status().message()).c_str());
      // exit() runs no destructors: the PS is stopped and the hosts' namespaces deleted first.
      cluster->reset();
      hosts.reset();
      std::exit(1);
    }
    return *rate;
  };
  for (int workers : {1, 2, 4}) {
    for (int64_t bytes : sizes) {
      if (absl::GetFlag(FLAGS_sweep)) PrintRate(workers, bytes, measure(workers, bytes, "auto"));
    }
  }
  // What each transport gives at the size of the first anchor: the data path's shared
  // memory (a worker on the PS's host), its TCP (a worker elsewhere), and gRPC.
  double tcp_rate = 0;
  for (const std::string& transport : absl::GetFlag(FLAGS_transports)) {
    const Rate rate = measure(1, 4 << 20, transport);
    if (transport == "tcp") tcp_rate = rate.updates_per_sec;
    PrintRate(1, 4 << 20, rate);
  }
  // The two anchor configurations: PyTorch, then ours right after it, so that both meet the
  // same load on this shared machine.
  struct Anchor {
    int workers;
    int64_t bytes;
    double factor;
    double seen;
  };
  for (const Anchor& anchor : {Anchor{1, 4 << 20, 2, 168}, Anchor{2, 4 << 10, 5, 1270}}) {
    if (!absl::GetFlag(FLAGS_anchors)) break;
    const double torch = TorchAnchor(anchor.workers, anchor.bytes, seconds, hosts.get());
    const Rate ours = measure(anchor.workers, anchor.bytes, "auto");
    // The figure seen before is of one host: no stand-in for a run between hosts.
    const double reference = torch > 0 ? torch : hosts == nullptr ? anchor.seen : -1;
    if (reference <= 0) continue;
    const double ratio = ours.updates_per_sec / reference;
    std::printf(
        "%s\n",
        nlohmann::json({{"benchmark",
                         absl::StrCat("ps_vs_torch_rpc_", anchor.workers, "w_", anchor.bytes, "B")},
                        {"value", ratio},
                        {"unit", "x PyTorch RPC"},
                        {"goal", anchor.factor},
                        {"goal_is", "at_least"},
                        {"met", ratio >= anchor.factor},
                        {"stratum_updates_per_sec", ours.updates_per_sec},
                        {"stratum_transport", ours.transport},
                        {"path", hosts != nullptr ? "TCP between network namespaces" : "one host"},
                        {"torch_updates_per_sec_now", torch},
                        {"torch_updates_per_sec_seen_before", anchor.seen}})
            .dump()
            .c_str());
    std::fflush(stdout);
  }
  if (absl::GetFlag(FLAGS_tls)) {
    cluster->reset();  // its PS holds the hosts' port
    return MeasureTls(self, seconds, tcp_rate, hosts.get());
  }
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv, "ps_bench: parameter-server push+pull throughput, as JSON");
  if (!absl::GetFlag(FLAGS_worker_address).empty()) {
    return stratum::RunWorker(absl::GetFlag(FLAGS_worker_address),
                              absl::GetFlag(FLAGS_worker_bytes), absl::GetFlag(FLAGS_seconds),
                              absl::GetFlag(FLAGS_worker_transport));
  }
  return stratum::Run();
}
