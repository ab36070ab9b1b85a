// WorkerConnection: how a RemoteWorkerExecutor reaches its worker: the calls of
// proto::WorkerService and the questions every task answers (health, who it is). Over gRPC
// in a job (GrpcWorkerConnection); tests give the executor a fake, to drive its logic (set
// up once, left out, restarted, held by another coordinator) without a process or a socket.
// Internal to coordinator/.
//
// Thread safety: every method may be called from several threads at once; CancelAll ends
// the RunClosure calls in flight (and makes later ones fail) from any thread.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include <grpcpp/client_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.grpc.pb.h"
#include "stratum/net/channel.h"
#include "stratum/net/health.h"

namespace stratum {

class WorkerConnection {
 public:
  virtual ~WorkerConnection() = default;
  // Errors as the worker gave them (its ErrorKind payloads kept), each within `timeout`.
  virtual absl::StatusOr<proto::SetupJobResponse> SetupJob(const proto::SetupJobRequest& request,
                                                           absl::Duration timeout) = 0;
  // CANCELLED once CancelAll was called, before or during the call.
  virtual absl::StatusOr<proto::RunClosureResponse> RunClosure(
      const proto::RunClosureRequest& request, absl::Duration timeout) = 0;
  // Best effort: done with the worker.
  virtual void Leave(const proto::LeaveRequest& request, absl::Duration timeout) = 0;
  // Who serves there now (another incarnation: it restarted).
  virtual absl::StatusOr<TaskReport> Report(absl::Duration timeout) = 0;
  // OK when the worker answers its health check.
  virtual absl::Status Health(absl::Duration timeout) = 0;
  virtual void CancelAll() = 0;
};

// Makes the connection to the worker at `address`; `peer` names it in errors.
using WorkerConnectionFactory = std::function<std::unique_ptr<WorkerConnection>(
    const std::string& peer, const std::string& address, const ChannelOptions& channel)>;

// proto::WorkerService over gRPC to `address`; `peer` names the worker in errors.
class GrpcWorkerConnection final : public WorkerConnection {
 public:
  GrpcWorkerConnection(std::string peer, std::string address, ChannelOptions channel);

  absl::StatusOr<proto::SetupJobResponse> SetupJob(const proto::SetupJobRequest& request,
                                                   absl::Duration timeout) override;
  absl::StatusOr<proto::RunClosureResponse> RunClosure(const proto::RunClosureRequest& request,
                                                       absl::Duration timeout) override;
  void Leave(const proto::LeaveRequest& request, absl::Duration timeout) override;
  absl::StatusOr<TaskReport> Report(absl::Duration timeout) override;
  absl::Status Health(absl::Duration timeout) override;
  void CancelAll() override;

 private:
  const std::string peer_;
  const std::string address_;
  const ChannelOptions channel_;
  std::unique_ptr<proto::WorkerService::Stub> stub_;
  absl::Mutex mutex_;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace stratum
