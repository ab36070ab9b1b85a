// The evaluator side-car in-process: it evaluates each new checkpoint of a job's folder,
// and one that is damaged is reported once and skipped while it waits for a newer one.
#include "stratum/worker/evaluator.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../data/idx_writer.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/training/fit_checkpoint.h"
#include "stratum/util/shutdown.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

// A 28x28 input, Dense(10, softmax).
constexpr char kModel[] = R"({"class_name": "Sequential", "config": {"layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 28, 28]}},
    {"class_name": "Flatten", "config": {"name": "flatten"}},
    {"class_name": "Dense", "config": {"name": "out", "units": 10, "activation": "softmax"}}]}})";

// What spdlog's default logger writes while one lives (it puts the previous one back). A
// wait for a line is woken by the lines themselves.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<Sink>()), previous_(spdlog::default_logger()) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::vector<std::string> Lines() const { return sink_->Lines(); }
  int CountLines(const std::string& part, const std::string& level = "") const {
    int count = 0;
    for (const std::string& line : Lines()) {
      count += absl::StrContains(line, part) && absl::StrContains(line, level) ? 1 : 0;
    }
    return count;
  }
  // Waits up to 30 s for a line holding `part`.
  bool WaitFor(const std::string& part) const { return sink_->AwaitLine(part, absl::Seconds(30)); }

 private:
  // Keeps every line, formatted.
  class Sink final : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::vector<std::string> Lines() const {
      absl::MutexLock lock(&mutex_);
      return lines_;
    }
    bool AwaitLine(const std::string& part, absl::Duration timeout) const {
      absl::MutexLock lock(&mutex_);
      auto logged = [this, &part]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
        return std::any_of(lines_.begin(), lines_.end(), [&part](const std::string& line) {
          return absl::StrContains(line, part);
        });
      };
      return mutex_.AwaitWithTimeout(absl::Condition(&logged), timeout);
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& message) override {
      spdlog::memory_buf_t formatted;
      formatter_->format(message, formatted);
      absl::MutexLock lock(&mutex_);
      lines_.push_back(fmt::to_string(formatted));
    }
    void flush_() override {}

   private:
    mutable absl::Mutex mutex_;
    std::vector<std::string> lines_ ABSL_GUARDED_BY(mutex_);
  };

  std::shared_ptr<Sink> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

// The passes a running evaluator has made over the checkpoint folder (RunEvaluator's
// after_pass), so that a test waits for passes instead of sleeping through them.
class PassCounter {
 public:
  void Count() {
    absl::MutexLock lock(&mutex_);
    ++passes_;
  }
  // Waits up to 30 s until `more` passes have been made after now.
  bool AwaitMore(int more) const {
    absl::MutexLock lock(&mutex_);
    const int wanted = passes_ + more;
    auto made = [this, wanted]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return passes_ >= wanted; };
    return mutex_.AwaitWithTimeout(absl::Condition(&made), absl::Seconds(30));
  }

 private:
  mutable absl::Mutex mutex_;
  int passes_ ABSL_GUARDED_BY(mutex_) = 0;
};

class EvaluatorTest : public ::testing::Test {
 protected:
  EvaluatorTest() {
    const std::string images = data_.Write(
        "images-idx3-ubyte", testing::UbyteIdx({6, 28, 28}, std::vector<uint8_t>(6 * 28 * 28, 7)));
    const std::string labels =
        data_.Write("labels-idx1-ubyte", testing::UbyteIdx({6}, {0, 1, 2, 3, 4, 5}));
    job_.model = nlohmann::json::parse(kModel);
    job_.loss = "sparse_categorical_crossentropy";
    job_.optimizer = "adam";
    job_.data.train = {"idx", images, labels};
    job_.data.test = {"idx", images, labels};
    job_.checkpoint.dir = data_.path() + "/checkpoints";
  }

  // Writes the checkpoint of `step` as Fit does, its variables as `change` leaves them.
  void Save(int64_t step, const std::function<void(std::vector<Tensor>&)>& change = nullptr) {
    FitState state;
    state.iteration = step;
    state.variables = model_.InitialVariables(1);
    if (change) change(state.variables);
    ASSERT_OK(SaveFitCheckpoint(job_.checkpoint.dir, 5, model_, *optimizer_, state));
  }

