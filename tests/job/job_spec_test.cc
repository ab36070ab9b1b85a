#include "stratum/job/job_spec.h"
#include "absl/strings/str_cat.h"
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
      ErrorOf(R"({"model": {}, "compile": {"loss": "mse", "metrics": ["auc"]}, "data": {}})"),
      HasSubstr("compile.metrics has \"auc\""));
  EXPECT_THAT(
      ErrorOf(R"({"model": {}, "compile": {"loss": "mse"}, "data": {"train": {"images": "a"}}})"),
      HasSubstr("data.train needs \"images\" and \"labels\""));
  EXPECT_THAT(
      ErrorOf(
          R"({"model": {}, "compile": {"loss": "mse"}, "data": {"train": {"images": "a", "labels": "b", "format": "csv"}}})"),
      HasSubstr("data.train.format is \"csv\""));
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
  EXPECT_TRUE(ParseJobSpec(job.dump(), "job.json", "/jobs").ok());
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

TEST(JobSpecTest, TheShippedExampleParses) {
  auto job = LoadJobSpec(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist.json");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->fit.epochs, 10);
  EXPECT_EQ(job->fit.batch_size_per_replica, 64);
}

}  // namespace
}  // namespace stratum
