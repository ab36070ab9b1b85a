#include "stratum/cluster/slurm_cluster_resolver.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

constexpr char kSource[] = "the Slurm step";

// Splits at commas outside brackets.
std::vector<std::string> TopLevelItems(absl::string_view text) {
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) return {};  // a ']' before its '[': no items, refused
    if (c == ',' && depth == 0) {
      items.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  items.push_back(std::move(current));
  return items;
}

absl::Status BadHostlist(absl::string_view hostlist, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_NODELIST \"", hostlist, "\" ", why,
                                                 ": give a Slurm hostlist such as "
                                                 "\"node[01-03,7],gpu5\""));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(absl::string_view hostlist) {
  std::vector<std::string> hosts;
  const std::vector<std::string> items = TopLevelItems(hostlist);
  if (items.empty()) return BadHostlist(hostlist, "has a ']' before its '['");
  for (const std::string& item : items) {
    if (item.empty()) return BadHostlist(hostlist, "has an empty entry");
    const size_t open = item.find('[');
    if (open == std::string::npos) {
      if (item.find(']') != std::string::npos) return BadHostlist(hostlist, "has a stray ']'");
      hosts.push_back(item);
      continue;
    }
    const size_t close = item.find(']', open);
    if (close == std::string::npos || item.find('[', open + 1) != std::string::npos) {
      return BadHostlist(hostlist, "has an unbalanced or nested '['");
    }
    const std::string prefix = item.substr(0, open);
    const std::string suffix = item.substr(close + 1);
    for (absl::string_view range :
         absl::StrSplit(absl::string_view(item).substr(open + 1, close - open - 1), ',')) {
      const std::vector<absl::string_view> ends = absl::StrSplit(range, '-');
      int64_t first = 0;
      int64_t last = 0;
      if (ends.size() > 2 || ends[0].empty() || !absl::SimpleAtoi(ends[0], &first) ||
          !absl::SimpleAtoi(ends.back(), &last) || last < first || last - first > 100000) {
        return BadHostlist(hostlist, absl::StrCat("has the range \"", range, "\""));
      }
      const size_t width = ends[0].size();  // "01-10": zero-padded to 2
      for (int64_t n = first; n <= last; ++n) {
        std::string number = absl::StrCat(n);
        if (number.size() < width) number.insert(0, width - number.size(), '0');
        hosts.push_back(absl::StrCat(prefix, number, suffix));
      }
    }
  }
  return hosts;
}

absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(absl::string_view tasks_per_node) {
  std::vector<int> counts;
  for (absl::string_view item : absl::StrSplit(tasks_per_node, ',')) {
    int count = 0;
    int repeat = 1;
    const size_t paren = item.find('(');
    const absl::string_view number = item.substr(0, paren);
    bool ok = absl::SimpleAtoi(number, &count) && count >= 0;
    if (ok && paren != absl::string_view::npos) {
      ok = item.size() > paren + 3 && item.substr(paren, 2) == "(x" && item.back() == ')' &&
           absl::SimpleAtoi(item.substr(paren + 2, item.size() - paren - 3), &repeat) &&
           repeat > 0 && repeat <= 100000;
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("SLURM_STEP_TASKS_PER_NODE \"", tasks_per_node, "\" has the entry \"", item,
                       "\": give counts such as \"2(x3),1\" (2 tasks on each of 3 nodes, then 1)"));
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), count);
  }
  return counts;
}