  testing::TempDir data_;
  JobSpec job_;
  Model model_ = *Model::FromKerasJson(absl::string_view(kModel));
  std::unique_ptr<Optimizer> optimizer_ = *Optimizer::FromKeras("adam");
};

// A damaged latest checkpoint reads as damaged at every poll: the evaluator used to warn
// about it at every poll for as long as it ran. It says once which checkpoint is damaged
// and why, skips it (leaving it where it is), and evaluates the next one.
TEST_F(EvaluatorTest, ADamagedCheckpointIsReportedOnceAndSkippedForANewerOne) {
  LogCapture log;
  // Step 1: a byte of its state file flipped (its checksum does not match).
  Save(1);
  const std::string state = CheckpointFolder(job_.checkpoint.dir, 1) + "/state.safetensors";
  {
    std::fstream file(state, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(std::filesystem::file_size(state) - 3));
    const char byte = static_cast<char>(file.peek() ^ 0x5a);
    file.seekp(file.tellg());
    file.put(byte);
  }
  ShutdownWatcher shutdown;
  absl::Status ended = absl::UnknownError("still running");
  PassCounter passes;
  std::thread evaluator([&] {
    ended = RunEvaluator(job_, shutdown, absl::Milliseconds(5), /*once=*/false,
                         [&passes] { passes.Count(); });
  });
  const std::string first =
      "checkpoint " + CheckpointFolder(job_.checkpoint.dir, 1) + " is damaged";
  EXPECT_TRUE(log.WaitFor(first));
  // Many more polls of the same latest checkpoint.
  EXPECT_TRUE(passes.AwaitMore(20));
  // Step 2: written by a run that diverged (Stratum never saves such variables).
  Save(2, [](std::vector<Tensor>& variables) {
    variables[0].data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  });
  const std::string second = "checkpoint " + CheckpointFolder(job_.checkpoint.dir, 2) +
                             " is damaged (it holds NaN or infinity in " +
                             model_.variables()[0].name + "), so it is skipped";
  EXPECT_TRUE(log.WaitFor(second));
  EXPECT_TRUE(passes.AwaitMore(20));
  Save(3);
  EXPECT_TRUE(log.WaitFor("evaluated the checkpoint at step 3"));
  shutdown.RequestShutdown();
  evaluator.join();
  EXPECT_TRUE(ended.ok()) << ended;
  EXPECT_EQ(log.CountLines(CheckpointFolder(job_.checkpoint.dir, 1), "[warning]"), 1);
  EXPECT_THAT(log.Lines(),
              ::testing::Contains(::testing::AllOf(
                  HasSubstr(first), HasSubstr("its checksum is"),
                  HasSubstr("so it is skipped: the evaluator waits for a newer checkpoint"))));
  EXPECT_EQ(log.CountLines(CheckpointFolder(job_.checkpoint.dir, 2), "[warning]"), 1);
  EXPECT_EQ(log.CountLines("evaluated the checkpoint at step 1"), 0);
  EXPECT_EQ(log.CountLines("evaluated the checkpoint at step 2"), 0);
  // Nothing is lost: the damaged ones are left for the job and people to look at.
  EXPECT_TRUE(std::filesystem::exists(state));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(job_.checkpoint.dir, 2)));
  std::ifstream evaluation(job_.checkpoint.dir + "/evaluation.json");
  const nlohmann::json report = nlohmann::json::parse(evaluation);
  EXPECT_EQ(report["step"], 3);
  ASSERT_EQ(report["history"].size(), 1u) << report;
  EXPECT_EQ(report["history"][0]["step"], 3);
}

