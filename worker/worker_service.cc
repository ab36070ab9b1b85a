#include "stratum/worker/worker_service.h"

#include "ps_worker.h"
#include "stratum/net/host_port.h"
#include "stratum/net/status.h"

namespace stratum {

WorkerService::WorkerService(ChannelOptions channel, absl::Duration lease,
                             WorkerFunctions functions)
    : worker_(std::make_unique<PsWorker>(std::move(channel), lease, std::move(functions))) {}
WorkerService::~WorkerService() = default;

grpc::Status WorkerService::SetupJob(grpc::ServerContext* context,
                                     const proto::SetupJobRequest* request,
                                     proto::SetupJobResponse* response) {
  absl::StatusOr<proto::SetupJobResponse> answer =
      worker_->SetupJob(*request, context != nullptr ? PeerHostOf(context->peer()) : "");
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  *response = *std::move(answer);
  return grpc::Status::OK;
}

grpc::Status WorkerService::RunClosure(grpc::ServerContext*,
                                       const proto::RunClosureRequest* request,
                                       proto::RunClosureResponse* response) {
  absl::StatusOr<proto::RunClosureResponse> answer = worker_->RunClosure(*request);
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  *response = *std::move(answer);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Leave(grpc::ServerContext*, const proto::LeaveRequest* request,
                                  proto::LeaveResponse* response) {
  *response = worker_->Leave(*request);
  return grpc::Status::OK;
}

}  // namespace stratum
