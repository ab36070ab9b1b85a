// stratum-ps: a parameter-server task. Holds variables and their optimizer state and
// applies the gradients workers push, as they arrive, on its TF_CONFIG address until
// SIGTERM/SIGINT.
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/task_main.h"
#include "stratum/ps/ps_service.h"
#include "stratum/util/flags.h"

int main(int argc, char** argv) {
  stratum::ShutdownWatcher shutdown;
  stratum::ParseFlagsOrExit(argc, argv,
                            "stratum-ps: a parameter-server task of a Stratum cluster.\n"
                            "Reads TF_CONFIG (task type \"ps\") and serves variables on the task's "
                            "address until SIGTERM.\nExit codes: 0 stopped cleanly, 1 failure, "
                            "2 configuration or usage error.");
  const stratum::TaskContext context =
      stratum::ResolveTaskOrExit({.binary = "stratum-ps", .task_types = {stratum::kPs}});
  stratum::VariableStore store;
  stratum::PsService service(store);
  return stratum::ServeUntilShutdown(context, shutdown, {&service});
}
