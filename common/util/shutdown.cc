#include "stratum/util/shutdown.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <ctime>

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
    if (requested()) _exit(128 + signo);
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

}  // namespace stratum
