#include "stratum/ps/ps_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/model/initial_fill.h"
#include "stratum/net/health.h"
#include "stratum/net/host_port.h"
#include "stratum/net/status.h"
#include "stratum/ps/ps_client.h"
#include "stratum/ps/ps_metrics.h"
#include "stratum/ps/store_checkpoint.h"
#include "stratum/tensor/tensor_proto.h"
#include "stratum/util/json_depth.h"
#include "stratum/util/memory.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// A variable's initial value: the one sent, or made here from its fill (a table's shard,
// never built whole by the coordinator), refused when it would not fit this process.
absl::StatusOr<Tensor> InitialValue(const proto::VariableDef& def) {
  if (!def.has_fill()) return TensorFromProto(def.initial_value());
  const proto::InitialFill& fill = def.fill();
  if (fill.kind() < 0 || fill.kind() > static_cast<int>(InitialFill::Kind::kSymmetric) ||
      fill.first() < 0 || fill.dims_size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("fill kind ", fill.kind(), ", first value ", fill.first(), ", ",
                     fill.dims_size(), " dimensions: send the fill of Model::InitialFills"));
  }
  std::vector<int64_t> dims;
  int64_t count = 1;
  for (int64_t d : fill.dims()) {
    if (d < 0 || (d > 0 && count > (int64_t{1} << 40) / d)) {
      return absl::InvalidArgumentError(absl::StrCat("a shard with dimension ", d, " after ", count,
                                                     " values: at most 2^40 values"));
    }
    count *= d;
    dims.push_back(d);
  }
  const auto bytes = static_cast<uint64_t>(count) * sizeof(float);
  if (const std::optional<uint64_t> available = AvailableMemoryBytes();
      available && bytes > *available) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a shard of ", bytes, " bytes does not fit the ", *available,
        " bytes this parameter server may still allocate: give the job more ps tasks, or "
        "this one more memory"));
  }
  Tensor value(DType::kFloat32, Shape(dims));
  const InitialFill made{.kind = static_cast<InitialFill::Kind>(fill.kind()),
                         .low = fill.low(),
                         .span = fill.span(),
                         .limit = fill.limit(),
                         .stream_seed = fill.stream_seed(),
                         .counter = fill.counter()};
  FillInitialValues(made, fill.first(), count, value.data<float>());
  return value;
}

struct Gradient {
  const std::string* name;
  Tensor tensor;
  std::vector<int64_t> rows;
  bool sparse;
};

absl::StatusOr<std::vector<Gradient>> DecodeGradients(
    const google::protobuf::RepeatedPtrField<proto::NamedTensor>& messages) {
  std::vector<Gradient> gradients;
  for (const proto::NamedTensor& message : messages) {
    absl::StatusOr<Tensor> tensor = TensorFromProto(message.tensor());
    if (!tensor.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("gradient for variable \"", message.name(),
                                                     "\": ", tensor.status().message()));
    }
    gradients.push_back({&message.name(), *std::move(tensor),
                         std::vector<int64_t>(message.rows().begin(), message.rows().end()),
                         message.rows_size() > 0});
  }
  return gradients;
}

absl::Status AppendValue(const VariableStore& store, const std::string& name,
                         google::protobuf::RepeatedPtrField<proto::NamedTensor>* values) {
  absl::StatusOr<Tensor> value = store.Read(name);
  if (!value.ok()) return value.status();
  proto::NamedTensor* out = values->Add();
  out->set_name(name);
  TensorToProto(*value, out->mutable_tensor());
  return absl::OkStatus();
}

std::vector<RowRead> DecodeRowReads(
    const google::protobuf::RepeatedPtrField<proto::RowRead>& messages) {
  std::vector<RowRead> reads;
  for (const proto::RowRead& message : messages) {
    reads.push_back({message.name(), {message.rows().begin(), message.rows().end()}});
  }
  return reads;
}

// Appends the rows `read` names (CheckPull checked them).
absl::Status AppendRows(const VariableStore& store, const RowRead& read,
                        google::protobuf::RepeatedPtrField<proto::NamedTensor>* values) {
  absl::StatusOr<Tensor> rows = store.ReadRows(read.name, read.rows);
  if (!rows.ok()) return rows.status();
  proto::NamedTensor* out = values->Add();
  out->set_name(read.name);
  TensorToProto(*rows, out->mutable_tensor());  // in the order read: the caller has the rows
  return absl::OkStatus();
}

