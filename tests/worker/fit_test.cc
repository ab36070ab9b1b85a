#include "stratum/worker/fit.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/checkpoint_reader.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/training/fit_checkpoint.h"
#include "stratum/worker/mirrored_strategy.h"

namespace stratum {
namespace {

constexpr char kModel[] = R"({"class_name": "Sequential", "config": {"layers": [
  {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 8]}},
  {"class_name": "Dense", "config": {"name": "hidden", "units": 16, "activation": "relu"}},
  {"class_name": "Dense", "config": {"name": "out", "units": 4, "activation": "softmax"}}]}})";

// Examples whose class is the argmax of a fixed linear map: learnable by the model.
Element SyntheticData(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Tensor x(DType::kFloat32, {n, 8});
  Tensor y(DType::kInt32, {n});
  for (int64_t i = 0; i < n; ++i) {
    float best = -1e9f;
    for (int c = 0; c < 4; ++c) {
      float score = 0;
      for (int j = 0; j < 8; ++j) {
        if (c == 0) x.data<float>()[i * 8 + j] = normal(rng);
        score += x.data<float>()[i * 8 + j] * static_cast<float>(((c * 8 + j) * 7919 % 13) - 6);
      }
      if (score > best) {
        best = score;
        y.data<int32_t>()[i] = c;
      }
    }
  }
  return {x, y};
}

Model TestModel() {
  auto model = Model::FromKerasJson(absl::string_view(kModel));
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

std::unique_ptr<MirroredStrategy> Mirrored(int replicas) {
  MirroredOptions options;
  for (int r = 0; r < replicas; ++r) options.devices.push_back("CPU:" + std::to_string(r));
  return *MirroredStrategy::Create(options);
}

// One training step of `strategy` on `batch` (a global batch), SGD without momentum.
std::vector<Tensor> OneStep(Strategy& strategy, const Model& model, const Element& batch) {
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras(
      nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.5}})"));
  DistributedVariables variables = strategy.CreateVariables(model.InitialVariables(3));
  const int replicas = strategy.NumReplicasInSync();
  std::vector<std::vector<std::vector<Tensor>>> slots(static_cast<size_t>(variables.num_copies()));
  std::vector<std::unique_ptr<Workspace>> workspaces;
  for (int r = 0; r < replicas; ++r) workspaces.push_back(model.NewWorkspace(r));
  const std::vector<Element> parts = *SplitRowsOverReplicas(batch, replicas);
  PerReplica<std::vector<Tensor>> gradients{std::vector<std::vector<Tensor>>(replicas)};
  EXPECT_TRUE(strategy
                  .RunEach([&](ReplicaContext& context) {
                    const int r = context.replica_id_in_sync_group();
                    return model
                        .TrainStep(variables.ReplicaValues(r), parts[r][0], parts[r][1], loss,
                                   1.0f / static_cast<float>(batch[0].rows()), *workspaces[r],
                                   gradients[r])
                        .status();
                  })
                  .ok());
  EXPECT_TRUE(strategy
                  .ApplyGradients(
                      gradients, variables,
                      [&](int copy, std::vector<Tensor>& vars, const std::vector<Tensor>& grads) {
                        optimizer->Apply(vars, grads, slots[copy], 0);
                        return absl::OkStatus();
                      })
                  .ok());
  return variables.primary();
}

TEST(FitTest, LossOverGlobalBatchMakesReplicasAgreeWithOneBigStep) {
  const Model model = TestModel();
  const Element batch = SyntheticData(48, 1);
  DefaultStrategy single;
  const std::vector<Tensor> expected = OneStep(single, model, batch);
  for (int replicas : {2, 3, 4}) {
    auto mirrored = Mirrored(replicas);
    const std::vector<Tensor> got = OneStep(*mirrored, model, batch);
    for (size_t i = 0; i < got.size(); ++i) {
      const float diff = (got[i].Flat() - expected[i].Flat()).abs().maxCoeff();
      EXPECT_LT(diff, 1e-5f) << replicas << " replicas, variable " << i;
    }
  }
}

