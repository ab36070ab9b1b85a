#include "stratum/ps/ps_client.h"

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "stratum/net/channel.h"
#include "stratum/net/status.h"
#include "stratum/tensor/tensor_proto.h"

namespace stratum {
namespace {

void Prepare(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::StatusOr<std::vector<Tensor>> DecodeValues(
    const google::protobuf::RepeatedPtrField<proto::NamedTensor>& values, const std::string& peer) {
  std::vector<Tensor> tensors;
  for (const proto::NamedTensor& value : values) {
    absl::StatusOr<Tensor> tensor = TensorFromProto(value.tensor());
    if (!tensor.ok()) {
      return absl::DataLossError(
          absl::StrCat(peer, ": variable \"", value.name(), "\": ", tensor.status().message()));
    }
    tensors.push_back(*std::move(tensor));
  }
  return tensors;
}

}  // namespace

PsClient::PsClient(std::string task, std::string address, PsClientOptions options)
    : task_(std::move(task)),
      address_(std::move(address)),
      options_(options),
      stub_(proto::ParameterServer::NewStub(MakeChannel(address_))) {}

std::string PsClient::Peer() const { return absl::StrCat(task_, " at ", address_); }

absl::StatusOr<std::vector<bool>> PsClient::CreateVariables(const std::vector<NamedValue>& initial,
                                                            const nlohmann::json& optimizer) {
  proto::CreateVariablesRequest request;
  const std::string optimizer_json = optimizer.is_null() ? "" : optimizer.dump();
  for (const NamedValue& variable : initial) {
    proto::VariableDef* def = request.add_variables();
    def->set_name(variable.name);
    TensorToProto(variable.value, def->mutable_initial_value());
    def->set_optimizer_json(optimizer_json);
  }
  grpc::ClientContext context;
  Prepare(context, options_.timeout);
  proto::CreateVariablesResponse response;
  if (absl::Status status =
          FromGrpcStatus(stub_->CreateVariables(&context, request, &response), Peer());
      !status.ok()) {
    return status;
  }
  return std::vector<bool>(response.created().begin(), response.created().end());
}

absl::StatusOr<std::vector<Tensor>> PsClient::Pull(const std::vector<std::string>& names) {
  proto::PullRequest request;
  for (const std::string& name : names) request.add_names(name);
  grpc::ClientContext context;
  Prepare(context, options_.timeout);
  proto::PullResponse response;
  if (absl::Status status = FromGrpcStatus(stub_->Pull(&context, request, &response), Peer());
      !status.ok()) {
    return status;
  }
  return DecodeValues(response.values(), Peer());
}

absl::Status PsClient::Push(const std::vector<NamedValue>& gradients, std::vector<Tensor>* pulled) {
  proto::PushRequest request;
  for (const NamedValue& gradient : gradients) {
    proto::NamedTensor* message = request.add_gradients();
    message->set_name(gradient.name);
    TensorToProto(gradient.value, message->mutable_tensor());
  }
  request.set_pull_after(pulled != nullptr);
  grpc::ClientContext context;
  Prepare(context, options_.timeout);
  proto::PushResponse response;
  if (absl::Status status = FromGrpcStatus(stub_->Push(&context, request, &response), Peer());
      !status.ok()) {
    return status;
  }
  if (pulled == nullptr) return absl::OkStatus();
  absl::StatusOr<std::vector<Tensor>> values = DecodeValues(response.values(), Peer());
  if (!values.ok()) return values.status();
  *pulled = *std::move(values);
  return absl::OkStatus();
}

absl::Status PsClient::Assign(const std::vector<NamedValue>& values) {
  proto::AssignRequest request;
  for (const NamedValue& value : values) {
    proto::NamedTensor* message = request.add_values();
    message->set_name(value.name);
    TensorToProto(value.value, message->mutable_tensor());
  }
  grpc::ClientContext context;
  Prepare(context, options_.timeout);
  proto::AssignResponse response;
  return FromGrpcStatus(stub_->Assign(&context, request, &response), Peer());
}

absl::StatusOr<proto::ListVariablesResponse> PsClient::ListVariables() {
  grpc::ClientContext context;
  Prepare(context, options_.timeout);
  proto::ListVariablesResponse response;
  if (absl::Status status = FromGrpcStatus(
          stub_->ListVariables(&context, proto::ListVariablesRequest(), &response), Peer());
      !status.ok()) {
    return status;
  }
  return response;
}

absl::StatusOr<proto::SaveResponse> PsClient::Save(const std::string& path) {
  proto::SaveRequest request;
  request.set_path(path);
  grpc::ClientContext context;
  Prepare(context, options_.timeout);
  proto::SaveResponse response;
  if (absl::Status status = FromGrpcStatus(stub_->Save(&context, request, &response), Peer());
      !status.ok()) {
    return status;
  }
  return response;
}

absl::Status PsClient::Restore(const std::string& path, uint32_t crc32) {
  proto::RestoreRequest request;
  request.set_path(path);
  request.set_crc32(crc32);
  grpc::ClientContext context;
  Prepare(context, options_.timeout);
  proto::RestoreResponse response;
  return FromGrpcStatus(stub_->Restore(&context, request, &response), Peer());
}

}  // namespace stratum
