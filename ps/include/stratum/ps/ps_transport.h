// PsTransport: how a PsClient's calls reach its parameter server, the calls of
// proto::ParameterServer as request in, answer out. A job uses gRPC (GrpcPsTransport: a
// channel that is reconnected at once when a PS is back, see ps_client.h); an
// InProcessPsTransport hands each call to a PsService of the caller's own process, with no
// socket and no gRPC runtime, so that tests drive the training job, its workers and its
// PSs in one process and make a PS fail or restart between two calls. The answer is the
// grpc::Status the service gave (its ErrorKind payloads in its details), which PsClient
// reads as it reads a remote one. Implementations are thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/support/status.h>

#include "absl/time/time.h"
#include "proto/ps.pb.h"
#include "stratum/net/channel.h"

namespace stratum {

class PsService;

class PsTransport {
 public:
  virtual ~PsTransport() = default;

  // Each call is answered within `timeout` (DEADLINE_EXCEEDED otherwise).
  virtual grpc::Status CreateVariables(const proto::CreateVariablesRequest& request,
                                       proto::CreateVariablesResponse* response,
                                       absl::Duration timeout) = 0;
  virtual grpc::Status Pull(const proto::PullRequest& request, proto::PullResponse* response,
                            absl::Duration timeout) = 0;
  virtual grpc::Status Push(const proto::PushRequest& request, proto::PushResponse* response,
                            absl::Duration timeout) = 0;
  virtual grpc::Status Assign(const proto::AssignRequest& request, proto::AssignResponse* response,
                              absl::Duration timeout) = 0;
  virtual grpc::Status SetLearningRate(const proto::SetLearningRateRequest& request,
                                       proto::SetLearningRateResponse* response,
                                       absl::Duration timeout) = 0;
  virtual grpc::Status ListVariables(const proto::ListVariablesRequest& request,
                                     proto::ListVariablesResponse* response,
                                     absl::Duration timeout) = 0;
  virtual grpc::Status Save(const proto::SaveRequest& request, proto::SaveResponse* response,
                            absl::Duration timeout) = 0;
  virtual grpc::Status Restore(const proto::RestoreRequest& request,
                               proto::RestoreResponse* response, absl::Duration timeout) = 0;
  // Where the PS's raw data path listens (a tcp_port of 0: it has none, use these calls).
  virtual grpc::Status DataPath(const proto::DataPathRequest& request,
                                proto::DataPathResponse* response, absl::Duration timeout) = 0;
  virtual grpc::Status Watch(const proto::WatchRequest& request, proto::WatchResponse* response,
                             absl::Duration timeout) = 0;
};

// Makes the transport to the PS at `address` (PsClientOptions::connect).
using PsTransportFactory = std::function<std::unique_ptr<PsTransport>(
    const std::string& address, const ChannelOptions& channel)>;

// The calls over a gRPC channel to `address` (TLS and message limits from `channel`).
std::unique_ptr<PsTransport> GrpcPsTransport(const std::string& address,
                                             const ChannelOptions& channel);

// The calls answered by `service` (which must outlive the transport) in this process, as
// if from another one: a claim carries no peer host. The timeout is not enforced (the
// calls do not wait on anything remote).
std::unique_ptr<PsTransport> InProcessPsTransport(PsService& service);

}  // namespace stratum
