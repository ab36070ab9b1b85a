// GrpcCoordinationService: the gRPC face of a CoordinationService (proto/coordination.proto),
// served by the leader task's TaskServer. It converts messages and statuses, nothing more,
// and runs the heartbeat watchdog (CoordinationService::CheckHeartbeats) on its own thread.
//
// Blocking calls (GetKeyValue, WaitAtBarrier) hold a server thread until they are answered;
// a call whose client went away is answered at its own deadline. Shutdown wakes them all, so
// call it before stopping the TaskServer, whose shutdown waits for the calls in flight:
//
//   CoordinationService service(options);
//   GrpcCoordinationService grpc_service(service);
//   auto server = TaskServer::Start(server_options, {&grpc_service});
//   ...
//   grpc_service.Shutdown();
//   (*server)->Shutdown(absl::Seconds(5));
//
// Thread-safe.
#pragma once

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordination.grpc.pb.h"
#include "stratum/worker/coordination_service.h"

namespace stratum {

// Trailing metadata key set on every error the service itself answers with. Its cluster
// error can be UNAVAILABLE ("worker:2 sent no heartbeat ..."), like gRPC's own error for a
// leader that is gone: clients tell the two apart by this key.
inline constexpr char kCoordinationAnswerKey[] = "stratum-coordination-answer";

class GrpcCoordinationService final : public proto::CoordinationService::Service {
 public:
  // `service` must outlive this. The watchdog checks heartbeats every `check_interval`
  // (zero: a quarter of the service's heartbeat timeout, at most a second).
  explicit GrpcCoordinationService(CoordinationService& service,
                                   absl::Duration check_interval = absl::ZeroDuration());
  ~GrpcCoordinationService() override;  // Shutdown()

  // Stops the watchdog and shuts the service down (every wait answers UNAVAILABLE).
  // Idempotent.
  void Shutdown();

  grpc::Status RegisterTask(grpc::ServerContext*, const proto::RegisterTaskRequest* request,
                            proto::RegisterTaskResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest* request,
                         proto::HeartbeatResponse* response) override;
  grpc::Status DisconnectTask(grpc::ServerContext*, const proto::DisconnectTaskRequest* request,
                              proto::DisconnectTaskResponse* response) override;
  grpc::Status SetKeyValue(grpc::ServerContext*, const proto::SetKeyValueRequest* request,
                           proto::SetKeyValueResponse* response) override;
  grpc::Status GetKeyValue(grpc::ServerContext* context, const proto::GetKeyValueRequest* request,
                           proto::GetKeyValueResponse* response) override;
  grpc::Status WaitAtBarrier(grpc::ServerContext* context,
                             const proto::WaitAtBarrierRequest* request,
                             proto::WaitAtBarrierResponse* response) override;
  grpc::Status ReportError(grpc::ServerContext*, const proto::ReportErrorRequest* request,
                           proto::ReportErrorResponse* response) override;

 private:
  void Watchdog();

  CoordinationService& service_;
  const absl::Duration check_interval_;

  absl::Mutex mutex_;
  absl::CondVar stop_changed_;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread watchdog_;
};

}  // namespace stratum