void AppendVariableStatuses(const VariableStore& store,
                            google::protobuf::RepeatedPtrField<proto::VariableStatus>* out) {
  for (const VariableInfo& info : store.List()) {
    proto::VariableStatus* variable = out->Add();
    variable->set_name(info.name);
    for (int64_t dim : info.shape.dims()) variable->add_dims(dim);
    variable->set_optimizer(info.optimizer);
    variable->set_updates(info.updates);
  }
}

// Restores the shards `request` lists from rows of a checkpoint written with another
// layout, opening only the files they are in.
absl::StatusOr<int> RestoreResharded(VariableStore& store, const proto::RestoreRequest& request,
                                     const Confinement& confinement) {
  std::vector<std::unique_ptr<SafetensorsReader>> opened(static_cast<size_t>(request.files_size()));
  std::vector<const SafetensorsReader*> files(opened.size(), nullptr);
  std::vector<SavedRows> rows;
  for (const proto::SavedRows& piece : request.rows()) {
    if (piece.file() < 0 || piece.file() >= request.files_size()) {
      return absl::InvalidArgumentError(absl::StrCat("rows of \"", piece.saved(),
                                                     "\" to restore name file ", piece.file(),
                                                     " of ", request.files_size()));
    }
    const auto file = static_cast<size_t>(piece.file());
    if (files[file] == nullptr) {
      const proto::CheckpointFile& source = request.files(piece.file());
      STRATUM_ASSIGN_OR_RETURN(opened[file],
                               SafetensorsReader::Open(source.path(), source.crc32(), confinement));
      files[file] = opened[file].get();
    }
    rows.push_back(
        {file, piece.saved(), piece.first_row(), piece.num_rows(), piece.shard(), piece.to_row()});
  }
  return RestoreStore(store, files, rows);
}

}  // namespace

grpc::Status PsService::CreateVariables(grpc::ServerContext*,
                                        const proto::CreateVariablesRequest* request,
                                        proto::CreateVariablesResponse* response) {
  if (absl::Status held = lease_.Heartbeat(CredentialOf(request->coordinator())); !held.ok()) {
    return ToGrpcStatus(held);
  }
  for (const proto::VariableDef& def : request->variables()) {
    absl::StatusOr<Tensor> initial = InitialValue(def);
    if (!initial.ok()) {
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "initial value of variable \"", def.name(), "\": ", initial.status().message())));
    }
    nlohmann::json optimizer = nullptr;
    if (!def.optimizer_json().empty()) {
      if (absl::Status deep = CheckJsonDepth(
              def.optimizer_json(), absl::StrCat("the optimizer of variable \"", def.name(), "\""),
              "send a Keras optimizer config");
          !deep.ok()) {
        return ToGrpcStatus(deep);
      }
      optimizer = nlohmann::json::parse(def.optimizer_json(), nullptr, /*allow_exceptions=*/false);
      if (optimizer.is_discarded()) {
        return ToGrpcStatus(absl::InvalidArgumentError(
            absl::StrCat("optimizer of variable \"", def.name(), "\" is not valid JSON")));
      }
    }
    absl::StatusOr<bool> created =
        store_.Create(def.name(), *initial, optimizer, request->replace());
    if (!created.ok()) return ToGrpcStatus(created.status());
    if (!*created && request->replace()) {
      spdlog::info("variable {} started afresh: it held an earlier job's value", def.name());
    }
    response->add_created(*created);
  }
  return grpc::Status::OK;
}

