// StopInStages: a process that ignores SIGTERM is told about (slow, then killed) and ended
// at the grace period; one that exits on SIGTERM is not mentioned.
#include "stratum/launch/task_processes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "absl/time/clock.h"

namespace stratum {
namespace {

std::unique_ptr<Subprocess> Start(const std::string& script) {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(options);
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

// A process that ignores SIGTERM; it says "ready" once its trap is set. `exec` keeps the
// ignored SIGTERM in the sleep itself, so the kill ends it.
constexpr char kStubborn[] = "trap '' TERM; echo ready; exec sleep 60";

// Waits until `process` has printed `text`, or `timeout` passes.
bool WaitForOutput(const Subprocess& process, const std::string& text, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (process.output().find(text) == std::string::npos) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));  // the shell is a real process: its output is polled
  }
  return true;
}

// The frozen task of QA round 3: the launcher waited out its grace period without a word.
TEST(StopInStagesTest, AProcessThatIgnoresSigtermIsReportedThenKilledAtTheGracePeriod) {
  auto stubborn = Start(kStubborn);
  auto obedient = Start("exec sleep 60");
  ASSERT_NE(stubborn, nullptr);
  ASSERT_NE(obedient, nullptr);
  ASSERT_TRUE(WaitForOutput(*stubborn, "ready", absl::Seconds(10)));  // the trap is set
  std::vector<std::pair<pid_t, bool>> notices;
  const absl::Time start = absl::Now();
  StopAll(
      {stubborn.get(), obedient.get()}, kSlowToStop + absl::Seconds(1),
      [&](const Subprocess& process, bool killed) { notices.emplace_back(process.pid(), killed); });
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(notices, ::testing::ElementsAre(std::pair{stubborn->pid(), false},
                                              std::pair{stubborn->pid(), true}));
  EXPECT_GE(took, kSlowToStop + absl::Seconds(1));
  EXPECT_LT(took, kSlowToStop + absl::Seconds(10));
  EXPECT_TRUE(stubborn->Poll().has_value());
  EXPECT_TRUE(obedient->Poll().has_value());
}

// A grace period shorter than kSlowToStop has no "still waiting" to tell: only the kill.
TEST(StopInStagesTest, AShortGracePeriodReportsOnlyTheKill) {
  auto stubborn = Start(kStubborn);
  ASSERT_NE(stubborn, nullptr);
  ASSERT_TRUE(WaitForOutput(*stubborn, "ready", absl::Seconds(10)));  // the trap is set
  std::vector<bool> notices;
  StopAll({stubborn.get()}, absl::Milliseconds(300),
          [&](const Subprocess&, bool killed) { notices.push_back(killed); });
  EXPECT_THAT(notices, ::testing::ElementsAre(true));
  EXPECT_TRUE(stubborn->Poll().has_value());
}

}  // namespace
}  // namespace stratum
