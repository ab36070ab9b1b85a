// TFRecord and CSV input as a user meets it: shards written by `stratum-data convert`,
// trained on by stratum-train, MultiWorkerMirrored workers (FILE sharding, AUTO's fallback
// to DATA, FILE refused with too few files) and parameter-server workers reading disjoint
// files; broken data refused before training with the file named.
#include <filesystem>
#include <fstream>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "stratum/testing/local_cluster.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using testing::RemoveFolder;
using testing::TempPath;
using json = nlohmann::json;

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist/";

struct BinaryRun {
  int code = -1;
  std::string output;
};

BinaryRun RunBinary(const std::string& binary, std::vector<std::string> args) {
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/" + binary};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return {};
  auto exit = (*process)->Wait(absl::Seconds(120));
  EXPECT_TRUE(exit.ok()) << exit.status();
  return {exit.ok() ? exit->ShellCode() : -1, (*process)->output()};
}

// TFRecord shards of Fashion-MNIST written once for the whole test binary by the real
// converter; data.train / data.test entries that read them, as the converter prints them.
class InputFilesTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempPath("tfrecord_shards"));
    RemoveFolder(*dir_);
    std::filesystem::create_directories(*dir_);
    train4_ = new json(Convert("train", 4, "train"));
    train3_ = new json(Convert("train", 3, "train3"));
    train1_ = new json(Convert("train", 1, "train1"));
    test_ = new json(Convert("t10k", 1, "test", "GZIP"));
  }
  static void TearDownTestSuite() { RemoveFolder(*dir_); }

  // The job file's entry the converter printed for what it wrote.
  static json Convert(const std::string& set, int shards, const std::string& prefix,
                      const std::string& compression = "") {
    const BinaryRun run = RunBinary(
        "stratum-data",
        {"convert", absl::StrCat("--images=", kFashionMnist, set, "-images-idx3-ubyte.gz"),
         absl::StrCat("--labels=", kFashionMnist, set, "-labels-idx1-ubyte.gz"),
         absl::StrCat("--out=", *dir_, "/", prefix), absl::StrCat("--shards=", shards),
         "--compression_type=" + compression});
    EXPECT_EQ(run.code, 0) << run.output;
    const size_t start = run.output.find("a job reads them with:\n");
    EXPECT_NE(start, std::string::npos) << run.output;
    if (start == std::string::npos) return json();
    return json::parse(run.output.substr(start + 23));
  }

  static json Job(const std::string& example, const json& train) {
    std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/" + example);
    json job = json::parse(file);
    job["data"] = {{"train", train}, {"test", *test_}};
    job.erase("checkpoint");
    return job;
  }

  static std::string Write(const json& job, const std::string& name) {
    const std::string path = TempPath(name + ".json");
    std::ofstream(path) << job.dump();
    return path;
  }

  static std::string* dir_;
  static json* train4_;
  static json* train3_;
  static json* train1_;
  static json* test_;
};

std::string* InputFilesTest::dir_ = nullptr;
json* InputFilesTest::train4_ = nullptr;
json* InputFilesTest::train3_ = nullptr;
json* InputFilesTest::train1_ = nullptr;
json* InputFilesTest::test_ = nullptr;

TEST_F(InputFilesTest, StratumTrainLearnsFromTheShardsTheConverterWrote) {
  EXPECT_EQ((*train4_)["features"]["image"]["decode_raw"], "uint8");
  EXPECT_EQ((*train4_)["features"]["label"]["dtype"], "int64");
  json job = Job("fashion_mnist.json", *train4_);
  job["data"].erase("rescale");  // uint8 pixels: 1/255 by default
  job["data"]["train"]["interleave"] = {{"cycle_length", 4}, {"block_length", 16}};
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 400;
  const std::string summary = TempPath("tfrecord_summary.json");
  const BinaryRun run = RunBinary(
      "stratum-train",
      {"--job=" + Write(job, "tfrecord_train"), "--summary_json=" + summary, "--progress=lines"});
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("60000 training examples"));
  std::ifstream file(summary);
  const json result = json::parse(file);
  // 400 steps of 64 on Fashion-MNIST: 0.80 to 0.83 seen; a wrong rescale or label gives 0.1.
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.75) << run.output;
}