grpc::Status PsService::Pull(grpc::ServerContext*, const proto::PullRequest* request,
                             proto::PullResponse* response) {
  static Histogram& seconds = PsRequestSeconds("pull", "grpc");
  ScopedTimer timer(&seconds);
  const std::vector<RowRead> row_reads = DecodeRowReads(request->row_reads());
  if (absl::Status status =
          store_.CheckPull({request->names().begin(), request->names().end()},
                           static_cast<uint64_t>(ChannelOptions{}.max_message_bytes), row_reads);
      !status.ok()) {
    return ToGrpcStatus(status);
  }
  for (const std::string& name : request->names()) {
    if (absl::Status status = AppendValue(store_, name, response->mutable_values()); !status.ok()) {
      return ToGrpcStatus(status);
    }
    absl::StatusOr<VariableInfo> info = store_.Info(name);
    response->add_updates(info.ok() ? info->updates : 0);
  }
  for (const RowRead& read : row_reads) {
    if (absl::Status status = AppendRows(store_, read, response->mutable_values()); !status.ok()) {
      return ToGrpcStatus(status);
    }
    absl::StatusOr<VariableInfo> info = store_.Info(read.name);
    response->add_updates(info.ok() ? info->updates : 0);
  }
  return grpc::Status::OK;
}

grpc::Status PsService::Push(grpc::ServerContext*, const proto::PushRequest* request,
                             proto::PushResponse* response) {
  static Histogram& seconds = PsRequestSeconds("push", "grpc");
  ScopedTimer timer(&seconds);
  absl::StatusOr<std::vector<Gradient>> gradients = DecodeGradients(request->gradients());
  if (!gradients.ok()) return ToGrpcStatus(gradients.status());
  const std::vector<RowRead> row_reads = DecodeRowReads(request->row_reads());
  if (request->pull_after() || !row_reads.empty()) {
    // The values it asks back are checked before any gradient is applied.
    std::vector<std::string> names;
    for (const Gradient& gradient : *gradients) {
      if (request->pull_after() && !gradient.sparse) names.push_back(*gradient.name);
    }
    if (absl::Status status = store_.CheckPull(
            names, static_cast<uint64_t>(ChannelOptions{}.max_message_bytes), row_reads);
        !status.ok()) {
      return ToGrpcStatus(status);
    }
  }
  std::vector<VariableStore::PushedGradient> pushed;
  for (const Gradient& gradient : *gradients) {
    pushed.push_back({gradient.name, &gradient.tensor, gradient.sparse ? &gradient.rows : nullptr});
  }
  absl::StatusOr<std::vector<int64_t>> updates = store_.ApplyPush(pushed);
  if (!updates.ok()) return ToGrpcStatus(updates.status());
  for (const int64_t count : *updates) response->add_updates(count);
  for (const Gradient& gradient : *gradients) {
    if (request->pull_after() && !gradient.sparse) {
      if (absl::Status status = AppendValue(store_, *gradient.name, response->mutable_values());
          !status.ok()) {
        return ToGrpcStatus(status);
      }
    }
  }
  for (const RowRead& read : row_reads) {
    if (absl::Status status = AppendRows(store_, read, response->mutable_values()); !status.ok()) {
      return ToGrpcStatus(status);
    }
  }
  return grpc::Status::OK;
}

grpc::Status PsService::Assign(grpc::ServerContext*, const proto::AssignRequest* request,
                               proto::AssignResponse*) {
  if (absl::Status held = lease_.Heartbeat(CredentialOf(request->coordinator())); !held.ok()) {
    return ToGrpcStatus(held);
  }
  for (const proto::NamedTensor& message : request->values()) {
    absl::StatusOr<Tensor> value = TensorFromProto(message.tensor());
    if (!value.ok()) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("value for variable \"", message.name(), "\": ", value.status().message())));
    }
    const std::vector<int64_t> rows(message.rows().begin(), message.rows().end());
    if (absl::Status status =
            store_.Assign(message.name(), *value, message.rows().empty() ? nullptr : &rows);
        !status.ok()) {
      return ToGrpcStatus(status);
    }
  }
  return grpc::Status::OK;
}

grpc::Status PsService::SetLearningRate(grpc::ServerContext*,
                                        const proto::SetLearningRateRequest* request,
                                        proto::SetLearningRateResponse* response) {
  if (absl::Status held = lease_.Heartbeat(CredentialOf(request->coordinator())); !held.ok()) {
    return ToGrpcStatus(held);
  }
  absl::StatusOr<int> changed = store_.SetLearningRate(request->learning_rate());
  if (!changed.ok()) return ToGrpcStatus(changed.status());
  response->set_variables(*changed);
  return grpc::Status::OK;
}

