#include "stratum/ps/ps_transport.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <algorithm>

#include "proto/ps.grpc.pb.h"
#include "stratum/ps/ps_client.h"
#include "stratum/ps/ps_service.h"

namespace stratum {
namespace {

class GrpcTransport final : public PsTransport {
 public:
  GrpcTransport(const std::string& address, const ChannelOptions& channel)
      : channel_(MakeChannel(address, channel)), stub_(proto::ParameterServer::NewStub(channel_)) {}

  grpc::Status CreateVariables(const proto::CreateVariablesRequest& request,
                               proto::CreateVariablesResponse* response,
                               absl::Duration timeout) override {
    return Call(&Stub::CreateVariables, request, response, timeout);
  }
  grpc::Status Pull(const proto::PullRequest& request, proto::PullResponse* response,
                    absl::Duration timeout) override {
    return Call(&Stub::Pull, request, response, timeout);
  }
  grpc::Status Push(const proto::PushRequest& request, proto::PushResponse* response,
                    absl::Duration timeout) override {
    return Call(&Stub::Push, request, response, timeout);
  }
  grpc::Status Assign(const proto::AssignRequest& request, proto::AssignResponse* response,
                      absl::Duration timeout) override {
    return Call(&Stub::Assign, request, response, timeout);
  }
  grpc::Status SetLearningRate(const proto::SetLearningRateRequest& request,
                               proto::SetLearningRateResponse* response,
                               absl::Duration timeout) override {
    return Call(&Stub::SetLearningRate, request, response, timeout);
  }
  grpc::Status ListVariables(const proto::ListVariablesRequest& request,
                             proto::ListVariablesResponse* response,
                             absl::Duration timeout) override {
    return Call(&Stub::ListVariables, request, response, timeout);
  }
  grpc::Status Save(const proto::SaveRequest& request, proto::SaveResponse* response,
                    absl::Duration timeout) override {
    return Call(&Stub::Save, request, response, timeout);
  }
  grpc::Status Restore(const proto::RestoreRequest& request, proto::RestoreResponse* response,
                       absl::Duration timeout) override {
    return Call(&Stub::Restore, request, response, timeout);
  }
  grpc::Status DataPath(const proto::DataPathRequest& request, proto::DataPathResponse* response,
                        absl::Duration timeout) override {
    return Call(&Stub::DataPath, request, response, timeout);
  }
  grpc::Status Watch(const proto::WatchRequest& request, proto::WatchResponse* response,
                     absl::Duration timeout) override {
    return Call(&Stub::Watch, request, response, timeout);
  }

 private:
  using Stub = proto::ParameterServer::Stub;

  // One unary call with its deadline.
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response, absl::Duration timeout) {
    grpc::ClientContext context;
    Prepare(context, timeout);
    return (stub_.get()->*method)(&context, request, response);
  }

  // Sets the call's deadline, `timeout` from now; while the channel's connection is failed,
  // first makes it again and waits for it (see ps_client.h).
  void Prepare(grpc::ClientContext& context, absl::Duration timeout) {
    const absl::Time now = absl::Now();
    context.set_deadline(absl::ToChronoTime(now + timeout));
    // Idle or connecting channels are fine: the call itself waits for the connection.
    if (channel_->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_TRANSIENT_FAILURE) return;
    // The back-off ends now and the connection is tried again. A PS still down costs the
    // whole wait: gRPC stays in TRANSIENT_FAILURE through failed retries, it cannot tell.
    grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
    channel_->WaitForConnected(absl::ToChronoTime(now + std::min(kReconnectWait, timeout / 2)));
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
};

class InProcessTransport final : public PsTransport {
 public:
  explicit InProcessTransport(PsService& service) : service_(service) {}

  grpc::Status CreateVariables(const proto::CreateVariablesRequest& request,
                               proto::CreateVariablesResponse* response, absl::Duration) override {
    return service_.CreateVariables(nullptr, &request, response);
  }
  grpc::Status Pull(const proto::PullRequest& request, proto::PullResponse* response,
                    absl::Duration) override {
    return service_.Pull(nullptr, &request, response);
  }
  grpc::Status Push(const proto::PushRequest& request, proto::PushResponse* response,
                    absl::Duration) override {
    return service_.Push(nullptr, &request, response);
  }
  grpc::Status Assign(const proto::AssignRequest& request, proto::AssignResponse* response,
                      absl::Duration) override {
    return service_.Assign(nullptr, &request, response);
  }
  grpc::Status SetLearningRate(const proto::SetLearningRateRequest& request,
                               proto::SetLearningRateResponse* response, absl::Duration) override {
    return service_.SetLearningRate(nullptr, &request, response);
  }
  grpc::Status ListVariables(const proto::ListVariablesRequest& request,
                             proto::ListVariablesResponse* response, absl::Duration) override {
    return service_.ListVariables(nullptr, &request, response);
  }
  grpc::Status Save(const proto::SaveRequest& request, proto::SaveResponse* response,
                    absl::Duration) override {
    return service_.Save(nullptr, &request, response);
  }
  grpc::Status Restore(const proto::RestoreRequest& request, proto::RestoreResponse* response,
                       absl::Duration) override {
    return service_.Restore(nullptr, &request, response);
  }
  grpc::Status DataPath(const proto::DataPathRequest& request, proto::DataPathResponse* response,
                        absl::Duration) override {
    return service_.DataPath(nullptr, &request, response);
  }
  grpc::Status Watch(const proto::WatchRequest& request, proto::WatchResponse* response,
                     absl::Duration) override {
    return service_.Watch(nullptr, &request, response);
  }

 private:
  PsService& service_;
};

}  // namespace

std::unique_ptr<PsTransport> GrpcPsTransport(const std::string& address,
                                             const ChannelOptions& channel) {
  return std::make_unique<GrpcTransport>(address, channel);
}

std::unique_ptr<PsTransport> InProcessPsTransport(PsService& service) {
  return std::make_unique<InProcessTransport>(service);
}

}  // namespace stratum
