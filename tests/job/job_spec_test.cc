#include "stratum/job/job_spec.h"
#include "absl/strings/str_cat.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/json_depth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum {
namespace {

using ::testing::HasSubstr;

constexpr char kMinimal[] = R"({
  "model": {"class_name": "Sequential", "config": {"layers": []}},
  "compile": {"optimizer": "adam", "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
  "data": {"train": {"images": "train-images.gz", "labels": "/abs/train-labels.gz"}}
})";

std::string ErrorOf(const std::string& text) {
  auto job = ParseJobSpec(text, "job.json", "/jobs");
  EXPECT_FALSE(job.ok());
  return std::string(job.status().message());
}

TEST(JobSpecTest, DefaultsAndRelativePaths) {
  auto job = ParseJobSpec(kMinimal, "job.json", "/jobs");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->strategy.type, "default");
  EXPECT_EQ(job->fit.epochs, 1);
  EXPECT_EQ(job->fit.batch_size_per_replica, 64);
  EXPECT_EQ(job->data.train.images, "/jobs/train-images.gz");
  EXPECT_EQ(job->data.train.labels, "/abs/train-labels.gz");
  EXPECT_TRUE(job->data.test.images.empty());
  EXPECT_EQ(job->optimizer, "adam");
}

TEST(JobSpecTest, ReadsEverySection) {
  auto job = ParseJobSpec(R"({
    "strategy": {"type": "mirrored", "devices": ["CPU:0", "CPU:1"], "cross_device_ops": "HierarchicalCopyAllReduce"},
    "model": {}, "compile": {"loss": "mse"},
    "data": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"}, "rescale": 1.0},
    "fit": {"epochs": 3, "steps_per_epoch": 10, "batch_size_per_replica": 32, "shuffle_buffer": 0, "seed": 7, "validate": false, "steps_per_execution": 5},
    "checkpoint": {"dir": "ckpt", "every_steps": 100, "max_to_keep": 2}})",
                          "job.json", "/jobs");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->strategy.devices.size(), 2u);
  EXPECT_EQ(job->strategy.cross_device_ops, "HierarchicalCopyAllReduce");
  EXPECT_EQ(job->fit.steps_per_epoch, 10);
  EXPECT_FALSE(job->fit.validate);
  EXPECT_EQ(job->fit.steps_per_execution, 5);
  EXPECT_EQ(job->checkpoint.dir, "/jobs/ckpt");
  EXPECT_EQ(job->data.rescale, 1.0);
  EXPECT_EQ(job->optimizer, "rmsprop");  // Keras' compile() default
}

TEST(JobSpecTest, ErrorsNameTheFieldAndTheFix) {
  EXPECT_THAT(ErrorOf("{"), HasSubstr("job.json: the job is not valid JSON"));
  // A key given twice (JSON keeps the last one without a word) is refused with its place.
  EXPECT_EQ(ErrorOf(R"({"fit": {"epochs": 5, "epochs": 50}})"),
            "job.json: key \"epochs\" appears twice in \"fit\" (JSON would keep the last "
            "silently): keep one");
  EXPECT_THAT(ErrorOf(R"({"model": {"config": {"layers": [{"config": {}}, {"config": {"units": 1,
                 "units": 2}}]}}})"),
              HasSubstr("key \"units\" appears twice in \"model.config.layers[].config\""));
  // A number no double holds (nlohmann throws out_of_range, not parse_error, for it).
  EXPECT_THAT(ErrorOf(R"({"fit": {"epochs": 1e400}})"),
              HasSubstr("job.json: the job holds a number out of range ("));
  EXPECT_THAT(ErrorOf(R"({"fit": {}, "fit": {}})"),
              HasSubstr("key \"fit\" appears twice in the top object"));
  // The same key in two objects is no repeat.
  EXPECT_THAT(ErrorOf(R"({"model": {"name": "a", "config": {"name": "b"}}})"),
              ::testing::Not(HasSubstr("appears twice")));
  EXPECT_THAT(ErrorOf(R"({"modle": {}})"),
              HasSubstr("job.json: job field modle is not a field Stratum knows: use "));
  EXPECT_THAT(ErrorOf(R"({"compile": {"loss": "mse"}, "data": {}})"),
              HasSubstr("job field model is missing"));
  EXPECT_THAT(ErrorOf(R"({"model": {}, "data": {}})"), HasSubstr("job field compile is missing"));
  EXPECT_THAT(
      ErrorOf(R"({"model": {}, "compile": {"loss": "mse", "metrics": ["precision"]}, "data": {}})"),
      HasSubstr("compile.metrics has \"precision\""));
  EXPECT_THAT(
      ErrorOf(R"({"model": {}, "compile": {"loss": "mse"}, "data": {"train": {"images": "a"}}})"),
      HasSubstr("data.train needs \"images\" and \"labels\""));
  EXPECT_THAT(
      ErrorOf(
          R"({"model": {}, "compile": {"loss": "mse"}, "data": {"train": {"images": "a", "labels": "b", "format": "parquet"}}})"),
      HasSubstr("data.train.format is \"parquet\": Stratum reads \"idx\" (gzipped or not), "
                "\"tfrecord\" (tf.train.Example records), \"csv\" and \"text\" (one example "
                "a line)"));
  EXPECT_THAT(
      ErrorOf(
          R"({"strategy": {"type": "tpu"}, "model": {}, "compile": {"loss": "mse"}, "data": {}})"),
      HasSubstr("strategy.type is \"tpu\""));
  EXPECT_THAT(
      ErrorOf(
          R"({"model": {}, "compile": {"loss": "mse"}, "data": {"train": {"images": "a", "labels": "b"}}, "fit": {"epochs": "ten"}})"),
      HasSubstr("fit.epochs is \"ten\", which has the wrong type: write a non-negative integer"));
  EXPECT_THAT(
      ErrorOf(
          R"({"model": {}, "compile": {"loss": "mse"}, "data": {"train": {"images": "a", "labels": "b"}}, "fit": {"epochs": 0}})"),
      HasSubstr("fit.epochs is 0"));
}

