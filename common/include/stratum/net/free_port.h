// Picks TCP ports that are free on this machine, for launchers and tests.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stratum {

// A port on `host` (an IPv4 or IPv6 address, or localhost) that nothing listens on now. Ports are
// drawn at random below the kernel's ephemeral range (32768+), so that they do not collide with the
// local ports of outgoing connections, and each is checked by binding it and claimed (ClaimPort),
// so that no other PickFreePort on this machine returns it while this process lives, even while the
// server that uses it is down between a stop and a restart. A program that binds ports by
// other means may still take it; callers start servers right away.
absl::StatusOr<int> PickFreePort(const std::string& host = "127.0.0.1");

// Claims `port` for the rest of this process's life against every other process's
// ClaimPort: an exclusive lock on a file named after the port in /tmp/stratum-port-claims,
// which the kernel drops when the process ends. False when another live process (or this
// one) holds it; true also when claims cannot be kept on this machine.
bool ClaimPort(int port);

// `count` different free ports on `host` (single picks may draw the same port twice).
absl::StatusOr<std::vector<int>> PickFreePorts(int count, const std::string& host = "127.0.0.1");

// The status code of a failed bind or listen with errno `error`: INVALID_ARGUMENT where only
// a change of address helps (the host is not this machine's, the port needs privileges), so
// that the process exits as misconfigured and is not restarted; else UNAVAILABLE.
absl::StatusCode ListenErrorCode(int error);

// Why a server could not listen on `address` ("host:port", as given to gRPC), found by
// binding it the same way: "<what> cannot listen on <address>: <cause>; <fix>", where `fix`
// says how to change the address. INVALID_ARGUMENT when the host is not an address of this
// machine or the port needs privileges; else UNAVAILABLE (the port is in use).
absl::Status ListenFailure(const std::string& what, const std::string& address,
                           const std::string& fix);

}  // namespace stratum
