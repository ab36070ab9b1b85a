// All-reduce bus bandwidth of Stratum's collectives (ring over same-host Unix sockets, or
// loopback TCP with --nounix_sockets) for 4 KiB
// to 64 MiB float32 with 2 and 4 processes, beside Gloo's ring through PyTorch measured in
// the same run (when python3-torch is installed). busbw = algbw * 2(n-1)/n, as NCCL and
// the anchors report it. Each size: the median of 20 runs (8 from 16 MiB up) after 2
// warm-ups, every run started together (a 1-float all-reduce as the barrier). Stratum and
// Gloo take turns, twice each (S G G S), and each side's figure is the mean of its two,
// so that on a shared machine a load that changes during the run does not favour a side.
//
//   allreduce_bench            # parent: runs 2 and 4 processes, prints JSON lines
//   allreduce_bench --rank=R --size=N --leader=HOST:PORT   # one process (spawned)
#include <unistd.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "stratum/net/free_port.h"
#include "stratum/net/task_server.h"
#include "stratum/worker/collective/collectives.h"
#include "stratum/worker/coordination_grpc_service.h"
#include "stratum/worker/coordination_service.h"
#include "stratum/worker/multi_worker_job.h"
#include "worker/collective/tcp_transport.h"

ABSL_FLAG(int, rank, -1, "This process's rank (set by the parent)");
ABSL_FLAG(int, size, 0, "Number of processes (set by the parent)");
ABSL_FLAG(std::string, leader, "", "The coordination service's address (set by the parent)");
ABSL_FLAG(std::string, process_counts, "2,4", "Process counts to measure");
ABSL_FLAG(std::string, sizes_kib, "4,256,4096,16384,65536",
          "Sizes to measure in KiB (the parent passes them to its ranks)");
ABSL_FLAG(int, iterations, 0,
          "Timed runs per size; 0: 20 up to 4 MiB, 8 above (more for profiling)");
ABSL_FLAG(bool, gloo, true, "Also measure Gloo through PyTorch, side by side");
ABSL_FLAG(bool, unix_sockets, true,
          "Ranks reach each other over Unix sockets (the default for ranks of one host); "
          "false: loopback TCP only");
ABSL_FLAG(int, pairs, 2,
          "Runs of each side, taking turns (Stratum, Gloo, Gloo, Stratum, ...); figures are "
          "their means");

namespace stratum {
namespace {

std::vector<size_t> Sizes() {
  std::vector<size_t> sizes;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_sizes_kib), ',')) {
    sizes.push_back(std::stoul(std::string(part)) << 10);
  }
  return sizes;
}

// One rank: connects, measures every size, rank 0 prints "size median_s" lines.
int RunRank(int rank, int size, const std::string& leader) {
  CoordinationAgentOptions agent_options;
  agent_options.leader_address = leader;
  agent_options.task = {kWorker, rank};
  agent_options.connect_timeout = absl::Seconds(30);
  auto agent = CoordinationAgent::Connect(agent_options);
  if (!agent.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(agent.status().message()).c_str());
    return 1;
  }
  CoordinationRendezvous rendezvous(**agent);
  TcpTransportOptions tcp{.rank = rank,
                          .size = size,
                          .connect_timeout = absl::Seconds(30),
                          .same_host_unix_sockets = absl::GetFlag(FLAGS_unix_sockets)};
  auto transport = ConnectTcpTransport(tcp, rendezvous);
  if (!transport.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(transport.status().message()).c_str());
    return 1;
  }
  auto collectives = Collectives::Create(*std::move(transport), {.timeout = absl::Seconds(60)});
  if (!collectives.ok()) return 1;
  float token = 0;
  for (size_t bytes : Sizes()) {
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    const int iterations = absl::GetFlag(FLAGS_iterations) > 0 ? absl::GetFlag(FLAGS_iterations)
                           : bytes <= (4 << 20)                ? 20
                                                               : 8;
    std::vector<double> seconds;
    for (int i = 0; i < iterations + 2; ++i) {
      if (!(*collectives)->AllReduce(ReduceOp::kSum, &token, 1).ok()) return 1;  // barrier
      const absl::Time start = absl::Now();
      absl::Status status = (*collectives)->AllReduce(ReduceOp::kSum, data.data(), data.size());
      if (!status.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, std::string(status.message()).c_str());
        return 1;
      }
      if (i >= 2) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    std::sort(seconds.begin(), seconds.end());
    if (rank == 0) std::printf("%zu %.9f\n", bytes, seconds[seconds.size() / 2]);
  }
  (void)(*agent)->WaitAtBarrier("bench/end", absl::Seconds(30));
  (void)(*agent)->Disconnect();
  return 0;
}

// Runs `n` ranks; the median seconds per size.
absl::StatusOr<std::map<size_t, double>> MeasureStratum(int n) {
  std::vector<TaskKey> tasks;
  for (int r = 0; r < n; ++r) tasks.push_back({kWorker, r});
  CoordinationService service(CoordinationServiceOptions{.tasks = tasks});
  GrpcCoordinationService grpc_service(service);
  auto port = PickFreePort();
  if (!port.ok()) return port.status();
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  TaskServerOptions server_options;
  server_options.task = TaskKey{kChief, 0};
  server_options.binary = "allreduce_bench";
  server_options.listen_address = address;
  auto server = TaskServer::Start(server_options, {&grpc_service});
  if (!server.ok()) return server.status();
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return absl::InternalError("cannot find this program's path");
  const std::string program(self, static_cast<size_t>(length));
  std::vector<absl::StatusOr<std::string>> outputs(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      outputs[r] =
          bench::RunProgram({program, absl::StrCat("--rank=", r), absl::StrCat("--size=", n),
                             "--leader=" + address, "--sizes_kib=" + absl::GetFlag(FLAGS_sizes_kib),
                             absl::StrCat("--iterations=", absl::GetFlag(FLAGS_iterations)),
                             absl::StrCat("--unix_sockets=", absl::GetFlag(FLAGS_unix_sockets))},
                            absl::Minutes(10));
    });
  }
  for (auto& thread : threads) thread.join();
  grpc_service.Shutdown();
  (*server)->Shutdown(absl::Seconds(1));
  for (const auto& output : outputs) {
    if (!output.ok()) return output.status();
  }
  std::map<size_t, double> medians;
  std::istringstream lines(*outputs[0]);
  size_t bytes;
  double seconds;
  while (lines >> bytes >> seconds) medians[bytes] = seconds;
  return medians;
}

