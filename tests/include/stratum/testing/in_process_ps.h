// InProcessPs: a parameter-server service (PsService over a TaskServer) in the test's own
// process, on a picked free loopback port. A test stops it and starts it again on the same
// port as a stratum-ps process restarts, with an empty store, only in microseconds: what
// clients do in the moments around a restart, without waiting for a process. Not
// thread-safe: use from the test thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "stratum/net/free_port.h"
#include "stratum/net/task_server.h"
#include "stratum/ps/ps_service.h"
#include "stratum/ps/variable_store.h"

namespace stratum::testing {

class InProcessPs {
 public:
  // Serves on a port picked (and claimed for this process: it is still ours at a restart).
  static absl::StatusOr<std::unique_ptr<InProcessPs>> Start() {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    std::unique_ptr<InProcessPs> ps(new InProcessPs(absl::StrCat("127.0.0.1:", *port)));
    if (absl::Status started = ps->Restart(); !started.ok()) return started;
    return ps;
  }
  ~InProcessPs() { Stop(); }
  InProcessPs(const InProcessPs&) = delete;
  InProcessPs& operator=(const InProcessPs&) = delete;

  const std::string& address() const { return address_; }
  VariableStore& store() { return *store_; }

  // Stops serving at once, as a killed PS.
  void Stop() {
    if (server_ != nullptr) server_->Shutdown(absl::ZeroDuration());
    server_.reset();
  }
  // Stops, and serves again on the same port as a new process: an empty store.
  absl::Status Restart() {
    Stop();
    store_ = std::make_unique<VariableStore>();
    service_ = std::make_unique<PsService>(*store_);
    TaskServerOptions options;
    options.task = {"ps", 0};
    options.binary = "in_process_ps";
    options.listen_address = address_;
    absl::StatusOr<std::unique_ptr<TaskServer>> server =
        TaskServer::Start(options, {service_.get()});
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    return absl::OkStatus();
  }

 private:
  explicit InProcessPs(std::string address) : address_(std::move(address)) {}

  const std::string address_;
  std::unique_ptr<VariableStore> store_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<TaskServer> server_;
};

}  // namespace stratum::testing
