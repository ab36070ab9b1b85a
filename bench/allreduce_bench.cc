// All-reduce bus bandwidth of Stratum's collectives (ring over same-host Unix sockets, or
// loopback TCP with --nounix_sockets) for 4 KiB
// to 64 MiB float32 with 2 and 4 processes, beside Gloo's ring through PyTorch measured in
// the same run (when python3-torch is installed). busbw = algbw * 2(n-1)/n, as NCCL and
// the anchors report it. Each size: the median of 20 runs (8 from 16 MiB up) after 2
// warm-ups, every run started together (a 1-float all-reduce as the barrier). Stratum and
// Gloo take turns, twice each (S G G S), and each side's figure is the mean of its two,
// so that on a shared machine a load that changes during the run does not favour a side.
// With --network_hosts every rank (Stratum's and Gloo's) runs on a simulated host of its
// own (tests' NetworkHosts: a network namespace per host, veth cables to one bridge), so
// the bytes cross a network path as between machines, optionally limited to --link_gbit.
// OpenMPI's MPI_Allreduce (../shared/peers/allreduce_mpi.c, built with mpicc) runs in the
// anchors' turns on the same path: its TCP transport where Stratum's ranks use TCP (on
// hosts, mpirun in host 0's namespace starts its daemons on the others through a launch
// agent that enters their namespaces), its shared memory where they use Unix sockets.
//
//   allreduce_bench            # parent: runs 2 and 4 processes, prints JSON lines
//   allreduce_bench --network_hosts [--link_gbit=1]   # each rank on its own host (root)
//   allreduce_bench --rank=R --size=N --leader=HOST:PORT   # one process (spawned)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "stratum/net/free_port.h"
#include "stratum/net/task_server.h"
#include "stratum/net/tls.h"
#include "stratum/testing/network_hosts.h"
#include "stratum/util/status_macros.h"
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
ABSL_FLAG(bool, mpi, true, "Also measure OpenMPI's MPI_Allreduce (mpicc, mpirun), side by side");
ABSL_FLAG(bool, unix_sockets, true,
          "Ranks reach each other over Unix sockets (the default for ranks of one host); "
          "false: loopback TCP only");
ABSL_FLAG(bool, network_hosts, false,
          "Each rank on a simulated host of its own (a network namespace on a bridge), TCP "
          "between them; needs root and iproute2");
ABSL_FLAG(double, link_gbit, 0,
          "With --network_hosts: each host sends at most this many Gbit/s (tc token bucket); "
          "0: as fast as the veth cables go");
ABSL_FLAG(bool, tls, false,
          "Stratum's TCP links speak mutual TLS (certificates made by deploy/make_tls_certs.sh); "
          "the anchors stay plaintext");
ABSL_FLAG(std::string, tls_dir, "", "Internal: this rank's TLS certificates");
ABSL_FLAG(std::string, host, "127.0.0.1", "Internal: the address this rank listens on");
ABSL_FLAG(bool, serve_leader, false,
          "Internal: this rank serves the coordination service on --leader");
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

// The coordination service of `size` ranks, served at `address` while it lives.
class Leader {
 public:
  static absl::StatusOr<std::unique_ptr<Leader>> Serve(int size, const std::string& address) {
    std::vector<TaskKey> tasks;
    for (int r = 0; r < size; ++r) tasks.push_back({kWorker, r});
    std::unique_ptr<Leader> leader(new Leader(CoordinationServiceOptions{.tasks = tasks}));
    TaskServerOptions options;
    options.task = TaskKey{kChief, 0};
    options.binary = "allreduce_bench";
    options.listen_address = address;
    STRATUM_ASSIGN_OR_RETURN(leader->server_, TaskServer::Start(options, {&leader->grpc_}));
    return leader;
  }
  ~Leader() {
    grpc_.Shutdown();
    server_->Shutdown(absl::Seconds(1));
  }
  CoordinationService& service() { return service_; }

 private:
  explicit Leader(CoordinationServiceOptions options) : service_(options), grpc_(service_) {}

  CoordinationService service_;
  GrpcCoordinationService grpc_;
  std::unique_ptr<TaskServer> server_;
};

