#include "stratum/ps/ps_client.h"

#include "data_path.h"
#include "stratum/util/error_kind.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stratum/net/channel.h"
#include "stratum/net/host_port.h"
#include "stratum/net/status.h"
#include "stratum/net/tls.h"
#include "stratum/tensor/tensor_proto.h"
#include "stratum/util/process_info.h"

namespace stratum {
namespace {

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

proto::CoordinatorId ThisCoordinator(const PsClientOptions& options) {
  proto::CoordinatorId id;
  id.set_incarnation(ProcessIncarnation());
  id.set_description(options.coordinator.empty() ? absl::StrCat("a coordinator with pid ", getpid())
                                                 : options.coordinator);
  id.set_address(options.coordinator_address);
  id.set_host(HostName());
  id.set_secret(ProcessSecret());
  id.set_checkpoint_dir(options.checkpoint_dir);
  return id;
}

CoordinatorClaimant ClaimantOf(const proto::CoordinatorId& id) {
  return {.incarnation = id.incarnation(),
          .secret = id.secret(),
          .who = id.description(),
          .address = id.address(),
          .host = id.host(),
          .checkpoint_dir = id.checkpoint_dir()};
}

CoordinatorCredential CredentialOf(const proto::CoordinatorId& id) {
  return {id.incarnation(), id.secret()};
}

namespace {

// A Save or Restore refused by a PS that no coordinator holds: it restarted since this
// coordinator claimed it, and lost the job's variables with its lease.
absl::Status LostIfUnheld(absl::Status status) {
  if (!IsErrorKind(status, ErrorKind::kNoCoordinatorHoldsIt)) return status;
  return WithErrorKind(
      absl::FailedPreconditionError(absl::StrCat(
          "a parameter server is unavailable: ", kPsLostItsVariables, ": ", status.message())),
      ErrorKind::kPsLostItsVariables);
}

}  // namespace

absl::Status PsFailure(const absl::Status& status) {
  // VariableStore::Find's answer: a PS that restarted between two calls holds nothing.
  if (IsErrorKind(status, ErrorKind::kVariableMissing)) {
    return WithErrorKind(
        absl::FailedPreconditionError(absl::StrCat(
            "a parameter server is unavailable: ", kPsLostItsVariables, ": ", status.message())),
        ErrorKind::kPsLostItsVariables);
  }
  // A PS that shuts down (SIGTERM) cancels the calls it is serving: no caller of PsClient
  // cancels its own calls, so CANCELLED is the PS going away.
  if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status) &&
      !absl::IsCancelled(status)) {
    return status;
  }
  return WithErrorKind(absl::FailedPreconditionError(
                           absl::StrCat("a parameter server is unavailable: ", status.message())),
                       ErrorKind::kPsUnavailable);
}

PsClient::PsClient(std::string task, std::string address, PsClientOptions options)
    : task_(std::move(task)),
      address_(std::move(address)),
      options_(options),
      transport_(options_.connect ? options_.connect(address_, options_.channel)
                                  : GrpcPsTransport(address_, options_.channel)) {}

std::string PsClient::Peer() const { return absl::StrCat(task_, " at ", address_); }

absl::StatusOr<std::vector<bool>> PsClient::CreateVariables(const std::vector<NamedValue>& initial,
                                                            const nlohmann::json& optimizer,
                                                            bool replace) {
  proto::CreateVariablesRequest request;
  for (const NamedValue& variable : initial) {
    proto::VariableDef* def = request.add_variables();
    def->set_name(variable.name);
    TensorToProto(variable.value, def->mutable_initial_value());
  }
  return SendCreate(request, optimizer, replace);
}

absl::StatusOr<std::vector<bool>> PsClient::CreateVariables(const std::vector<FilledShard>& shards,
                                                            const nlohmann::json& optimizer,
                                                            bool replace) {
  proto::CreateVariablesRequest request;
  for (const FilledShard& shard : shards) {
    proto::VariableDef* def = request.add_variables();
    def->set_name(shard.name);
    proto::InitialFill* fill = def->mutable_fill();
    fill->set_kind(static_cast<int>(shard.fill.kind));
    fill->set_low(shard.fill.low);
    fill->set_span(shard.fill.span);
    fill->set_limit(shard.fill.limit);
    fill->set_stream_seed(shard.fill.stream_seed);
    fill->set_first(shard.first);
    fill->set_counter(shard.fill.counter);
    for (int64_t d : shard.shape.dims()) fill->add_dims(d);
  }
  return SendCreate(request, optimizer, replace);
}

absl::StatusOr<std::vector<bool>> PsClient::SendCreate(proto::CreateVariablesRequest& request,
                                                       const nlohmann::json& optimizer,
                                                       bool replace) {
  request.set_replace(replace);
  *request.mutable_coordinator() = ThisCoordinator(options_);
  const std::string optimizer_json = optimizer.is_null() ? "" : optimizer.dump();
  for (proto::VariableDef& def : *request.mutable_variables()) {
    def.set_optimizer_json(optimizer_json);
  }
  proto::CreateVariablesResponse response;
  if (absl::Status status =
          FromGrpcStatus(transport_->CreateVariables(request, &response, options_.timeout), Peer());
      !status.ok()) {
    return status;
  }
  return std::vector<bool>(response.created().begin(), response.created().end());
}

