// MultiWorkerMirroredStrategy with communication implementation NCCL: the gradients of
// every replica of every worker are summed by one NCCL group (one rank per GPU replica),
// as tf.distribute does for GPU tensors. The group forms through the coordination service's
// key-value store (a Rendezvous):
//   1. every worker publishes the identity (host name, PCI bus id) of each of its GPUs;
//   2. the first worker draws NCCL's unique id and publishes it;
//   3. every worker reads the others' GPUs, refuses a job in which two replicas share a GPU
//      (NCCL would fail with "Duplicate GPU detected"; here the error names the workers),
//      takes its ranks (the replicas of the workers before it come first) and joins.
// Every wait has the collectives' timeout as its deadline (cuda/nccl_group.h), and the
// group's waits also stop at the rendezvous' cluster error: `rendezvous` must outlive it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stratum/worker/collective/transport.h"

#if STRATUM_WITH_CUDA
#include "stratum/cuda/nccl_group.h"
#endif

namespace stratum {

struct NcclRanks {
  int first_rank = 0;  // this worker's first replica
  int num_ranks = 0;   // over the job
};

// From every worker's GPU identities (index = worker), `worker`'s ranks. FAILED_PRECONDITION
// naming the workers (`worker_names`, index = worker) when two replicas share a GPU.
absl::StatusOr<NcclRanks> PlanNcclRanks(const std::vector<std::vector<std::string>>& gpus,
                                        const std::vector<std::string>& worker_names, int worker);

#if STRATUM_WITH_CUDA
struct NcclAcrossWorkersOptions {
  int worker = 0;                         // this worker's index among the job's workers
  std::vector<std::string> worker_names;  // every worker's task name, index = worker
  std::vector<int> devices;               // this worker's physical GPUs, one per replica
  absl::Duration timeout = absl::Minutes(5);
  std::string key_prefix = "collective/nccl";
};

absl::StatusOr<std::unique_ptr<cuda::NcclGroup>> FormNcclAcrossWorkers(
    const NcclAcrossWorkersOptions& options, Rendezvous& rendezvous);
#endif

}  // namespace stratum