TEST(FitTest, MirroredCopiesStayIdenticalAfterEveryStep) {
  const Model model = TestModel();
  auto strategy = Mirrored(3);
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras("adam");
  DistributedVariables variables = strategy->CreateVariables(model.InitialVariables(5));
  std::vector<std::vector<std::vector<Tensor>>> slots(3);
  std::vector<std::unique_ptr<Workspace>> workspaces;
  for (int r = 0; r < 3; ++r) workspaces.push_back(model.NewWorkspace(r));
  PerReplica<std::vector<Tensor>> gradients{std::vector<std::vector<Tensor>>(3)};
  for (int step = 0; step < 30; ++step) {
    const Element batch = SyntheticData(30, 100 + step);
    const std::vector<Element> parts = *SplitRowsOverReplicas(batch, 3);
    ASSERT_TRUE(strategy
                    ->RunEach([&](ReplicaContext& context) {
                      const int r = context.replica_id_in_sync_group();
                      return model
                          .TrainStep(variables.ReplicaValues(r), parts[r][0], parts[r][1], loss,
                                     1.0f / 30, *workspaces[r], gradients[r])
                          .status();
                    })
                    .ok());
    ASSERT_TRUE(strategy
                    ->ApplyGradients(
                        gradients, variables,
                        [&](int copy, std::vector<Tensor>& vars, const std::vector<Tensor>& grads) {
                          optimizer->Apply(vars, grads, slots[copy], step);
                          return absl::OkStatus();
                        })
                    .ok());
    for (int r = 1; r < 3; ++r) {
      for (size_t i = 0; i < variables.primary().size(); ++i) {
        ASSERT_TRUE(variables.ReplicaValues(r)[i].BitwiseEqual(variables.ReplicaValues(0)[i]))
            << "step " << step << ", replica " << r << ", variable " << i;
      }
    }
  }
}

FitData Data(int64_t train, int64_t test) {
  FitData data;
  data.train = Dataset::FromTensorSlices(SyntheticData(train, 11));
  data.test = Dataset::FromTensorSlices(SyntheticData(test, 12));
  data.has_test = true;
  data.train_examples = train;
  data.test_examples = test;
  data.rescale = 1.0;
  return data;
}

// Data(train, 100) whose training example `row` has an infinite feature: the step that
// trains on it (in order, with no shuffle) has a loss that is not finite.
FitData DataWithAnInfiniteExample(int64_t train, int64_t row) {
  Element examples = SyntheticData(train, 11);
  examples[0].data<float>()[row * 8] = INFINITY;
  FitData data = Data(train, 100);
  data.train = Dataset::FromTensorSlices(examples);
  return data;
}

TEST(FitTest, EverySingleProcessStrategyLearns) {
  const Model model = TestModel();
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras("adam");
  std::vector<std::unique_ptr<Strategy>> strategies;
  strategies.push_back(std::make_unique<DefaultStrategy>());
  strategies.push_back(*OneDeviceStrategy::Create("CPU:0"));
  strategies.push_back(Mirrored(2));
  MirroredOptions central;
  central.devices = {"CPU:0", "CPU:1"};
  strategies.push_back(*CentralStorageStrategy::Create(central));
  for (auto& strategy : strategies) {
    FitOptions options;
    options.epochs = 8;
    options.batch_size_per_replica = 16;
    options.progress = ProgressStyle::kNone;
    auto summary = Fit(*strategy, model, loss, *optimizer, Data(2000, 500), options);
    ASSERT_TRUE(summary.ok()) << strategy->name() << ": " << summary.status();
    EXPECT_GT(summary->test_accuracy, 0.85) << strategy->name();
    EXPECT_LT(summary->history.back().loss, summary->history.front().loss) << strategy->name();
    EXPECT_EQ(summary->num_replicas_in_sync, strategy->NumReplicasInSync());
  }
}

