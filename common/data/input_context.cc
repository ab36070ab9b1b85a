#include "stratum/data/input_context.h"

#include <algorithm>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "dataset_graph.h"
#include "stratum/util/status_macros.h"

namespace stratum {

using data_internal::DatasetGraph;
using data_internal::DatasetNode;
using data_internal::NodePtr;

absl::StatusOr<int64_t> InputContext::GetPerReplicaBatchSize(int64_t global_batch_size) const {
  if (num_replicas_in_sync < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("InputContext.num_replicas_in_sync is ", num_replicas_in_sync,
                     ": it must be 1 or more; build the context from the strategy"));
  }
  if (global_batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global batch size ", global_batch_size, " is not positive: use a multiple of ",
        num_replicas_in_sync, ", e.g. ", 64 * num_replicas_in_sync));
  }
  if (global_batch_size % num_replicas_in_sync != 0) {
    const int64_t suggestion = global_batch_size / num_replicas_in_sync * num_replicas_in_sync;
    return absl::InvalidArgumentError(absl::StrCat(
        "global batch size ", global_batch_size, " does not divide evenly over ",
        num_replicas_in_sync, " replicas in sync: use a multiple of ", num_replicas_in_sync,
        ", e.g. ", suggestion > 0 ? suggestion : num_replicas_in_sync));
  }
  return global_batch_size / num_replicas_in_sync;
}

absl::StatusOr<AutoShardPolicy> AutoShardPolicyFromName(absl::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  if (upper == "OFF") return AutoShardPolicy::kOff;
  if (upper == "AUTO") return AutoShardPolicy::kAuto;
  if (upper == "FILE") return AutoShardPolicy::kFile;
  if (upper == "DATA") return AutoShardPolicy::kData;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown auto-shard policy \"", name, "\": use OFF, AUTO, FILE or DATA"));
}

const char* AutoShardPolicyName(AutoShardPolicy policy) {
  switch (policy) {
    case AutoShardPolicy::kOff:
      return "OFF";
    case AutoShardPolicy::kAuto:
      return "AUTO";
    case AutoShardPolicy::kFile:
      return "FILE";
    case AutoShardPolicy::kData:
      return "DATA";
  }
  return "?";
}

namespace {

// Rebuilds the chain above the source on top of `source`.
NodePtr ReplaceSource(const NodePtr& node, const NodePtr& source) {
  if (node->is_source()) return source;
  return node->WithInput(ReplaceSource(node->input(), source));
}

// Rebuilds the chain above `target` (a node of the chain under `node`) on `replacement`.
NodePtr ReplaceNode(const NodePtr& node, const NodePtr& target, const NodePtr& replacement) {
  if (node == target) return replacement;
  return node->WithInput(ReplaceNode(node->input(), target, replacement));
}

NodePtr SourceOf(NodePtr node) {
  while (!node->is_source()) node = node->input();
  return node;
}

}  // namespace

absl::StatusOr<Dataset> AutoShard(const Dataset& dataset, AutoShardPolicy policy, int num_workers,
                                  int worker_index) {
  STRATUM_RETURN_IF_ERROR(dataset.status());
  if (num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AutoShard: num_workers ", num_workers,
                     " is not positive: use the cluster's worker count"));
  }
  if (worker_index < 0 || worker_index >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("AutoShard: worker_index ", worker_index,
                                                   " is out of range for ", num_workers,
                                                   " workers: use 0..", num_workers - 1));
  }
  if (policy == AutoShardPolicy::kOff || num_workers == 1) return dataset;

  const NodePtr& root = DatasetGraph::Node(dataset);
  const NodePtr source = SourceOf(root);
  const int64_t files = source->NumFileUnits();
  if (policy == AutoShardPolicy::kAuto) {
    policy = files >= num_workers ? AutoShardPolicy::kFile : AutoShardPolicy::kData;
  }
  if (policy == AutoShardPolicy::kData) {
    return DatasetGraph::Wrap(
        ReplaceSource(root, DatasetGraph::MakeShard(source, num_workers, worker_index)));
  }
  if (files == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AutoShard FILE: the dataset reads no files (its source is ", source->Name(),
                     "): use the DATA policy (or AUTO) to shard it by element"));
  }
  if (files < num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AutoShard FILE: the dataset reads ", files, " file units (", source->Name(),
        ") but there are ", num_workers,
        " workers, so some would get none: use the DATA policy (or AUTO), or split the data "
        "into at least ",
        num_workers, " files"));
  }
  return DatasetGraph::Wrap(ReplaceSource(root, source->ShardFiles(num_workers, worker_index)));
}

