// The one epoch loop (stratum/training/epoch_loop.h) against a fake StepRunner: the order of
// the runner's calls, the figures of the history and the summary with step figures on the
// host and on the device, the stop vote, divergence, and backups at the cadence.
#include "stratum/training/epoch_loop.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/training/evaluate.h"
#include "stratum/training/fit_state.h"
#include "stratum/training/training_status.h"

namespace stratum {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kModel[] = R"({"class_name": "Sequential", "config": {"layers": [
  {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 3]}},
  {"class_name": "Dense", "config": {"name": "out", "units": 2, "activation": "softmax"}}]}})";

Model TestModel() {
  auto model = Model::FromKerasJson(absl::string_view(kModel));
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

std::unique_ptr<Optimizer> Sgd() {
  return *Optimizer::FromKeras(
      nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.1}})"));
}

// Each step: 4 examples, 3 of them right, a loss sum of 2 (or `loss_at` at one iteration).
// With `on_device`, the figures stay "on the device" until TakeStats.
class FakeRunner : public StepRunner {
 public:
  FakeRunner(const Model& model, bool on_device) : model_(model), on_device_(on_device) {}

  bool HasStepStats() const override { return !on_device_; }
  absl::Status StartEpoch(int epoch, int64_t first_step) override {
    calls.push_back("start " + std::to_string(epoch) + "@" + std::to_string(first_step));
    return absl::OkStatus();
  }
  absl::StatusOr<StepResult> Step(int /*epoch*/, int64_t /*step*/, int64_t iteration) override {
    iterations.push_back(iteration);
    const StepStats stats{
        .loss_sum = iteration == nan_at ? std::nan("") : 2.0, .correct = 3, .examples = 4};
    if (on_device_) {
      Accumulate(device_, stats);
      return StepResult{};
    }
    return StepResult{.stats = stats};
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status TakeStats(StepStats& into) override {
    Accumulate(into, device_);
    device_ = StepStats{};
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> ExamplesTrained(int64_t first_step, int64_t last_step) override {
    return 4 * (last_step - first_step);
  }
  absl::Status GetState(std::vector<Tensor>* variables,
                        std::vector<std::vector<Tensor>>* slots) override {
    *variables = model_.InitialVariables(1);
    if (slots != nullptr) {
      slots->clear();
      for (const Tensor& variable : *variables) slots->push_back(Sgd()->NewSlots(variable));
    }
    ++states_taken;
    return absl::OkStatus();
  }
  absl::StatusOr<EpochLog> Evaluate() override {
    ++evaluations;
    return EpochLog{.val_loss = 0.25, .val_accuracy = 0.5, .validated = true};
  }

  std::vector<std::string> calls;
  std::vector<int64_t> iterations;
  int64_t nan_at = -1;
  int evaluations = 0;
  int states_taken = 0;

 private:
  const Model& model_;
  const bool on_device_;
  StepStats device_{};
};

FitOptions QuietOptions(int epochs) {
  FitOptions options;
  options.epochs = epochs;
  options.progress = ProgressStyle::kNone;
  return options;
}

FitState Fresh(const Model& model) {
  FitState state;
  state.variables = model.InitialVariables(1);
  return state;
}

class EpochLoopTest : public ::testing::TestWithParam<bool> {};

TEST_P(EpochLoopTest, TrainsEveryStepOfEveryEpochAndSummarizes) {
  DefaultStrategy strategy;
  const Model model = TestModel();
  FakeRunner runner(model, /*on_device=*/GetParam());
  const FitOptions options = QuietOptions(2);
  const EpochLoopSpec spec{.steps_per_epoch = 3, .has_test = true};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, *Sgd(), options, spec, Fresh(model), runner);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_THAT(runner.calls, ElementsAre("start 1@0", "start 2@0"));
  EXPECT_THAT(runner.iterations, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_EQ(summary->steps, 6);
  ASSERT_EQ(summary->history.size(), 2u);
  for (const EpochLog& log : summary->history) {
    EXPECT_EQ(log.steps, 3);
    EXPECT_DOUBLE_EQ(log.loss, 0.5);  // 3 steps x 2 over 3 x 4 examples
    EXPECT_DOUBLE_EQ(log.accuracy, 0.75);
    EXPECT_TRUE(log.validated);
  }
  // The last epoch's validation is the test figure: evaluated once per epoch, not again.
  EXPECT_EQ(runner.evaluations, 2);
  EXPECT_TRUE(summary->tested);
  EXPECT_DOUBLE_EQ(summary->test_loss, 0.25);
  EXPECT_DOUBLE_EQ(summary->test_accuracy, 0.5);
  EXPECT_EQ(summary->strategy, strategy.name());
  EXPECT_EQ(summary->variables.size(), model.InitialVariables(1).size());
}

TEST_P(EpochLoopTest, ResumesInTheMiddleOfAnEpochWithItsFiguresSoFar) {
  DefaultStrategy strategy;
  const Model model = TestModel();
  FakeRunner runner(model, /*on_device=*/GetParam());
  FitOptions options = QuietOptions(2);
  std::FILE* out = std::tmpfile();
  options.out = out;
  FitState state = Fresh(model);
  state.epoch = 1;
  state.step_in_epoch = 1;
  state.iteration = 4;
  state.epoch_stats = {.loss_sum = 6, .correct = 0, .examples = 4};
  state.history.push_back(EpochLogJson(EpochLog{.epoch = 1, .steps = 3}));
  const EpochLoopSpec spec{.steps_per_epoch = 3, .has_test = false};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, *Sgd(), options, spec, std::move(state), runner);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_THAT(runner.calls, ElementsAre("start 2@1"));
  EXPECT_THAT(runner.iterations, ElementsAre(4, 5));
  ASSERT_EQ(summary->history.size(), 2u);
  // The carried step (loss 6, none right) and the two trained here (2 each, 3 of 4 right).
  EXPECT_DOUBLE_EQ(summary->history[1].loss, 10.0 / 12);
  EXPECT_DOUBLE_EQ(summary->history[1].accuracy, 6.0 / 12);
  EXPECT_EQ(summary->resumed_from_step, 4);
  EXPECT_FALSE(summary->tested);
  std::rewind(out);
  char line[256] = {};
  ASSERT_NE(std::fgets(line, sizeof(line), out), nullptr);
  EXPECT_STREQ(line, "resumed from checkpoint step 4 (epoch 2, step 1)\n");
  std::fclose(out);
}

TEST_P(EpochLoopTest, AStopEndsAfterTheAgreedStepAsStoppedEarly) {
  DefaultStrategy strategy;
  const Model model = TestModel();
  FakeRunner runner(model, /*on_device=*/GetParam());
  FitOptions options = QuietOptions(2);
  absl::Notification stop;
  stop.Notify();
  options.stop = &stop;
  const EpochLoopSpec spec{.steps_per_epoch = 3};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, *Sgd(), options, spec, Fresh(model), runner);
  ASSERT_FALSE(summary.ok());
  EXPECT_TRUE(IsStoppedEarly(summary.status())) << summary.status();
  EXPECT_THAT(summary.status().message(), HasSubstr("after step 1 (epoch 1, step 1 of 3)"));
  EXPECT_THAT(runner.iterations, ElementsAre(0));
}