TEST(FitTest, PartialLastBatchIsSplitAndEveryExampleCounted) {
  const Model model = TestModel();
  auto strategy = Mirrored(3);
  FitOptions options;
  options.batch_size_per_replica = 4;  // global 12; 25 examples leave a last batch of 1
  options.progress = ProgressStyle::kNone;
  options.shuffle_buffer = 0;
  auto summary = Fit(*strategy, model, Loss::SparseCategoricalCrossentropy(),
                     **Optimizer::FromKeras("sgd"), Data(25, 7), options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, 3);
  EXPECT_EQ(summary->history[0].steps, 3);
  const auto json = summary->ToJson();
  for (const char* key : {"test_accuracy", "test_loss", "steps", "examples_per_sec", "wall_s",
                          "strategy", "num_replicas_in_sync", "num_workers", "num_ps"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_EQ(json["strategy"], "MirroredStrategy");
}

TEST(FitTest, StepsPerEpochRepeatsTheData) {
  const Model model = TestModel();
  DefaultStrategy strategy;
  FitOptions options;
  options.epochs = 2;
  options.steps_per_epoch = 10;  // 10 x 16 = 160 examples per epoch from 50
  options.batch_size_per_replica = 16;
  options.progress = ProgressStyle::kNone;
  auto summary = Fit(strategy, model, Loss::SparseCategoricalCrossentropy(),
                     **Optimizer::FromKeras("adam"), Data(50, 10), options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, 20);
}

TEST(FitTest, AResumedRunWithDropoutAndBatchNormEndsWithTheSameVariables) {
  // Dropout masks come from (seed, step, replica), not from a stream that a restart would
  // begin again, and BatchNormalization's moving statistics (non-trainable, without
  // optimizer slots) are saved and restored: one epoch, a restart from its checkpoint and a
  // second epoch give the bits of two epochs in one go.
  constexpr char kDropoutModel[] = R"({"class_name": "Sequential", "config": {"layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 8]}},
    {"class_name": "Dense", "config": {"name": "hidden", "units": 16, "activation": "relu"}},
    {"class_name": "BatchNormalization", "config": {"name": "bn", "synchronized": true}},
    {"class_name": "Dropout", "config": {"name": "dropout", "rate": 0.3}},
    {"class_name": "Dense", "config": {"name": "out", "units": 4, "activation": "softmax"}}]}})";
  const Model model = *Model::FromKerasJson(absl::string_view(kDropoutModel));
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras("adam");
  const std::string dir = ::testing::TempDir() + "/fit_dropout_resume_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto run = [&](int epochs, const std::string& checkpoint_dir) {
    auto strategy = Mirrored(2);
    FitOptions options;
    options.epochs = epochs;
    options.steps_per_epoch = 12;
    options.batch_size_per_replica = 8;
    options.progress = ProgressStyle::kNone;
    options.checkpoint_dir = checkpoint_dir;
    return Fit(*strategy, model, loss, *optimizer, Data(400, 100), options);
  };
  auto whole = run(2, "");
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_OK(run(1, dir));
  auto resumed = run(2, dir);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from_step, 12);
  ASSERT_EQ(resumed->variables.size(), whole->variables.size());
  for (size_t v = 0; v < whole->variables.size(); ++v) {
    const Tensor& a = resumed->variables[v];
    const Tensor& b = whole->variables[v];
    ASSERT_EQ(a.byte_size(), b.byte_size());
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.byte_size()), 0) << v;
  }
  // The evaluator side-car's reader finds the same variables by name in Fit's checkpoint.
  auto read = ReadLatestCheckpoint(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step, 24);
  ASSERT_EQ(read->variables.size(), model.variables().size());
  for (size_t v = 0; v < model.variables().size(); ++v) {
    EXPECT_TRUE(read->variables[model.variables()[v].name].BitwiseEqual(resumed->variables[v]))
        << model.variables()[v].name;
  }
  std::filesystem::remove_all(dir);
}

