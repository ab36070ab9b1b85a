#include "worker_connection.h"

#include "absl/time/clock.h"
#include "stratum/net/status.h"
#include "stratum/util/status_macros.h"

namespace stratum {

GrpcWorkerConnection::GrpcWorkerConnection(std::string peer, std::string address,
                                           ChannelOptions channel)
    : peer_(std::move(peer)),
      address_(std::move(address)),
      channel_(std::move(channel)),
      stub_(proto::WorkerService::NewStub(MakeChannel(address_, channel_))) {}

absl::StatusOr<proto::SetupJobResponse> GrpcWorkerConnection::SetupJob(
    const proto::SetupJobRequest& request, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  proto::SetupJobResponse response;
  STRATUM_RETURN_IF_ERROR(FromGrpcStatus(stub_->SetupJob(&context, request, &response), peer_));
  return response;
}

absl::StatusOr<proto::RunClosureResponse> GrpcWorkerConnection::RunClosure(
    const proto::RunClosureRequest& request, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  {
    absl::MutexLock lock(&mutex_);
    if (cancelled_) return absl::CancelledError("the coordinator is shutting down");
    in_flight_.insert(&context);
  }
  proto::RunClosureResponse response;
  const absl::Status status =
      FromGrpcStatus(stub_->RunClosure(&context, request, &response), peer_);
  absl::MutexLock lock(&mutex_);
  in_flight_.erase(&context);
  if (cancelled_ && !status.ok()) {
    return absl::CancelledError("the coordinator shut down before the closure ended");
  }
  if (!status.ok()) return status;
  return response;
}

void GrpcWorkerConnection::Leave(const proto::LeaveRequest& request, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  proto::LeaveResponse response;
  (void)stub_->Leave(&context, request, &response);
}

absl::StatusOr<TaskReport> GrpcWorkerConnection::Report(absl::Duration timeout) {
  return GetTaskReport(address_, timeout, channel_);
}

absl::Status GrpcWorkerConnection::Health(absl::Duration timeout) {
  return CheckHealth(address_, timeout, channel_);
}

void GrpcWorkerConnection::CancelAll() {
  absl::MutexLock lock(&mutex_);
  cancelled_ = true;
  for (grpc::ClientContext* context : in_flight_) context->TryCancel();
}

}  // namespace stratum