// evaluation.json holds the latest result at its top level and every one in "history",
// across restarts of the side-car (QA: it held only the last, so a run's course was lost).
TEST_F(EvaluatorTest, EvaluationJsonKeepsEveryResultAcrossRestarts) {
  auto run_until_evaluated = [&](int64_t step) {
    LogCapture log;
    ShutdownWatcher shutdown;
    absl::Status ended = absl::UnknownError("still running");
    std::thread evaluator([&] { ended = RunEvaluator(job_, shutdown, absl::Milliseconds(5)); });
    EXPECT_TRUE(log.WaitFor(absl::StrCat("evaluated the checkpoint at step ", step)));
    shutdown.RequestShutdown();
    evaluator.join();
    EXPECT_TRUE(ended.ok()) << ended;
    std::ifstream file(job_.checkpoint.dir + "/evaluation.json");
    return nlohmann::json::parse(file);
  };
  Save(1);
  run_until_evaluated(1);
  Save(2);
  nlohmann::json report = run_until_evaluated(2);
  EXPECT_EQ(report["step"], 2);
  ASSERT_EQ(report["history"].size(), 2u) << report;
  EXPECT_EQ(report["history"][0]["step"], 1);
  EXPECT_EQ(report["history"][1]["step"], 2);
  EXPECT_EQ(report["history"][1]["val_accuracy"], report["val_accuracy"]);
  // Resumed from step 1, the job writes step 2 again: its new result replaces the old one.
  std::filesystem::remove_all(CheckpointFolder(job_.checkpoint.dir, 2));
  Save(2, [](std::vector<Tensor>& variables) { variables[0].SetZero(); });
  report = run_until_evaluated(2);
  ASSERT_EQ(report["history"].size(), 2u) << report;
  EXPECT_EQ(report["history"][0]["step"], 1);
  EXPECT_EQ(report["history"][1]["val_loss"], report["val_loss"]);

  // A damaged report is kept aside with a warning, not overwritten without a word (QA
  // round 4, finding 3); a folder in its place too, where the side-car used to abort
  // (finding 2).
  const std::string report_path = job_.checkpoint.dir + "/evaluation.json";
  for (const bool folder : {false, true}) {
    std::filesystem::remove_all(report_path);
    std::filesystem::remove_all(report_path + ".damaged");
    if (folder) {
      std::filesystem::create_directories(report_path);
    } else {
      std::ofstream(report_path) << R"({"history": [{"step": 1)";
    }
    Save(3);
    LogCapture log;
    report = run_until_evaluated(3);
    ASSERT_EQ(report["history"].size(), 1u) << report;
    EXPECT_TRUE(folder ? std::filesystem::is_directory(report_path + ".damaged")
                       : std::filesystem::is_regular_file(report_path + ".damaged"));
  }
}

// --eval_once: one pass over the latest checkpoint, without a stop, as stratum-launch runs
// when the side-car is down at the end of a job (QA round 4, finding 5).
TEST_F(EvaluatorTest, OncePassEvaluatesTheLatestCheckpointAndReturns) {
  Save(1);
  Save(2);
  ShutdownWatcher never_stopped;
  const absl::Time start = absl::Now();
  ASSERT_OK(RunEvaluator(job_, never_stopped, absl::Hours(1), /*once=*/true));
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));  // not the hour between polls
  std::ifstream file(job_.checkpoint.dir + "/evaluation.json");
  const nlohmann::json report = nlohmann::json::parse(file);
  EXPECT_EQ(report["step"], 2);
  EXPECT_EQ(report["history"].size(), 1u);
}

// The warning for a damaged report names it and where it is kept.
TEST_F(EvaluatorTest, ADamagedEvaluationJsonIsKeptAsideWithAWarning) {
  std::filesystem::create_directories(job_.checkpoint.dir);
  const std::string report_path = job_.checkpoint.dir + "/evaluation.json";
  std::ofstream(report_path) << "not json";
  Save(1);
  LogCapture log;
  ShutdownWatcher shutdown;
  absl::Status ended = absl::UnknownError("still running");
  std::thread evaluator([&] { ended = RunEvaluator(job_, shutdown, absl::Milliseconds(5)); });
  EXPECT_TRUE(log.WaitFor("evaluated the checkpoint at step 1"));
  shutdown.RequestShutdown();
  evaluator.join();
  EXPECT_TRUE(ended.ok()) << ended;
  EXPECT_EQ(
      log.CountLines(absl::StrCat(report_path, " is not a JSON object: it is corrupt: kept as ",
                                  report_path, ".damaged; the results start anew"),
                     "warn"),
      1);
  std::ifstream kept(report_path + ".damaged");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "not json");
}

}  // namespace
}  // namespace stratum