// Keras' TerminateOnNaN, as an error: training stops at the step whose loss is not finite,
// says where and what to change, and saves nothing from that step on.
TEST(FitTest, ALossThatIsNotFiniteStopsTrainingWithTheFixAndSavesNothingAfterIt) {
  const Model model = TestModel();
  auto optimizer = *Optimizer::FromKeras("adam");
  for (int replicas : {1, 2}) {
    const std::string dir =
        absl::StrCat(::testing::TempDir(), "/fit_diverged_", getpid(), "_", replicas);
    std::filesystem::remove_all(dir);
    auto strategy = Mirrored(replicas);
    FitOptions options;
    options.epochs = 2;
    options.batch_size_per_replica = 16 / replicas;
    options.shuffle_buffer = 0;
    options.progress = ProgressStyle::kNone;
    options.checkpoint_dir = dir;
    options.checkpoint_every_steps = 2;
    // Row 100 is in step 7 (rows 96 to 111) of 25.
    auto summary = Fit(*strategy, model, Loss::SparseCategoricalCrossentropy(), *optimizer,
                       DataWithAnInfiniteExample(400, 100), options);
    EXPECT_EQ(summary.status().code(), absl::StatusCode::kFailedPrecondition) << replicas;
    EXPECT_THAT(
        std::string(summary.status().message()),
        ::testing::AllOf(::testing::StartsWith("training diverged: the loss is "),
                         ::testing::HasSubstr("after step 7 (epoch 1, step 7 of 25)"),
                         ::testing::HasSubstr("learning_rate"),
                         ::testing::HasSubstr("resumes from the checkpoint of step 6 in " + dir)));
    auto newest = ReadLatestCheckpoint(dir);
    ASSERT_TRUE(newest.ok()) << newest.status();
    EXPECT_EQ(newest->step, 6) << replicas;
    for (const auto& [name, value] : newest->variables) {
      EXPECT_TRUE(AllFinite(value)) << name;
    }
    std::filesystem::remove_all(dir);
  }
  // In step 1, before any save: the job run again starts from scratch, and says so.
  const std::string dir = absl::StrCat(::testing::TempDir(), "/fit_diverged_at_once_", getpid());
  std::filesystem::remove_all(dir);
  FitOptions options;
  options.batch_size_per_replica = 16;
  options.shuffle_buffer = 0;
  options.progress = ProgressStyle::kNone;
  options.checkpoint_dir = dir;
  DefaultStrategy single;
  auto summary = Fit(single, model, Loss::SparseCategoricalCrossentropy(), *optimizer,
                     DataWithAnInfiniteExample(400, 0), options);
  EXPECT_THAT(std::string(summary.status().message()),
              ::testing::AllOf(::testing::HasSubstr("after step 1 (epoch 1, step 1 of 25)"),
                               ::testing::EndsWith(": it starts from scratch, as no checkpoint "
                                                   "was written in " +
                                                   dir + " before the divergence")));
  std::filesystem::remove_all(dir);
}

// Mid-epoch, the checkpoint's position in the data is a count of steps of its global
// batch over its workers' shards: resumed with another batch or number of workers it would
// skip or repeat data, so it is refused with the fix.
TEST(FitTest, ResumingMidEpochWithAnotherGlobalBatchOrWorkerCountIsRefusedWithTheFix) {
  const Model model = *Model::FromKerasJson(absl::string_view(kModel));
  auto optimizer = *Optimizer::FromKeras("adam");
  const std::string dir = ::testing::TempDir() + "/fit_other_batch_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto run = [&](int replicas) {
    auto strategy = Mirrored(replicas);
    FitOptions options;
    options.epochs = 1;
    options.steps_per_epoch = 12;
    options.batch_size_per_replica = 8;
    options.progress = ProgressStyle::kNone;
    options.checkpoint_dir = dir;
    return Fit(*strategy, model, Loss::SparseCategoricalCrossentropy(), *optimizer, Data(400, 100),
               options);
  };
  // What a run of 2 replicas (global batch 16) leaves when it is killed at step 5.
  FitState state;
  state.step_in_epoch = 5;
  state.iteration = 5;
  state.global_batch = 16;
  state.variables = model.InitialVariables(1);
  for (const Tensor& variable : state.variables)
    state.slots.push_back(optimizer->NewSlots(variable));
  ASSERT_OK(SaveFitCheckpoint(dir, 2, model, *optimizer, state));
  auto refused = run(1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(refused.status().message()),
      ::testing::HasSubstr("stopped in the middle of epoch 1 with a global batch of 16, and this "
                           "run has a global batch of 8 over 1 worker(s) (1 x 1 replica(s) x 8)"));
  // The fix names the batch, whichever of its factors changed (QA round 4, finding 10: a
  // changed fit.batch_size_per_replica was told to use the earlier workers and devices).
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("resume with its global batch of 16 again (the workers, "
                                   "devices and fit.batch_size_per_replica it was written with)"));
  auto resumed = run(2);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from_step, 5);

  // The same global batch over another number of workers splits the data otherwise (each
  // worker reads its own shard): refused too.
  state.iteration = 30;
  state.num_workers = 2;
  ASSERT_OK(SaveFitCheckpoint(dir, 2, model, *optimizer, state));
  refused = run(2);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("with a global batch of 16 over 2 worker(s), and this run has a "
                                   "global batch of 16 over 1 worker(s)"));
  std::filesystem::remove_all(dir);
}