INSTANTIATE_TEST_SUITE_P(StepFiguresOnTheHostOrOnTheDevice, EpochLoopTest, ::testing::Bool());

TEST(EpochLoopTest, ALossThatIsNotFiniteEndsTrainingAtThatStepWithStepFigures) {
  DefaultStrategy strategy;
  const Model model = TestModel();
  FakeRunner runner(model, /*on_device=*/false);
  runner.nan_at = 1;
  const EpochLoopSpec spec{.steps_per_epoch = 3};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, *Sgd(), QuietOptions(2), spec, Fresh(model), runner);
  ASSERT_FALSE(summary.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(summary.status())) << summary.status();
  EXPECT_THAT(summary.status().message(),
              HasSubstr("training diverged: the loss is nan after step 2 (epoch 1, step 2 of 3)"));
  EXPECT_THAT(runner.iterations, ElementsAre(0, 1));
}

TEST(EpochLoopTest, ALossThatIsNotFiniteOnTheDeviceEndsTrainingAtTheEpochsEnd) {
  DefaultStrategy strategy;
  const Model model = TestModel();
  FakeRunner runner(model, /*on_device=*/true);
  runner.nan_at = 1;
  const EpochLoopSpec spec{.steps_per_epoch = 3};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, *Sgd(), QuietOptions(2), spec, Fresh(model), runner);
  ASSERT_FALSE(summary.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(summary.status())) << summary.status();
  EXPECT_THAT(summary.status().message(), HasSubstr("the epoch's loss is nan after step 3"));
  EXPECT_THAT(runner.iterations, ElementsAre(0, 1, 2));
}

TEST(EpochLoopTest, BacksUpAtTheStepCadenceAndAtEveryEpochsEnd) {
  DefaultStrategy strategy;
  const Model model = TestModel();
  FakeRunner runner(model, /*on_device=*/true);
  FitOptions options = QuietOptions(2);
  options.checkpoint_dir = ::testing::TempDir() + "/epoch_loop_backups";
  std::filesystem::remove_all(options.checkpoint_dir);
  options.checkpoint_every_steps = 2;
  options.max_to_keep = 10;
  const EpochLoopSpec spec{.steps_per_epoch = 3};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, *Sgd(), options, spec, Fresh(model), runner);
  ASSERT_TRUE(summary.ok()) << summary.status();
  // Step 2 (mid-epoch 1), 3 (epoch 1's end), 4 (mid-epoch 2), 6 (epoch 2's end; the cadence's
  // step 6 is the epoch's end, saved once).
  for (int64_t step : {2, 3, 4, 6}) {
    EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(options.checkpoint_dir, step)))
        << "no checkpoint of step " << step;
  }
  EXPECT_FALSE(std::filesystem::exists(CheckpointFolder(options.checkpoint_dir, 5)));
  // Four backups and the summary's variables.
  EXPECT_EQ(runner.states_taken, 5);
  absl::StatusOr<std::optional<FitState>> latest =
      LoadLatestFitCheckpoint(options.checkpoint_dir, model, *Sgd());
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->epoch, 2);
  EXPECT_EQ((*latest)->iteration, 6);
  EXPECT_EQ((*latest)->history.size(), 2u);
}

}  // namespace
}  // namespace stratum