std::string DescribeAutoShard(const Dataset& dataset, AutoShardPolicy policy, int num_workers) {
  const std::string name = AutoShardPolicyName(policy);
  if (!dataset.status().ok()) return absl::StrCat("auto_shard_policy ", name);
  if (policy == AutoShardPolicy::kOff || num_workers <= 1) {
    return absl::StrCat("auto_shard_policy ", name, ": every worker reads all of the data");
  }
  const NodePtr source = SourceOf(DatasetGraph::Node(dataset));
  const int64_t files = source->NumFileUnits();
  const char* suffix = num_workers % 10 == 2 && num_workers % 100 != 12   ? "nd"
                       : num_workers % 10 == 3 && num_workers % 100 != 13 ? "rd"
                                                                          : "th";
  const std::string nth = absl::StrCat("every worker reads all of it and keeps every ", num_workers,
                                       suffix, " example");
  if (policy == AutoShardPolicy::kData) {
    return absl::StrCat("auto_shard_policy DATA: ", nth, " (", source->Name(), ")");
  }
  if (files >= num_workers) {
    return absl::StrCat("auto_shard_policy ", name, ": sharding by FILE, ", files, " files (",
                        source->Name(), ") over ", num_workers, " workers, each reading its own");
  }
  if (files == 0) {
    return absl::StrCat(
        "auto_shard_policy AUTO: sharding by DATA, since the data is not read "
        "from files (",
        source->Name(), "): ", nth);
  }
  return absl::StrCat("auto_shard_policy AUTO: sharding by DATA, since the data's ", files,
                      files == 1 ? " file is" : " files are", " fewer than the ", num_workers,
                      " workers (FILE needs one per worker): ", nth);
}

absl::StatusOr<int64_t> SmallestShardExamples(const Dataset& dataset, AutoShardPolicy policy,
                                              int num_workers, int64_t total_examples) {
  if (policy == AutoShardPolicy::kOff || num_workers <= 1) return total_examples;
  int64_t smallest = -1;
  for (int w = 0; w < num_workers; ++w) {
    STRATUM_ASSIGN_OR_RETURN(const Dataset part, AutoShard(dataset, policy, num_workers, w));
    STRATUM_ASSIGN_OR_RETURN(const int64_t count, part.Cardinality());
    if (count < 0) return total_examples / num_workers;
    smallest = smallest < 0 ? count : std::min(smallest, count);
  }
  return smallest;
}

absl::StatusOr<Dataset> RebatchForWorkers(const Dataset& dataset, int num_workers) {
  STRATUM_RETURN_IF_ERROR(dataset.status());
  if (num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("RebatchForWorkers: num_workers ", num_workers,
                                                   " is not positive: use the worker count"));
  }
  if (num_workers == 1) return dataset;
  const NodePtr& root = DatasetGraph::Node(dataset);
  NodePtr batch = root;
  while (batch != nullptr && batch->BatchSize() == 0) batch = batch->input();
  if (batch == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExperimentalDistributeDataset over ", num_workers,
                     " workers needs a dataset of global batches, and this one has no Batch: call "
                     ".Batch(global_batch_size) before distributing it"));
  }
  const int64_t global = batch->BatchSize();
  if (global % num_workers != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExperimentalDistributeDataset: the global batch of ", global, " (",
                     batch->Name(), ") does not divide evenly over ", num_workers,
                     " workers: use a global batch that is a multiple of ", num_workers,
                     " (per-replica batch x num_replicas_in_sync)"));
  }
  return DatasetGraph::Wrap(ReplaceNode(root, batch, batch->WithBatchSize(global / num_workers)));
}

absl::StatusOr<std::vector<Element>> SplitBatch(const Element& global_batch, int num_replicas) {
  if (num_replicas < 1) {
    return absl::InvalidArgumentError(absl::StrCat("SplitBatch: num_replicas ", num_replicas,
                                                   " is not positive: use the replica count"));
  }
  std::vector<Element> parts(static_cast<size_t>(num_replicas));
  for (size_t i = 0; i < global_batch.size(); ++i) {
    const Tensor& component = global_batch[i];
    if (!component.valid() || component.shape().rank() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SplitBatch: component ", i, " is ",
          component.valid() ? component.DebugString() : "an empty Tensor",
          ", which has no batch axis to split: batch the dataset before distributing it"));
    }
    const int64_t rows = component.rows();
    if (rows % num_replicas != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SplitBatch: component ", i, " ", component.DebugString(), " has ", rows,
                       " rows, which do not divide evenly over ", num_replicas,
                       " replicas: use a global batch size that is a multiple of ", num_replicas,
                       " and Batch(..., drop_remainder=true)"));
    }
    const int64_t per_replica = rows / num_replicas;
    for (int r = 0; r < num_replicas; ++r) {
      parts[static_cast<size_t>(r)].push_back(
          component.SliceRows(r * per_replica, (r + 1) * per_replica));
    }
  }
  return parts;
}

}  // namespace stratum
