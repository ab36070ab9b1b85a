// What memory this process may still use, for checks that refuse a configuration before
// it allocates rather than after std::bad_alloc.
#pragma once

#include <cstdint>
#include <optional>

namespace stratum {

// Bytes this process may still allocate: MemAvailable, or less under the memory limit of
// its cgroup (v2) or of a cgroup above it (a container's, a Slurm job's), where what is
// left is the limit less the usage, page cache that can be dropped (inactive_file) not
// counted as used. nullopt when neither can be read.
std::optional<uint64_t> AvailableMemoryBytes();

}  // namespace stratum
