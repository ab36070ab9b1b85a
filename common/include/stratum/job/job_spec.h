// JobSpec: one training job as a JSON file (README "The job spec"). The same file drives
// stratum-train, the coordinator, MultiWorkerMirrored workers and stratum-launch. The
// model and compile parts are Keras' own formats and are parsed by stratum/model; this
// file checks the rest and fills in defaults. Plain data.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "stratum/data/csv.h"
#include "stratum/data/example.h"
#include "stratum/data/record_files.h"
#include "stratum/data/tfrecord.h"

namespace stratum {

// multi_worker_mirrored: tf.distribute.experimental.CommunicationOptions.
struct CommunicationSpec {
  std::string implementation = "AUTO";  // AUTO, RING or NCCL
  int64_t bytes_per_pack = 0;           // 0: every gradient in one pack
  double timeout_seconds = 300;         // the deadline of each collective
};

struct StrategySpec {
  // default, one_device, mirrored, central_storage, parameter_server, multi_worker_mirrored
  std::string type = "default";
  std::vector<std::string> devices;  // one_device (first), mirrored, central_storage
  std::string cross_device_ops;      // mirrored: ReductionToOneDevice, HierarchicalCopyAllReduce
                                     // or NcclAllReduce
  int num_packs = 1;                 // mirrored with NcclAllReduce
  // Logical GPUs per physical GPU (tf.config.set_logical_device_configuration); 1: none.
  int logical_gpus_per_gpu = 1;
  // Threads of one replica's CPU kernels (tf.config.threading.
  // set_intra_op_parallelism_threads); 1: the replica's own thread alone.
  int intra_op_parallelism_threads = 1;
  nlohmann::json variable_partitioner;  // parameter_server
  CommunicationSpec communication;      // multi_worker_mirrored
};

// A Keras preprocessing layer applied to one feature of a source as it is read, before
// batching, as the ParameterServerStrategy tutorial's dataset.map applies its lookups:
// StringLookup (string tokens to ids) or IntegerLookup (int64 tokens to ids); for text lines,
// TextVectorization (a line to ids) on the feature "line".
struct PreprocessSpec {
  std::string feature;   // the feature (tfrecord), column (csv) or "line" (text)
  nlohmann::json layer;  // {"class_name": ..., "config": ...}; a vocabulary file's path
                         // made absolute with the job file's folder
};

struct DataSourceSpec {
  std::string format = "idx";  // idx, tfrecord, csv or text
  // idx: absolute, or relative to the job file's folder
  std::string images;
  std::string labels;
  // tfrecord, csv and text: paths or glob patterns, absolute or made so with the job file's folder
  // (patterns are matched when the data is read)
  std::vector<std::string> files;
  Compression compression = Compression::kNone;  // compression_type
  // tfrecord: tf.io feature specs, in key order but the label's last; the others feed the
  // model's inputs by name (or the one input, whatever its name)
  std::vector<FeatureSpec> features;
  // tfrecord: label_key; csv: label_name; text: labels ("file_index": a line's label is the
  // index of the files entry that names its file)
  std::string label;
  std::vector<PreprocessSpec> preprocess;  // tfrecord, csv and text, in key order
  CsvOptions csv;                          // csv
  ReadOptions read;  // tfrecord, csv and text: num_parallel_reads, interleave, ...

  // Whether the job gives this source (data.test is optional).
  bool given() const { return format == "idx" ? !images.empty() : !files.empty(); }
};

struct DataSpec {
  DataSourceSpec train;
  DataSourceSpec test;
  // Multiplies the model's input (Keras' Rescaling); 0, the default: 1/255 for uint8 data
  // (pixels), 1 for any other.
  double rescale = 0;
  std::string auto_shard_policy = "AUTO";
};

// One of fit.callbacks: a Keras callback by its class name, with its arguments as Keras
// names them, each checked (type and value) and the missing ones filled with Keras'
// defaults. BackupAndRestore is not one of them: it is the job's checkpoint (CheckpointSpec).
struct CallbackSpec {
  std::string class_name;  // EarlyStopping, ReduceLROnPlateau, TerminateOnNaN, CSVLogger, ...
  nlohmann::json config;   // every argument
};

struct FitSpec {
  int epochs = 1;
  int64_t steps_per_epoch = 0;  // 0: one pass over the training data
  int64_t batch_size_per_replica = 64;
  int64_t shuffle_buffer = 10000;
  uint64_t seed = 1;
  bool validate = true;  // evaluate on the test set after each epoch
  // Parameter-server jobs: training steps per closure (Keras' steps_per_execution).
  int64_t steps_per_execution = 1;
  std::vector<CallbackSpec> callbacks;  // in the order given: Keras calls them so
};

// checkpoint.max_to_keep null: every checkpoint is kept, as TF's max_to_keep=None.
inline constexpr int kKeepEveryCheckpoint = std::numeric_limits<int>::max();

struct CheckpointSpec {
  std::string dir;  // empty: no checkpoints
  int64_t every_steps = 0;
  int max_to_keep = 3;  // kKeepEveryCheckpoint: all
  // BackupAndRestore's delete_checkpoint: the checkpoints are removed once the job has
  // trained every epoch (a run again then starts afresh).
  bool delete_at_end = false;
};

struct JobSpec {
  StrategySpec strategy;
  nlohmann::json model;      // Keras model.to_json() (object, or the JSON string Keras writes)
  nlohmann::json optimizer;  // compile.optimizer
  nlohmann::json loss;       // compile.loss
  std::vector<std::string> metrics;
  DataSpec data;
  FitSpec fit;
  CheckpointSpec checkpoint;
};

struct JobSpecOptions {
  // A job must say its data; one whose workers run user closures alone may leave "data"
  // out (their datasets come from the functions registered on them).
  bool needs_data = true;
};

// Parses a job. `source` names it in errors (the file path); relative data paths are
// resolved against `base_dir`. Each error is one sentence naming the field and the fix.
absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view json_text, absl::string_view source,
                                     absl::string_view base_dir = "", JobSpecOptions options = {});

// Reads and parses a job file.
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

}  // namespace stratum
