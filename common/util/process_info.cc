#include "stratum/util/process_info.h"

#include <unistd.h>

#include <chrono>
#include <random>

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

}  // namespace stratum