TEST_F(InputFilesTest, StratumTrainLearnsFromCsvFiles) {
  // label = 1 when a + 2b > c: a rule a small network learns to 0.95 and more.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-1, 1);
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    files.push_back(absl::StrCat(*dir_, "/rule-", f, ".csv"));
    std::ofstream out(files.back());
    out << "a,b,\"c, the third\",label\n";
    for (int i = 0; i < 2000; ++i) {
      const float a = value(rng), b = value(rng), c = value(rng);
      out << a << "," << b << "," << c << "," << (a + 2 * b > c ? 1 : 0) << "\n";
    }
  }
  const json dense = {{"class_name", "Dense"}, {"config", {{"units", 16}, {"activation", "relu"}}}};
  json job = {
      {"model",
       {{"class_name", "Sequential"},
        {"config",
         {{"layers",
           {{{"class_name", "InputLayer"}, {"config", {{"batch_input_shape", {nullptr, 3}}}}},
            dense,
            {{"class_name", "Dense"}, {"config", {{"units", 2}, {"activation", "softmax"}}}}}}}}}},
      {"compile",
       {{"optimizer", {{"class_name", "Adam"}, {"config", {{"learning_rate", 0.01}}}}},
        {"loss", "sparse_categorical_crossentropy"},
        {"metrics", {"accuracy"}}}},
      {"data",
       {{"train",
         {{"format", "csv"}, {"files", {*dir_ + "/rule-[01].csv"}}, {"label_name", "label"}}},
        {"test", {{"format", "csv"}, {"files", files[2]}, {"label_name", "label"}}}}},
      {"fit", {{"epochs", 5}, {"batch_size_per_replica", 32}, {"seed", 3}}}};
  const std::string summary = TempPath("csv_summary.json");
  const BinaryRun run = RunBinary(
      "stratum-train",
      {"--job=" + Write(job, "csv_train"), "--summary_json=" + summary, "--progress=lines"});
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("4000 training examples"));
  std::ifstream file(summary);
  EXPECT_GT(json::parse(file)["test_accuracy"].get<double>(), 0.9) << run.output;

  // The same rule as one sigmoid output with binary_crossentropy (its 0/1 labels as they
  // are), in one process and on a parameter-server cluster (each worker its own file).
  job["model"]["config"]["layers"][2]["config"] = {{"units", 1}, {"activation", "sigmoid"}};
  job["compile"]["loss"] = "binary_crossentropy";
  job["compile"]["metrics"] = {"binary_accuracy"};
  const std::string binary_summary = TempPath("csv_binary_summary.json");
  const BinaryRun binary =
      RunBinary("stratum-train", {"--job=" + Write(job, "csv_binary"),
                                  "--summary_json=" + binary_summary, "--progress=lines"});
  ASSERT_EQ(binary.code, 0) << binary.output;
  std::ifstream binary_file(binary_summary);
  EXPECT_GT(json::parse(binary_file)["test_accuracy"].get<double>(), 0.9) << binary.output;
  job["strategy"] = {{"type", "parameter_server"}};
  job["fit"]["epochs"] = 3;
  const std::string ps_summary = TempPath("csv_binary_ps_summary.json");
  const BinaryRun ps =
      RunBinary("stratum-launch", {"--job=" + Write(job, "csv_binary_ps"), "--workers=2", "--ps=1",
                                   "--summary-json=" + ps_summary});
  ASSERT_EQ(ps.code, 0) << ps.output;
  std::ifstream ps_file(ps_summary);
  EXPECT_GT(json::parse(ps_file)["test_accuracy"].get<double>(), 0.85) << ps.output;
}

TEST_F(InputFilesTest, BrokenDataIsRefusedBeforeTrainingNamingTheFileOrTheFeature) {
  json job = Job("fashion_mnist.json", *train4_);
  job["data"]["train"]["features"]["image"]["shape"] = {28, 27};
  BinaryRun run = RunBinary("stratum-train", {"--job=" + Write(job, "bad_shape")});
  EXPECT_EQ(run.code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("feature \"image\" holds 784 bytes, but decode_raw uint8 "
                                    "into shape [28, 27] takes 756"));
  // A shard cut short: found when the files are counted, before the first step.
  const std::string cut = *dir_ + "/cut-00000-of-00001.tfrecord";
  std::filesystem::copy_file((*train1_)["files"][0].get<std::string>().substr(
                                 0, (*train1_)["files"][0].get<std::string>().find('*')) +
                                 "00000-of-00001.tfrecord",
                             cut, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(cut, std::filesystem::file_size(cut) - 100);
  job = Job("fashion_mnist.json", *train4_);
  job["data"]["train"]["files"] = {cut};
  run = RunBinary("stratum-train", {"--job=" + Write(job, "cut")});
  EXPECT_NE(run.code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr(cut + ": the record at byte offset "));
  EXPECT_THAT(run.output, HasSubstr("the file is truncated"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("Epoch 1")));
  job["data"]["train"]["files"] = {*dir_ + "/nothing-*.tfrecord"};
  run = RunBinary("stratum-train", {"--job=" + Write(job, "none")});
  EXPECT_NE(run.code, 0);
  EXPECT_THAT(run.output, HasSubstr("data.train.files pattern " + *dir_ +
                                    "/nothing-*.tfrecord matches no file"));
}

// Two MultiWorkerMirrored workers on `train`; worker 0's output and the summary.
struct MwmsRun {
  bool ok = false;
  std::string output;
  json summary;
};
MwmsRun TrainMwms(const json& job, const std::string& name) {
  const std::string path = TempPath(name + ".json");
  std::ofstream(path) << job.dump();
  const std::string summary = TempPath(name + "_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .args_by_type = {{"worker",
                         {"--job=" + path, "--summary_json=" + summary, "--cluster_timeout=30s"}}},
       .forward_output = false});
  // A job refused on its configuration may end its workers before the cluster is seen
  // healthy: Start's error then carries their output.
  if (!cluster.ok()) return {false, std::string(cluster.status().message()), nullptr};
  MwmsRun run;
  for (int w = 1; w >= 0; --w) {
    auto exit = (*cluster)->WaitForExit({"worker", w}, absl::Seconds(120));
    EXPECT_TRUE(exit.ok()) << exit.status();
    if (w == 0) run.ok = exit.ok() && exit->success();
  }
  run.output = (*cluster)->Output({"worker", 0});
  std::ifstream file(summary);
  run.summary = json::parse(file, nullptr, /*allow_exceptions=*/false);
  return run;
}