// Mid-epoch, the steps done are the first of the epoch's shuffled order: resumed with
// another seed or shuffle buffer, the rest of the epoch would repeat some examples and skip
// others (QA: it was accepted without a word), so it is refused with the fix.
TEST(FitTest, ResumingMidEpochWithAnotherShuffleIsRefusedWithTheFix) {
  const Model model = *Model::FromKerasJson(absl::string_view(kModel));
  auto optimizer = *Optimizer::FromKeras("adam");
  const std::string dir = ::testing::TempDir() + "/fit_other_shuffle";
  auto run = [&](int64_t shuffle_buffer, uint64_t seed) {
    auto strategy = Mirrored(1);
    FitOptions options;
    options.epochs = 1;
    options.steps_per_epoch = 12;
    options.batch_size_per_replica = 8;
    options.shuffle_buffer = shuffle_buffer;
    options.seed = seed;
    options.progress = ProgressStyle::kNone;
    options.checkpoint_dir = dir;
    return Fit(*strategy, model, Loss::SparseCategoricalCrossentropy(), *optimizer, Data(400, 100),
               options);
  };
  // What a run shuffling with a buffer of 100 and seed 7 leaves when it is killed at step 5.
  auto save = [&](std::optional<int64_t> shuffle_buffer) {
    std::filesystem::remove_all(dir);
    FitState state;
    state.step_in_epoch = 5;
    state.iteration = 5;
    state.global_batch = 8;
    state.num_workers = 1;
    state.shuffle_buffer = shuffle_buffer;
    state.seed = 7;
    state.variables = model.InitialVariables(1);
    for (const Tensor& variable : state.variables)
      state.slots.push_back(optimizer->NewSlots(variable));
    ASSERT_OK(SaveFitCheckpoint(dir, 2, model, *optimizer, state));
  };
  save(100);
  auto refused = run(100, 8);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr(
                  "stopped in the middle of epoch 1 of data shuffled with fit.shuffle_buffer 100 "
                  "and fit.seed 7, and this run shuffles with fit.shuffle_buffer 100 and fit.seed "
                  "8: the rest of the epoch would repeat some examples and skip others; resume "
                  "with the earlier fit.shuffle_buffer and fit.seed, or remove " +
                  dir));
  refused = run(0, 7);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("this run shuffles with no shuffle (fit.shuffle_buffer 0)"));
  auto resumed = run(100, 7);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from_step, 5);

  // Unshuffled data has one order whatever the seed; a checkpoint that did not record its
  // order (written before it was recorded) is resumed as before.
  save(0);
  EXPECT_OK(run(1, 8));
  save(std::nullopt);
  EXPECT_OK(run(100, 8));
  std::filesystem::remove_all(dir);
}