grpc::Status PsService::ListVariables(grpc::ServerContext*, const proto::ListVariablesRequest*,
                                      proto::ListVariablesResponse* response) {
  AppendVariableStatuses(store_, response->mutable_variables());
  response->set_refused_non_finite(store_.refused_non_finite());
  response->set_total_bytes(store_.total_bytes());
  return grpc::Status::OK;
}

grpc::Status PsService::Save(grpc::ServerContext*, const proto::SaveRequest* request,
                             proto::SaveResponse* response) {
  absl::StatusOr<std::string> folder =
      lease_.HolderCheckpointDir(CredentialOf(request->coordinator()), "Save");
  if (!folder.ok()) return ToGrpcStatus(folder.status());
  if (absl::Status inside = CheckInsideFolder(request->path(), *folder, "Save"); !inside.ok()) {
    return ToGrpcStatus(inside);
  }
  // Only a checkpoint begun after the stop holds everything trained before it.
  bool after_stop;
  uint64_t save_id;
  {
    absl::MutexLock lock(&stop_mutex_);
    after_stop = stopping_;
    if (next_save_id_ == 0) ++next_save_id_;  // 0 names no save
    save_id = next_save_id_++;
  }
  // Opened beneath the folder: a link swapped in after the check above leads nowhere.
  absl::StatusOr<WrittenFile> written = SaveStore(store_, request->path(), Confinement{*folder});
  if (!written.ok()) return ToGrpcStatus(written.status());
  response->set_crc32(written->crc32);
  response->set_bytes(written->bytes);
  AppendVariableStatuses(store_, response->mutable_variables());
  response->set_stopping(after_stop);
  response->set_save_id(save_id);
  if (after_stop) {
    absl::MutexLock lock(&stop_mutex_);
    saves_since_stopping_.push_back(save_id);
    spdlog::info(
        "saved its state in {}; serving on until the coordinator has committed the checkpoint",
        request->path());
  }
  return grpc::Status::OK;
}

grpc::Status PsService::Restore(grpc::ServerContext*, const proto::RestoreRequest* request,
                                proto::RestoreResponse* response) {
  absl::StatusOr<std::string> folder =
      lease_.HolderCheckpointDir(CredentialOf(request->coordinator()), "Restore");
  if (!folder.ok()) return ToGrpcStatus(folder.status());
  if (request->rows().empty()) {
    if (absl::Status inside = CheckInsideFolder(request->path(), *folder, "Restore");
        !inside.ok()) {
      return ToGrpcStatus(inside);
    }
  }
  for (const proto::CheckpointFile& source : request->files()) {
    if (absl::Status inside = CheckInsideFolder(source.path(), *folder, "Restore"); !inside.ok()) {
      return ToGrpcStatus(inside);
    }
  }
  absl::StatusOr<int> restored;
  if (request->rows().empty()) {
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> file =
        SafetensorsReader::Open(request->path(), request->crc32(), Confinement{*folder});
    restored = file.ok() ? RestoreStore(store_, **file) : file.status();
  } else {
    restored = RestoreResharded(store_, *request, Confinement{*folder});
  }
  if (!restored.ok()) return ToGrpcStatus(restored.status());
  response->set_variables(*restored);
  return grpc::Status::OK;
}

grpc::Status PsService::DataPath(grpc::ServerContext*, const proto::DataPathRequest*,
                                 proto::DataPathResponse* response) {
  response->set_tcp_port(data_path_.tcp_port);
  response->set_unix_socket(data_path_.unix_name);
  response->set_token(data_path_.token);
  response->set_max_bytes(static_cast<int64_t>(data_path_.max_bytes));
  return grpc::Status::OK;
}

