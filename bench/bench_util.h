// What the benchmarks share: running a program to its end for its output, a cluster's TLS
// certificates, and printing one figure as one JSON line beside its goal.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "stratum/net/tls.h"
#include "stratum/util/subprocess.h"

namespace stratum::bench {

// Runs `argv` with its output captured; the output, or an error with it when the program
// fails or outlives `timeout`.
inline absl::StatusOr<std::string> RunProgram(std::vector<std::string> argv,
                                              absl::Duration timeout = absl::Minutes(20)) {
  const std::string program = argv.front();
  SubprocessOptions options;
  options.argv = std::move(argv);
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  if (!process.ok()) return process.status();
  auto exit = (*process)->Wait(timeout);
  if (!exit.ok()) return exit.status();
  if (!exit->success()) {
    return absl::InternalError(
        absl::StrCat(program, " ", exit->ToString(), ": ", (*process)->output()));
  }
  return (*process)->output();
}

// Makes a cluster's certificates in `dir` with `source_dir`/deploy/make_tls_certs.sh, as
// users make them; the benchmarks' processes check them for the name "stratum" (the
// simulated hosts' addresses are not in them).
inline absl::Status MakeCertificates(const std::string& source_dir, const std::string& dir) {
  return RunProgram({source_dir + "/deploy/make_tls_certs.sh", dir}, absl::Minutes(1)).status();
}

// The credentials MakeCertificates wrote to `dir`.
inline absl::StatusOr<TlsCredentials> CertificatesIn(const std::string& dir) {
  return LoadTlsCredentials({dir + "/tls.crt", dir + "/tls.key", dir + "/ca.crt", "stratum"});
}

// The last line of `output` that is a JSON object: what a benchmark's worker process printed
// as its result, after whatever it logged (merged stdout and stderr).
inline nlohmann::json LastJsonLine(const std::string& output) {
  size_t end = output.size();
  while (end > 0) {
    const size_t start = output.rfind('\n', end - 1);
    const size_t from = start == std::string::npos ? 0 : start + 1;
    if (from < end && output[from] == '{') {
      return nlohmann::json::parse(output.substr(from, end - from), nullptr, false);
    }
    if (start == std::string::npos) break;
    end = start;
  }
  return nlohmann::json::value_t::discarded;
}

// One figure: {"benchmark", "value", "unit", "goal", "goal_is", "met", "setup"}. A goal of
// null (an anchor, or a figure reported without a goal) prints no "met".
inline void PrintFigure(const std::string& name, double value, const std::string& unit,
                        const nlohmann::json& goal, const std::string& goal_is,
                        const std::string& setup) {
  nlohmann::json line = {{"benchmark", name}, {"value", value},     {"unit", unit},
                         {"goal", goal},      {"goal_is", goal_is}, {"setup", setup}};
  if (goal.is_number()) {
    const double target = goal.get<double>();
    line["met"] = goal_is == "at_most" ? value <= target : value >= target;
  }
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

// Puts the model and compile settings of the job file `example` (such as
// examples/fashion_mnist_cnn.json) into `job`, which keeps its data, fit and strategy: a
// benchmark of one job trained with another example's model.
inline void UseModelOf(const std::string& example, nlohmann::json& job) {
  std::ifstream file(example);
  const nlohmann::json other = nlohmann::json::parse(file);
  job["model"] = other["model"];
  job["compile"] = other["compile"];
}

}  // namespace stratum::bench