// A checkpoint written by plain SGD holds no momentum slots: resumed by SGD with momentum,
// the error names the optimizer settings, not "another model" (the model is the same).
TEST(FitTest, ResumingWithOptimizerSettingsThatKeepOtherSlotsNamesTheOptimizer) {
  const Model model = TestModel();
  auto plain = *Optimizer::FromKeras(
      nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.1}})"));
  auto momentum = *Optimizer::FromKeras(nlohmann::json::parse(
      R"({"class_name": "SGD", "config": {"learning_rate": 0.1, "momentum": 0.9}})"));
  const std::string dir = ::testing::TempDir() + "/fit_other_slots_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  FitState state;
  state.iteration = 4;
  state.variables = model.InitialVariables(1);
  state.slots.resize(state.variables.size());
  ASSERT_OK(SaveFitCheckpoint(dir, 2, model, *plain, state));
  auto refused = LoadLatestFitCheckpoint(dir, model, *momentum);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(refused.status().message()),
            "checkpoint " + dir +
                "/ckpt-000000000004 has no momentum slots (no hidden/kernel/slot_momentum): "
                "it was written by SGD without momentum, and the job's SGD has momentum; use the "
                "same optimizer settings as the run that wrote it, or remove " +
                dir + " to train from scratch");
  // A variable the checkpoint lacks is still another model's.
  const Model other = *Model::FromKerasJson(absl::string_view(R"({"class_name": "Sequential",
      "config": {"layers": [{"class_name": "InputLayer", "config": {"batch_input_shape": [null, 8]}},
      {"class_name": "Dense", "config": {"name": "wide", "units": 4}}]}})"));
  auto another = LoadLatestFitCheckpoint(dir, other, *plain);
  EXPECT_THAT(std::string(another.status().message()),
              ::testing::HasSubstr("has no wide/kernel of shape [8, 4]: it was written for another "
                                   "model; use the same model or another checkpoint.dir"));
  // A model that has some of the checkpoint's variables (its layer "out" removed) is another
  // model too: resuming it used to take what matched and drop the rest without a word.
  const Model smaller = *Model::FromKerasJson(absl::string_view(R"({"class_name": "Sequential",
      "config": {"layers": [{"class_name": "InputLayer", "config": {"batch_input_shape": [null, 8]}},
      {"class_name": "Dense", "config": {"name": "hidden", "units": 16}}]}})"));
  auto subset = LoadLatestFitCheckpoint(dir, smaller, *plain);
  EXPECT_EQ(subset.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(subset.status().message()),
              ::testing::HasSubstr("holds out/bias, out/kernel, which the job's model does not "
                                   "have: it was written for another model"));
  // Slots the job's optimizer does not keep are dropped (TensorFlow warns likewise): SGD
  // without momentum resumes from SGD with momentum.
  state.iteration = 8;
  state.slots.clear();
  for (const Tensor& variable : state.variables)
    state.slots.push_back(momentum->NewSlots(variable));
  ASSERT_OK(SaveFitCheckpoint(dir, 2, model, *momentum, state));
  auto without_momentum = LoadLatestFitCheckpoint(dir, model, *plain);
  ASSERT_TRUE(without_momentum.ok()) << without_momentum.status();
  ASSERT_TRUE(without_momentum->has_value());
  EXPECT_EQ((*without_momentum)->iteration, 8);
  std::filesystem::remove_all(dir);
}

// Sets `field` of the manifest of `folder` to `value` and seals it again with a matching
// checksum, as someone who edits it with care would: only the values themselves can tell.
void ForgeManifest(const std::string& folder, const std::string& field,
                   const nlohmann::json& value) {
  nlohmann::json manifest = *ReadCheckpointManifest(folder);
  manifest[field] = value;
  manifest[kManifestChecksumKey] = ManifestChecksum(manifest);
  std::ofstream(folder + "/manifest.json") << manifest.dump(2);
}

// What a run of 12 steps per epoch at a global batch of 16 saves at step `iteration`.
FitState StateAt(const Model& model, const Optimizer& optimizer, int64_t iteration) {
  FitState state;
  state.epoch = iteration / 12;
  state.step_in_epoch = iteration % 12;
  state.iteration = iteration;
  for (int64_t epoch = 1; epoch <= state.epoch; ++epoch) {
    state.history.push_back({{"epoch", epoch}, {"steps", 12}, {"loss", 1.0}, {"accuracy", 0.5}});
  }
  state.global_batch = 16;
  state.num_workers = 1;
  state.variables = model.InitialVariables(1);
  for (const Tensor& variable : state.variables)
    state.slots.push_back(optimizer.NewSlots(variable));
  return state;
}

