// TaskServer: the gRPC server of a long-running Stratum task. It always serves the
// standard health service (grpc.health.v1, what Kubernetes' native gRPC probes call) and
// Stratum's TaskService (role, index, incarnation, uptime, version); a role adds its own
// services. With TLS the server requires a client certificate from the cluster's CA; since
// Kubernetes' gRPC probes cannot speak TLS, the health service can also be served alone,
// plaintext, on a second address. Thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/http_server.h"
#include "stratum/net/tls.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace stratum {

struct TaskServerOptions {
  TaskKey task;
  std::string binary;          // "stratum-worker"
  std::string listen_address;  // "127.0.0.1:2222" or "[::]:2222"
  int max_message_bytes = 256 * 1024 * 1024;
  // Mutual TLS; plaintext when empty.
  std::optional<TlsCredentials> tls = std::nullopt;
  // When not empty, a second, plaintext server with only the health service (what the
  // probes of a TLS pod call), e.g. "[::]:8081". It reports what the main server does.
  std::string health_listen_address = "";
  // When not empty, an HTTP server (e.g. "[::]:9090") with Prometheus' /metrics
  // (MetricsRegistry::Global()), plaintext: what scrapers read.
  std::string metrics_listen_address = "";
};

class TaskServer {
 public:
  // Binds and starts serving, reporting SERVING, for the server (health service "") and by
  // name for its Stratum services ("stratum.proto.ParameterServer", ...). `services` must
  // outlive the server.
  // UNAVAILABLE naming the address when it (or the health address) cannot be bound (in
  // use, not an interface).
  static absl::StatusOr<std::unique_ptr<TaskServer>> Start(
      const TaskServerOptions& options, const std::vector<grpc::Service*>& services = {});
  ~TaskServer();

  // Reports NOT_SERVING, then stops: new calls are refused at once, calls in flight get
  // `grace` to finish before they are cancelled.
  void Shutdown(absl::Duration grace);
  int port() const { return port_; }
  // The port of the plaintext health server; 0 when there is none.
  int health_port() const { return health_port_; }
  // The port of the HTTP metrics server; 0 when there is none.
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }

 private:
  class TaskServiceImpl;
  class PlaintextHealthImpl;
  TaskServer() = default;
  void SetServing(bool serving);

  std::unique_ptr<TaskServiceImpl> task_service_;
  std::unique_ptr<PlaintextHealthImpl> plaintext_health_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_server_;
  std::unique_ptr<HttpServer> metrics_server_;
  std::vector<std::string> service_names_;  // the health service answers for these too
  int port_ = 0;
  int health_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace stratum
