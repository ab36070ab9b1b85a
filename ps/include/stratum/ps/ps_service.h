// PsService: the gRPC face of a VariableStore (proto/ps.proto). It converts messages to
// tensors, checks every gradient of a push before it applies the first (a bad request
// changes nothing), and turns absl::Status into grpc::Status. Thread-safe.
#pragma once

#include "proto/ps.grpc.pb.h"
#include "stratum/ps/variable_store.h"

namespace stratum {

class PsService final : public proto::ParameterServer::Service {
 public:
  explicit PsService(VariableStore& store) : store_(store) {}

  grpc::Status CreateVariables(grpc::ServerContext*, const proto::CreateVariablesRequest* request,
                               proto::CreateVariablesResponse* response) override;
  grpc::Status Pull(grpc::ServerContext*, const proto::PullRequest* request,
                    proto::PullResponse* response) override;
  grpc::Status Push(grpc::ServerContext*, const proto::PushRequest* request,
                    proto::PushResponse* response) override;
  grpc::Status Assign(grpc::ServerContext*, const proto::AssignRequest* request,
                      proto::AssignResponse* response) override;
  grpc::Status ListVariables(grpc::ServerContext*, const proto::ListVariablesRequest* request,
                             proto::ListVariablesResponse* response) override;
  grpc::Status Save(grpc::ServerContext*, const proto::SaveRequest* request,
                    proto::SaveResponse* response) override;
  grpc::Status Restore(grpc::ServerContext*, const proto::RestoreRequest* request,
                       proto::RestoreResponse* response) override;

 private:
  VariableStore& store_;
};

}  // namespace stratum