// One rank: connects, measures every size, rank 0 prints "size median_s" lines.
int RunRank(int rank, int size, const std::string& leader_address) {
  // On simulated hosts no parent's address is reachable: rank 0 serves the leader.
  std::unique_ptr<Leader> leader;
  if (absl::GetFlag(FLAGS_serve_leader)) {
    absl::StatusOr<std::unique_ptr<Leader>> served = Leader::Serve(size, leader_address);
    if (!served.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(served.status().message()).c_str());
      return 1;
    }
    leader = *std::move(served);
  }
  CoordinationAgentOptions agent_options;
  agent_options.leader_address = leader_address;
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
                          .host = absl::GetFlag(FLAGS_host),
                          .connect_timeout = absl::Seconds(30),
                          .same_host_unix_sockets = absl::GetFlag(FLAGS_unix_sockets)};
  if (const std::string dir = absl::GetFlag(FLAGS_tls_dir); !dir.empty()) {
    absl::StatusOr<TlsCredentials> credentials = bench::CertificatesIn(dir);
    absl::StatusOr<std::shared_ptr<const TlsContext>> tls =
        credentials.ok() ? TlsContext::Create(*credentials)
                         : absl::StatusOr<std::shared_ptr<const TlsContext>>(credentials.status());
    if (!tls.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(tls.status().message()).c_str());
      return 1;
    }
    tcp.tls = *std::move(tls);
  }
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
  if (leader != nullptr) {
    // The others disconnect after the barrier; a moment for them before the leader goes.
    (void)leader->service().AwaitEveryTaskTold(absl::Milliseconds(200));
  }
  return 0;
}

// This program's own path, to start its ranks.
absl::StatusOr<std::string> ThisProgram() {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return absl::InternalError("cannot find this program's path");
  return std::string(self, static_cast<size_t>(length));
}

// Runs `argvs` at once, each with a deadline; their outputs.
absl::StatusOr<std::vector<std::string>> RunTogether(
    const std::vector<std::vector<std::string>>& argvs) {
  std::vector<absl::StatusOr<std::string>> outputs(argvs.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < argvs.size(); ++r) {
    threads.emplace_back([&, r] { outputs[r] = bench::RunProgram(argvs[r], absl::Minutes(10)); });
  }
  for (auto& thread : threads) thread.join();
  std::vector<std::string> texts;
  for (auto& output : outputs) {
    if (!output.ok()) return output.status();
    texts.push_back(*std::move(output));
  }
  return texts;
}

// The certificates of --tls, made once; "" when they cannot be.
const std::string& TlsCertificates() {
  static const std::string* const dir = [] {
    const std::string made = "/tmp/allreduce_bench_certs";
    const absl::Status status = bench::MakeCertificates(STRATUM_SOURCE_DIR, made);
    if (!status.ok()) {
      std::fprintf(stderr, "allreduce_bench: --tls: %s\n", std::string(status.message()).c_str());
    }
    return new std::string(status.ok() ? made : "");
  }();
  return *dir;
}

// Runs `n` ranks (each on a host of `hosts` when given); the median seconds per size.
absl::StatusOr<std::map<size_t, double>> MeasureStratum(int n, const testing::NetworkHosts* hosts) {
  STRATUM_ASSIGN_OR_RETURN(const std::string program, ThisProgram());
  auto port = PickFreePort();
  if (!port.ok()) return port.status();
  std::unique_ptr<Leader> leader;
  std::string address = absl::StrCat("127.0.0.1:", *port);
  if (hosts != nullptr) {
    address = absl::StrCat(hosts->Ip(0), ":", *port);  // served by rank 0
  } else {
    STRATUM_ASSIGN_OR_RETURN(leader, Leader::Serve(n, address));
  }
  std::vector<std::vector<std::string>> argvs;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = {
        program,
        absl::StrCat("--rank=", r),
        absl::StrCat("--size=", n),
        "--leader=" + address,
        "--sizes_kib=" + absl::GetFlag(FLAGS_sizes_kib),
        absl::StrCat("--iterations=", absl::GetFlag(FLAGS_iterations)),
        absl::StrCat("--unix_sockets=", hosts == nullptr && absl::GetFlag(FLAGS_unix_sockets))};
    if (absl::GetFlag(FLAGS_tls)) argv.push_back("--tls_dir=" + TlsCertificates());
    if (hosts != nullptr) {
      argv.push_back("--host=" + hosts->Ip(r));
      if (r == 0) argv.push_back("--serve_leader");
      argv = hosts->OnHost(r, argv);
    }
    argvs.push_back(std::move(argv));
  }
  absl::StatusOr<std::vector<std::string>> outputs = RunTogether(argvs);
  leader.reset();
  if (!outputs.ok()) return outputs.status();
  std::map<size_t, double> medians;
  std::istringstream lines((*outputs)[0]);
  size_t bytes;
  double seconds;
  while (lines >> bytes >> seconds) medians[bytes] = seconds;
  return medians;
}

