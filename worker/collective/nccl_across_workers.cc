#include "stratum/worker/collective/nccl_across_workers.h"

#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "stratum/util/status_macros.h"

namespace stratum {

absl::StatusOr<NcclRanks> PlanNcclRanks(const std::vector<std::vector<std::string>>& gpus,
                                        const std::vector<std::string>& worker_names, int worker) {
  if (worker < 0 || static_cast<size_t>(worker) >= gpus.size() ||
      worker_names.size() != gpus.size()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", worker, " is not among ", gpus.size(),
                                                   " workers (", worker_names.size(), " names)"));
  }
  NcclRanks ranks;
  std::map<std::string, std::string> user_of;  // GPU identity -> "worker:1 (replica 0)"
  for (size_t w = 0; w < gpus.size(); ++w) {
    if (static_cast<int>(w) == worker) ranks.first_rank = ranks.num_ranks;
    for (size_t r = 0; r < gpus[w].size(); ++r) {
      // Without the address ("worker:1 at host:port"), which a worker gives only for its
      // peers: every worker then words the refusal alike, and the job reports it once.
      const std::string& name = worker_names[w];
      const std::string user =
          absl::StrCat(name.substr(0, name.find(" at ")), " (replica ", r, ")");
      auto [it, inserted] = user_of.emplace(gpus[w][r], user);
      if (!inserted) {
        return absl::FailedPreconditionError(absl::StrCat(
            "communication implementation NCCL needs a GPU of its own for every replica of the "
            "job, but ",
            it->second, " and ", user, " both use GPU \"", gpus[w][r],
            "\" (NCCL refuses two ranks on one GPU): give each replica its own GPU, or use "
            "strategy.communication.implementation RING or AUTO, which sum across workers in "
            "host memory"));
      }
      ++ranks.num_ranks;
    }
  }
  return ranks;
}

#if STRATUM_WITH_CUDA
absl::StatusOr<std::unique_ptr<cuda::NcclGroup>> FormNcclAcrossWorkers(
    const NcclAcrossWorkersOptions& options, Rendezvous& rendezvous) {
  const int workers = static_cast<int>(options.worker_names.size());
  const absl::Time deadline = absl::Now() + options.timeout;
  STRATUM_ASSIGN_OR_RETURN(std::vector<std::string> mine, cuda::GpuIdentities(options.devices));
  STRATUM_RETURN_IF_ERROR(rendezvous.Set(absl::StrCat(options.key_prefix, "/gpus/", options.worker),
                                         absl::StrJoin(mine, "\n")));
  std::vector<std::vector<std::string>> gpus(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    if (w == options.worker) {
      gpus[static_cast<size_t>(w)] = mine;
      continue;
    }
    absl::StatusOr<std::string> theirs =
        rendezvous.Get(absl::StrCat(options.key_prefix, "/gpus/", w),
                       std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!theirs.ok()) {
      return RendezvousWaitError(options.worker_names[static_cast<size_t>(w)],
                                 "GPUs for the NCCL group", theirs.status(),
                                 deadline - options.timeout, deadline);
    }
    gpus[static_cast<size_t>(w)] = absl::StrSplit(*theirs, '\n');
  }
  STRATUM_ASSIGN_OR_RETURN(NcclRanks ranks,
                           PlanNcclRanks(gpus, options.worker_names, options.worker));
  // Drawn once the job is known to be valid: the id opens NCCL's bootstrap socket.
  const std::string id_key = absl::StrCat(options.key_prefix, "/unique_id");
  std::string unique_id;
  if (options.worker == 0) {
    STRATUM_ASSIGN_OR_RETURN(unique_id, cuda::NewNcclUniqueId());
    STRATUM_RETURN_IF_ERROR(rendezvous.Set(id_key, absl::BytesToHexString(unique_id)));
  } else {
    STRATUM_ASSIGN_OR_RETURN(
        std::string hex,
        rendezvous.Get(id_key, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    unique_id = absl::HexStringToBytes(hex);
  }
  cuda::NcclGroupOptions group;
  group.unique_id = unique_id;
  group.num_ranks = ranks.num_ranks;
  group.first_rank = ranks.first_rank;
  group.devices = options.devices;
  group.timeout = options.timeout;
  group.participants = absl::StrJoin(options.worker_names, ", ");
  group.abort_check = [&rendezvous] { return rendezvous.cluster_error(); };
  return cuda::NcclGroup::Create(group);
}
#endif

}  // namespace stratum