// A manifest that gives a place in training no run can be at (QA set "epoch": -1 and
// "step_in_epoch": 999, and Fit resumed from there) is damage, as one whose checksum does
// not match: the newest checkpoint before it is restored and the forged one kept aside as
// .damaged; when there is none, the error names the file, the field, its value and the fix.
TEST(FitTest, AManifestWhosePlaceInTrainingNoRunCanBeAtIsDamage) {
  const Model model = TestModel();
  auto optimizer = *Optimizer::FromKeras("adam");
  const std::string dir = ::testing::TempDir() + "/fit_forged_" + std::to_string(getpid());
  struct Forgery {
    std::string field;
    nlohmann::json value;
    std::string named;  // what the error says of it
  };
  // Step 17: epoch 2, 5 steps into it, after one epoch of 12.
  const std::vector<Forgery> forgeries = {
      {"epoch", -1, "gives epoch -1"},
      {"step_in_epoch", -5, "gives step_in_epoch -5"},
      {"step_in_epoch", 999, "gives step_in_epoch 999, more than its step 17"},
      {"epoch", 13, "gives epoch 13, more epochs than the 12 steps before its epoch"},
      {"epoch", 2, "gives epoch 2, but its history lists 1 completed epoch(s)"},
      {"history", nlohmann::json::object(), "gives history {}"},
      {"global_batch", -16, "gives global_batch -16"},
      {"epoch_stats",
       {{"loss_sum", nullptr}, {"correct", 3}, {"examples", 80}},
       "gives epoch_stats with loss_sum nan"},
  };
  for (const Forgery& forgery : forgeries) {
    std::filesystem::remove_all(dir);
    ASSERT_OK(SaveFitCheckpoint(dir, 3, model, *optimizer, StateAt(model, *optimizer, 17)));
    const std::string folder = CheckpointFolder(dir, 17);
    ForgeManifest(folder, forgery.field, forgery.value);
    auto refused = LoadLatestFitCheckpoint(dir, model, *optimizer);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << forgery.named;
    EXPECT_THAT(std::string(refused.status().message()),
                ::testing::AllOf(::testing::HasSubstr(forgery.named),
                                 ::testing::HasSubstr(": it is corrupt or was edited"),
                                 ::testing::HasSubstr("to train from scratch, remove " + dir)));
    EXPECT_TRUE(std::filesystem::exists(folder)) << forgery.named;  // nothing renamed
  }
  // With an intact one before it, that one is restored.
  std::filesystem::remove_all(dir);
  for (int64_t step : {12, 17}) {
    ASSERT_TRUE(
        SaveFitCheckpoint(dir, 3, model, *optimizer, StateAt(model, *optimizer, step)).ok());
  }
  ForgeManifest(CheckpointFolder(dir, 17), "step_in_epoch", 999);
  auto restored = LoadLatestFitCheckpoint(dir, model, *optimizer);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->iteration, 12);
  EXPECT_EQ((*restored)->epoch, 1);
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 17) + ".damaged"));
  std::filesystem::remove_all(dir);
}

