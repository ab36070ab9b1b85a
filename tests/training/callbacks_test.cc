// Keras' callbacks against Keras' own numbers: the epoch EarlyStopping stops at on scripted
// histories (the example of Keras' docstring included), the rates ReduceLROnPlateau sets,
// CSVLogger's file as Python's csv module writes it, TensorBoard's event files read back
// through an independent decoder (tests/training/read_tfevents.py), and a resumed run that
// decides as the uninterrupted one.
#include "stratum/training/callbacks.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/job/job_spec.h"
#include "stratum/testing/independent_readers.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/number_text.h"

namespace stratum {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The training a callback watches: weights are one float, the epoch they were trained in.
class FakeHost : public CallbackHost {
 public:
  bool writes_files() const override { return writes; }
  FILE* out() const override { return output; }
  bool has_step_logs() const override { return true; }
  float learning_rate() const override { return rate; }
  absl::Status SetLearningRate(float value) override {
    rate = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<Tensor>> GetWeights() override {
    return std::vector<Tensor>{Tensor::Scalar(weights)};
  }
  absl::Status SetWeights(const std::vector<Tensor>& values) override {
    weights = *values[0].data<float>();
    restored = true;
    return absl::OkStatus();
  }
  absl::Status SaveModel(const std::string& path, bool weights_only) override {
    saved.push_back({path, weights_only, weights});
    return absl::OkStatus();
  }
  struct Saved {
    std::string path;
    bool weights_only;
    float weights;
    bool operator==(const Saved& other) const {
      return path == other.path && weights_only == other.weights_only && weights == other.weights;
    }
  };
  std::vector<Saved> saved;

  bool writes = true;
  FILE* output = stderr;
  float rate = 0.001f;
  float weights = 0;
  bool restored = false;
};

// The callbacks of `spec` (a job's fit.callbacks entry), parsed as a job parses them.
std::unique_ptr<Callback> Make(const nlohmann::json& entry, bool with_test = true) {
  nlohmann::json job = {
      {"model", {{"class_name", "Sequential"}, {"config", {{"layers", nlohmann::json::array()}}}}},
      {"compile", {{"loss", "mse"}, {"metrics", {"accuracy"}}}},
      {"data", {{"train", {{"images", "/x"}, {"labels", "/y"}}}}},
      {"fit", {{"callbacks", {entry}}}}};
  if (with_test) job["data"]["test"] = {{"images", "/x"}, {"labels", "/y"}};
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(job.dump(), "job.json", "/tmp");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  auto made = MakeCallbacks(parsed->fit.callbacks);
  EXPECT_TRUE(made.ok()) << made.status();
  return std::move(made->front());
}

// Runs `callback` over epochs whose `key` takes `values` in turn (weights = the epoch), as
// the epoch loop calls it; the epochs trained (the last one the one it stopped after).
int Train(Callback& callback, FakeHost& host, const std::string& key,
          const std::vector<double>& values, const std::vector<Logs>& history = {}) {
  EXPECT_OK(callback.OnTrainBegin(history, host));
  int epoch = static_cast<int>(history.size());
  for (; epoch < static_cast<int>(values.size()); ++epoch) {
    host.weights = static_cast<float>(epoch);
    Logs logs = {{key, values[static_cast<size_t>(epoch)]}};
    EXPECT_OK(callback.OnEpochEnd(epoch, logs, EpochLog{}, host));
    if (callback.stop_training()) {
      ++epoch;
      break;
    }
  }
  EXPECT_OK(callback.OnTrainEnd(host));
  return epoch;
}

TEST(EarlyStoppingTest, KerasDocstringExampleRunsFourEpochs) {
  // keras.callbacks.EarlyStopping(monitor='loss', patience=3) on a loss that never moves:
  // "Only 4 epochs are run."
  auto callback =
      Make({{"class_name", "EarlyStopping"}, {"config", {{"monitor", "loss"}, {"patience", 3}}}});
  FakeHost host;
  EXPECT_EQ(Train(*callback, host, "loss", std::vector<double>(10, 0.25)), 4);
}

TEST(EarlyStoppingTest, StopsWhenPatienceRunsOutAndRestoresTheBestEpoch) {
  auto callback = Make({{"class_name", "EarlyStopping"},
                        {"config", {{"patience", 2}, {"restore_best_weights", true}}}});
  FakeHost host;
  // val_loss best at epoch 2 (0-based); epochs 3 and 4 do not improve: stop after 4.
  EXPECT_EQ(Train(*callback, host, "val_loss", {0.9, 0.7, 0.5, 0.6, 0.55, 0.1, 0.1}), 5);
  EXPECT_TRUE(host.restored);
  EXPECT_EQ(host.weights, 2.0f);
}

TEST(EarlyStoppingTest, MinDeltaCountsSmallGainsAsNone) {
  auto callback =
      Make({{"class_name", "EarlyStopping"}, {"config", {{"patience", 1}, {"min_delta", 0.05}}}});
  FakeHost host;
  // 0.94 is 0.06 below 1.0: an improvement; 0.90 is only 0.04 below 0.94: none, and
  // patience 1 stops after it.
  EXPECT_EQ(Train(*callback, host, "val_loss", {1.0, 0.94, 0.90, 0.5, 0.4}), 3);
}

TEST(EarlyStoppingTest, AccuracyIsMaximizedInAutoMode) {
  auto callback = Make({{"class_name", "EarlyStopping"},
                        {"config", {{"monitor", "val_accuracy"}, {"patience", 1}}}});
  FakeHost host;
  EXPECT_EQ(Train(*callback, host, "val_accuracy", {0.5, 0.6, 0.7, 0.65, 0.9}), 4);
}

TEST(EarlyStoppingTest, ABaselineNotBeatenStopsAfterPatienceWithTheBestEpochRestored) {
  // Keras: "If no epoch improves on baseline, training will run for patience epochs and
  // restore weights from the best epoch in that set."
  auto callback =
      Make({{"class_name", "EarlyStopping"},
            {"config", {{"patience", 3}, {"baseline", 0.1}, {"restore_best_weights", true}}}});
  FakeHost host;
  EXPECT_EQ(Train(*callback, host, "val_loss", {0.5, 0.4, 0.45, 0.3, 0.2}), 3);
  EXPECT_EQ(host.weights, 1.0f);
}

TEST(EarlyStoppingTest, StartFromEpochWaitsBeforeWatching) {
  auto callback = Make(
      {{"class_name", "EarlyStopping"}, {"config", {{"patience", 0}, {"start_from_epoch", 3}}}});
  FakeHost host;
  // Epochs 0-2 are not watched; 3 sets the best, 4 does not improve: stop after it.
  EXPECT_EQ(Train(*callback, host, "val_loss", {0.1, 0.9, 0.9, 0.8, 0.85, 0.1}), 5);
}

TEST(EarlyStoppingTest, AResumedRunStopsWhereTheUninterruptedOneDoes) {
  const nlohmann::json spec = {{"class_name", "EarlyStopping"}, {"config", {{"patience", 2}}}};
  const std::vector<double> losses = {0.9, 0.7, 0.5, 0.6, 0.55, 0.1, 0.1};
  FakeHost host;
  auto whole = Make(spec);
  const int uninterrupted = Train(*whole, host, "val_loss", losses);
  for (size_t done = 1; done < 5; ++done) {
    std::vector<Logs> history;
    for (size_t e = 0; e < done; ++e) history.push_back({{"val_loss", losses[e]}});
    auto resumed = Make(spec);
    EXPECT_EQ(Train(*resumed, host, "val_loss", losses, history), uninterrupted) << done;
  }
}

TEST(ReduceLROnPlateauTest, ReducesAfterPatienceRespectingCooldownAndTheFloor) {
  auto callback =
      Make({{"class_name", "ReduceLROnPlateau"},
            {"config", {{"patience", 2}, {"factor", 0.5}, {"cooldown", 1}, {"min_lr", 0.0003}}}});
  FakeHost host;
  ASSERT_OK(callback->OnTrainBegin({}, host));
  // By hand, with Keras' rules (min_delta 1e-4): epoch 0 best; 1, 2 no gain -> 0.0005 and
  // cooldown 1; 3 ends the cooldown (its counter reaches 0 first, so the epoch counts:
  // wait 1); 4 -> 0.00025, floored at 0.0003; then the rate is at the floor: it stays.
  const std::vector<double> losses = {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
  std::vector<float> rates;
  std::vector<double> logged;
  for (int epoch = 0; epoch < 9; ++epoch) {
    Logs logs = {{"val_loss", losses[static_cast<size_t>(epoch)]}};
    ASSERT_OK(callback->OnEpochEnd(epoch, logs, EpochLog{}, host));
    rates.push_back(host.rate);
    logged.push_back(logs.at("learning_rate"));
  }
  EXPECT_THAT(rates, ElementsAre(0.001f, 0.001f, 0.0005f, 0.0005f, 0.0003f, 0.0003f, 0.0003f,
                                 0.0003f, 0.0003f));
  // The logs carry the rate the epoch trained with, as Keras' callback adds it.
  EXPECT_FLOAT_EQ(static_cast<float>(logged[2]), 0.001f);
  EXPECT_FLOAT_EQ(static_cast<float>(logged[3]), 0.0005f);
}

TEST(ReduceLROnPlateauTest, AResumedRunGoesOnAtTheReducedRate) {
  const nlohmann::json spec = {{"class_name", "ReduceLROnPlateau"},
                               {"config", {{"patience", 1}, {"factor", 0.1}}}};
  FakeHost host;
  auto resumed = Make(spec);
  std::vector<Logs> history = {{{"val_loss", 1.0}}, {{"val_loss", 1.0}}, {{"val_loss", 2.0}}};
  ASSERT_OK(resumed->OnTrainBegin(history, host));
  EXPECT_FLOAT_EQ(host.rate, 0.00001f);  // reduced after epochs 1 and 2
}

TEST(ModelCheckpointTest, SavesEveryEpochUnderItsFormattedName) {
  auto callback = Make({{"class_name", "ModelCheckpoint"},
                        {"config", {{"filepath", "/out/ckpt-{epoch:02d}-{val_loss:.2f}"}}}});
  FakeHost host;
  EXPECT_EQ(Train(*callback, host, "val_loss", {0.5, 0.25, 0.75}), 3);
  using Saved = FakeHost::Saved;
  EXPECT_THAT(host.saved, ElementsAre(Saved{"/out/ckpt-01-0.50", false, 0},
                                      Saved{"/out/ckpt-02-0.25", false, 1},
                                      Saved{"/out/ckpt-03-0.75", false, 2}));
}

TEST(ModelCheckpointTest, SaveBestOnlySavesTheEpochsThatImproveAndResumesTheBest) {
  const nlohmann::json spec = {{"class_name", "ModelCheckpoint"},
                               {"config",
                                {{"filepath", "/out/best.weights.h5"},
                                 {"monitor", "val_accuracy"},
                                 {"save_best_only", true},
                                 {"save_weights_only", true}}}};
  FakeHost host;
  auto callback = Make(spec);
  EXPECT_EQ(Train(*callback, host, "val_accuracy", {0.5, 0.7, 0.6, 0.8, 0.8}), 5);
  using Saved = FakeHost::Saved;
  // Accuracy is maximized (mode auto); an equal value is no improvement.
  EXPECT_THAT(host.saved, ElementsAre(Saved{"/out/best.weights.h5", true, 0},
                                      Saved{"/out/best.weights.h5", true, 1},
                                      Saved{"/out/best.weights.h5", true, 3}));
  // Resumed after epoch 2 (best 0.7): epoch 3's 0.6 is not saved, epoch 4's 0.8 is.
  FakeHost resumed_host;
  auto resumed = Make(spec);
  Train(*resumed, resumed_host, "val_accuracy", {0.5, 0.7, 0.6, 0.8},
        {{{"val_accuracy", 0.5}}, {{"val_accuracy", 0.7}}});
  EXPECT_THAT(resumed_host.saved, ElementsAre(Saved{"/out/best.weights.h5", true, 3}));
}

TEST(ModelCheckpointTest, AnInitialValueThresholdMustBeBeatenFirst) {
  auto callback = Make(
      {{"class_name", "ModelCheckpoint"},
       {"config",
        {{"filepath", "/out/m"}, {"save_best_only", true}, {"initial_value_threshold", 0.3}}}});
  FakeHost host;
  Train(*callback, host, "val_loss", {0.5, 0.4, 0.2});
  ASSERT_EQ(host.saved.size(), 1u);
  EXPECT_EQ(host.saved[0].weights, 2.0f);
}

TEST(ModelCheckpointTest, OnlyTheChiefWrites) {
  auto callback = Make({{"class_name", "ModelCheckpoint"}, {"config", {{"filepath", "/out/m"}}}});
  FakeHost host;
  host.writes = false;
  Train(*callback, host, "val_loss", {0.5, 0.4});
  EXPECT_TRUE(host.saved.empty());
}

TEST(FormatPythonStyleTest, FillsPlaceholdersAsPythonsFormatDoes) {
  const Logs logs = {{"val_loss", 0.123456}, {"accuracy", 0.875}};
  EXPECT_EQ(FormatPythonStyle("m-{epoch}", 7, logs), "m-7");
  EXPECT_EQ(FormatPythonStyle("m-{epoch:03d}", 7, logs), "m-007");
  EXPECT_EQ(FormatPythonStyle("m-{epoch:3d}", 7, logs), "m-  7");
  EXPECT_EQ(FormatPythonStyle("{val_loss:.2f}", 1, logs), "0.12");
  EXPECT_EQ(FormatPythonStyle("{val_loss:.3e}", 1, logs), "1.235e-01");
  EXPECT_EQ(FormatPythonStyle("{accuracy}", 1, logs), "0.875");
  EXPECT_EQ(FormatPythonStyle("{accuracy:.1%}", 1, logs), "87.5%");
  EXPECT_EQ(FormatPythonStyle("{{epoch}}-{epoch}", 2, logs), "{epoch}-2");
}

TEST(PythonFloatTest, WritesWhatPythonsReprWrites) {
  EXPECT_EQ(PythonFloat(0.1), "0.1");
  EXPECT_EQ(PythonFloat(123.0), "123.0");
  EXPECT_EQ(PythonFloat(-2.5), "-2.5");
  EXPECT_EQ(PythonFloat(1e-05), "1e-05");
  EXPECT_EQ(PythonFloat(0.0001), "0.0001");
  EXPECT_EQ(PythonFloat(1e16), "1e+16");
  EXPECT_EQ(PythonFloat(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(PythonFloat(static_cast<float>(0.001)), "0.0010000000474974513");
  EXPECT_EQ(PythonFloat(1.5e-07), "1.5e-07");
  EXPECT_EQ(PythonFloat(0.0), "0.0");
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

TEST(CSVLoggerTest, WritesEpochThenTheSortedKeysAsPythonsCsvDoes) {
  const std::string path = ::testing::TempDir() + "/csv_logger_" + std::to_string(getpid());
  auto callback =
      Make({{"class_name", "CSVLogger"}, {"config", {{"filename", path}, {"separator", ";"}}}});
  FakeHost host;
  ASSERT_OK(callback->OnTrainBegin({}, host));
  Logs first = {{"loss", 0.5}, {"accuracy", 0.75}, {"val_loss", 0.25}};
  ASSERT_OK(callback->OnEpochEnd(0, first, EpochLog{}, host));
  Logs second = {{"loss", 0.125}, {"accuracy", 1.0}};  // not validated: NA
  ASSERT_OK(callback->OnEpochEnd(1, second, EpochLog{}, host));
  EXPECT_EQ(ReadFile(path), "epoch;accuracy;loss;val_loss\n0;0.75;0.5;0.25\n1;1.0;0.125;NA\n");
  std::filesystem::remove(path);
}

TEST(CSVLoggerTest, AResumedRunWritesEveryEpochAndAppendKeepsTheFile) {
  const std::string path = ::testing::TempDir() + "/csv_resume_" + std::to_string(getpid());
  FakeHost host;
  {
    auto callback = Make({{"class_name", "CSVLogger"}, {"config", {{"filename", path}}}});
    ASSERT_OK(callback->OnTrainBegin({{{"loss", 2.0}}}, host));
    Logs logs = {{"loss", 1.0}};
    ASSERT_OK(callback->OnEpochEnd(1, logs, EpochLog{}, host));
  }
  EXPECT_EQ(ReadFile(path), "epoch,loss\n0,2.0\n1,1.0\n");
  {
    auto callback =
        Make({{"class_name", "CSVLogger"}, {"config", {{"filename", path}, {"append", true}}}});
    ASSERT_OK(callback->OnTrainBegin({{{"loss", 2.0}}, {{"loss", 1.0}}}, host));
    Logs logs = {{"loss", 0.5}};
    ASSERT_OK(callback->OnEpochEnd(2, logs, EpochLog{}, host));
  }
  EXPECT_EQ(ReadFile(path), "epoch,loss\n0,2.0\n1,1.0\n2,0.5\n");
  std::filesystem::remove(path);
}

TEST(CSVLoggerTest, OnlyTheChiefWrites) {
  const std::string path = ::testing::TempDir() + "/csv_chief_" + std::to_string(getpid());
  auto callback = Make({{"class_name", "CSVLogger"}, {"config", {{"filename", path}}}});
  FakeHost host;
  host.writes = false;
  ASSERT_OK(callback->OnTrainBegin({}, host));
  Logs logs = {{"loss", 1.0}};
  ASSERT_OK(callback->OnEpochEnd(0, logs, EpochLog{}, host));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(CSVLoggerTest, AFolderItCannotWriteIsNamed) {
  auto callback =
      Make({{"class_name", "CSVLogger"}, {"config", {{"filename", "/proc/no/such/dir/log.csv"}}}});
  FakeHost host;
  const absl::Status status = callback->OnTrainBegin({}, host);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("/proc/no/such/dir/log.csv"));
}

TEST(TensorBoardTest, EventFilesReadBackThroughAnIndependentDecoder) {
  const std::string dir = ::testing::TempDir() + "/tensorboard_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto callback =
      Make({{"class_name", "TensorBoard"}, {"config", {{"log_dir", dir}, {"update_freq", 2}}}});
  FakeHost host;
  ASSERT_OK(callback->OnTrainBegin({}, host));
  for (int64_t iteration = 0; iteration < 4; ++iteration) {
    ASSERT_OK(callback->OnTrainBatchEnd(iteration, {{"loss", 1.0 / (iteration + 1)}}, host));
  }
  Logs logs = {{"loss", 0.5}, {"accuracy", 0.75}, {"val_loss", 0.625}, {"val_accuracy", 0.5}};
  EpochLog figures;
  figures.examples_per_sec = 1000;
  ASSERT_OK(callback->OnEpochEnd(0, logs, figures, host));
  callback.reset();  // closes the files
  absl::StatusOr<std::vector<nlohmann::json>> scalars = testing::ReadTensorBoardScalars(dir);
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  std::map<std::string, std::vector<std::pair<int64_t, double>>> seen;
  for (const nlohmann::json& scalar : *scalars) {
    EXPECT_EQ(scalar["plugin"], "scalars");
    seen[scalar["run"].get<std::string>() + "/" + scalar["tag"].get<std::string>()].emplace_back(
        scalar["step"].get<int64_t>(), scalar["value"].get<double>());
  }
  using Points = std::vector<std::pair<int64_t, double>>;
  EXPECT_EQ(seen["train/batch_loss"], (Points{{2, 0.5}, {4, 0.25}}));
  EXPECT_EQ(seen["train/epoch_loss"], (Points{{0, 0.5}}));
  EXPECT_EQ(seen["train/epoch_accuracy"], (Points{{0, 0.75}}));
  EXPECT_EQ(seen["train/epoch_examples_per_second"], (Points{{0, 1000}}));
  EXPECT_EQ(seen["validation/epoch_loss"], (Points{{0, 0.625}}));
  EXPECT_EQ(seen["validation/epoch_accuracy"], (Points{{0, 0.5}}));
  ASSERT_EQ(seen["train/epoch_learning_rate"].size(), 1u);
  EXPECT_FLOAT_EQ(static_cast<float>(seen["train/epoch_learning_rate"][0].second), 0.001f);

  // A damaged byte is found by the decoder's CRC check.
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/validation")) {
    std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-6, std::ios::end);
    file.put('\x7f');
  }
  const absl::Status damaged = testing::ReadTensorBoardScalars(dir).status();
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.message(), HasSubstr("data CRC wrong"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stratum
