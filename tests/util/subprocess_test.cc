#include "stratum/util/subprocess.h"

#include <signal.h>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Subprocess> Shell(const std::string& script,
                                  std::vector<std::pair<std::string, std::string>> env = {}) {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  options.env = std::move(env);
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

TEST(SubprocessTest, CapturesStdoutAndStderrAndExitCode) {
  auto process = Shell("echo out; echo err >&2; printf tail; exit 3");
  auto exit = process->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 3);
  EXPECT_EQ(exit->ShellCode(), 3);
  EXPECT_FALSE(exit->success());
  EXPECT_EQ(exit->ToString(), "exited with code 3");
  EXPECT_THAT(process->output(), HasSubstr("out\n"));
  EXPECT_THAT(process->output(), HasSubstr("err\n"));
  EXPECT_THAT(process->output(), HasSubstr("tail\n"));
}

TEST(SubprocessTest, PassesEnvironment) {
  auto process = Shell("echo \"v=$STRATUM_TEST_VALUE\"", {{"STRATUM_TEST_VALUE", "42"}});
  ASSERT_OK(process->Wait(absl::Seconds(10)));
  EXPECT_THAT(process->output(), HasSubstr("v=42"));
}

TEST(SubprocessTest, PrefixesForwardedLines) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", "echo one; echo two"};
  options.output_prefix = "[worker:1] ";
  options.forward_fd = fds[1];
  auto process = Subprocess::Spawn(std::move(options));
  ASSERT_OK(process);
  ASSERT_OK((*process)->Wait(absl::Seconds(10)));
  process->reset();  // joins the reader, so everything is forwarded
  close(fds[1]);
  std::string text(256, '\0');
  text.resize(read(fds[0], text.data(), text.size()));
  close(fds[0]);
  EXPECT_EQ(text, "[worker:1] one\n[worker:1] two\n");
}

TEST(SubprocessTest, WaitTimesOutOnARunningChild) {
  auto process = Shell("sleep 30");
  auto exit = process->Wait(absl::Milliseconds(50));
  EXPECT_EQ(exit.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(process->Poll().has_value());
}

TEST(SubprocessTest, StopSendsTermThenKill) {
  auto polite = Shell("sleep 30");
  ExitInfo stopped = polite->Stop(absl::Seconds(5));
  EXPECT_EQ(stopped.signal, SIGTERM);

  // A child that ignores SIGTERM is killed after the grace period.
  auto stubborn = Shell("trap '' TERM; echo ready; while true; do sleep 0.05; done");
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (polite->output().empty() && stubborn->output().find("ready") == std::string::npos &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));  // the shell is a real process: its output is polled
  }
  ASSERT_THAT(stubborn->output(), HasSubstr("ready"));
  const absl::Time start = absl::Now();
  ExitInfo killed = stubborn->Stop(absl::Milliseconds(300));
  EXPECT_EQ(killed.signal, SIGKILL);
  EXPECT_EQ(killed.ToString(), "was killed by signal 9 (SIGKILL)");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
}

TEST(SubprocessTest, MissingProgramIsAClearError) {
  SubprocessOptions options;
  options.argv = {"/nonexistent/stratum-worker"};
  auto process = Subprocess::Spawn(std::move(options));
  ASSERT_FALSE(process.ok());
  EXPECT_EQ(process.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(process.status().message(),
              HasSubstr("cannot run /nonexistent/stratum-worker: No such file or directory"));
}

TEST(SubprocessTest, DestructorKillsARunningChild) {
  auto process = Shell("sleep 30");
  const pid_t pid = process->pid();
  process.reset();
  EXPECT_EQ(kill(pid, 0), -1);  // reaped and gone
}

// A process the child started in a session of its own (setsid: out of reach of the
// group's SIGKILL) keeps the output pipe open as long as it lives: the destructor does not
// wait for it. stratum-launch used to outlive its --grace_period by as long (QA round 4,
// finding 4).
TEST(SubprocessTest, DestructorDoesNotWaitForAnEscapedHolderOfTheOutput) {
  auto process = Shell("setsid sleep 60 & echo $!");
  ASSERT_NE(process, nullptr);
  ASSERT_OK(process->Wait(absl::Seconds(10)));
  const pid_t holder = std::stoi(process->output());
  const absl::Time start = absl::Now();
  process.reset();
  const absl::Duration took = absl::Now() - start;
  kill(holder, SIGKILL);
  EXPECT_LT(took, absl::Seconds(10));  // not the holder's 60 s
}

}  // namespace
}  // namespace stratum
