#include "stratum/cuda/nccl_group.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/util/process_info.h"
#include "stratum/util/status_macros.h"

namespace stratum::cuda {
namespace {

bool InProgressOrOk(ncclResult_t result) {
  return result == ncclSuccess || result == ncclInProgress;
}

// How often a wait asks the abort check: a cluster error is a gRPC-free read, but the
// spin below runs every few microseconds.
constexpr absl::Duration kAbortCheckInterval = absl::Milliseconds(200);
constexpr char kAllReduce[] = "an NCCL all-reduce across the workers";

}  // namespace

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  STRATUM_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::vector<std::string>> GpuIdentities(const std::vector<int>& devices) {
  // The host as NCCL tells hosts apart: NCCL_HOSTID, else its name and this boot's id.
  std::string host;
  if (const char* host_id = std::getenv("NCCL_HOSTID"); host_id != nullptr) {
    host = absl::StrCat("NCCL_HOSTID=", host_id);
  } else {
    std::string boot_id;
    std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot_id);
    host = boot_id.empty() ? HostName() : absl::StrCat(HostName(), "/", boot_id);
  }
  std::vector<std::string> identities;
  for (int device : devices) {
    char bus[64] = {};
    STRATUM_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, sizeof(bus), device));
    identities.push_back(absl::StrCat(host, " ", bus));
  }
  return identities;
}

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Create(const NcclGroupOptions& options) {
  if (options.unique_id.size() != NCCL_UNIQUE_ID_BYTES || options.devices.empty() ||
      options.first_rank < 0 ||
      options.first_rank + static_cast<int>(options.devices.size()) > options.num_ranks ||
      options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an NCCL group needs a unique id of ", NCCL_UNIQUE_ID_BYTES,
        " bytes, at least one device, ranks within the group and a positive timeout; got ",
        options.unique_id.size(), " bytes, ", options.devices.size(), " device(s), ranks ",
        options.first_rank, "..", options.first_rank + options.devices.size(), " of ",
        options.num_ranks, ", timeout ", absl::FormatDuration(options.timeout)));
  }
  auto group = std::unique_ptr<NcclGroup>(new NcclGroup(options));
  STRATUM_RETURN_IF_ERROR(group->Form());
  return group;
}