// A job file whose top level is not an object is named as the file, not as a field with an
// empty name.
TEST(JobSpecTest, AJobThatIsNotAnObjectIsNamedAsTheFile) {
  EXPECT_EQ(ErrorOf("[]"),
            "job.json: the job is [], not a JSON object: write the job as one object, "
            "{\"model\": ..., \"compile\": ..., \"data\": ..., ...} (see "
            "examples/fashion_mnist.json)");
  EXPECT_THAT(ErrorOf("\"job\""), HasSubstr("job.json: the job is \"job\", not a JSON object"));
  EXPECT_THAT(ErrorOf("7"), ::testing::Not(HasSubstr("job field  ")));
}

TEST(JobSpecTest, NegativeCountsAreRefusedWithTheFix) {
  nlohmann::json job = nlohmann::json::parse(kMinimal);
  job["checkpoint"] = {{"dir", "/tmp/c"}, {"every_steps", -1}};
  EXPECT_THAT(ErrorOf(job.dump()),
              HasSubstr("checkpoint.every_steps is -1: use 0 (a checkpoint at every epoch's end "
                        "only) or a number of steps"));
  job["checkpoint"] = {{"dir", "/tmp/c"}, {"max_to_keep", 0}};
  EXPECT_THAT(ErrorOf(job.dump()),
              HasSubstr("checkpoint.max_to_keep is 0: keep at least 1 checkpoint (the latest), "
                        "or null for every one"));
  // null keeps every checkpoint, as TF's max_to_keep=None (QA: there was no way to say so).
  job["checkpoint"] = {{"dir", "/tmp/c"}, {"max_to_keep", nullptr}};
  absl::StatusOr<JobSpec> keep_all = ParseJobSpec(job.dump(), "job.json", "/jobs");
  ASSERT_TRUE(keep_all.ok()) << keep_all.status();
  EXPECT_EQ(keep_all->checkpoint.max_to_keep, kKeepEveryCheckpoint);
  job.erase("checkpoint");
  job["fit"] = {{"steps_per_epoch", -5}};
  EXPECT_THAT(ErrorOf(job.dump()), HasSubstr("fit.steps_per_epoch is -5: use 0"));
  job["fit"] = {{"shuffle_buffer", -1}};
  EXPECT_THAT(ErrorOf(job.dump()), HasSubstr("fit.shuffle_buffer is -1"));
  job["fit"] = {{"steps_per_execution", 0}};
  EXPECT_THAT(ErrorOf(job.dump()), HasSubstr("fit.steps_per_execution is 0: use 1 or more"));
  job.erase("fit");
  // Checked for every binary (stratum-worker took any value, and did not apply it).
  job["strategy"] = {{"type", "mirrored"}, {"logical_gpus_per_gpu", 0}};
  EXPECT_THAT(ErrorOf(job.dump()),
              HasSubstr("strategy.logical_gpus_per_gpu is 0: use 1 (no split) or more"));
  job["strategy"] = {{"type", "default"}, {"intra_op_parallelism_threads", 0}};
  EXPECT_THAT(ErrorOf(job.dump()), HasSubstr("strategy.intra_op_parallelism_threads is 0: use 1"));
  job["strategy"] = {{"type", "default"}, {"intra_op_parallelism_threads", 2}};
  absl::StatusOr<JobSpec> two_threads = ParseJobSpec(job.dump(), "job.json", "/jobs");
  ASSERT_TRUE(two_threads.ok()) << two_threads.status();
  EXPECT_EQ(two_threads->strategy.intra_op_parallelism_threads, 2);
}