// Parses the anchors' lines "... bytes=B ... busbw_GBps=X" into busbw per size.
std::map<size_t, double> AnchorBusbw(const std::string& output) {
  std::map<size_t, double> busbw;
  const std::regex line(R"(bytes=(\d+) .*busbw_GBps=([0-9.]+))");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    busbw[std::stoul((*it)[1])] = std::stod((*it)[2]);
  }
  return busbw;
}

// Gloo through PyTorch, from ../shared/peers/allreduce_gloo.py: busbw per size. On
// simulated hosts each rank runs the anchor's own loop on its host (bench/gloo_rank.py),
// rank 0's host the rendezvous.
std::map<size_t, double> MeasureGloo(int n, const testing::NetworkHosts* hosts) {
  const std::string script = std::string(STRATUM_SOURCE_DIR) + "/../shared/peers/allreduce_gloo.py";
  std::vector<std::vector<std::string>> argvs;
  if (hosts == nullptr) {
    argvs.push_back({"/usr/bin/python3", script, std::to_string(n)});
  } else {
    for (int r = 0; r < n; ++r) {
      argvs.push_back(
          hosts->OnHost(r, {"/usr/bin/env", "MASTER_ADDR=" + hosts->Ip(0), "MASTER_PORT=29533",
                            "GLOO_SOCKET_IFNAME=eth0", "/usr/bin/python3",
                            std::string(STRATUM_SOURCE_DIR) + "/bench/gloo_rank.py", script,
                            std::to_string(r), std::to_string(n)}));
    }
  }
  absl::StatusOr<std::vector<std::string>> outputs = RunTogether(argvs);
  if (!outputs.ok()) {
    std::fprintf(stderr, "gloo anchor not measured: %s\n",
                 std::string(outputs.status().message()).substr(0, 300).c_str());
    return {};
  }
  return AnchorBusbw((*outputs)[0]);
}

// Builds ../shared/peers/allreduce_mpi.c once; its path, or "" without mpicc.
const std::string& MpiAnchor() {
  static const std::string* const built = [] {
    const std::string binary = "/tmp/stratum_allreduce_mpi";
    absl::StatusOr<std::string> made = bench::RunProgram(
        {"/usr/bin/mpicc", "-O2",
         std::string(STRATUM_SOURCE_DIR) + "/../shared/peers/allreduce_mpi.c", "-o", binary},
        absl::Minutes(2));
    if (!made.ok()) {
      std::fprintf(stderr, "mpi anchor not built: %s\n",
                   std::string(made.status().message()).substr(0, 300).c_str());
    }
    return new std::string(made.ok() ? binary : "");
  }();
  return *built;
}

