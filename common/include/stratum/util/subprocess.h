// Subprocess: one child process with its output forwarded line by line under a prefix
// ("[worker:1] ..."), optionally kept in memory, and ways to wait for it, signal it and
// stop it (TERM, then KILL after a grace period). The launcher and the LocalCluster test
// fixture start every cluster task through it.
//
// The child leads its own process group and signals go to the whole group. It gets
// SIGTERM if the thread that spawned it dies (PR_SET_PDEATHSIG), so a
// killed launcher leaves nothing behind; spawn from a thread that lives as long as the
// children (main). Methods are thread-safe; the destructor kills a child still running.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace stratum {

struct ExitInfo {
  int exit_code = -1;  // when the child exited
  int signal = 0;      // when a signal ended it

  bool success() const { return signal == 0 && exit_code == 0; }
  // Shell convention: the exit code, or 128 + signal.
  int ShellCode() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exited with code 2" or "was killed by signal 9 (SIGKILL)".
  std::string ToString() const;
};

struct SubprocessOptions {
  std::vector<std::string> argv;  // argv[0] is the path of the program
  // Set in the child's environment on top of the parent's.
  std::vector<std::pair<std::string, std::string>> env;
  // Each output line (stdout and stderr, merged) is written to `forward_fd` as
  // prefix + line; -1 forwards nothing.
  std::string output_prefix;
  int forward_fd = 1;
  // When set, only the lines for which it returns true are forwarded (the rest still go to
  // the log file and the captured output). Called on the output thread.
  std::function<bool(absl::string_view line)> forward_if;
  // When set, every output line is appended to this file, as the child wrote it (the file
  // is created if missing, with the umask's permissions).
  std::string log_path;
  // Keeps the output in memory for output().
  bool capture_output = false;
};

class Subprocess {
 public:
  // Starts the child. An error names the program when it cannot be run.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(SubprocessOptions options);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // The exit, if the child has ended (reaps it without blocking).
  std::optional<ExitInfo> Poll();
  // Waits up to `timeout` for the child to end; DEADLINE_EXCEEDED if it is still running.
  absl::StatusOr<ExitInfo> Wait(absl::Duration timeout);
  // Sends `signal` to the child's process group if the child is still running.
  void Signal(int signal);
  // SIGTERM, up to `grace` to exit, then SIGKILL; returns how it ended.
  ExitInfo Stop(absl::Duration grace);
  // Everything the child has written so far (with capture_output).
  std::string output() const;

 private:
  explicit Subprocess(SubprocessOptions options) : options_(std::move(options)) {}
  void ForwardOutput(int fd);

  const SubprocessOptions options_;
  pid_t pid_ = -1;
  std::thread reader_;
  // Tells the reader to stop waiting for the end of the output: a process that left the
  // child's group (setsid) may hold the pipe open for as long as it lives.
  int stop_reading_fd_ = -1;
  absl::Notification output_closed_;
  mutable absl::Mutex mutex_;
  std::optional<ExitInfo> exit_ ABSL_GUARDED_BY(mutex_);
  std::string output_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace stratum