// Values that parse but mean nothing a user could want, found by a QA pass: each is refused
// by name with the fix instead of being quietly ignored or trained on.
TEST(JobSpecTest, ValuesThatCannotBeMeantAreRefusedWithTheFix) {
  nlohmann::json job = nlohmann::json::parse(kMinimal);
  job["strategy"] = {{"type", "default"}, {"devices", {"GPU:3"}}};
  EXPECT_THAT(ErrorOf(job.dump()),
              HasSubstr("strategy.devices is given for the default strategy, which runs on its "
                        "one device: remove \"devices\", or use strategy.type \"one_device\" "
                        "or \"mirrored\""));
  job.erase("strategy");
  for (double rescale : {0.0, -0.5}) {
    job["data"]["rescale"] = rescale;
    EXPECT_THAT(ErrorOf(job.dump()),
                HasSubstr(absl::StrCat("data.rescale is ", rescale,
                                       ": use a positive factor, such as 0.00392156862745098 "
                                       "(1/255) for pixels")));
  }
  job["data"].erase("rescale");
  job["fit"] = {{"steps_per_epoch", int64_t{1} << 62}};
  EXPECT_THAT(ErrorOf(job.dump()),
              HasSubstr("fit.steps_per_epoch is 4611686018427387904: use 0 (one pass over the "
                        "training data) or a number of steps up to 1000000000000"));
  job["fit"] = {{"steps_per_epoch", 1000000000000}};
  EXPECT_OK(ParseJobSpec(job.dump(), "job.json", "/jobs"));
}

TEST(JobSpecTest, MissingFileIsNotFound) {
  auto job = LoadJobSpec("/nonexistent/job.json");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("--job"));
}

