#include "stratum/util/process_info.h"

#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "stratum/util/version.h"

namespace stratum {
namespace {

struct ProcessFacts {
  ProcessFacts() : start(std::chrono::steady_clock::now()) {
    std::random_device device;
    std::mt19937_64 engine((static_cast<uint64_t>(device()) << 32) ^ device());
    do {
      incarnation = engine();
    } while (incarnation == 0);
  }
  std::chrono::steady_clock::time_point start;
  uint64_t incarnation = 0;
};

const ProcessFacts& Facts() {
  static const ProcessFacts facts;
  return facts;
}

}  // namespace

const char* StratumVersion() { return kStratumVersion; }

uint64_t ProcessIncarnation() { return Facts().incarnation; }

namespace {

std::string RandomSecret() {
  std::string bytes(16, '\0');
  size_t filled = 0;
  while (filled < bytes.size()) {
    const ssize_t got = getrandom(bytes.data() + filled, bytes.size() - filled, 0);
    if (got > 0) {
      filled += static_cast<size_t>(got);
    } else if (errno != EINTR) {
      // No kernel randomness (a very old kernel): the C++ library's device instead.
      std::random_device device;
      for (; filled < bytes.size(); ++filled) bytes[filled] = static_cast<char>(device());
    }
  }
  return bytes;
}

}  // namespace

const std::string& ProcessSecret() {
  static const std::string* const secret = new std::string(RandomSecret());
  return *secret;
}

const std::string& ProcessWorkerSecret() {
  static const std::string* const secret = new std::string(RandomSecret());
  return *secret;
}

const std::string& HostName() {
  static const std::string* const name = [] {
    char buffer[256] = {};
    return new std::string(gethostname(buffer, sizeof(buffer) - 1) == 0 ? buffer : "?");
  }();
  return *name;
}

double ProcessUptimeSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - Facts().start).count();
}

void RemoveLeftoversOfDeadProcesses(const std::string& folder, const std::string& prefix) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t digits = name.find_last_not_of("0123456789") + 1;
    int pid = 0;
    if (!absl::SimpleAtoi(name.substr(digits), &pid) || pid <= 0 || pid == getpid()) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code ignored;
    std::filesystem::remove_all(entry.path(), ignored);
  }
}

}  // namespace stratum
