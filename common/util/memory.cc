#include "stratum/util/memory.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stratum {

std::optional<uint64_t> AvailableMemoryBytes() {
  std::optional<uint64_t> available;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    uint64_t kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lu kB", &kib) == 1) available = kib * 1024;
  }
  std::string path;
  std::ifstream cgroup("/proc/self/cgroup");
  for (std::string line; std::getline(cgroup, line);) {
    if (absl::StartsWith(line, "0::")) path = line.substr(3);
  }
  for (std::string dir = absl::StrCat("/sys/fs/cgroup", path == "/" ? "" : path);;) {
    std::ifstream max_file(dir + "/memory.max");
    std::ifstream current_file(dir + "/memory.current");
    std::string max_text;
    uint64_t limit = 0;
    uint64_t current = 0;
    if (max_file >> max_text && absl::SimpleAtoi(max_text, &limit) && current_file >> current) {
      uint64_t reclaimable = 0;
      std::ifstream stat(dir + "/memory.stat");
      for (std::string line; std::getline(stat, line);) {
        uint64_t bytes = 0;
        if (std::sscanf(line.c_str(), "inactive_file %lu", &bytes) == 1) reclaimable = bytes;
      }
      const uint64_t used = current > reclaimable ? current - reclaimable : 0;
      const uint64_t left = limit > used ? limit - used : 0;
      available = available ? std::min(*available, left) : left;
    }
    if (dir == "/sys/fs/cgroup") break;
    dir = dir.substr(0, dir.rfind('/'));
  }
  return available;
}

}  // namespace stratum