// Printing or walking a value recurses once per level: a job nested 60,000 levels deep
// crashed the binaries (stack overflow) while its error message was being written.
TEST(JobSpecTest, ADeeplyNestedJobIsRefusedNotACrash) {
  const std::string deep = std::string(60000, '[') + std::string(60000, ']');
  auto job = ParseJobSpec(deep, "deep.json");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()),
              HasSubstr("deep.json: the job nests arrays and objects 60000 levels deep"));
  // Brackets inside strings do not count.
  EXPECT_EQ(JsonNestingDepth(R"({"a": "[[[[\"[[[", "b": [[1]]})"), 3);
}

TEST(JobSpecTest, NumbersOutOfRangeAndFilesThatAreNotJobsAreRefused) {
  nlohmann::json big = nlohmann::json::parse(kMinimal);
  big["fit"] = {{"epochs", 4294967297LL}};
  EXPECT_THAT(ErrorOf(big.dump()), HasSubstr("fit.epochs is 4294967297, which is out of range"));
  big["fit"] = {{"seed", -1}};
  EXPECT_THAT(ErrorOf(big.dump()), HasSubstr("fit.seed is -1, which has the wrong type"));
  for (const char* path : {"/dev/zero", "/tmp"}) {
    auto loaded = LoadJobSpec(path);
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("is not a regular file"));
  }
}

TEST(JobSpecTest, ReadsTFRecordAndCsvSources) {
  auto job = ParseJobSpec(R"({
    "model": {}, "compile": {"loss": "sparse_categorical_crossentropy"},
    "data": {
      "train": {"format": "tfrecord", "files": ["shards/train-*", "/abs/extra.tfrecord"],
                "compression_type": "GZIP", "label_key": "label",
                "features": {"label": {"type": "FixedLenFeature", "dtype": "int64", "shape": []},
                             "image": {"dtype": "string", "decode_raw": "uint8", "shape": [28, 28]}},
                "num_parallel_reads": 4,
                "interleave": {"cycle_length": 2, "block_length": 8, "deterministic": false},
                "ignore_errors": true},
      "test": {"format": "csv", "files": "test.csv", "label_name": "y", "field_delim": ";",
               "column_defaults": [0.5, 1, "", []], "select_columns": ["a", "y"],
               "header": false, "column_names": ["a", "b", "c", "y"], "na_value": "?"},
      "auto_shard_policy": "FILE"}})",
                          "job.json", "/jobs");
  ASSERT_TRUE(job.ok()) << job.status();
  const DataSourceSpec& train = job->data.train;
  EXPECT_EQ(train.format, "tfrecord");
  EXPECT_EQ(train.files, (std::vector<std::string>{"/jobs/shards/train-*", "/abs/extra.tfrecord"}));
  EXPECT_EQ(train.compression, Compression::kGzip);
  ASSERT_EQ(train.features.size(), 2u);
  EXPECT_EQ(train.features[0].key, "image");  // the model's input first, the label last
  EXPECT_EQ(train.features[1].key, "label");
  EXPECT_EQ(train.read.num_parallel_reads, 4);
  EXPECT_EQ(train.read.cycle_length, 2);
  EXPECT_EQ(train.read.block_length, 8);
  EXPECT_FALSE(train.read.deterministic);
  EXPECT_TRUE(train.read.ignore_errors);
  const DataSourceSpec& test = job->data.test;
  EXPECT_TRUE(test.given());
  EXPECT_EQ(test.files, std::vector<std::string>{"/jobs/test.csv"});
  EXPECT_EQ(test.csv.field_delim, ';');
  EXPECT_FALSE(test.csv.header);
  ASSERT_EQ(test.csv.column_defaults.size(), 4u);
  EXPECT_EQ(test.csv.column_defaults[0].type, CsvColumnDefault::Type::kFloat32);
  EXPECT_EQ(test.csv.column_defaults[1].type, CsvColumnDefault::Type::kInt64);
  EXPECT_EQ(test.csv.column_defaults[2].type, CsvColumnDefault::Type::kString);
  EXPECT_TRUE(test.csv.column_defaults[3].required);
  EXPECT_EQ(job->data.rescale, 0);  // chosen from the data when it is read
}

