#include "stratum/worker/coordination_client.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stratum/net/status.h"
#include "stratum/util/error_kind.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/coordination_grpc_service.h"

namespace stratum {
namespace {

constexpr char kRestartAdvice[] = "restart the job; it resumes from the last checkpoint";
// A wait's call outlives the wait itself by this much, so that the service's answer (which
// names the missing tasks) arrives before gRPC's own deadline cuts it off.
constexpr absl::Duration kWaitSlack = absl::Seconds(5);
// How long a failing task spends telling the leader why (see ReportError).
constexpr absl::Duration kReportErrorTimeout = absl::Seconds(2);

void SetTask(const TaskKey& task, proto::CoordinatedTask* out) {
  out->set_type(task.type);
  out->set_index(task.index);
}

// Whether the error came from the service itself rather than from gRPC (no answer).
bool IsServiceAnswer(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  return trailers.find(kCoordinationAnswerKey) != trailers.end();
}

int64_t ToMillis(absl::Duration timeout) {
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout));
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

// LocalCoordinationClient

LocalCoordinationClient::LocalCoordinationClient(CoordinationService& service, TaskKey task,
                                                 uint64_t incarnation)
    : service_(service),
      task_(std::move(task)),
      incarnation_(incarnation != 0 ? incarnation : NewIncarnation()),
      registered_(service_.RegisterTask(task_, incarnation_)) {}

absl::Status LocalCoordinationClient::SetKeyValue(const std::string& key,
                                                  const std::string& value) {
  if (!registered_.ok()) return registered_;
  return service_.SetKeyValue(key, value);
}

absl::StatusOr<std::string> LocalCoordinationClient::GetKeyValue(const std::string& key,
                                                                 absl::Duration timeout) {
  if (!registered_.ok()) return registered_;
  return service_.GetKeyValue(key, absl::Now() + timeout);
}

absl::StatusOr<std::string> LocalCoordinationClient::TryGetKeyValue(const std::string& key) {
  if (!registered_.ok()) return registered_;
  return service_.TryGetKeyValue(key);
}

absl::Status LocalCoordinationClient::WaitAtBarrier(const std::string& id, absl::Duration timeout) {
  if (!registered_.ok()) return registered_;
  return service_.WaitAtBarrier(id, task_, absl::Now() + timeout);
}

absl::Status LocalCoordinationClient::ReportError(const absl::Status& error) {
  return service_.ReportError(task_, error);
}

absl::Status LocalCoordinationClient::cluster_error() const {
  if (!registered_.ok()) return registered_;
  return service_.cluster_error();
}

// CoordinationAgent

CoordinationAgent::CoordinationAgent(CoordinationAgentOptions options)
    : options_(std::move(options)),
      stub_(proto::CoordinationService::NewStub(
          MakeChannel(options_.leader_address, options_.channel))) {
  if (options_.incarnation == 0) options_.incarnation = NewIncarnation();
}

absl::StatusOr<std::unique_ptr<CoordinationAgent>> CoordinationAgent::Connect(
    CoordinationAgentOptions options) {
  std::unique_ptr<CoordinationAgent> agent(new CoordinationAgent(std::move(options)));
  if (absl::Status status = agent->Register(); !status.ok()) return status;
  agent->heartbeats_ = std::thread([agent = agent.get()] { agent->HeartbeatLoop(); });
  return agent;
}

CoordinationAgent::~CoordinationAgent() { StopHeartbeats(); }

std::string CoordinationAgent::Leader() const {
  return absl::StrCat("coordination service on ", options_.leader_name, " at ",
                      options_.leader_address);
}

absl::Status CoordinationAgent::CallStatus(const std::string& what,
                                           const grpc::ClientContext& context,
                                           const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  // The service's own answers pass on with their code, as worded: the cluster error names
  // the task at fault ("worker:2 sent no heartbeat for 10.9s ..."), and the leader that
  // answered is not lost, even when the code is UNAVAILABLE.
  const bool no_answer =
      code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
  if (no_answer && !IsServiceAnswer(context)) {
    // No answer at all (a wait's call outlives the wait, see kWaitSlack). The service
    // lives in the leader's process: a job cannot go on without it.
    return absl::UnavailableError(absl::StrCat(
        options_.task.ToString(), " lost the ", Leader(), " while ", what, " (",
        status.error_message(), "); ", options_.leader_name,
        " died, hangs or is unreachable, and the job cannot go on without it: ", kRestartAdvice));
  }
  // What the answer is (the failed task it names) stays with it.
  return Rewrapped(FromGrpcStatus(status, Leader()), code,
                   absl::StrCat(options_.task.ToString(), " ", what, ": ", Leader(), ": ",
                                status.error_message()));
}

absl::Status CoordinationAgent::Register() {
  proto::RegisterTaskRequest request;
  SetTask(options_.task, request.mutable_task());
  request.set_incarnation(options_.incarnation);
  proto::RegisterTaskResponse response;
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  grpc::Status status;
  std::unique_ptr<grpc::ClientContext> context;
  while (true) {
    // Waits for the channel to connect, so that a leader that starts late is waited for.
    context = std::make_unique<grpc::ClientContext>();
    context->set_wait_for_ready(true);
    context->set_deadline(absl::ToChronoTime(deadline));
    status = stub_->RegisterTask(context.get(), request, &response);
    // The service's own UNAVAILABLE (the cluster already failed) is its answer.
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || IsServiceAnswer(*context) ||
        absl::Now() >= deadline) {
      break;
    }
    // The leader's server is starting or stopping.
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (status.ok()) {
    service_incarnation_ = response.service_incarnation();
    heartbeat_timeout_ = absl::Milliseconds(response.heartbeat_timeout_ms());
    return absl::OkStatus();
  }
  if (IsServiceAnswer(*context)) return CallStatus("registering", *context, status);
  switch (status.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::UNAVAILABLE:
      return absl::DeadlineExceededError(absl::StrCat(
          options_.task.ToString(), " could not register with the ", Leader(), " within ",
          absl::FormatDuration(options_.connect_timeout), " (", status.error_message(),
          "): check that ", options_.leader_name, " runs and that ", options_.leader_address,
          " (its address in TF_CONFIG) is reachable from this task"));
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::UnimplementedError(absl::StrCat(
          options_.leader_name, " at ", options_.leader_address,
          " serves no coordination service: it is not the leader (chief:0, else worker:0) of "
          "a MultiWorkerMirrored job; every task must get the same cluster in TF_CONFIG"));
    default:
      return CallStatus("registering", *context, status);
  }
}

void CoordinationAgent::HeartbeatLoop() {
  proto::HeartbeatRequest request;
  SetTask(options_.task, request.mutable_task());
  request.set_incarnation(options_.incarnation);
  // A call may take up to half the timeout, so that a hanging leader is still noticed in
  // time.
  const absl::Duration call_timeout = std::max(options_.heartbeat_interval, heartbeat_timeout_ / 2);
  absl::Time last_answer = absl::Now();
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mutex_);
      const absl::Time wake = absl::Now() + options_.heartbeat_interval;
      while (!stop_ && absl::Now() < wake) stop_changed_.WaitWithDeadline(&mutex_, wake);
      if (stop_) return;
      heartbeat_call_ = &context;
    }
    SetDeadline(context, call_timeout);
    proto::HeartbeatResponse response;
    const grpc::Status status = stub_->Heartbeat(&context, request, &response);
    {
      absl::MutexLock lock(&mutex_);
      heartbeat_call_ = nullptr;
      if (stop_) return;
    }
    if (status.ok() && response.service_incarnation() != service_incarnation_) {
      SetClusterError(absl::AbortedError(absl::StrCat(
          "the ", Leader(), " is not the one this task registered with: ", options_.leader_name,
          " restarted and lost the cluster's state; ", kRestartAdvice)));
      return;
    }
    if (status.ok() && response.error_code() != 0) {
      // The job's first failure, which names its task ("worker:2 failed: ..."), as the
      // answer to ReportError gives it: the same words whichever way it is learnt.
      absl::Status first(static_cast<absl::StatusCode>(response.error_code()),
                         response.error_message());
      PayloadsFromProto(response.error_payloads(), first);
      SetClusterError(std::move(first));
      return;
    }
    if (status.ok()) {
      last_answer = absl::Now();
      continue;
    }
    const absl::Duration silent = absl::Now() - last_answer;
    if (silent > heartbeat_timeout_) {
      SetClusterError(absl::UnavailableError(
          absl::StrCat("lost the ", Leader(), ": no answer to heartbeats for ",
                       absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))),
                       " (last error: ", status.error_message(), "); ", options_.leader_name,
                       " died or is unreachable: ", kRestartAdvice)));
      return;
    }
  }
}

