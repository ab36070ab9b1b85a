#include "stratum/util/shutdown.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <utility>

#include "spdlog/spdlog.h"

namespace stratum {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

ShutdownWatcher::ShutdownWatcher() {
  // A closed output (the launcher killed, `| head`) must not kill the process before its
  // stop saves the job's state: the write fails instead.
  signal(SIGPIPE, SIG_IGN);
  sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([this] { Run(); });
}

ShutdownWatcher::~ShutdownWatcher() {
  stop_ = true;
  thread_.join();
}

void ShutdownWatcher::Run() {
  const sigset_t set = ShutdownSignals();
  // Polls so that the destructor can stop this thread without sending a signal.
  const timespec poll{0, 100 * 1000 * 1000};
  while (!stop_) {
    const int signo = sigtimedwait(&set, nullptr, &poll);
    if (signo <= 0) continue;
    if (requested()) {
      // Said before exiting, so that the output does not just stop (QA).
      char line[96];
      const int length =
          snprintf(line, sizeof(line), "%s: second signal %d while stopping: exiting at once\n",
                   program_invocation_short_name, signo);
      if (length > 0) (void)!write(STDERR_FILENO, line, static_cast<size_t>(length));
      _exit(128 + signo);
    }
    signal_number_ = signo;
    RequestShutdown();
  }
}

void ShutdownWatcher::RequestShutdown() {
  if (!notify_claimed_.exchange(true)) requested_.Notify();
}

bool ShutdownWatcher::WaitFor(absl::Duration timeout) const {
  return requested_.WaitForNotificationWithTimeout(timeout);
}

StopDeadline::StopDeadline(const ShutdownWatcher& shutdown, absl::Duration timeout) {
  thread_ = std::thread([this, &shutdown, timeout] {
    while (!shutdown.WaitFor(absl::Milliseconds(100))) {
      if (ended_.HasBeenNotified()) return;
    }
    const int signal = shutdown.signal_number();
    if (signal == 0) return;  // RequestShutdown: the program stops by itself
    if (!stoppable_) {
      spdlog::warn("signal {}: stopping", signal);
      absl::MutexLock lock(&before_exit_mutex_);
      if (before_exit_) before_exit_(signal);
      std::_Exit(128 + signal);
    }
    spdlog::warn(
        "signal {}: training stops after the current step (one step every worker agrees "
        "on, in a multi-worker job), with the job's state saved there (within {})",
        signal, absl::FormatDuration(timeout));
    if (ended_.WaitForNotificationWithTimeout(timeout)) return;
    spdlog::error(
        "signal {}: training did not stop within {}: exiting; the job resumes from its "
        "last checkpoint",
        signal, absl::FormatDuration(timeout));
    std::_Exit(128 + signal);
  });
}

StopDeadline::~StopDeadline() {
  End();
  thread_.join();
}

void StopDeadline::SetBeforeExit(std::function<void(int signal)> before_exit) {
  absl::MutexLock lock(&before_exit_mutex_);
  before_exit_ = std::move(before_exit);
}

void StopDeadline::End() {
  if (!end_claimed_.exchange(true)) ended_.Notify();
}

}  // namespace stratum
