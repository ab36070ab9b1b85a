// stratum-health: one grpc.health.v1 check of a task, what Kubernetes' native gRPC probe
// does, for places that run a command instead (a compose file's healthcheck, an exec
// probe, a script waiting for a cluster):
//
//   stratum-health --address=localhost:8081      exit 0 when the task reports SERVING,
//                                                1 with the reason when it does not
//
// A task's health port (--health_port) serves the health service alone, in plaintext; a
// TLS cluster's gRPC port takes the cluster's certificates, from --tls_cert, --tls_key and
// --tls_ca or STRATUM_TLS_* as the task binaries take them (so a check run in a task's
// container uses that task's certificates).
#include <cstdio>
#include <string>

#include <grpc/support/log.h>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "stratum/net/health.h"
#include "stratum/net/task_main.h"
#include "stratum/net/tls.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/flags.h"

ABSL_FLAG(std::string, address, "localhost:8081", "the task's health address, host:port");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(1),
          "how long to wait for the answer (Kubernetes' probes default to 1s)");

namespace {

constexpr char kUsage[] =
    "stratum-health --address=HOST:PORT [--timeout=1s] [--tls_cert=F --tls_key=F --tls_ca=F]: "
    "exits 0 when the task answers SERVING, 1 (saying why) when it does not";

}  // namespace

int main(int argc, char** argv) {
  using namespace stratum;
  ParseFlagsOrExit(argc, argv, kUsage);
  // gRPC's own error lines (a failed TLS handshake, in OpenSSL's words) would come before
  // the one sentence below, which already says what failed.
  gpr_set_log_function([](gpr_log_func_args*) {});
  const std::string address = absl::GetFlag(FLAGS_address);
  if (absl::Status valid =
          CheckDurationFlag("--timeout", absl::GetFlag(FLAGS_timeout), absl::Milliseconds(1),
                            "a check needs time to answer", "--timeout=1s");
      !valid.ok()) {
    std::fprintf(stderr, "stratum-health: %s\n", std::string(valid.message()).c_str());
    return kExitUsage;
  }
  ChannelOptions channel;
  if (const TlsFiles files = TlsFilesFromFlags(); !files.empty()) {
    absl::StatusOr<TlsCredentials> tls = LoadTlsCredentials(files);
    if (!tls.ok()) {
      std::fprintf(stderr, "stratum-health: %s\n", std::string(tls.status().message()).c_str());
      return kExitUsage;
    }
    channel.tls = *std::move(tls);
  }
  absl::Status health = CheckHealth(address, absl::GetFlag(FLAGS_timeout), channel);
  if (!health.ok()) {
    std::fprintf(stderr, "stratum-health: %s is not serving: %s\n", address.c_str(),
                 std::string(health.message()).c_str());
    return kExitFailure;
  }
  std::printf("%s: SERVING\n", address.c_str());
  return kExitSuccess;
}
