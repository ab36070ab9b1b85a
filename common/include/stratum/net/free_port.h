// Picks TCP ports that are free on this machine, for launchers and tests.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stratum {

// A port on `host` that nothing listens on now. Ports are drawn at random below the
// kernel's ephemeral range (32768+), so that they do not collide with the local ports of
// outgoing connections, and each is checked by binding it. Another process may still take
// it before the caller binds it; callers start servers right away.
absl::StatusOr<int> PickFreePort(const std::string& host = "127.0.0.1");

// `count` different free ports on `host` (single picks may draw the same port twice).
absl::StatusOr<std::vector<int>> PickFreePorts(int count, const std::string& host = "127.0.0.1");

}  // namespace stratum