void CoordinationAgent::StopHeartbeats() {
  {
    absl::MutexLock lock(&mutex_);
    stop_ = true;
    if (heartbeat_call_ != nullptr) heartbeat_call_->TryCancel();
    stop_changed_.SignalAll();
  }
  if (heartbeats_.joinable()) heartbeats_.join();
}

void CoordinationAgent::SetClusterError(absl::Status error) {
  absl::MutexLock lock(&mutex_);
  if (!cluster_error_.ok()) return;
  spdlog::error("{}", std::string(error.message()));
  cluster_error_ = std::move(error);
}

absl::Status CoordinationAgent::cluster_error() const {
  absl::MutexLock lock(&mutex_);
  return cluster_error_;
}

absl::Status CoordinationAgent::SetKeyValue(const std::string& key, const std::string& value) {
  STRATUM_RETURN_IF_ERROR(cluster_error());
  proto::SetKeyValueRequest request;
  request.set_key(key);
  request.set_value(value);
  grpc::ClientContext context;
  SetDeadline(context, options_.rpc_timeout);
  proto::SetKeyValueResponse response;
  return CallStatus(absl::StrCat("setting key \"", key, "\""), context,
                    stub_->SetKeyValue(&context, request, &response));
}

absl::StatusOr<std::string> CoordinationAgent::GetKeyValue(const std::string& key,
                                                           absl::Duration timeout) {
  STRATUM_RETURN_IF_ERROR(cluster_error());
  proto::GetKeyValueRequest request;
  request.set_key(key);
  request.set_timeout_ms(ToMillis(timeout));
  grpc::ClientContext context;
  SetDeadline(context, timeout + kWaitSlack);
  proto::GetKeyValueResponse response;
  STRATUM_RETURN_IF_ERROR(CallStatus(absl::StrCat("waiting for key \"", key, "\""), context,
                                     stub_->GetKeyValue(&context, request, &response)));
  return std::move(*response.mutable_value());
}

