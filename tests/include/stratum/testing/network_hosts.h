// stratum::testing::NetworkHosts: several hosts simulated on this machine, for tests of
// what crosses a real network. Each host is a network namespace of its own with one
// address (10.213.0.1, 10.213.0.2, ...) on a shared switch: a bridge in one more
// namespace, joined to each host by a veth pair (its cable). Between hosts there is no
// loopback and no same-host shortcut (an abstract Unix socket is private to its
// namespace), so the TCP paths run as they would between machines; and Disconnect() pulls
// a host's cable: packets are dropped silently, with no reset, the network failure that
// leaves whatever has no deadline hanging.
//
//   auto hosts = NetworkHosts::Create(2);
//   argv = (*hosts)->OnHost(1, {"/path/stratum-worker", "--job=..."});  // runs on host 1
//   (*hosts)->Disconnect(1);
//
// Everything stays inside namespaces the fixture makes (and the destructor deletes): no
// address or route of this machine's own network changes. Needs root and iproute2's `ip`;
// Unsupported() says why not, for a test to skip with.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stratum::testing {

class NetworkHosts {
 public:
  // Why hosts cannot be made here (not root, no `ip`), or "" when they can.
  static std::string Unsupported();
  // Makes `count` hosts, all cabled to the switch.
  static absl::StatusOr<std::unique_ptr<NetworkHosts>> Create(int count);
  ~NetworkHosts();
  NetworkHosts(const NetworkHosts&) = delete;
  NetworkHosts& operator=(const NetworkHosts&) = delete;

  int size() const { return count_; }
  // Host `host`'s address, "10.213.0.<host + 1>".
  std::string Ip(int host) const;
  // `argv` as a command line that runs it on `host` (`ip netns exec <namespace> argv...`;
  // the program keeps its process id, so signals reach it).
  std::vector<std::string> OnHost(int host, const std::vector<std::string>& argv) const;
  // Pulls the host's cable out of the switch (its port goes down: every packet to or from
  // it is dropped, nobody is told), and plugs it back in.
  absl::Status Disconnect(int host);
  absl::Status Reconnect(int host);
  // Shapes what `host` sends to `bits_per_second` (tc's token bucket on its cable), as a
  // NIC of that speed; 0 removes the limit. Needs tc (iproute2).
  absl::Status LimitRate(int host, int64_t bits_per_second);

 private:
  NetworkHosts(std::string prefix, int count) : prefix_(std::move(prefix)), count_(count) {}
  std::string HostNamespace(int host) const;
  std::string SwitchNamespace() const;

  const std::string prefix_;
  const int count_;
};

}  // namespace stratum::testing
