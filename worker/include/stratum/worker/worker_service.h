// WorkerService: the gRPC face of a parameter-server job's worker (proto::WorkerService),
// a thin adapter over PsWorker (worker/ps_worker.h), which holds the logic: SetupJob
// builds the job, RunClosure runs the built-in train_step or a function the worker program
// registered (WorkerFunctions), Leave drops the job. Thread-safe.
#pragma once

#include <memory>

#include "absl/time/time.h"
#include "proto/worker.grpc.pb.h"
#include "stratum/net/channel.h"
#include "stratum/worker/worker_functions.h"

namespace stratum {

class PsWorker;

class WorkerService final : public proto::WorkerService::Service {
 public:
  // `channel`: how the worker reaches the PSs (TLS); `lease`: how long a silent
  // coordinator keeps its claim on the worker; `functions`: the worker program's own.
  explicit WorkerService(ChannelOptions channel = {}, absl::Duration lease = absl::Seconds(5),
                         WorkerFunctions functions = {});
  ~WorkerService() override;

  grpc::Status SetupJob(grpc::ServerContext*, const proto::SetupJobRequest* request,
                        proto::SetupJobResponse* response) override;
  grpc::Status RunClosure(grpc::ServerContext*, const proto::RunClosureRequest* request,
                          proto::RunClosureResponse* response) override;
  grpc::Status Leave(grpc::ServerContext*, const proto::LeaveRequest* request,
                     proto::LeaveResponse* response) override;

 private:
  std::unique_ptr<PsWorker> worker_;
};

}  // namespace stratum