absl::StatusOr<std::string> CoordinationAgent::TryGetKeyValue(const std::string& key) {
  STRATUM_RETURN_IF_ERROR(cluster_error());
  proto::GetKeyValueRequest request;
  request.set_key(key);
  request.set_no_wait(true);
  grpc::ClientContext context;
  SetDeadline(context, options_.rpc_timeout);
  proto::GetKeyValueResponse response;
  STRATUM_RETURN_IF_ERROR(CallStatus(absl::StrCat("reading key \"", key, "\""), context,
                                     stub_->GetKeyValue(&context, request, &response)));
  return std::move(*response.mutable_value());
}

absl::Status CoordinationAgent::WaitAtBarrier(const std::string& id, absl::Duration timeout) {
  STRATUM_RETURN_IF_ERROR(cluster_error());
  proto::WaitAtBarrierRequest request;
  request.set_barrier_id(id);
  SetTask(options_.task, request.mutable_task());
  request.set_timeout_ms(ToMillis(timeout));
  grpc::ClientContext context;
  SetDeadline(context, timeout + kWaitSlack);
  proto::WaitAtBarrierResponse response;
  return CallStatus(absl::StrCat("waiting at barrier \"", id, "\""), context,
                    stub_->WaitAtBarrier(&context, request, &response));
}

absl::Status CoordinationAgent::ReportError(const absl::Status& error) {
  proto::ReportErrorRequest request;
  SetTask(options_.task, request.mutable_task());
  request.set_error_code(static_cast<int>(error.code()));
  request.set_error_message(std::string(error.message()));
  PayloadsToProto(error, request.mutable_error_payloads());
  grpc::ClientContext context;
  // Best effort and bounded tightly: the task is on its way out, and a leader that does
  // not answer (gone, or cut off by the network) would hold it for the whole rpc_timeout;
  // the others learn of the failure through their heartbeats anyway.
  SetDeadline(context, std::min(options_.rpc_timeout, kReportErrorTimeout));
  proto::ReportErrorResponse response;
  STRATUM_RETURN_IF_ERROR(
      CallStatus("reporting its error", context, stub_->ReportError(&context, request, &response)));
  // Learnt now rather than at the next heartbeat: the caller names the first failure.
  absl::MutexLock lock(&mutex_);
  if (cluster_error_.ok()) {
    cluster_error_ = absl::Status(static_cast<absl::StatusCode>(response.cluster_error_code()),
                                  response.cluster_error_message());
    PayloadsFromProto(response.cluster_error_payloads(), cluster_error_);
  }
  return absl::OkStatus();
}

absl::Status CoordinationAgent::Disconnect(absl::Duration timeout) {
  proto::DisconnectTaskRequest request;
  SetTask(options_.task, request.mutable_task());
  request.set_incarnation(options_.incarnation);
  grpc::ClientContext context;
  SetDeadline(context, timeout > absl::ZeroDuration() ? timeout : options_.rpc_timeout);
  proto::DisconnectTaskResponse response;
  const absl::Status status =
      CallStatus("disconnecting", context, stub_->DisconnectTask(&context, request, &response));
  StopHeartbeats();
  return status;
}

}  // namespace stratum
