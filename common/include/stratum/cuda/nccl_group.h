// NCCL across processes: the all-reduce of MultiWorkerMirroredStrategy with communication
// implementation NCCL. One NCCL rank per replica of every worker (rank = the replicas of the
// workers before this one + the local replica), found through a unique id that the first
// worker draws (NewNcclUniqueId) and the others receive through the coordination service's
// key-value store (worker/nccl_across_workers.cc).
//
// NCCL's blocking calls wait forever for a peer that died or hangs: TF's most reported
// collective failure (tensorflow#31499, #35878). Here the communicators are non-blocking,
// and every wait on them (forming the group, the all-reduces, closing it) polls NCCL's
// asynchronous error and CUDA's events against a deadline; when it passes, or NCCL reports a
// failure, the communicators are aborted and the error names the workers of the job and the
// fix. The waits also poll an abort check (the coordination service's cluster error), so a
// peer that stopped heartbeating or reported a failure ends them in seconds, not at the
// timeout. The host never blocks in a CUDA call behind an NCCL kernel.
//
// Thread safety: one thread at a time.
#pragma once

#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stratum/cuda/all_reduce.h"
#include "stratum/cuda/device.h"

namespace stratum::cuda {

// ncclGetUniqueId's bytes: what every rank needs to join the group.
absl::StatusOr<std::string> NewNcclUniqueId();

// "<host> <PCI bus id>" of each device: what NCCL calls the same GPU (it refuses two ranks
// on one, so the group's callers compare these first and say which workers share). The
// host is told apart as NCCL does: "<host name>/<boot id>", or NCCL_HOSTID where it is set
// (NCCL then treats processes with different ids as different hosts, even on one GPU).
absl::StatusOr<std::vector<std::string>> GpuIdentities(const std::vector<int>& devices);

struct NcclGroupOptions {
  std::string unique_id;     // NewNcclUniqueId's bytes, drawn by one process of the job
  int num_ranks = 0;         // over the whole job
  int first_rank = 0;        // the rank of devices[0]; devices[i] is first_rank + i
  std::vector<int> devices;  // this process's physical GPUs, one rank each
  // Each wait's deadline: forming the group, each all-reduce, closing it.
  absl::Duration timeout = absl::Minutes(5);
  // Who the ranks are, for errors ("chief:0, worker:0, worker:1").
  std::string participants;
  // Called about every 200 ms while a wait polls; an error from it aborts the group and
  // ends the wait with that error (a job passes its coordination service's cluster error).
  std::function<absl::Status()> abort_check = nullptr;
};

class NcclGroup final : public DeviceAllReduce {
 public:
  // Forms the group: returns when every rank of the job has joined. DEADLINE_EXCEEDED
  // (naming the participants) when they have not within the timeout; UNAVAILABLE when NCCL
  // fails to connect them.
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(const NcclGroupOptions& options);
  // Flushes and frees the communicators (aborts them if that does not finish in time).
  ~NcclGroup() override;

  std::string name() const override { return "NCCL across workers"; }
  // Queues, on each buffer's stream, the SUM over every rank of the job of `count` floats;
  // `buffers` are this process's replicas in device order. Before queueing it waits (on the
  // host, with the deadline) for the all-reduce queued two calls ago, so at most two are in
  // flight and a dead peer is noticed one step after it died.
  absl::Status AllReduce(const std::vector<ReplicaBuffer>& buffers, int64_t count) override;
  // Waits until every all-reduce queued so far has finished: call it before anything that
  // would block the host on these streams (reading metrics, variables).
  absl::Status Wait();
  // After a failure elsewhere (a peer gone, seen by the host collectives): aborts the
  // communicators instead of the destructor's flush, which would wait for the peers on
  // this host until the timeout.
  void Abandon() { (void)Abort(absl::OkStatus()); }

 private:
  explicit NcclGroup(const NcclGroupOptions& options) : options_(options) {}

  absl::Status Form();
  // Polls `done` (true: finished) and every communicator's asynchronous error until done
  // or `deadline`; then, or on an NCCL error, aborts the group. `what` names the wait.
  absl::Status PollUntil(const std::function<absl::StatusOr<bool>()>& done, absl::Time deadline,
                         const std::string& what);
  absl::StatusOr<bool> Idle() const;  // no communicator has an NCCL call in progress
  absl::Status WaitForCall(int slot);
  absl::Status Abort(absl::Status why);
  // UNAVAILABLE: `what` failed with `cause`, which a rank that died or left explains.
  absl::Status RankFailed(const std::string& what, const absl::Status& cause) const;

  const NcclGroupOptions options_;
  std::vector<ncclComm_t> comms_;  // one per device
  // The events recorded after the all-reduce of the last two calls, per device.
  std::vector<Event> done_[2];
  bool queued_[2] = {false, false};
  int64_t calls_ = 0;
  bool aborted_ = false;
};

}  // namespace stratum::cuda