std::string PsClient::transport() const {
  absl::MutexLock lock(&data_mutex_);
  if (data_ == nullptr || data_->transport().empty()) return "grpc";
  return data_->transport();
}

std::shared_ptr<PsDataClient> PsClient::DataClient() {
  if (options_.data_path_min_bytes < 0) return nullptr;
  absl::MutexLock lock(&data_mutex_);
  if (data_asked_ || absl::Now() < data_retry_after_) return data_;
  if (options_.channel.tls && data_tls_ == nullptr) {
    absl::StatusOr<std::shared_ptr<const TlsContext>> tls =
        TlsContext::Create(*options_.channel.tls);
    if (!tls.ok()) {  // gRPC, which took the same certificates, carries the tensors then
      spdlog::warn("{}: no data path: {}", Peer(), std::string(tls.status().message()));
      data_asked_ = true;
      return nullptr;
    }
    data_tls_ = *std::move(tls);
  }
  const absl::Duration timeout = std::min(options_.timeout, absl::Seconds(10));
  proto::DataPathResponse response;
  const grpc::Status status = transport_->DataPath(proto::DataPathRequest(), &response, timeout);
  // UNIMPLEMENTED: a PS without a data path. Anything else: ask again next time.
  if (!status.ok() && status.error_code() != grpc::StatusCode::UNIMPLEMENTED) return nullptr;
  data_asked_ = true;
  if (!status.ok() || response.tcp_port() <= 0) return nullptr;
  const std::string host = HostOf(address_);
  PsDataClientOptions options;
  options.timeout = options_.timeout;
  options.shared_memory = options_.shared_memory;
  options.limits.max_bytes = static_cast<uint64_t>(response.max_bytes());
  options.tls = data_tls_;
  data_ = std::make_shared<PsDataClient>(
      Peer(), host,
      DataPathEndpoint{response.tcp_port(), response.unix_socket(), response.token(),
                       static_cast<uint64_t>(response.max_bytes())},
      options);
  return data_;
}

void PsClient::ForgetDataClient(bool back_off) {
  constexpr absl::Duration kBackOff = absl::Seconds(30);
  absl::MutexLock lock(&data_mutex_);
  data_asked_ = false;
  data_.reset();
  if (back_off) data_retry_after_ = absl::Now() + kBackOff;
}

