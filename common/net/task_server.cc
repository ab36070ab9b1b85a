#include "stratum/net/task_server.h"

#include <unistd.h>

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "proto/task.grpc.pb.h"
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

absl::StatusOr<std::unique_ptr<TaskServer>> TaskServer::Start(
    const TaskServerOptions& options, const std::vector<grpc::Service*>& services) {
  // Process-wide switch; must be set before the first ServerBuilder.
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<TaskServer> server(new TaskServer());
  server->task_service_ = std::make_unique<TaskServiceImpl>(options);

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // A second server on a port that is in use must fail, not share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(server->task_service_.get());
  for (grpc::Service* service : services) builder.RegisterService(service);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        options.task.ToString(), " cannot listen on ", options.listen_address,
        ": the port is in use or the host is not an address of this machine; free the port "
        "or fix the task's address in TF_CONFIG"));
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

TaskServer::~TaskServer() { Shutdown(absl::ZeroDuration()); }

void TaskServer::Shutdown(absl::Duration grace) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

}  // namespace stratum
