#include "remote_worker_executor.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"
#include "stratum/tensor/tensor_proto.h"
#include "stratum/util/error_kind.h"
#include "stratum/util/status_macros.h"

namespace stratum {

RemoteWorkerExecutor::RemoteWorkerExecutor(std::string task, std::string address,
                                           proto::SetupJobRequest setup, absl::Duration timeout,
                                           std::unique_ptr<WorkerConnection> connection,
                                           std::function<absl::Status()> may_set_up_again)
    : task_(std::move(task)),
      address_(std::move(address)),
      setup_(std::move(setup)),
      timeout_(timeout),
      connection_(std::move(connection)),
      may_set_up_again_(std::move(may_set_up_again)) {}

RemoteWorkerExecutor::~RemoteWorkerExecutor() {
  {
    absl::MutexLock lock(&setup_mutex_);
    if (generation_ == 0) return;  // never set up: nothing held
  }
  proto::LeaveRequest request;
  request.set_coordinator_incarnation(setup_.coordinator_incarnation());
  request.set_coordinator_secret(setup_.coordinator().secret());
  connection_->Leave(request, absl::Seconds(1));
}

std::string RemoteWorkerExecutor::name() const { return absl::StrCat(task_, " at ", address_); }

absl::StatusOr<ClosureOutputs> RemoteWorkerExecutor::Execute(const Closure& closure) {
  absl::StatusOr<uint64_t> generation = EnsureSetUp();
  if (!generation.ok()) return generation.status();
  proto::RunClosureRequest request;
  request.set_function(closure.function);
  request.set_coordinator_incarnation(setup_.coordinator_incarnation());
  request.set_coordinator_secret(setup_.coordinator().secret());
  for (const ClosureArg& arg : closure.args) {
    proto::ClosureArgument* sent = request.add_args();
    if (const Tensor* tensor = arg.tensor()) {
      TensorToProto(*tensor, sent->mutable_tensor());
    } else {
      sent->mutable_per_worker()->set_id(arg.per_worker()->id);
      sent->mutable_per_worker()->set_dataset(arg.per_worker()->dataset);
    }
  }
  if (cancelled_) return absl::CancelledError("the coordinator is shutting down");
  absl::StatusOr<proto::RunClosureResponse> response = connection_->RunClosure(request, timeout_);
  if (!response.ok() && cancelled_) {
    return absl::CancelledError("the coordinator shut down before the closure ended");
  }
  if (!response.ok()) return Classify(response.status(), *generation);
  ClosureOutputs outputs;
  for (const proto::TensorProto& output : response->outputs()) {
    absl::StatusOr<Tensor> tensor = TensorFromProto(output);
    if (!tensor.ok()) return tensor.status();
    outputs.push_back(*std::move(tensor));
  }
  return outputs;
}

void RemoteWorkerExecutor::Cancel() {
  cancelled_ = true;
  connection_->CancelAll();
}

absl::Status RemoteWorkerExecutor::LeftOut() const {
  absl::MutexLock lock(&left_out_mutex_);
  return left_out_;
}

absl::Status RemoteWorkerExecutor::WaitUntilAvailable(const std::atomic<bool>& stop) {
  uint64_t refused_by = 0;
  {
    absl::MutexLock lock(&left_out_mutex_);
    if (!left_out_.ok()) refused_by = left_out_incarnation_;
  }
  if (refused_by != 0) {
    // Left out: the process that could not set the job up will not by itself; its restart
    // (another incarnation on the address) may.
    while (!stop) {
      absl::StatusOr<TaskReport> report = connection_->Report(absl::Seconds(1));
      if (report.ok() && report->incarnation != refused_by) {
        spdlog::info("{} restarted; it will be set up anew", name());
        absl::MutexLock lock(&left_out_mutex_);
        left_out_ = absl::OkStatus();
        return absl::OkStatus();
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    return absl::CancelledError("stopping");
  }
  bool said = false;
  while (!stop) {
    if (connection_->Health(absl::Seconds(1)).ok()) {
      spdlog::info("{} answers again; it will be set up anew", name());
      return absl::OkStatus();
    }
    if (!said) spdlog::warn("{} is down; its closures run on the other workers", name());
    said = true;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::CancelledError("stopping");
}

absl::StatusOr<uint64_t> RemoteWorkerExecutor::EnsureSetUp() {
  absl::MutexLock lock(&setup_mutex_);
  if (set_up_) return generation_;
  // A worker that lost its job may have been set up by another coordinator since.
  if (generation_ > 0) STRATUM_RETURN_IF_ERROR(may_set_up_again_());
  // The process asked (read first: one that restarts meanwhile is another, not left out).
  const absl::StatusOr<TaskReport> asked = connection_->Report(absl::Seconds(1));
  const absl::Status status = connection_->SetupJob(setup_, timeout_).status();
  if (!status.ok()) {
    // The worker's own answer about the job (its data, memory, files), as opposed to a
    // transport fault, a lease or a restart, which Classify handles.
    const bool refused_the_job =
        asked.ok() && (absl::IsInvalidArgument(status) || absl::IsNotFound(status) ||
                       absl::IsResourceExhausted(status) || absl::IsDataLoss(status) ||
                       absl::IsOutOfRange(status) || absl::IsUnimplemented(status) ||
                       absl::IsPermissionDenied(status) ||
                       (absl::IsFailedPrecondition(status) &&
                        !IsErrorKind(status, ErrorKind::kHeldByAnotherCoordinator)));
    if (!refused_the_job) return Classify(status, generation_, /*locked=*/true);
    // It cannot build the job where the coordinator could: left out until it restarts; the
    // others go on.
    const std::string why(absl::StripPrefix(status.message(), absl::StrCat(name(), ": ")));
    spdlog::warn("{} cannot set the job up, so it is left out until it restarts: {}", name(), why);
    absl::MutexLock lock(&left_out_mutex_);
    left_out_ = absl::Status(status.code(), absl::StrCat(name(), " cannot set the job up: ", why));
    left_out_incarnation_ = asked->incarnation;
    return absl::UnavailableError(
        absl::StrCat(name(), " is left out: it cannot set the job up: ", why));
  }
  {
    absl::MutexLock lock(&left_out_mutex_);
    left_out_ = absl::OkStatus();  // set up after all (another thread, a restart)
  }
  set_up_ = true;
  return ++generation_;
}

absl::Status RemoteWorkerExecutor::Classify(const absl::Status& status, uint64_t generation,
                                            bool locked) {
  if (IsErrorKind(status, ErrorKind::kHeldByAnotherCoordinator)) {
    return Rewrapped(status, absl::StrCat(status.message(),
                                          "; this coordinator stops and leaves the job to it"));
  }
  const bool lost = IsErrorKind(status, ErrorKind::kNotSetUp);
  const bool down =
      absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) || absl::IsCancelled(status);
  if (!lost && !down) return status;
  {
    std::optional<absl::MutexLock> lock;
    if (!locked) lock.emplace(&setup_mutex_);
    if (generation_ == generation) set_up_ = false;
  }
  return Rewrapped(status, lost ? absl::StatusCode::kAborted : absl::StatusCode::kUnavailable,
                   status.message());
}

}  // namespace stratum
