// The one epoch loop (stratum/training/epoch_loop.h) against a fake StepRunner: the order of
// the runner's calls, the figures of the history and the summary with step figures on the
// host and on the device, the stop vote, divergence, backups at the cadence, and the hooks
// of a runner that is not Fit's (several steps a call, its own backups, resume point, epoch
// line notes and epoch start).
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
#include "stratum/util/status_macros.h"

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

// The parameter-server job's kind of runner: several steps a call, figures at the epoch's
// end, its own backups (at an epoch's end only on the cadence, before the line), its own
// resume point, epoch line notes, and an epoch that began before the loop's call.
class ClosureRunner : public FakeRunner {
 public:
  explicit ClosureRunner(const Model& model) : FakeRunner(model, /*on_device=*/true) {}

  int64_t StepsPerCall() const override { return 4; }
  absl::StatusOr<StepResult> Steps(int epoch, int64_t step, int64_t iteration,
                                   int64_t count) override {
    asked.push_back(count);
    for (int64_t i = 0; i < count; ++i) {
      STRATUM_RETURN_IF_ERROR(Step(epoch, step + i, iteration + i).status());
    }
    return StepResult{.steps = count};
  }
  std::optional<double> EpochStart() const override { return epoch_start; }
  BackupPolicy Backups() const override {
    return {.by_runner = true, .every_epoch_end = false, .before_epoch_line = true};
  }
  std::optional<ResumePoint> ResumeFrom() const override {
    return ResumePoint{.checkpoint_dir = "/runner/ckpt", .newest_step = 7};
  }
  absl::Status BackUp(const FitState& state) override {
    events.push_back("backup " + std::to_string(state.iteration) + " (" +
                     std::to_string(state.epoch) + "+" + std::to_string(state.step_in_epoch) +
                     ", " + std::to_string(state.history.size()) + " epochs)");
    EXPECT_TRUE(state.variables.empty());
    return absl::OkStatus();
  }
  EpochLineNotes EpochEnded(const EpochLog& log) override {
    events.push_back("ended " + std::to_string(log.epoch));
    return {.after_epoch = " (again)", .after_steps = " on 2 workers"};
  }

  std::vector<int64_t> asked;
  std::vector<std::string> events;
  std::optional<double> epoch_start;
};

FitOptions LinesInto(std::FILE* out, int epochs) {
  FitOptions options;
  options.epochs = epochs;
  options.progress = ProgressStyle::kLines;
  options.out = out;
  return options;
}

std::vector<std::string> Lines(std::FILE* out) {
  std::rewind(out);
  std::vector<std::string> lines;
  char line[512] = {};
  while (std::fgets(line, sizeof(line), out) != nullptr) lines.emplace_back(line);
  return lines;
}

TEST(EpochLoopTest, AsksForSeveralStepsClippedAtTheCadenceAndTheEpochsEnd) {
  DefaultStrategy strategy;
  const Model model = TestModel();
  ClosureRunner runner(model);
  std::FILE* out = std::tmpfile();
  FitOptions options = LinesInto(out, 2);
  options.checkpoint_dir = "/runner/ckpt";  // never written: the runner backs up
  options.checkpoint_every_steps = 3;
  const EpochLoopSpec spec{.steps_per_epoch = 5};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, *Sgd(), options, spec, Fresh(model), runner);
  ASSERT_TRUE(summary.ok()) << summary.status();
  // Epoch 1: steps 0-2 (to the cadence), 3-4 (to the epoch's end); epoch 2: 5, 6-8, 9.
  EXPECT_THAT(runner.asked, ElementsAre(3, 2, 1, 3, 1));
  EXPECT_THAT(runner.iterations, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  ASSERT_EQ(summary->history.size(), 2u);
  EXPECT_EQ(summary->history[0].steps, 5);
  EXPECT_DOUBLE_EQ(summary->history[0].loss, 0.5);
  // Saved at the cadence, mid-epoch, by the runner; epoch 1's end (step 5) is off the
  // cadence, so not saved; none of the variables read for a backup, only for the summary.
  EXPECT_THAT(runner.events,
              ElementsAre("backup 3 (0+3, 0 epochs)", "ended 1", "backup 6 (1+1, 1 epochs)",
                          "backup 9 (1+4, 1 epochs)", "ended 2"));
  EXPECT_EQ(runner.states_taken, 1);
  const std::vector<std::string> lines = Lines(out);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], ::testing::StartsWith("Epoch 1/2 (again) - 5 steps on 2 workers - loss "
                                              "0.5000 - accuracy 0.7500 - "));
  std::fclose(out);
}

TEST(EpochLoopTest, ARunnersBackupAtAnEpochsEndOnTheCadenceComesBeforeItsLine) {
  DefaultStrategy strategy;
  const Model model = TestModel();
  ClosureRunner runner(model);
  FitOptions options = QuietOptions(2);
  options.checkpoint_dir = "/runner/ckpt";
  options.checkpoint_every_steps = 4;
  const EpochLoopSpec spec{.steps_per_epoch = 4};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, *Sgd(), options, spec, Fresh(model), runner);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_THAT(runner.asked, ElementsAre(4, 4));
  // The epoch's own log is in the history its backup records.
  EXPECT_THAT(runner.events, ElementsAre("backup 4 (1+0, 1 epochs)", "ended 1",
                                         "backup 8 (2+0, 2 epochs)", "ended 2"));
}

TEST(EpochLoopTest, ARunnerThatGoesOnWithAnEpochKeepsItsStartItsResumePointAndItsWords) {
  DefaultStrategy strategy;
  const Model model = TestModel();
  ClosureRunner runner(model);
  runner.epoch_start = EpochLoopNow() - 100;
  runner.nan_at = 5;
  std::FILE* out = std::tmpfile();
  FitState state = Fresh(model);
  state.epoch = 1;
  state.step_in_epoch = 1;
  state.iteration = 4;
  state.history.push_back(EpochLogJson(EpochLog{.epoch = 1, .steps = 3}));
  EpochLoopSpec spec{.steps_per_epoch = 3, .say_resumed = false};
  absl::StatusOr<FitSummary> summary =
      RunEpochs(strategy, model, *Sgd(), LinesInto(out, 3), spec, std::move(state), runner);
  ASSERT_FALSE(summary.ok());
  // The runner's resume point, not the loop's start (step 4).
  EXPECT_THAT(summary.status().message(),
              HasSubstr("the epoch's loss is nan after step 6 (epoch 2, step 3 of 3), so training "
                        "stopped there"));
  EXPECT_THAT(summary.status().message(),
              HasSubstr("it resumes from the checkpoint of step 7 in /runner/ckpt"));
  EXPECT_THAT(runner.asked, ElementsAre(2));
  EXPECT_TRUE(Lines(out).empty());  // no "resumed from" line: the runner says it its own way

  // Without the loss that is not finite, the epoch's seconds count from the runner's start.
  ClosureRunner again(model);
  again.epoch_start = EpochLoopNow() - 100;
  FitState resumed = Fresh(model);
  resumed.epoch = 1;
  resumed.step_in_epoch = 1;
  resumed.iteration = 4;
  resumed.history.push_back(EpochLogJson(EpochLog{.epoch = 1, .steps = 3}));
  summary = RunEpochs(strategy, model, *Sgd(), QuietOptions(2), spec, std::move(resumed), again);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->history.size(), 2u);
  EXPECT_GE(summary->history[1].seconds, 100);
  std::fclose(out);
}

}  // namespace
}  // namespace stratum
