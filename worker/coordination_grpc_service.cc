#include "stratum/worker/coordination_grpc_service.h"

#include <grpcpp/server_context.h>

#include <algorithm>
#include <chrono>

#include "stratum/net/status.h"

namespace stratum {
namespace {

TaskKey FromProto(const proto::CoordinatedTask& task) { return {task.type(), task.index()}; }

// The deadline of a wait: the one the client asked for, or the call's own if that is
// sooner (a client that gives up is not waited for beyond it).
absl::Time WaitDeadline(const grpc::ServerContext& context, int64_t timeout_ms) {
  const absl::Time requested = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, timeout_ms));
  const auto call = context.deadline();
  if (call == std::chrono::system_clock::time_point::max()) return requested;
  return std::min(requested, absl::FromChrono(call));
}

// The service's `status` as the call's, marked as the service's own answer.
grpc::Status Answer(grpc::ServerContext* context, const absl::Status& status) {
  if (!status.ok()) context->AddTrailingMetadata(kCoordinationAnswerKey, "1");
  return ToGrpcStatus(status);
}

}  // namespace

GrpcCoordinationService::GrpcCoordinationService(CoordinationService& service,
                                                 absl::Duration check_interval)
    : service_(service),
      check_interval_(check_interval > absl::ZeroDuration()
                          ? check_interval
                          : std::min(absl::Seconds(1), service.heartbeat_timeout() / 4)) {
  watchdog_ = std::thread([this] { Watchdog(); });
}

GrpcCoordinationService::~GrpcCoordinationService() { Shutdown(); }

void GrpcCoordinationService::Shutdown() {
  {
    absl::MutexLock lock(&mutex_);
    stop_ = true;
    stop_changed_.SignalAll();
  }
  if (watchdog_.joinable()) watchdog_.join();
  service_.Shutdown();
}

void GrpcCoordinationService::Watchdog() {
  while (true) {
    {
      absl::MutexLock lock(&mutex_);
      const absl::Time wake = absl::Now() + check_interval_;
      while (!stop_ && absl::Now() < wake) stop_changed_.WaitWithDeadline(&mutex_, wake);
      if (stop_) return;
    }
    service_.CheckHeartbeats();
  }
}

grpc::Status GrpcCoordinationService::RegisterTask(grpc::ServerContext* context,
                                                   const proto::RegisterTaskRequest* request,
                                                   proto::RegisterTaskResponse* response) {
  response->set_service_incarnation(service_.incarnation());
  response->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(service_.heartbeat_timeout()));
  return Answer(context, service_.RegisterTask(FromProto(request->task()), request->incarnation()));
}

grpc::Status GrpcCoordinationService::Heartbeat(grpc::ServerContext*,
                                                const proto::HeartbeatRequest* request,
                                                proto::HeartbeatResponse* response) {
  response->set_service_incarnation(service_.incarnation());
  const absl::Status status =
      service_.Heartbeat(FromProto(request->task()), request->incarnation());
  response->set_error_code(static_cast<int>(status.code()));
  response->set_error_message(std::string(status.message()));
  PayloadsToProto(status, response->mutable_error_payloads());
  return grpc::Status::OK;
}

grpc::Status GrpcCoordinationService::DisconnectTask(grpc::ServerContext* context,
                                                     const proto::DisconnectTaskRequest* request,
                                                     proto::DisconnectTaskResponse*) {
  return Answer(context,
                service_.DisconnectTask(FromProto(request->task()), request->incarnation()));
}

grpc::Status GrpcCoordinationService::SetKeyValue(grpc::ServerContext* context,
                                                  const proto::SetKeyValueRequest* request,
                                                  proto::SetKeyValueResponse*) {
  return Answer(context, service_.SetKeyValue(request->key(), request->value()));
}

grpc::Status GrpcCoordinationService::GetKeyValue(grpc::ServerContext* context,
                                                  const proto::GetKeyValueRequest* request,
                                                  proto::GetKeyValueResponse* response) {
  absl::StatusOr<std::string> value =
      request->no_wait()
          ? service_.TryGetKeyValue(request->key())
          : service_.GetKeyValue(request->key(), WaitDeadline(*context, request->timeout_ms()));
  if (!value.ok()) return Answer(context, value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status GrpcCoordinationService::WaitAtBarrier(grpc::ServerContext* context,
                                                    const proto::WaitAtBarrierRequest* request,
                                                    proto::WaitAtBarrierResponse*) {
  return Answer(context, service_.WaitAtBarrier(request->barrier_id(), FromProto(request->task()),
                                                WaitDeadline(*context, request->timeout_ms())));
}

grpc::Status GrpcCoordinationService::ReportError(grpc::ServerContext* context,
                                                  const proto::ReportErrorRequest* request,
                                                  proto::ReportErrorResponse* response) {
  absl::Status error(static_cast<absl::StatusCode>(request->error_code()),
                     request->error_message());
  PayloadsFromProto(request->error_payloads(), error);
  const absl::Status reported = service_.ReportError(FromProto(request->task()), error);
  if (!reported.ok()) return Answer(context, reported);
  const absl::Status first = service_.cluster_error();
  response->set_cluster_error_code(static_cast<int>(first.code()));
  response->set_cluster_error_message(std::string(first.message()));
  PayloadsToProto(first, response->mutable_cluster_error_payloads());
  return grpc::Status::OK;
}

}  // namespace stratum