absl::StatusOr<SlurmClusterResolver> SlurmClusterResolver::Create(
    const SlurmClusterOptions& options,
    const std::function<std::optional<std::string>(const char*)>& getenv) {
  auto env = [&](const char* name) -> std::optional<std::string> {
    if (getenv) return getenv(name);
    const char* value = std::getenv(name);
    return value == nullptr ? std::nullopt : std::optional<std::string>(value);
  };
  // The step's variables, with the job's as TensorFlow falls back to them.
  auto required = [&](const char* name, const char* fallback) -> absl::StatusOr<std::string> {
    std::optional<std::string> value = env(name);
    if (!value && fallback != nullptr) value = env(fallback);
    if (!value || value->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name,
                       " is not set, so this process is not a task of a Slurm step: start it with "
                       "srun, or give it TF_CONFIG instead of --cluster_resolver=slurm"));
    }
    return *value;
  };
  SlurmClusterResolver resolver;
  resolver.rpc_layer_ = options.rpc_layer;
  STRATUM_RETURN_IF_ERROR(ValidateRpcLayer(options.rpc_layer, kSource));

  STRATUM_ASSIGN_OR_RETURN(const std::string rank_text, required("SLURM_PROCID", nullptr));
  int rank = 0;
  if (!absl::SimpleAtoi(rank_text, &rank) || rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SLURM_PROCID is \"", rank_text, "\", not a task rank (0 or more)"));
  }
  STRATUM_ASSIGN_OR_RETURN(const std::string nodelist,
                           required("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"));
  STRATUM_ASSIGN_OR_RETURN(const std::string per_node_text,
                           required("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"));
  STRATUM_ASSIGN_OR_RETURN(std::vector<std::string> hosts, ExpandSlurmHostlist(nodelist));
  STRATUM_ASSIGN_OR_RETURN(std::vector<int> per_node, ExpandSlurmTasksPerNode(per_node_text));
  if (per_node.size() != hosts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SLURM_STEP_TASKS_PER_NODE \"", per_node_text, "\" gives ", per_node.size(),
                     " nodes, but SLURM_STEP_NODELIST \"", nodelist, "\" has ", hosts.size(),
                     ": they must describe the same step"));
  }

  // GPUs: the step's (their ids, which this rank's share is taken from), else those
  // CUDA_VISIBLE_DEVICES shows; the option only says how many there are, numbered from 0.
  std::vector<std::string> gpu_ids;
  {
    std::optional<std::string> gpus = env("SLURM_STEP_GPUS");
    if (!gpus || gpus->empty()) gpus = env("CUDA_VISIBLE_DEVICES");
    if (gpus && !gpus->empty()) gpu_ids = absl::StrSplit(*gpus, ',', absl::SkipEmpty());
  }
  if (options.gpus_per_node) {
    gpu_ids.clear();
    for (int g = 0; g < *options.gpus_per_node; ++g) gpu_ids.push_back(absl::StrCat(g));
  }
  const int gpus_per_node = static_cast<int>(gpu_ids.size());
  const int most_tasks = *std::max_element(per_node.begin(), per_node.end());
  const int gpus_per_task = options.gpus_per_task
                                ? *options.gpus_per_task
                                : (most_tasks > 0 ? gpus_per_node / most_tasks : 0);
  if (gpus_per_node < 0 || gpus_per_task < 0 || most_tasks * gpus_per_task > gpus_per_node) {
    return absl::InvalidArgumentError(
        absl::StrCat(most_tasks, " tasks on a node with ", gpus_per_task, " GPUs each need ",
                     most_tasks * gpus_per_task, " GPUs, but a node has ", gpus_per_node,
                     ": ask for fewer GPUs per task, or more GPUs per node"));
  }

  // Every task of the step in the order Slurm numbers them (its default block distribution:
  // the nodes in the step's order, then local rank). TensorFlow's resolver sorts the nodes
  // by name instead, which gives node10's address to a rank on node9; not here.
  std::vector<std::string> addresses;
  std::vector<std::string> gpu_lists;
  std::vector<std::string> task_nodes;
  for (size_t n = 0; n < hosts.size(); ++n) {
    for (int local = 0; local < per_node[n]; ++local) {
      addresses.push_back(absl::StrCat(hosts[n], ":", options.port_base + local));
      task_nodes.push_back(hosts[n]);
      std::vector<std::string> gpus;
      for (int g = 0; g < gpus_per_task; ++g) {
        gpus.push_back(gpu_ids[static_cast<size_t>(local * gpus_per_task + g)]);
      }
      gpu_lists.push_back(absl::StrJoin(gpus, ","));
    }
  }
  const int step_tasks = static_cast<int>(addresses.size());
  std::map<std::string, int> jobs = options.jobs;
  if (jobs.empty()) jobs[kWorker] = step_tasks;
  int wanted = 0;
  for (const auto& [type, count] : jobs) wanted += count;
  if (wanted > step_tasks) {
    return absl::InvalidArgumentError(
        absl::StrCat("the jobs want ", wanted, " tasks, but the Slurm step has ", step_tasks,
                     ": start the step with srun --ntasks=", wanted, ", or ask for fewer tasks"));
  }
  if (rank >= step_tasks) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_PROCID ", rank, " is not below the ",
                                                   step_tasks, " tasks of the step"));
  }
  int first = 0;
  for (const auto& [type, count] : jobs) {  // std::map: sorted by name, as TensorFlow sorts
    for (int i = 0; i < count; ++i) resolver.spec_.SetTask(type, i, addresses[first + i]);
    if (rank >= first && rank < first + count) {
      resolver.task_type_ = type;
      resolver.task_id_ = rank - first;
    }
    first += count;
  }
  if (resolver.task_type_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SLURM_PROCID ", rank, " is past the ", wanted,
                     " tasks the jobs ask for: give the jobs every task of the step"));
  }
  // A step distributed otherwise (--distribution=cyclic, an arbitrary layout) puts ranks
  // elsewhere: this node must be where the block order puts this rank.
  if (std::optional<std::string> node = env("SLURMD_NODENAME");
      node && !node->empty() && *node != task_nodes[static_cast<size_t>(rank)]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SLURM_PROCID ", rank, " runs on ", *node, ", but the step's block order puts it on ",
        task_nodes[static_cast<size_t>(rank)],
        ": start the step with srun's default (block) distribution"));
  }
  resolver.cuda_visible_devices_ = gpu_lists[static_cast<size_t>(rank)];
  STRATUM_RETURN_IF_ERROR(ValidateClusterSpec(resolver.spec_, kSource));
  return resolver;
}

absl::StatusOr<UnionClusterResolver> UnionClusterResolver::Create(
    const std::vector<const ClusterResolver*>& resolvers) {
  UnionClusterResolver merged;
  for (const ClusterResolver* resolver : resolvers) {
    for (const auto& [type, tasks] : resolver->cluster_spec().jobs()) {
      if (merged.spec_.HasJob(type)) {
        return absl::InvalidArgumentError(
            absl::StrCat("two of the union's resolvers define the job \"", type,
                         "\": give each job to one resolver"));
      }
      for (const auto& [index, address] : tasks) merged.spec_.SetTask(type, index, address);
    }
    if (merged.task_type_.empty() && resolver->has_task()) {
      merged.task_type_ = resolver->task_type();
      merged.task_id_ = resolver->task_id();
    }
    if (merged.rpc_layer_.empty()) merged.rpc_layer_ = resolver->rpc_layer();
  }
  STRATUM_RETURN_IF_ERROR(ValidateClusterSpec(merged.spec_, "the union of resolvers"));
  if (merged.has_task()) {
    STRATUM_RETURN_IF_ERROR(
        ValidateTask(merged.spec_, merged.task_type_, merged.task_id_, "the union of resolvers"));
  }
  return merged;
}

}  // namespace stratum
