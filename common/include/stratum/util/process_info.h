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

// 16 random bytes drawn once per process from the kernel (getrandom), which the process
// never publishes: a coordinator proves with it that a call comes from the coordinator that
// claimed a parameter server or worker (its incarnation is public: status calls report it).
const std::string& ProcessSecret();
// Another 16 random bytes, which a coordinator hands the workers it sets up (they check its
// closures with it): a worker learns nothing that lets it act as the coordinator towards the
// parameter servers.
const std::string& ProcessWorkerSecret();

// This machine's host name ("?" when it cannot be read), read once.
const std::string& HostName();

// Seconds since ProcessIncarnation() or ProcessUptimeSeconds() was first called (both are
// called at the start of every main).
double ProcessUptimeSeconds();

// Removes what processes killed mid-write left in `folder`: each entry (file or folder)
// whose name starts with `prefix` and ends with the pid of a process that no longer exists
// ("checkpoint.tmp.4242", "stratum-backup-worker-1-4242"). Those of live processes stay.
void RemoveLeftoversOfDeadProcesses(const std::string& folder, const std::string& prefix);

}  // namespace stratum