namespace {

void AddRowReads(const std::vector<RowRead>& reads,
                 google::protobuf::RepeatedPtrField<proto::RowRead>* out) {
  for (const RowRead& read : reads) {
    proto::RowRead* message = out->Add();
    message->set_name(read.name);
    message->mutable_rows()->Assign(read.rows.begin(), read.rows.end());
  }
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> PsClient::Pull(const std::vector<std::string>& names,
                                                   const std::vector<RowRead>& row_reads) {
  if (std::shared_ptr<PsDataClient> data = DataClient()) {
    DataCallOutcome outcome;
    absl::StatusOr<std::vector<Tensor>> values = data->Pull(names, &outcome, row_reads);
    if (outcome != DataCallOutcome::kAnswered) {
      ForgetDataClient(/*back_off=*/absl::IsDeadlineExceeded(values.status()) &&
                       outcome == DataCallOutcome::kNotSent);
    }
    if (outcome != DataCallOutcome::kNotSent) return values;
  }
  proto::PullRequest request;
  for (const std::string& name : names) request.add_names(name);
  AddRowReads(row_reads, request.mutable_row_reads());
  proto::PullResponse response;
  if (absl::Status status =
          FromGrpcStatus(transport_->Pull(request, &response, options_.timeout), Peer());
      !status.ok()) {
    return status;
  }
  return DecodeValues(response.values(), Peer());
}

absl::Status PsClient::Push(const std::vector<NamedValue>& gradients, std::vector<Tensor>* pulled,
                            const std::vector<RowRead>& row_reads) {
  int64_t bytes = 0;
  for (const NamedValue& gradient : gradients) {
    bytes += static_cast<int64_t>(gradient.value.byte_size());
  }
  if (pulled == nullptr && !row_reads.empty()) {
    return absl::InvalidArgumentError("a push with row reads needs somewhere to put them (pulled)");
  }
  // Small pushes go over gRPC unless they read rows back, which the data path serves best.
  std::shared_ptr<PsDataClient> data =
      bytes >= options_.data_path_min_bytes || !row_reads.empty() ? DataClient() : nullptr;
  if (data != nullptr) {
    std::vector<std::string> names;
    std::vector<Tensor> tensors;
    std::vector<const std::vector<int64_t>*> rows;
    for (const NamedValue& gradient : gradients) {
      names.push_back(gradient.name);
      tensors.push_back(gradient.value);
      rows.push_back(gradient.rows.has_value() ? &*gradient.rows : nullptr);
    }
    DataCallOutcome outcome;
    absl::Status status = data->Push(names, tensors, pulled, &outcome, rows, row_reads);
    if (outcome != DataCallOutcome::kAnswered) {
      ForgetDataClient(/*back_off=*/absl::IsDeadlineExceeded(status) &&
                       outcome == DataCallOutcome::kNotSent);
    }
    if (outcome != DataCallOutcome::kNotSent) return status;
  }
  proto::PushRequest request;
  for (const NamedValue& gradient : gradients) {
    proto::NamedTensor* message = request.add_gradients();
    message->set_name(gradient.name);
    TensorToProto(gradient.value, message->mutable_tensor());
    if (gradient.rows.has_value()) {
      message->mutable_rows()->Assign(gradient.rows->begin(), gradient.rows->end());
    }
  }
  request.set_pull_after(pulled != nullptr);
  AddRowReads(row_reads, request.mutable_row_reads());
  proto::PushResponse response;
  if (absl::Status status =
          FromGrpcStatus(transport_->Push(request, &response, options_.timeout), Peer());
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
  *request.mutable_coordinator() = ThisCoordinator(options_);
  for (const NamedValue& value : values) {
    proto::NamedTensor* message = request.add_values();
    message->set_name(value.name);
    TensorToProto(value.value, message->mutable_tensor());
    if (value.rows) message->mutable_rows()->Assign(value.rows->begin(), value.rows->end());
  }
  proto::AssignResponse response;
  return FromGrpcStatus(transport_->Assign(request, &response, options_.timeout), Peer());
}

absl::Status PsClient::SetLearningRate(float rate) {
  proto::SetLearningRateRequest request;
  *request.mutable_coordinator() = ThisCoordinator(options_);
  request.set_learning_rate(rate);
  proto::SetLearningRateResponse response;
  return FromGrpcStatus(transport_->SetLearningRate(request, &response, options_.timeout), Peer());
}

absl::StatusOr<proto::ListVariablesResponse> PsClient::ListVariables() {
  proto::ListVariablesResponse response;
  if (absl::Status status = FromGrpcStatus(
          transport_->ListVariables(proto::ListVariablesRequest(), &response, options_.timeout),
          Peer());
      !status.ok()) {
    return status;
  }
  return response;
}

absl::StatusOr<proto::SaveResponse> PsClient::Save(const std::string& path) {
  proto::SaveRequest request;
  request.set_path(path);
  *request.mutable_coordinator() = ThisCoordinator(options_);
  proto::SaveResponse response;
  if (absl::Status status =
          FromGrpcStatus(transport_->Save(request, &response, options_.timeout), Peer());
      !status.ok()) {
    return LostIfUnheld(status);
  }
  return response;
}

absl::Status PsClient::Restore(const std::string& path, uint32_t crc32) {
  proto::RestoreRequest request;
  request.set_path(path);
  request.set_crc32(crc32);
  return SendRestore(request);
}

absl::Status PsClient::Restore(const std::vector<CheckpointFileRef>& files,
                               const std::vector<SavedRows>& rows) {
  proto::RestoreRequest request;
  for (const CheckpointFileRef& file : files) {
    proto::CheckpointFile* out = request.add_files();
    out->set_path(file.path);
    out->set_crc32(file.crc32);
  }
  for (const SavedRows& piece : rows) {
    proto::SavedRows* out = request.add_rows();
    out->set_file(static_cast<int32_t>(piece.file));
    out->set_saved(piece.saved);
    out->set_first_row(piece.first_row);
    out->set_num_rows(piece.num_rows);
    out->set_shard(piece.shard);
    out->set_to_row(piece.to_row);
  }
  return SendRestore(request);
}

absl::Status PsClient::SendRestore(proto::RestoreRequest& request) {
  *request.mutable_coordinator() = ThisCoordinator(options_);
  proto::RestoreResponse response;
  return LostIfUnheld(
      FromGrpcStatus(transport_->Restore(request, &response, options_.timeout), Peer()));
}

absl::StatusOr<proto::WatchResponse> PsClient::Watch(bool saves_checkpoints, bool leaving,
                                                     bool claim, uint64_t committed_save) {
  proto::WatchRequest request;
  request.set_saves_checkpoints(saves_checkpoints);
  request.set_leaving(leaving);
  request.set_claim(claim);
  request.set_committed_save(committed_save);
  *request.mutable_coordinator() = ThisCoordinator(options_);
  // A claim may wait out the lease of a holder that just died (about 6 s).
  const absl::Duration timeout =
      claim ? options_.timeout : std::min(options_.timeout, absl::Seconds(1));
  proto::WatchResponse response;
  if (absl::Status status = FromGrpcStatus(transport_->Watch(request, &response, timeout), Peer());
      !status.ok()) {
    return status;
  }
  return response;
}

}  // namespace stratum
