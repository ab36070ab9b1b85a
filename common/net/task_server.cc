#include "stratum/net/task_server.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include <grpc/support/log.h>
#include <spdlog/spdlog.h>

#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/coordination.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "proto/task.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "stratum/net/channel.h"
#include "stratum/net/free_port.h"
#include "stratum/util/metrics.h"
#include "stratum/util/process_info.h"

namespace stratum {

class TaskServer::TaskServiceImpl final : public proto::TaskService::Service {
 public:
  explicit TaskServiceImpl(const TaskServerOptions& options) : options_(options) {}

  grpc::Status GetTaskStatus(grpc::ServerContext*, const proto::GetTaskStatusRequest*,
                             proto::GetTaskStatusResponse* response) override {
    response->set_task_type(options_.task.type);
    response->set_task_index(options_.task.index);
    response->set_incarnation(ProcessIncarnation());
    response->set_uptime_seconds(ProcessUptimeSeconds());
    response->set_version(StratumVersion());
    response->set_binary(options_.binary);
    response->set_pid(getpid());
    return grpc::Status::OK;
  }

 private:
  const TaskServerOptions options_;
};

// The health service of the plaintext health port: Check only (what probes call), for the
// whole server (service ""), reporting what the main server reports.
class TaskServer::PlaintextHealthImpl final : public grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override {
    if (!request->service().empty() &&
        std::find(services_.begin(), services_.end(), request->service()) == services_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("this task does not serve \"", request->service(), "\""));
    }
    response->set_status(serving_ ? grpc::health::v1::HealthCheckResponse::SERVING
                                  : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }
  // `services`: the names it answers for besides "" (fixed before it serves).
  explicit PlaintextHealthImpl(std::vector<std::string> services)
      : services_(std::move(services)) {}
  void SetServing(bool serving) { serving_ = serving; }

 private:
  std::atomic<bool> serving_{false};
  const std::vector<std::string> services_;
};

namespace {

// Clients ping during long calls to notice a silent peer (ChannelOptions): accept their
// pings, which gRPC's defaults would answer with "too many pings" and a closed connection.
void AcceptKeepalivePings(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

// gRPC logs a failed bind itself, in several lines of its own, before BuildAndStart
// returns; the caller's error says it in one sentence with the fix, so those are dropped.
thread_local bool building_server = false;

// gRPC's own log lines, in the process's log format (with the task in every line).
void LogThroughSpdlog(gpr_log_func_args* args) {
  if (building_server && std::strstr(args->file, "chttp2_server") != nullptr) return;
  const char* slash = std::strrchr(args->file, '/');
  const char* file = slash != nullptr ? slash + 1 : args->file;
  const auto level = args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::err
                     : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                               : spdlog::level::debug;
  spdlog::log(level, "gRPC ({}:{}): {}", file, args->line, args->message);
}

std::unique_ptr<grpc::Server> BuildAndStartQuietly(grpc::ServerBuilder& builder) {
  static std::once_flag installed;
  std::call_once(installed, [] { gpr_set_log_function(LogThroughSpdlog); });
  building_server = true;
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  building_server = false;
  return server;
}

// The full name ("stratum.proto.ParameterServer") of a service Stratum's tasks serve, for
// the health service to answer for it by name; empty for another.
std::string FullNameOf(grpc::Service* service) {
  if (dynamic_cast<proto::ParameterServer::Service*>(service) != nullptr) {
    return proto::ParameterServer::service_full_name();
  }
  if (dynamic_cast<proto::WorkerService::Service*>(service) != nullptr) {
    return proto::WorkerService::service_full_name();
  }
  if (dynamic_cast<proto::CoordinationService::Service*>(service) != nullptr) {
    return proto::CoordinationService::service_full_name();
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<TaskServer>> TaskServer::Start(
    const TaskServerOptions& options, const std::vector<grpc::Service*>& services) {
  // Process-wide switch; must be set before the first ServerBuilder.
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<TaskServer> server(new TaskServer());
  server->task_service_ = std::make_unique<TaskServiceImpl>(options);

  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      options.listen_address,
      options.tls ? MakeTlsServerCredentials(*options.tls) : grpc::InsecureServerCredentials(),
      &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // A second server on a port that is in use must fail, not share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  AcceptKeepalivePings(builder);
  builder.RegisterService(server->task_service_.get());
  for (grpc::Service* service : services) builder.RegisterService(service);
  server->server_ = BuildAndStartQuietly(builder);
  if (server->server_ == nullptr || server->port_ == 0) {
    return ListenFailure(options.task.ToString(), options.listen_address,
                         "fix the task's address in TF_CONFIG (or --listen_address)");
  }
  // The health service answers for the server ("") and, by name, for each service on it,
  // as Kubernetes' gRPC probes with a `service` ask (unknown names: NOT_FOUND).
  server->service_names_ = {proto::TaskService::service_full_name()};
  for (grpc::Service* service : services) {
    if (std::string name = FullNameOf(service); !name.empty()) {
      server->service_names_.push_back(std::move(name));
    }
  }
  if (!options.health_listen_address.empty()) {
    // Only a health service of its own: not gRPC's default one, which would serve every
    // service's status (and needs an asynchronous server).
    server->plaintext_health_ = std::make_unique<PlaintextHealthImpl>(server->service_names_);
    grpc::ServerBuilder health;
    health.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
    health.AddListeningPort(options.health_listen_address, grpc::InsecureServerCredentials(),
                            &server->health_port_);
    health.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    AcceptKeepalivePings(health);
    health.RegisterService(server->plaintext_health_.get());
    server->health_server_ = BuildAndStartQuietly(health);
    if (server->health_server_ == nullptr || server->health_port_ == 0) {
      return ListenFailure(absl::StrCat(options.task.ToString(), "'s health service"),
                           options.health_listen_address, "choose another --health_port");
    }
  }
  if (!options.metrics_listen_address.empty()) {
    MetricsRegistry::Global()
        .GetGauge("stratum_task_info", "This task: its name, binary, version and incarnation.",
                  {{"task", options.task.ToString()},
                   {"binary", options.binary},
                   {"version", StratumVersion()},
                   {"incarnation", absl::StrFormat("%016x", ProcessIncarnation())}})
        .Set(1);
    absl::StatusOr<std::unique_ptr<HttpServer>> metrics = HttpServer::Start(
        options.metrics_listen_address,
        {{"/metrics", [](const std::string&) {
            return HttpResponse{.content_type = "text/plain; version=0.0.4; charset=utf-8",
                                .body = MetricsRegistry::Global().Render()};
          }}});
    if (!metrics.ok()) {
      return ListenFailure(absl::StrCat(options.task.ToString(), "'s metrics server"),
                           options.metrics_listen_address, "choose another --metrics_port");
    }
    server->metrics_server_ = *std::move(metrics);
  }
  server->SetServing(true);
  return server;
}

void TaskServer::SetServing(bool serving) {
  for (const std::string& name : service_names_) {
    server_->GetHealthCheckService()->SetServingStatus(name, serving);
  }
  server_->GetHealthCheckService()->SetServingStatus(serving);
  if (plaintext_health_) plaintext_health_->SetServing(serving);
}

TaskServer::~TaskServer() { Shutdown(absl::ZeroDuration()); }

void TaskServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  SetServing(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  if (health_server_) {
    health_server_->Shutdown();
    health_server_->Wait();
  }
  metrics_server_.reset();
}

}  // namespace stratum
