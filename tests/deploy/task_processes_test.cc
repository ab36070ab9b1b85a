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
  auto process = Subprocess::Spawn(options);
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

// The frozen task of QA round 3: the launcher waited out its grace period without a word.
TEST(StopInStagesTest, AProcessThatIgnoresSigtermIsReportedThenKilledAtTheGracePeriod) {
  // `exec` keeps the ignored SIGTERM in the sleep itself, so the kill ends it.
  auto stubborn = Start("trap '' TERM; exec sleep 60");
  auto obedient = Start("exec sleep 60");
  ASSERT_NE(stubborn, nullptr);
  ASSERT_NE(obedient, nullptr);
  absl::SleepFor(absl::Milliseconds(200));  // the trap is set
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
  auto stubborn = Start("trap '' TERM; exec sleep 60");
  ASSERT_NE(stubborn, nullptr);
  absl::SleepFor(absl::Milliseconds(200));
  std::vector<bool> notices;
  StopAll({stubborn.get()}, absl::Milliseconds(300),
          [&](const Subprocess&, bool killed) { notices.push_back(killed); });
  EXPECT_THAT(notices, ::testing::ElementsAre(true));
  EXPECT_TRUE(stubborn->Poll().has_value());
}

}  // namespace
}  // namespace stratum
