// Picks TCP ports that are free on this machine, for launchers and tests.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stratum {

// A port on `host` that nothing listens on now. Ports are drawn at random below the
// kernel's ephemeral range (32768+), so that they do not collide with the local ports of
// outgoing connections, and each is checked by binding it and claimed (ClaimPort), so that
// no other PickFreePort on this machine returns it while this process lives, even while the
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

}  // namespace stratum