// OpenMPI's MPI_Allreduce on `n` ranks: over TCP (`tcp`) or shared memory; on `hosts`, one
// rank per host, mpirun on host 0 reaching the others through a launch agent that runs
// its daemon in their namespace (with a host name of its own: OpenMPI tells nodes apart
// by name).
std::map<size_t, double> MeasureMpi(int n, bool tcp, const testing::NetworkHosts* hosts) {
  const std::string& binary = MpiAnchor();
  if (binary.empty()) return {};
  std::vector<std::string> argv = {"/usr/bin/mpirun",
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "-np",
                                   std::to_string(n),
                                   "--mca",
                                   "btl",
                                   tcp ? "tcp,self" : "vader,self"};
  if (hosts != nullptr) {
    const std::string agent = "/tmp/stratum_mpi_netns_agent.sh";
    std::string script =
        "#!/bin/sh\n# mpirun's launch agent: HOST COMMAND... in HOST's namespace\n"
        "host=$1; shift\ncase $host in\n";
    std::vector<std::string> slots;
    for (int r = 0; r < n; ++r) {
      // OnHost gives "ip netns exec NAMESPACE argv...".
      const std::string ns = hosts->OnHost(r, {"true"})[3];
      absl::StrAppend(&script, "  ", hosts->Ip(r), ") ns=", ns, "; name=mpihost", r, " ;;\n");
      slots.push_back(hosts->Ip(r) + ":1");
    }
    absl::StrAppend(&script,
                    "  *) echo \"no namespace for $host\" >&2; exit 1 ;;\nesac\n"
                    "exec ip netns exec \"$ns\" unshare --uts sh -c \"hostname $name; $*\"\n");
    std::ofstream(agent) << script;
    chmod(agent.c_str(), 0755);
    argv.insert(argv.end(),
                {"--host", absl::StrJoin(slots, ","), "--mca", "plm_rsh_agent", agent, "--mca",
                 "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0"});
    argv.push_back(binary);
    // mpirun itself runs on host 0, under a name of its own too.
    std::vector<std::string> wrapped = {"/usr/bin/unshare", "--uts", "/bin/sh", "-c",
                                        "hostname mpihost0; exec \"$0\" \"$@\""};
    wrapped.insert(wrapped.end(), argv.begin(), argv.end());
    argv = hosts->OnHost(0, wrapped);
  } else {
    if (tcp) argv.insert(argv.end(), {"--mca", "btl_tcp_if_include", "lo"});
    argv.push_back(binary);
  }
  absl::StatusOr<std::string> output = bench::RunProgram(argv, absl::Minutes(10));
  if (!output.ok()) {
    std::fprintf(stderr, "mpi anchor not measured: %s\n",
                 std::string(output.status().message()).substr(0, 600).c_str());
    return {};
  }
  return AnchorBusbw(*output);
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
  const bool on_hosts = absl::GetFlag(FLAGS_network_hosts);
  const double link_gbit = absl::GetFlag(FLAGS_link_gbit);
  // How the ranks reach each other, as the figures' setup says it.
  std::string path = absl::GetFlag(FLAGS_unix_sockets) ? "Unix sockets" : "loopback TCP";
  if (absl::GetFlag(FLAGS_tls)) {
    if (TlsCertificates().empty()) return 2;
    if (!on_hosts && absl::GetFlag(FLAGS_unix_sockets)) {
      std::fprintf(stderr,
                   "allreduce_bench: --tls needs TCP: add --nounix_sockets or --network_hosts\n");
      return 2;
    }
  }
  std::string gloo_path = "loopback TCP";
  if (on_hosts) {
    path = link_gbit > 0
               ? absl::StrCat("TCP between network namespaces, links of ", link_gbit, " Gbit/s")
               : "TCP between network namespaces (veth)";
    gloo_path = path;
  }
  if (absl::GetFlag(FLAGS_tls)) absl::StrAppend(&path, " with mutual TLS");
  for (int n : counts) {
    std::unique_ptr<testing::NetworkHosts> hosts;
    if (on_hosts) {
      absl::StatusOr<std::unique_ptr<testing::NetworkHosts>> made =
          testing::NetworkHosts::Create(n);
      if (!made.ok()) {
        std::fprintf(stderr, "allreduce_bench: --network_hosts: %s\n",
                     std::string(made.status().message()).c_str());
        return 2;
      }
      hosts = *std::move(made);
      for (int host = 0; host < n && link_gbit > 0; ++host) {
        if (absl::Status limited = hosts->LimitRate(host, static_cast<int64_t>(link_gbit * 1e9));
            !limited.ok()) {
          std::fprintf(stderr, "allreduce_bench: --link_gbit: %s\n",
                       std::string(limited.message()).c_str());
          return 2;
        }
      }
    }
    // Stratum and Gloo take turns (S G G S for two pairs), so a load that rises or falls
    // during the run weighs on both sides alike.
    std::vector<std::map<size_t, double>> stratum_busbw, stratum_seconds, gloo_busbw, mpi_busbw;
    const bool tcp = on_hosts || !absl::GetFlag(FLAGS_unix_sockets);
    for (int pair = 0; pair < pairs; ++pair) {
      for (int turn = 0; turn < 2; ++turn) {
        if ((turn == 0) == (pair % 2 == 1)) {
          if (absl::GetFlag(FLAGS_gloo)) gloo_busbw.push_back(MeasureGloo(n, hosts.get()));
          if (absl::GetFlag(FLAGS_mpi)) mpi_busbw.push_back(MeasureMpi(n, tcp, hosts.get()));
          continue;
        }
        auto medians = MeasureStratum(n, hosts.get());
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
    const std::map<size_t, double> mpi = Mean(mpi_busbw);
    const std::map<size_t, double> seconds = Mean(stratum_seconds);
    for (const auto& [bytes, busbw] : Mean(stratum_busbw)) {
      const std::string setup = absl::StrCat(n, " processes, ", path, ", ring, float32 ",
                                             bytes >> 10, " KiB, mean of ", pairs, " runs");
      const std::string name = absl::StrCat("allreduce_busbw_n", n, "_", bytes >> 10, "KiB");
      bench::PrintFigure(name, busbw, "GB/s", nlohmann::json(), "at_least", setup);
      if (bytes == (4 << 10) && n == 2) {
        bench::PrintFigure("allreduce_latency_n2_4KiB", seconds.at(bytes) * 1e3, "ms",
                           on_hosts ? 0.15 : 0.1, "at_most", setup);
      }
      if (link_gbit > 0 && on_hosts) {
        // What the link allows is its rate: busbw is what each link carries each way.
        bench::PrintFigure(absl::StrCat("allreduce_busbw_of_link_n", n, "_", bytes >> 10, "KiB"),
                           busbw * 8 / link_gbit, "x",
                           bytes >= (16 << 20) ? nlohmann::json(0.9) : nlohmann::json(), "at_least",
                           setup);
      }
      auto anchor = gloo.find(bytes);
      if (anchor != gloo.end() && anchor->second > 0) {
        bench::PrintFigure(
            absl::StrCat("gloo_busbw_n", n, "_", bytes >> 10, "KiB"), anchor->second, "GB/s",
            nlohmann::json(), "at_least",
            absl::StrCat(n, " processes, Gloo via PyTorch over ", gloo_path, ", ring, float32 ",
                         bytes >> 10, " KiB, mean of ", pairs, " runs"));
        bench::PrintFigure(
            absl::StrCat("allreduce_busbw_vs_gloo_n", n, "_", bytes >> 10, "KiB"),
            busbw / anchor->second, "x",
            bytes >= (4 << 20) ? nlohmann::json(1.5) : nlohmann::json(), "at_least",
            setup + ", side by side in this run, taking turns with Gloo (" + gloo_path + ")");
      }
      if (auto found = mpi.find(bytes); found != mpi.end() && found->second > 0) {
        const std::string mpi_path = tcp ? gloo_path : "shared memory (vader)";
        bench::PrintFigure(
            absl::StrCat("mpi_busbw_n", n, "_", bytes >> 10, "KiB"), found->second, "GB/s",
            nlohmann::json(), "at_least",
            absl::StrCat(n, " processes, OpenMPI MPI_Allreduce over ", mpi_path, ", float32 ",
                         bytes >> 10, " KiB, mean of ", pairs, " runs"));
        // The goal holds TCP to TCP on loopback; on one host MPI's shared memory is reported
        // beside. Between namespaces OpenMPI 4.1's ranks sleep in its progress loop (8 ms per
        // 4 KiB all-reduce, in nanosleep, CPUs idle): a figure to report, not to meet.
        const bool comparable = tcp && !on_hosts && bytes >= (4 << 20);
        bench::PrintFigure(
            absl::StrCat("allreduce_busbw_vs_mpi_n", n, "_", bytes >> 10, "KiB"),
            busbw / found->second, "x", comparable ? nlohmann::json(0.9) : nlohmann::json(),
            "at_least",
            setup + ", side by side in this run, taking turns with OpenMPI (" + mpi_path + ")");
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
