// stratum-ps: a parameter-server task. Holds variables and their optimizer state and
// applies the gradients workers push, as they arrive, on its TF_CONFIG address until
// SIGTERM/SIGINT. Large pushes and pulls may take its raw data path (--data_path), whose
// endpoint the gRPC service announces. After SIGTERM it serves on while its coordinator
// commits a checkpoint of the job's state (PsService::StopNeedNotWait), at most
// --stop_timeout.
#include <spdlog/spdlog.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "data_path.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/host_port.h"
#include "stratum/net/task_main.h"
#include "stratum/ps/ps_service.h"
#include "stratum/util/flags.h"

ABSL_FLAG(bool, data_path, true,
          "Serve pushes and pulls also on a raw socket beside gRPC (shared memory for workers "
          "on this host), announced through gRPC; with the cluster's mutual TLS on TCP when it "
          "has TLS");
ABSL_FLAG(int, data_port, 0, "The data path's TCP port; 0: any free port");
ABSL_FLAG(std::string, checkpoint_root, "",
          "The folder every job's checkpoint folder must be in: a coordinator that claims this "
          "PS with a checkpoint folder elsewhere is refused, so Save and Restore touch nothing "
          "outside it; empty: any folder the claiming coordinator declares");
ABSL_FLAG(absl::Duration, stop_timeout, absl::Seconds(20),
          "After SIGTERM, how long to serve on while the coordinator saves the job's state "
          "(it is told at once); less than the pod's terminationGracePeriodSeconds");

namespace {

// The coordinator watches every 0.5 s: 2 s without a word means it is gone.
constexpr absl::Duration kWatchWindow = absl::Seconds(2);

// A PS that goes takes the variables trained since the last checkpoint with it: while a
// coordinator that saves checkpoints watches, serve on until it has committed a checkpoint
// that holds them (it learns of the stop from its next Watch, and says the checkpoint is
// committed through the Watch after). A second signal exits at once (ShutdownWatcher).
void WaitForTheCoordinatorsSave(stratum::PsService& service, absl::Duration timeout) {
  service.BeginStopping();
  std::string why = service.StopNeedNotWait(kWatchWindow);
  if (!why.empty()) return;
  spdlog::info(
      "serving on until the coordinator has committed a checkpoint of the job's state (at most "
      "{})",
      absl::FormatDuration(timeout));
  const absl::Time deadline = absl::Now() + timeout;
  while ((why = service.StopNeedNotWait(kWatchWindow)).empty()) {
    if (absl::Now() >= deadline) {
      spdlog::warn("{}", service.StopWaitTimedOut(timeout));
      return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  spdlog::info("{}: stopping", why);
}

}  // namespace

int main(int argc, char** argv) {
  stratum::ShutdownWatcher shutdown;
  stratum::ParseFlagsOrExit(argc, argv,
                            "stratum-ps: a parameter-server task of a Stratum cluster.\n"
                            "Reads TF_CONFIG (task type \"ps\") and serves variables on the task's "
                            "address until SIGTERM.\nExit codes: 0 stopped cleanly, 1 failure, "
                            "2 configuration or usage error.");
  const stratum::TaskContext context =
      stratum::ResolveTaskOrExit({.binary = "stratum-ps", .task_types = {stratum::kPs}});
  if (absl::GetFlag(FLAGS_data_port) < 0 || absl::GetFlag(FLAGS_data_port) > 65535) {
    return stratum::ReportFatal(context.binary, absl::InvalidArgumentError(absl::StrCat(
                                                    "--data_port ", absl::GetFlag(FLAGS_data_port),
                                                    " is not a port: use 1 to 65535, or 0 for any "
                                                    "free port")));
  }
  stratum::VariableStore store;
  std::unique_ptr<stratum::PsDataServer> data_server;
  if (absl::GetFlag(FLAGS_data_path) && !context.listen_address.empty()) {
    stratum::PsDataServerOptions options{.host = stratum::HostOf(context.listen_address),
                                         .port = absl::GetFlag(FLAGS_data_port),
                                         .shutdown_grace = context.shutdown_grace};
    if (context.channel.tls) {
      absl::StatusOr<std::shared_ptr<const stratum::TlsContext>> tls =
          stratum::TlsContext::Create(*context.channel.tls);
      if (!tls.ok()) return stratum::ReportFatal(context.binary, tls.status());
      options.tls = *std::move(tls);
    }
    absl::StatusOr<std::unique_ptr<stratum::PsDataServer>> started =
        stratum::PsDataServer::Start(store, std::move(options));
    if (!started.ok()) return stratum::ReportFatal(context.binary, started.status());
    data_server = *std::move(started);
    spdlog::info("data path on TCP port {}{}{}", data_server->endpoint().tcp_port,
                 context.channel.tls ? " with mutual TLS" : "",
                 data_server->endpoint().unix_name.empty()
                     ? ""
                     : "; shared memory for workers on this host");
  }
  stratum::PsService service(
      store, data_server != nullptr ? data_server->endpoint() : stratum::DataPathEndpoint{});
  service.SetCheckpointRoot(absl::GetFlag(FLAGS_checkpoint_root));
  const int code = stratum::ServeUntilShutdown(context, shutdown, {&service}, [&service] {
    WaitForTheCoordinatorsSave(service, absl::GetFlag(FLAGS_stop_timeout));
  });
  if (data_server != nullptr) data_server->Shutdown();
  return code;
}