grpc::Status PsService::Watch(grpc::ServerContext* context, const proto::WatchRequest* request,
                              proto::WatchResponse* response) {
  const proto::CoordinatorId& id = request->coordinator();
  // A leaving coordinator ends the wait of a stopping PS, unless another holds the PS (the
  // one the PS waits for).
  bool left = false;
  if (request->leaving()) {
    left = lease_.Release(CredentialOf(id)) || lease_.Heartbeat(CredentialOf(id)).ok();
  } else if (request->claim()) {
    // A folder is inside (or is) the root when a name in it is strictly inside the root.
    if (!checkpoint_root_.empty() && !id.checkpoint_dir().empty()) {
      if (absl::Status inside =
              CheckInsideFolder(id.checkpoint_dir() + "/checkpoint", checkpoint_root_, "A claim");
          !inside.ok()) {
        return ToGrpcStatus(absl::PermissionDeniedError(
            absl::StrCat("this parameter server refuses the claim of ", id.description(),
                         ": its checkpoint folder ", id.checkpoint_dir(),
                         " is outside --checkpoint_root ", checkpoint_root_,
                         ", the only place this PS writes and reads checkpoints: set the "
                         "job's checkpoint.dir inside it")));
      }
    }
    // A holder that just died falls silent within the lease: wait that long for it.
    CoordinatorClaimant claimant = ClaimantOf(id);
    if (context != nullptr) claimant.peer = PeerHostOf(context->peer());  // null: in-process
    if (absl::Status claimed = lease_.Claim(claimant, lease_.lease() + absl::Seconds(1));
        !claimed.ok()) {
      return ToGrpcStatus(claimed);
    }
  } else if (absl::Status held = lease_.Heartbeat(CredentialOf(id)); !held.ok()) {
    return ToGrpcStatus(held);
  }
  absl::MutexLock lock(&stop_mutex_);
  if (left) {
    last_saving_watch_ = absl::InfinitePast();
  } else if (!request->leaving() && request->saves_checkpoints()) {
    last_saving_watch_ = clock_.Now();
    saving_coordinator_address_ = id.address();
  }
  // Only the holder's word counts (a refused caller got its error above; a leaving one that
  // did not hold the PS is not `left`).
  const uint64_t committed = request->committed_save();
  if (committed != 0 && (left || !request->leaving()) &&
      std::find(saves_since_stopping_.begin(), saves_since_stopping_.end(), committed) !=
          saves_since_stopping_.end()) {
    committed_since_stopping_ = true;
  }
  response->set_stopping(stopping_);
  response->set_saved(committed_since_stopping_);
  response->set_incarnation(ProcessIncarnation());
  return grpc::Status::OK;
}

void PsService::BeginStopping() {
  absl::MutexLock lock(&stop_mutex_);
  stopping_ = true;
}

std::string PsService::StopNeedNotWait(absl::Duration watch_window) const {
  std::string silent_coordinator;
  {
    absl::MutexLock lock(&stop_mutex_);
    if (committed_since_stopping_) return "the coordinator saved the job's state";
    if (clock_.Now() - last_saving_watch_ <= watch_window) return "";
    // Probed at most every kProbeInterval: the caller asks often, and each probe is a
    // connection for the coordinator to accept.
    if (last_saving_watch_ != absl::InfinitePast()) {
      if (clock_.Now() - last_probe_ < kProbeInterval) return "";
      silent_coordinator = saving_coordinator_address_;
    }
  }
  if (!silent_coordinator.empty()) {
    // Unlocked: a probe may take its whole timeout.
    const bool gone = RefusesConnections(silent_coordinator, absl::Milliseconds(300));
    absl::MutexLock lock(&stop_mutex_);
    last_probe_ = clock_.Now();
    if (!gone) return "";
  }
  absl::MutexLock lock(&stop_mutex_);
  // Nobody will commit the checkpoint this PS wrote its state into.
  const std::string uncommitted =
      saves_since_stopping_.empty()
          ? ""
          : ", and the checkpoint this server's state was saved into was not committed (the "
            "job resumes from its last committed checkpoint)";
  return absl::StrCat(last_saving_watch_ == absl::InfinitePast()
                          ? "no coordinator that saves checkpoints is training on it"
                          : "its coordinator is gone",
                      uncommitted);
}

std::string PsService::StopWaitTimedOut(absl::Duration timeout) const {
  absl::MutexLock lock(&stop_mutex_);
  return absl::StrCat(saves_since_stopping_.empty()
                          ? "the coordinator saved nothing"
                          : "the coordinator saved this server's state but committed no "
                            "checkpoint holding it",
                      " within --stop_timeout ", absl::FormatDuration(timeout),
                      ": stopping; the job resumes from its last checkpoint");
}

}  // namespace stratum