TEST(JobSpecTest, ReadsTextLineSourcesAndChecksThemWithTheFix) {
  auto data = [](const std::string& train) {
    return R"({"model": {}, "compile": {"loss": "sparse_categorical_crossentropy"},
               "data": {"train": )" +
           train + "}}";
  };
  const std::string line =
      R"("preprocess": {"line": {"class_name": "TextVectorization",
                                 "config": {"vocabulary": "vocab.txt"}}})";
  auto job = ParseJobSpec(data(R"({"format": "text", "files": ["cowper.txt", "derby/*.txt.gz"],
      "compression_type": "GZIP", "labels": "file_index", )" +
                               line + "}"),
                          "job.json", "/jobs");
  ASSERT_TRUE(job.ok()) << job.status();
  const DataSourceSpec& train = job->data.train;
  EXPECT_EQ(train.format, "text");
  EXPECT_EQ(train.files, (std::vector<std::string>{"/jobs/cowper.txt", "/jobs/derby/*.txt.gz"}));
  EXPECT_EQ(train.compression, Compression::kGzip);
  EXPECT_EQ(train.label, "file_index");
  ASSERT_EQ(train.preprocess.size(), 1u);
  EXPECT_EQ(train.preprocess[0].layer["config"]["vocabulary"], "/jobs/vocab.txt");

  EXPECT_THAT(ErrorOf(data(R"({"format": "text", "files": "a", )" + line + "}")),
              HasSubstr("data.train.labels is missing: give \"file_index\": a line's label is "
                        "the index of the files entry that names its file"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "text", "files": "a", "labels": "file_index"})")),
              HasSubstr("data.train.preprocess is missing: give the layer that makes each line "
                        "ids"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "text", "files": "a", "labels": "file_index",
      "preprocess": {"text": {"class_name": "StringLookup", "config": {}}}})")),
              HasSubstr("data.train.preprocess.text names something other than \"line\""));
  EXPECT_THAT(ErrorOf(data(R"({"format": "text", "files": "a", "labels": "file_index",
      "preprocess": {"line": {"class_name": "IntegerLookup", "config": {}}}})")),
              HasSubstr("data.train.preprocess.line is not a TextVectorization or StringLookup "
                        "layer"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "text", "files": "a", "labels": "file_index",
      "label_name": "y", )" +
                           line + "}")),
              HasSubstr("data.train.label_name is not a field Stratum knows"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "lines", "files": "a"})")),
              HasSubstr("\"csv\" and \"text\" (one example a line)"));
}

TEST(JobSpecTest, TFRecordAndCsvSourcesAreCheckedWithTheFix) {
  auto data = [](const std::string& train) {
    return R"({"model": {}, "compile": {"loss": "mse"}, "data": {"train": )" + train + "}}";
  };
  const std::string label = R"("label": {"dtype": "int64"})";
  EXPECT_THAT(ErrorOf(data(R"({"format": "tfrecord", "features": {)" + label + "}}")),
              HasSubstr("data.train.files is missing: give the data files"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "tfrecord", "files": "a", "features": {)" + label + "}}")),
              HasSubstr("data.train.label_key is missing"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "tfrecord", "files": "a", "label_key": "label",
                                "features": {)" +
                           label + "}}")),
              HasSubstr("data.train.features has no feature besides the label: give the "
                        "features the model takes"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "tfrecord", "files": "a", "label_key": "label",
                                "features": {"x": {"dtype": "string"}, )" +
                           label + "}}")),
              HasSubstr("data.train.features.x is a string feature without decode_raw: "
                        "Stratum's tensors hold numbers, so give \"decode_raw\""));
  EXPECT_THAT(ErrorOf(data(R"({"format": "tfrecord", "files": "a", "label_key": "label",
                                "features": {"x": {"dtype": "int64"}, )" +
                           label + R"(}, "preprocess": {"x": {"class_name": "StringLookup",
                                "config": {"vocabulary": ["a"]}}}})")),
              HasSubstr("data.train.preprocess.x is StringLookup on a int64 feature: apply "
                        "StringLookup to string features without decode_raw (tokens), and "
                        "IntegerLookup to int64 features"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "tfrecord", "files": "a", "label_key": "label",
                                "features": {"x": {"dtype": "int64"}, )" +
                           label + R"(}, "preprocess": {"y": {"class_name": "Normalization",
                                "config": {}}}})")),
              HasSubstr("data.train.preprocess.y is not a StringLookup or IntegerLookup layer"));
  EXPECT_THAT(
      ErrorOf(data(R"({"format": "tfrecord", "files": "a", "compression_type": "LZ4"})")),
      HasSubstr("data.train.compression_type is \"LZ4\": use \"\" (none), \"GZIP\" or \"ZLIB\""));
  EXPECT_THAT(
      ErrorOf(data(R"({"format": "tfrecord", "files": "a", "interleave": {"cycle_length": 0}})")),
      HasSubstr("data.train.interleave.cycle_length is 0 with block_length 1"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "csv", "files": "a"})")),
              HasSubstr("data.train.label_name is missing"));
  EXPECT_THAT(
      ErrorOf(data(R"({"format": "csv", "files": "a", "label_name": "y", "field_delim": "ab"})")),
      HasSubstr("data.train.field_delim is \"ab\": use one character"));
  EXPECT_THAT(ErrorOf(data(R"({"format": "csv", "files": "a", "label_name": "y", "images": "b"})")),
              HasSubstr("data.train.images is not a field Stratum knows"));
  EXPECT_THAT(
      ErrorOf(
          R"({"strategy": {"type": "multi_worker_mirrored"}, "model": {}, "compile": {"loss": "mse"},
                  "data": {"train": {"format": "csv", "files": "a", "label_name": "y",
                                     "ignore_errors": true}}})"),
      HasSubstr("data.train.ignore_errors is true for a multi_worker_mirrored job: its workers "
                "train in lock-step"));
}

// kMinimal with data.test and fit.callbacks `callbacks` (a JSON list).
std::string WithCallbacks(const std::string& callbacks, bool with_test = true) {
  return absl::StrCat(R"({
  "model": {"class_name": "Sequential", "config": {"layers": []}},
  "compile": {"loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
  "data": {"train": {"images": "a", "labels": "b"})",
                      with_test ? R"(, "test": {"images": "c", "labels": "d"})" : "",
                      R"(},
  "fit": {"callbacks": )",
                      callbacks, "}}");
}

TEST(JobSpecTest, CallbacksTakeKerasArgumentsWithKerasDefaults) {
  auto job = ParseJobSpec(WithCallbacks(R"([
      {"class_name": "EarlyStopping", "config": {"patience": 3, "restore_best_weights": true},
       "module": "keras.callbacks", "registered_name": null},
      "TerminateOnNaN",
      {"class_name": "CSVLogger", "config": {"filename": "run/log.csv"}},
      {"class_name": "TensorBoard", "config": {"update_freq": "batch"}},
      {"class_name": "ReduceLROnPlateau", "config": {"monitor": "val_accuracy"}}])"),
                          "job.json", "/jobs");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->fit.callbacks.size(), 5u);
  const nlohmann::json& early = job->fit.callbacks[0].config;
  EXPECT_EQ(early["monitor"], "val_loss");
  EXPECT_EQ(early["patience"], 3);
  EXPECT_EQ(early["mode"], "auto");
  EXPECT_TRUE(early["baseline"].is_null());
  EXPECT_EQ(job->fit.callbacks[1].class_name, "TerminateOnNaN");
  EXPECT_EQ(job->fit.callbacks[2].config["filename"], "/jobs/run/log.csv");
  EXPECT_EQ(job->fit.callbacks[2].config["separator"], ",");
  EXPECT_EQ(job->fit.callbacks[3].config["log_dir"], "/jobs/logs");
  EXPECT_EQ(job->fit.callbacks[3].config["update_freq"], 1);  // "batch": every step
  EXPECT_EQ(job->fit.callbacks[4].config["factor"], 0.1);
  EXPECT_EQ(job->fit.callbacks[4].config["patience"], 10);
}

TEST(JobSpecTest, BackupAndRestoreIsTheJobsCheckpoint) {
  auto job = ParseJobSpec(WithCallbacks(R"([{"class_name": "BackupAndRestore",
      "config": {"backup_dir": "backup", "save_freq": 50}}])"),
                          "job.json", "/jobs");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->fit.callbacks.empty());
  EXPECT_EQ(job->checkpoint.dir, "/jobs/backup");
  EXPECT_EQ(job->checkpoint.every_steps, 50);
  EXPECT_TRUE(job->checkpoint.delete_at_end);  // Keras' default delete_checkpoint
  auto kept = ParseJobSpec(WithCallbacks(R"([{"class_name": "BackupAndRestore",
      "config": {"backup_dir": "/b", "delete_checkpoint": false}}])"),
                           "job.json", "/jobs");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(kept->checkpoint.delete_at_end);
  EXPECT_EQ(kept->checkpoint.every_steps, 0);  // "epoch"
}

TEST(JobSpecTest, CallbacksAreRefusedByNameWithTheFix) {
  EXPECT_THAT(
      ErrorOf(WithCallbacks(R"(["ProgbarLogger"])")),
      HasSubstr("job field fit.callbacks[0] is the callback \"ProgbarLogger\", which "
                "Stratum does not run: use one of BackupAndRestore, CSVLogger, "
                "EarlyStopping, ModelCheckpoint, ReduceLROnPlateau, TensorBoard, TerminateOnNaN"));
  EXPECT_THAT(ErrorOf(WithCallbacks(R"([{"class_name": "LearningRateScheduler"}])")),
              HasSubstr("give the optimizer's learning_rate a Keras schedule"));
  EXPECT_THAT(
      ErrorOf(WithCallbacks(R"([{"class_name": "EarlyStopping", "config": {"patiense": 2}}])")),
      HasSubstr("job field fit.callbacks[0].config.patiense is not a field Stratum "
                "knows: use baseline, min_delta, mode, monitor, patience"));
  EXPECT_THAT(
      ErrorOf(WithCallbacks(R"([{"class_name": "EarlyStopping", "config": {"patience": "2"}}])")),
      HasSubstr("fit.callbacks[0].config.patience is \"2\", which has the wrong type"));
  EXPECT_THAT(
      ErrorOf(WithCallbacks(R"([{"class_name": "EarlyStopping", "config": {"mode": "lower"}}])")),
      HasSubstr("fit.callbacks[0].config.mode is \"lower\": use \"auto\", \"min\" or \"max\""));
  EXPECT_THAT(
      ErrorOf(WithCallbacks(R"([{"class_name": "ReduceLROnPlateau", "config": {"factor": 2}}])")),
      HasSubstr("config.factor is 2: use a factor from 0 up to (not including) 1"));
  EXPECT_THAT(ErrorOf(WithCallbacks(R"([{"class_name": "CSVLogger"}])")),
              HasSubstr("fit.callbacks[0].config.filename is missing: give CSVLogger its "
                        "filename"));
  EXPECT_THAT(
      ErrorOf(WithCallbacks(R"([{"class_name": "TensorBoard", "config": {"histogram_freq": 1}}])")),
      HasSubstr("config.histogram_freq is 1: Stratum's TensorBoard writes scalars"));
  EXPECT_THAT(
      ErrorOf(WithCallbacks(R"([{"class_name": "TensorBoard", "config": {"update_freq": 0}}])")),
      HasSubstr("write \"epoch\", \"batch\" or a number of steps (1 or more)"));
  // A monitor the epochs' logs lack: Keras would warn at every epoch and never act.
  EXPECT_THAT(ErrorOf(WithCallbacks(
                  R"([{"class_name": "EarlyStopping", "config": {"monitor": "val_auc"}}])")),
              HasSubstr("monitor is \"val_auc\", which the epochs' logs do not have: monitor "
                        "one of accuracy, loss, val_accuracy, val_loss"));
  EXPECT_THAT(ErrorOf(WithCallbacks(R"(["EarlyStopping"])", /*with_test=*/false)),
              HasSubstr("monitor is \"val_loss\", which is measured on data.test after each "
                        "epoch, and this job has no data.test or sets fit.validate false: give "
                        "data.test, or monitor one of accuracy, loss"));
  EXPECT_THAT(ErrorOf(absl::StrCat(
                  R"({"model": {}, "compile": {"loss": "mse"}, "data": {"train": {"images": "a",
      "labels": "b"}}, "checkpoint": {"dir": "/c"}, "fit": {"callbacks": [{"class_name":
      "BackupAndRestore", "config": {"backup_dir": "/b"}}]}})")),
              HasSubstr("backs up into /b, and the job already has checkpoint.dir /c: give one "
                        "backup folder"));
  EXPECT_THAT(ErrorOf(WithCallbacks(R"([{"class_name": "ModelCheckpoint",
      "config": {"filepath": "m.keras"}}])")),
              HasSubstr("does not write Keras' .keras archive"));
  EXPECT_THAT(ErrorOf(WithCallbacks(R"([{"class_name": "ModelCheckpoint",
      "config": {"filepath": "m", "save_weights_only": true}}])")),
              HasSubstr("the filepath must end in .weights.h5"));
  EXPECT_THAT(ErrorOf(WithCallbacks(R"([{"class_name": "ModelCheckpoint",
      "config": {"filepath": "m-{epoch:02d}-{val_auc:.2f}"}}])")),
              HasSubstr("has the placeholder {val_auc:.2f}, which the epochs' logs do not give"));
  EXPECT_THAT(ErrorOf(WithCallbacks(R"([{"class_name": "ModelCheckpoint",
      "config": {"filepath": "m-{val_loss:02d}"}}])")),
              HasSubstr("has the placeholder {val_loss:02d}, whose format Python refuses"));
  EXPECT_THAT(ErrorOf(WithCallbacks(R"([{"class_name": "ModelCheckpoint",
      "config": {"filepath": "m", "save_freq": 100}}])")),
              HasSubstr("saves at epochs' ends"));
  // Without save_best_only the monitor is not read: no data.test is needed.
  auto job = ParseJobSpec(WithCallbacks(R"([{"class_name": "ModelCheckpoint",
      "config": {"filepath": "out/m-{epoch}"}}])",
                                        /*with_test=*/false),
                          "job.json", "/jobs");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->fit.callbacks[0].config["filepath"], "/jobs/out/m-{epoch}");
  EXPECT_THAT(ErrorOf(WithCallbacks(R"({"EarlyStopping": {}})")),
              HasSubstr("fit.callbacks is {\"EarlyStopping\":{}}, not a list"));
}

TEST(JobSpecTest, TheShippedExampleParses) {
  auto job = LoadJobSpec(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist.json");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->fit.epochs, 10);
  EXPECT_EQ(job->fit.batch_size_per_replica, 64);
}

}  // namespace
}  // namespace stratum
