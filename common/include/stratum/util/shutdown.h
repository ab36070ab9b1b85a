// ShutdownWatcher turns SIGINT and SIGTERM into a notification that main can wait on, so
// every binary stops the same way: finish or refuse in-flight work, then exit.
//
// Create exactly one, at the top of main, before any other thread starts: it blocks the
// two signals in the calling thread, every thread started afterwards inherits that mask,
// and a private thread receives them with sigtimedwait. A second signal while shutting
// down exits at once (code 128 + signal), for a user who does not want to wait.
// Child processes must unblock the signals before exec (Subprocess does). SIGPIPE is
// ignored: a closed stdout makes writes fail, it does not end the process.
#pragma once

#include <atomic>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace stratum {

class ShutdownWatcher {
 public:
  ShutdownWatcher();
  ~ShutdownWatcher();
  ShutdownWatcher(const ShutdownWatcher&) = delete;
  ShutdownWatcher& operator=(const ShutdownWatcher&) = delete;

  // True once SIGINT or SIGTERM arrived (or RequestShutdown was called).
  bool requested() const { return requested_.HasBeenNotified(); }
  // Waits until shutdown is requested or `timeout` passes; returns requested().
  bool WaitFor(absl::Duration timeout) const;
  void Wait() const { requested_.WaitForNotification(); }
  // The signal that asked for shutdown, or 0.
  int signal_number() const { return signal_number_.load(); }
  // Asks for shutdown from inside the program, as if a signal had come.
  void RequestShutdown();
  const absl::Notification& notification() const { return requested_; }

 private:
  void Run();

  absl::Notification requested_;
  std::atomic<int> signal_number_{0};
  std::atomic<bool> notify_claimed_{false};  // Notify() may be called only once.
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// For a main whose work stops cleanly at its own pace once the watcher is notified (Fit
// with FitOptions::stop saves the job's state first). A signal before Begin exits at once
// (128 + signal); after Begin, the work gets `timeout` to reach End (or the destructor)
// before the process exits anyway. Declare it after the ShutdownWatcher it watches.
class StopDeadline {
 public:
  StopDeadline(const ShutdownWatcher& shutdown, absl::Duration timeout);
  ~StopDeadline();  // End()
  StopDeadline(const StopDeadline&) = delete;
  StopDeadline& operator=(const StopDeadline&) = delete;

  void Begin() { stoppable_ = true; }
  void End();
  // What to call, with the signal, before a signal that came before Begin exits the
  // process: a multi-worker task tells its peers at once, rather than letting them find
  // out at their heartbeat timeout. It must return within a few seconds. Setting another
  // (nullptr to clear) waits for a call in progress, so what it uses may be destroyed
  // afterwards.
  void SetBeforeExit(std::function<void(int signal)> before_exit);

 private:
  std::atomic<bool> stoppable_{false};
  absl::Mutex before_exit_mutex_;
  std::function<void(int)> before_exit_ ABSL_GUARDED_BY(before_exit_mutex_);
  absl::Notification ended_;
  std::atomic<bool> end_claimed_{false};
  std::thread thread_;
};

}  // namespace stratum