// Stratum never saves variables or slots that are not finite (training diverged first), so
// a checkpoint that holds NaN or infinity is damaged: it is never restored.
TEST(FitTest, ACheckpointWhoseVariablesAreNotFiniteIsNeverRestored) {
  const Model model = TestModel();
  auto optimizer = *Optimizer::FromKeras("adam");
  const std::string dir = ::testing::TempDir() + "/fit_not_finite_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  FitState nan = StateAt(model, *optimizer, 5);
  nan.variables[2].data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_OK(SaveFitCheckpoint(dir, 3, model, *optimizer, nan));
  auto refused = LoadLatestFitCheckpoint(dir, model, *optimizer);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::AllOf(
                  ::testing::HasSubstr("checkpoint " + CheckpointFolder(dir, 5) +
                                       " holds NaN or infinity in " + model.variables()[2].name),
                  ::testing::HasSubstr("remove " + dir)));
  // An optimizer slot likewise; an intact checkpoint before it is restored.
  FitState infinite = StateAt(model, *optimizer, 8);
  infinite.slots[0][1].data<float>()[0] = std::numeric_limits<float>::infinity();
  ASSERT_OK(SaveFitCheckpoint(dir, 3, model, *optimizer, StateAt(model, *optimizer, 7)));
  ASSERT_OK(SaveFitCheckpoint(dir, 3, model, *optimizer, infinite));
  auto restored = LoadLatestFitCheckpoint(dir, model, *optimizer);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ((*restored)->iteration, 7);
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 8) + ".damaged"));
  std::filesystem::remove_all(dir);
}

// A checkpoint further into its epoch than an epoch of this run has steps (one written
// with more data or another steps_per_epoch, or edited): resumed, it used to skip the rest
// of that epoch without a word. It is refused, naming the checkpoint, the field, its
// value, and the fixes.
TEST(FitTest, ResumingFurtherIntoAnEpochThanItHasStepsIsRefusedWithTheFix) {
  const Model model = TestModel();
  auto optimizer = *Optimizer::FromKeras("adam");
  const std::string dir = ::testing::TempDir() + "/fit_past_epoch_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto run = [&] {
    DefaultStrategy strategy;
    FitOptions options;
    options.epochs = 3;
    options.steps_per_epoch = 12;
    options.batch_size_per_replica = 16;
    options.progress = ProgressStyle::kNone;
    options.checkpoint_dir = dir;
    return Fit(strategy, model, Loss::SparseCategoricalCrossentropy(), *optimizer, Data(400, 100),
               options);
  };
  // A run of 20 steps per epoch: the end of epoch 1 (step 20), and 12 steps into epoch 2.
  FitState state = StateAt(model, *optimizer, 12);
  state.iteration = 20;
  state.history[0]["steps"] = 20;
  ASSERT_OK(SaveFitCheckpoint(dir, 3, model, *optimizer, state));
  state.iteration = 32;
  state.step_in_epoch = 12;
  ASSERT_OK(SaveFitCheckpoint(dir, 3, model, *optimizer, state));
  auto refused = run();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(refused.status().message()),
            "checkpoint " + CheckpointFolder(dir, 32) +
                " gives step_in_epoch 12, but an epoch of this run has only 12 steps: it was "
                "written by a run with other data or another fit.steps_per_epoch, or its "
                "manifest was edited; resume with the job's earlier data and steps_per_epoch, or "
                "remove " +
                dir +
                " to train from scratch; or, to resume from the end of epoch 1, delete the "
                "checkpoint folders newer than " +
                CheckpointFolder(dir, 20));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 32)));  // nothing is lost
  // One step less is a place this run can be at.
  state.iteration = 31;
  state.step_in_epoch = 11;
  std::filesystem::remove_all(CheckpointFolder(dir, 32));
  ASSERT_OK(SaveFitCheckpoint(dir, 3, model, *optimizer, state));
  auto resumed = run();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from_step, 31);
  std::filesystem::remove_all(dir);
}

TEST(FitTest, WrongInputShapeIsAClearError) {
  const Model model = TestModel();
  DefaultStrategy strategy;
  FitData data = Data(20, 5);
  data.train =
      Dataset::FromTensorSlices({Tensor(DType::kFloat32, {20, 9}), Tensor(DType::kInt32, {20})});
  FitOptions options;
  options.progress = ProgressStyle::kNone;
  auto summary = Fit(strategy, model, Loss::SparseCategoricalCrossentropy(),
                     **Optimizer::FromKeras("adam"), data, options);
  ASSERT_FALSE(summary.ok());
  EXPECT_THAT(
      std::string(summary.status().message()),
      ::testing::HasSubstr("the data's examples are float32[20, 9] but the model takes [8]"));
}

}  // namespace
}  // namespace stratum
