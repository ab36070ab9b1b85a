// Input distribution as in tf.distribute: the InputContext a dataset function receives,
// auto-sharding of a dataset over workers (policies OFF, AUTO, FILE, DATA), and the split
// of a global batch into per-replica batches that ExperimentalDistributeDataset does.
//
// Auto-sharding rewrites the pipeline at its source, as TensorFlow's rewrite does: FILE
// hands each worker a subset of the source files, DATA inserts Shard(num_workers, index)
// right after the source. Sharding before Shuffle and Batch keeps the shards disjoint and
// every worker's batches full.
//
// Thread safety: plain values and functions without state; use from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stratum/data/dataset.h"

namespace stratum {

struct InputContext {
  int num_input_pipelines = 1;
  int input_pipeline_id = 0;
  int num_replicas_in_sync = 1;

  // global_batch_size / num_replicas_in_sync; INVALID_ARGUMENT when it does not divide.
  absl::StatusOr<int64_t> GetPerReplicaBatchSize(int64_t global_batch_size) const;
};

enum class AutoShardPolicy { kOff, kAuto, kFile, kData };

// "OFF", "AUTO", "FILE", "DATA" (as tf.data.experimental.AutoShardPolicy spells them).
absl::StatusOr<AutoShardPolicy> AutoShardPolicyFromName(absl::string_view name);
const char* AutoShardPolicyName(AutoShardPolicy policy);

// Worker `worker_index`'s part of `dataset`:
//   OFF:  the dataset unchanged (every worker sees all of it);
//   DATA: every num_workers-th element of the source, starting at worker_index;
//   FILE: every num_workers-th source file (unit) starting at worker_index; an error when
//         the dataset reads no files or fewer files than there are workers;
//   AUTO: FILE when the dataset reads at least num_workers files, else DATA.
// With one worker every policy returns the dataset unchanged. INVALID_ARGUMENT for a bad
// worker count or index, or a dataset in an error state (its error).
absl::StatusOr<Dataset> AutoShard(const Dataset& dataset, AutoShardPolicy policy, int num_workers,
                                  int worker_index);

// What AutoShard does with `policy` over num_workers workers, as a sentence for the log,
// e.g. "auto_shard_policy AUTO: sharding by FILE, 8 files (TFRecord(8 files)) over 2
// workers" or, when AUTO falls back, why it chose DATA.
std::string DescribeAutoShard(const Dataset& dataset, AutoShardPolicy policy, int num_workers);

// The examples of the smallest worker's part of `dataset` (AutoShard's, each worker's part
// counted where the source knows its size, e.g. files of uneven length), or
// total_examples / num_workers when it does not; total_examples for OFF. Workers in
// lock-step all run the steps this fills.
absl::StatusOr<int64_t> SmallestShardExamples(const Dataset& dataset, AutoShardPolicy policy,
                                              int num_workers, int64_t total_examples);

// Each worker's part of a dataset of GLOBAL batches, as tf.distribute rebatches for
// several workers: the topmost Batch(B) of the chain becomes Batch(B / num_workers), so
// that one step over all the workers still takes B examples. INVALID_ARGUMENT, with the
// fix, when the dataset has no Batch or B does not divide by num_workers.
absl::StatusOr<Dataset> RebatchForWorkers(const Dataset& dataset, int num_workers);

// Splits every component of `global_batch` along axis 0 into num_replicas equal parts that
// share its buffers; element r of the result is replica r's batch. INVALID_ARGUMENT when a
// component is a scalar or its rows do not divide by num_replicas.
absl::StatusOr<std::vector<Element>> SplitBatch(const Element& global_batch, int num_replicas);

}  // namespace stratum