// The MultiWorkerMirrored example on `train`, one epoch of `steps` (0: one pass).
json MwmsJob(const json& train, int steps) {
  json job = InputFilesTest::Job("fashion_mnist_mwms.json", train);
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = steps;
  job["strategy"]["communication"]["timeout_seconds"] = 20;
  return job;
}

TEST_F(InputFilesTest, MultiWorkerMirroredShardsByFileAndRunsTheSmallestShardsSteps) {
  const MwmsRun even = TrainMwms(MwmsJob(*train4_, 20), "mwms_four_files");
  ASSERT_TRUE(even.ok) << even.output;
  EXPECT_THAT(even.output, HasSubstr("auto_shard_policy AUTO: sharding by FILE, 4 files "
                                     "(TFRecord(4 files)) over 2 workers, each reading its own"));
  // 3 files of 20,000 over 2 workers: worker 0 reads files 0 and 2, worker 1 file 1; both
  // run the steps of the smaller part, 20,000 / 64.
  const MwmsRun run = TrainMwms(MwmsJob(*train3_, 0), "mwms_files");
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_THAT(run.output, HasSubstr("auto_shard_policy AUTO: sharding by FILE, 3 files "
                                    "(TFRecord(3 files)) over 2 workers, each reading its own"));
  ASSERT_TRUE(run.summary.is_object());
  EXPECT_EQ(run.summary["steps"], 20000 / 64);
  EXPECT_GT(run.summary["test_accuracy"].get<double>(), 0.75);
}

TEST_F(InputFilesTest, MultiWorkerMirroredFallsBackToDataShardingOrRefusesFileWithTheFix) {
  json job = MwmsJob(*train1_, 50);
  const MwmsRun run = TrainMwms(job, "mwms_one_file");
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("auto_shard_policy AUTO: sharding by DATA, since the data's 1 file is "
                        "fewer than the 2 workers (FILE needs one per worker): every worker "
                        "reads all of it and keeps every 2nd example"));
  job["data"]["auto_shard_policy"] = "FILE";
  const MwmsRun refused = TrainMwms(job, "mwms_file_refused");
  EXPECT_FALSE(refused.ok);
  EXPECT_THAT(refused.output, HasSubstr("AutoShard FILE: the dataset reads 1 file units "
                                        "(TFRecord(1 file)) but there are 2 workers"));
  EXPECT_THAT(refused.output, HasSubstr("split the data into at least 2 files"));
}

TEST_F(InputFilesTest, ParameterServerWorkersReadDisjointFiles) {
  json job = Job("fashion_mnist_ps.json", *train4_);
  job["fit"]["epochs"] = 2;
  job["fit"]["steps_per_epoch"] = 100;
  const std::string summary = TempPath("ps_files_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 2,
       .chief = true,
       .args_by_type = {{"chief",
                         {"--job=" + Write(job, "ps_files"), "--summary_json=" + summary}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(120));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_TRUE(exit->success()) << (*cluster)->Output({"chief", 0});
  const std::string prefix = (*train4_)["files"][0].get<std::string>();
  const std::string folder = prefix.substr(0, prefix.find('*'));
  for (int w = 0; w < 2; ++w) {
    const std::string output = (*cluster)->Output({"worker", w});
    EXPECT_THAT(output, HasSubstr("this worker reads TFRecord(2 files)"));
    EXPECT_THAT(output, HasSubstr("(FILE): 30000 training examples"));
  }
  std::ifstream file(summary);
  const json result = json::parse(file);
  EXPECT_EQ(result["steps"], 200);
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.6);
}

}  // namespace
}  // namespace stratum