// Gloo through PyTorch, from ../shared/peers/allreduce_gloo.py: busbw per size.
std::map<size_t, double> MeasureGloo(int n) {
  std::map<size_t, double> busbw;
  const std::string script = std::string(STRATUM_SOURCE_DIR) + "/../shared/peers/allreduce_gloo.py";
  auto output =
      bench::RunProgram({"/usr/bin/python3", script, std::to_string(n)}, absl::Minutes(10));
  if (!output.ok()) {
    std::fprintf(stderr, "gloo anchor not measured: %s\n",
                 std::string(output.status().message()).substr(0, 300).c_str());
    return busbw;
  }
  const std::regex line(R"(bytes=(\d+) .*busbw_GBps=([0-9.]+))");
  for (std::sregex_iterator it(output->begin(), output->end(), line), end; it != end; ++it) {
    busbw[std::stoul((*it)[1])] = std::stod((*it)[2]);
  }
  return busbw;
}

// The mean of each size's figure over the runs that measured it.
std::map<size_t, double> Mean(const std::vector<std::map<size_t, double>>& runs) {
  std::map<size_t, double> sum;
  std::map<size_t, int> count;
  for (const auto& run : runs) {
    for (const auto& [bytes, value] : run) {
      sum[bytes] += value;
      ++count[bytes];
    }
  }
  for (auto& [bytes, value] : sum) value /= count[bytes];
  return sum;
}

int RunParent() {
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_process_counts), ',')) {
    counts.push_back(std::stoi(std::string(part)));
  }
  const int pairs = std::max(1, absl::GetFlag(FLAGS_pairs));
  for (int n : counts) {
    // Stratum and Gloo take turns (S G G S for two pairs), so a load that rises or falls
    // during the run weighs on both sides alike.
    std::vector<std::map<size_t, double>> stratum_busbw, stratum_seconds, gloo_busbw;
    for (int pair = 0; pair < pairs; ++pair) {
      for (int turn = 0; turn < 2; ++turn) {
        if ((turn == 0) == (pair % 2 == 1)) {
          if (absl::GetFlag(FLAGS_gloo)) gloo_busbw.push_back(MeasureGloo(n));
          continue;
        }
        auto medians = MeasureStratum(n);
        if (!medians.ok()) {
          std::fprintf(stderr, "allreduce_bench: %s\n",
                       std::string(medians.status().message()).c_str());
          return 1;
        }
        std::map<size_t, double> busbw;
        for (const auto& [bytes, seconds] : *medians) {
          busbw[bytes] = static_cast<double>(bytes) / seconds / 1e9 * 2.0 * (n - 1) / n;
        }
        stratum_busbw.push_back(std::move(busbw));
        stratum_seconds.push_back(*std::move(medians));
      }
    }
    const std::map<size_t, double> gloo = Mean(gloo_busbw);
    const std::map<size_t, double> seconds = Mean(stratum_seconds);
    for (const auto& [bytes, busbw] : Mean(stratum_busbw)) {
      const std::string setup = absl::StrCat(
          n, " processes, ", absl::GetFlag(FLAGS_unix_sockets) ? "Unix sockets" : "loopback TCP",
          ", ring, float32 ", bytes >> 10, " KiB, mean of ", pairs, " runs");
      const std::string name = absl::StrCat("allreduce_busbw_n", n, "_", bytes >> 10, "KiB");
      bench::PrintFigure(name, busbw, "GB/s", nlohmann::json(), "at_least", setup);
      if (bytes == (4 << 10) && n == 2) {
        bench::PrintFigure("allreduce_latency_n2_4KiB", seconds.at(bytes) * 1e3, "ms", 0.1,
                           "at_most", setup);
      }
      auto anchor = gloo.find(bytes);
      if (anchor != gloo.end() && anchor->second > 0) {
        bench::PrintFigure(absl::StrCat("gloo_busbw_n", n, "_", bytes >> 10, "KiB"), anchor->second,
                           "GB/s", nlohmann::json(), "at_least",
                           absl::StrCat(n,
                                        " processes, Gloo via PyTorch over loopback TCP, ring, "
                                        "float32 ",
                                        bytes >> 10, " KiB, mean of ", pairs, " runs"));
        bench::PrintFigure(
            absl::StrCat("allreduce_busbw_vs_gloo_n", n, "_", bytes >> 10, "KiB"),
            busbw / anchor->second, "x",
            bytes >= (4 << 20) ? nlohmann::json(1.5) : nlohmann::json(), "at_least",
            setup + ", side by side in this run, taking turns with Gloo (loopback TCP)");
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rank = absl::GetFlag(FLAGS_rank);
  if (rank >= 0) {
    return stratum::RunRank(rank, absl::GetFlag(FLAGS_size), absl::GetFlag(FLAGS_leader));
  }
  return stratum::RunParent();
}