absl::Status NcclGroup::Form() {
  // The environment overrides the config: blocking calls would wait without a deadline.
  if (const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
      blocking != nullptr && std::string(blocking) == "1") {
    return absl::FailedPreconditionError(
        "NCCL_COMM_BLOCKING=1 is set: NCCL's calls would block without a deadline, and a peer "
        "that died would hang this worker; unset it (Stratum polls non-blocking communicators "
        "against strategy.communication.timeout_seconds)");
  }
  ncclUniqueId id;
  std::memcpy(id.internal, options_.unique_id.data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait is polled against the deadline instead
  comms_.assign(options_.devices.size(), nullptr);
  STRATUM_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (size_t i = 0; i < options_.devices.size(); ++i) {
    if (absl::Status set =
            CudaStatus(cudaSetDevice(options_.devices[i]), "cudaSetDevice", __FILE__, __LINE__);
        !set.ok()) {
      ncclGroupEnd();
      return Abort(set);
    }
    const ncclResult_t result = ncclCommInitRankConfig(
        &comms_[i], options_.num_ranks, id, options_.first_rank + static_cast<int>(i), &config);
    if (!InProgressOrOk(result)) {
      ncclGroupEnd();
      return Abort(NcclStatus(result, "ncclCommInitRankConfig(...)", __FILE__, __LINE__));
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (!InProgressOrOk(ended)) {
    return Abort(NcclStatus(ended, "ncclGroupEnd()", __FILE__, __LINE__));
  }
  STRATUM_RETURN_IF_ERROR(
      PollUntil([this] { return Idle(); }, absl::Now() + options_.timeout,
                absl::StrCat("forming the NCCL group of ", options_.num_ranks, " ranks")));
  for (int slot = 0; slot < 2; ++slot) {
    for (int device : options_.devices) {
      STRATUM_ASSIGN_OR_RETURN(Event event, Event::Create(device));
      done_[slot].push_back(std::move(event));
    }
  }
  return absl::OkStatus();
}

NcclGroup::~NcclGroup() {
  if (aborted_ || comms_.empty()) return;
  // Finalize flushes what this rank still owes its peers; a peer that is gone would keep it
  // in progress forever, so it is bounded too, and aborted when it does not end.
  absl::Status closed = Wait();
  if (aborted_) return;  // Wait gave up: the communicators are gone
  // One group: blocking communicators (NCCL_COMM_BLOCKING=1) would otherwise wait in the
  // first Finalize for the local ranks not yet finalized.
  ncclGroupStart();
  for (ncclComm_t comm : comms_) {
    const ncclResult_t result = ncclCommFinalize(comm);  // in progress: non-blocking
    if (closed.ok() && !InProgressOrOk(result)) {
      closed = NcclStatus(result, "ncclCommFinalize", __FILE__, __LINE__);
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (closed.ok() && !InProgressOrOk(ended)) {
    closed = NcclStatus(ended, "ncclGroupEnd", __FILE__, __LINE__);
  }
  if (closed.ok()) {
    closed = PollUntil([this] { return Idle(); }, absl::Now() + options_.timeout,
                       "closing the NCCL group");
  }
  if (aborted_) return;
  if (!closed.ok()) {
    (void)Abort(closed);
    return;
  }
  for (ncclComm_t comm : comms_) ncclCommDestroy(comm);
}

absl::StatusOr<bool> NcclGroup::Idle() const {
  for (ncclComm_t comm : comms_) {
    ncclResult_t state = ncclSuccess;
    STRATUM_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) {
      return NcclStatus(state, "ncclCommGetAsyncError(...)", __FILE__, __LINE__);
    }
  }
  return true;
}

absl::Status NcclGroup::PollUntil(const std::function<absl::StatusOr<bool>()>& done,
                                  absl::Time deadline, const std::string& what) {
  absl::Time next_abort_check = absl::Now() + kAbortCheckInterval;
  for (int polls = 0;; ++polls) {
    absl::StatusOr<bool> finished = done();
    // A peer that died shows as an asynchronous error on the communicators.
    if (finished.ok() && !*finished) {
      absl::StatusOr<bool> idle = Idle();
      if (!idle.ok()) finished = idle.status();
    }
    if (!finished.ok()) return Abort(RankFailed(what, finished.status()));
    if (*finished) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (options_.abort_check && now >= next_abort_check) {
      next_abort_check = now + kAbortCheckInterval;
      if (absl::Status abort = options_.abort_check(); !abort.ok()) {
        return Abort(absl::Status(
            abort.code(), absl::StrCat("gave up on ", what, " (ranks: ", options_.participants,
                                       "): ", abort.message())));
      }
    }
    if (now >= deadline) {
      return Abort(absl::DeadlineExceededError(absl::StrCat(
          what, " did not finish within ", absl::FormatDuration(options_.timeout), ": one of ",
          options_.participants,
          " died or hangs (NCCL does not say which; the coordination service names a task "
          "that stopped heartbeating). Restart the job (it resumes from the last checkpoint), "
          "or raise strategy.communication.timeout_seconds if the steps are this slow")));
    }
    // Spin briefly (a step is tens of microseconds), then back off.
    if (polls < 2000) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(100));
    }
  }
}

absl::Status NcclGroup::RankFailed(const std::string& what, const absl::Status& cause) const {
  return absl::UnavailableError(absl::StrCat(
      what, " failed: ", cause.message(), ". A rank of the job (", options_.participants,
      ") failed or left; see their logs, then restart the job (it resumes from the last "
      "checkpoint)"));
}

absl::Status NcclGroup::Abort(absl::Status why) {
  if (!aborted_) {
    aborted_ = true;
    for (ncclComm_t comm : comms_) {
      if (comm != nullptr) ncclCommAbort(comm);
    }
  }
  return why;
}

absl::Status NcclGroup::WaitForCall(int slot) {
  if (!queued_[slot]) return absl::OkStatus();
  const std::vector<Event>& events = done_[slot];
  STRATUM_RETURN_IF_ERROR(PollUntil(
      [&events]() -> absl::StatusOr<bool> {
        for (const Event& event : events) {
          const cudaError_t state = cudaEventQuery(event.get());
          if (state == cudaErrorNotReady) return false;
          STRATUM_CUDA_RETURN_IF_ERROR(state);
        }
        return true;
      },
      absl::Now() + options_.timeout, kAllReduce));
  queued_[slot] = false;
  return absl::OkStatus();
}

absl::Status NcclGroup::AllReduce(const std::vector<ReplicaBuffer>& buffers, int64_t count) {
  if (aborted_) return Wait();
  if (buffers.size() != comms_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the NCCL group holds ", comms_.size(),
                                                   " local ranks, given ", buffers.size(),
                                                   " buffers"));
  }
  const int slot = static_cast<int>(calls_ % 2);
  STRATUM_RETURN_IF_ERROR(WaitForCall(slot));
  STRATUM_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  for (size_t r = 0; r < buffers.size(); ++r) {
    const ncclResult_t result =
        ncclAllReduce(buffers[r].data, buffers[r].data, static_cast<size_t>(count), ncclFloat,
                      ncclSum, comms_[r], buffers[r].stream->get());
    // A peer that died before this call shows here, at once, rather than while polling.
    if (!InProgressOrOk(result)) {
      ncclGroupEnd();
      return Abort(
          RankFailed(kAllReduce, NcclStatus(result, "ncclAllReduce(...)", __FILE__, __LINE__)));
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (!InProgressOrOk(ended)) {
    return Abort(RankFailed(kAllReduce, NcclStatus(ended, "ncclGroupEnd()", __FILE__, __LINE__)));
  }
  // Non-blocking communicators may still be queueing the kernels.
  STRATUM_RETURN_IF_ERROR(PollUntil([this] { return Idle(); }, absl::Now() + options_.timeout,
                                    "queueing an NCCL all-reduce"));
  for (size_t r = 0; r < buffers.size(); ++r) {
    STRATUM_RETURN_IF_ERROR(done_[slot][r].Record(*buffers[r].stream));
  }
  queued_[slot] = true;
  ++calls_;
  return absl::OkStatus();
}

absl::Status NcclGroup::Wait() {
  if (aborted_) {
    return absl::FailedPreconditionError(
        "the NCCL group was aborted after an earlier failure: restart the job");
  }
  STRATUM_RETURN_IF_ERROR(WaitForCall(0));
  return WaitForCall(1);
}

}  // namespace stratum::cuda
