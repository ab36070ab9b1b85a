// Facts about the running process that status calls report: its incarnation (random per
// start, so a restarted task is told apart from the one before it), uptime and version.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace stratum {

// Stratum's version, e.g. "0.1.0".
const char* StratumVersion();

// A random, non-zero 64-bit id drawn once per process.
uint64_t ProcessIncarnation();

// This machine's host name ("?" when it cannot be read), read once.
const std::string& HostName();

// Seconds since ProcessIncarnation() or ProcessUptimeSeconds() was first called (both are
// called at the start of every main).
double ProcessUptimeSeconds();

}  // namespace stratum
