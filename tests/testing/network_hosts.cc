#include "stratum/testing/network_hosts.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/util/status_macros.h"
#include "stratum/util/subprocess.h"

namespace stratum::testing {
namespace {

std::string IpProgram() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// Runs `ip args...` and waits for it; the error quotes the command and what it printed.
absl::Status RunIp(const std::vector<std::string>& args) {
  SubprocessOptions options;
  options.argv = {IpProgram()};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  if (options.argv.front().empty()) return absl::FailedPreconditionError("no `ip` program");
  options.forward_fd = -1;
  options.capture_output = true;
  STRATUM_ASSIGN_OR_RETURN(auto process, Subprocess::Spawn(options));
  STRATUM_ASSIGN_OR_RETURN(ExitInfo exit, process->Wait(absl::Seconds(20)));
  if (exit.success()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("`ip ", absl::StrJoin(args, " "), "` ", exit.ToString(),
                                          ": ", process->output()));
}

}  // namespace

std::string NetworkHosts::Unsupported() {
  if (geteuid() != 0) return "simulated hosts need root (network namespaces)";
  if (IpProgram().empty()) return "simulated hosts need iproute2's `ip` (apt-get install iproute2)";
  return "";
}

absl::StatusOr<std::unique_ptr<NetworkHosts>> NetworkHosts::Create(int count) {
  if (std::string why = Unsupported(); !why.empty()) return absl::FailedPreconditionError(why);
  if (count < 1 || count > 250) {
    return absl::InvalidArgumentError(absl::StrCat(count, " hosts: make 1 to 250"));
  }
  // Unique per process and per call, so tests running side by side never share a name.
  static std::atomic<int> made{0};
  std::unique_ptr<NetworkHosts> hosts(
      new NetworkHosts(absl::StrCat("stratum-", getpid(), "-", made++), count));
  const std::string sw = hosts->SwitchNamespace();
  STRATUM_RETURN_IF_ERROR(RunIp({"netns", "add", sw}));
  STRATUM_RETURN_IF_ERROR(RunIp({"-n", sw, "link", "add", "br0", "type", "bridge"}));
  STRATUM_RETURN_IF_ERROR(RunIp({"-n", sw, "link", "set", "br0", "up"}));
  for (int host = 0; host < count; ++host) {
    const std::string ns = hosts->HostNamespace(host);
    const std::string port = absl::StrCat("port", host);
    STRATUM_RETURN_IF_ERROR(RunIp({"netns", "add", ns}));
    // The cable: eth0 on the host, its other end a port of the switch's bridge.
    STRATUM_RETURN_IF_ERROR(RunIp(
        {"-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", sw}));
    STRATUM_RETURN_IF_ERROR(RunIp({"-n", sw, "link", "set", port, "master", "br0", "up"}));
    STRATUM_RETURN_IF_ERROR(
        RunIp({"-n", ns, "addr", "add", absl::StrCat(hosts->Ip(host), "/24"), "dev", "eth0"}));
    STRATUM_RETURN_IF_ERROR(RunIp({"-n", ns, "link", "set", "eth0", "up"}));
    STRATUM_RETURN_IF_ERROR(RunIp({"-n", ns, "link", "set", "lo", "up"}));
  }
  return hosts;
}

NetworkHosts::~NetworkHosts() {
  // Deleting a namespace also deletes the veth pairs in it; one not made yet is skipped.
  for (int host = 0; host < count_; ++host) {
    if (std::filesystem::exists("/run/netns/" + HostNamespace(host))) {
      (void)RunIp({"netns", "del", HostNamespace(host)});
    }
  }
  if (std::filesystem::exists("/run/netns/" + SwitchNamespace())) {
    (void)RunIp({"netns", "del", SwitchNamespace()});
  }
}

std::string NetworkHosts::Ip(int host) const { return absl::StrCat("10.213.0.", host + 1); }

std::vector<std::string> NetworkHosts::OnHost(int host,
                                              const std::vector<std::string>& argv) const {
  std::vector<std::string> command = {IpProgram(), "netns", "exec", HostNamespace(host)};
  command.insert(command.end(), argv.begin(), argv.end());
  return command;
}

absl::Status NetworkHosts::Disconnect(int host) {
  return RunIp({"-n", SwitchNamespace(), "link", "set", absl::StrCat("port", host), "down"});
}

absl::Status NetworkHosts::LimitRate(int host, int64_t bits_per_second) {
  if (bits_per_second <= 0) {
    return RunIp(
        {"netns", "exec", HostNamespace(host), "tc", "qdisc", "del", "dev", "eth0", "root"});
  }
  // A token bucket (tbf): netem, which would add delay, is not in every kernel. Its burst
  // holds a millisecond at the rate (at least 64 KiB), as a NIC's queue would.
  const int64_t burst = std::max<int64_t>(64 << 10, bits_per_second / 8 / 1000);
  return RunIp({"netns", "exec", HostNamespace(host), "tc", "qdisc", "replace", "dev", "eth0",
                "root", "tbf", "rate", absl::StrCat(bits_per_second, "bit"), "burst",
                absl::StrCat(burst), "latency", "10ms"});
}

absl::Status NetworkHosts::Reconnect(int host) {
  return RunIp({"-n", SwitchNamespace(), "link", "set", absl::StrCat("port", host), "up"});
}

std::string NetworkHosts::HostNamespace(int host) const {
  return absl::StrCat(prefix_, "-h", host);
}

std::string NetworkHosts::SwitchNamespace() const { return prefix_ + "-sw"; }

}  // namespace stratum::testing
