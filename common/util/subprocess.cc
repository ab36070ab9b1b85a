#include "stratum/util/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

extern char** environ;

namespace stratum {
namespace {

std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    absl::string_view text(*entry);
    bool overridden = false;
    for (const auto& [name, value] : overrides) {
      if (text.size() > name.size() && text.substr(0, name.size()) == name &&
          text[name.size()] == '=') {
        overridden = true;
      }
    }
    if (!overridden) env.emplace_back(text);
  }
  for (const auto& [name, value] : overrides) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

void WriteAll(int fd, absl::string_view text) {
  while (!text.empty()) {
    const ssize_t written = write(fd, text.data(), text.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;
    text.remove_prefix(static_cast<size_t>(written));
  }
}

ExitInfo FromWaitStatus(int status) {
  ExitInfo info;
  if (WIFEXITED(status)) info.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) info.signal = WTERMSIG(status);
  return info;
}

}  // namespace

std::string ExitInfo::ToString() const {
  if (signal != 0) {
    return absl::StrCat("was killed by signal ", signal, " (SIG", sigabbrev_np(signal), ")");
  }
  return absl::StrCat("exited with code ", exit_code);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(SubprocessOptions options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("no program to run");
  std::unique_ptr<Subprocess> process(new Subprocess(std::move(options)));
  const SubprocessOptions& opts = process->options_;

  int output_pipe[2];
  int exec_error_pipe[2];
  if (pipe2(output_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (pipe2(exec_error_pipe, O_CLOEXEC) != 0) {
    close(output_pipe[0]);
    close(output_pipe[1]);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  std::vector<std::string> argv_strings = opts.argv;
  std::vector<std::string> env_strings = ChildEnvironment(opts.env);
  std::vector<char*> argv = CStrings(argv_strings);
  std::vector<char*> envp = CStrings(env_strings);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    for (int fd : {output_pipe[0], output_pipe[1], exec_error_pipe[0], exec_error_pipe[1]})
      close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", opts.argv[0], ": fork: ", strerror(error)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    // Its own process group, so that signals reach whatever it starts in turn, and a
    // terminal's Ctrl-C reaches only the parent, which then stops children in order.
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // The parent may block SIGTERM/SIGINT.
    signal(SIGPIPE, SIG_DFL);                  // and ignore SIGPIPE (ShutdownWatcher)
    dup2(output_pipe[1], STDOUT_FILENO);
    dup2(output_pipe[1], STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execve(argv[0], argv.data(), envp.data());
    const int error = errno;
    (void)!write(exec_error_pipe[1], &error, sizeof(error));
    _exit(127);
  }
  process->pid_ = pid;
  setpgid(pid, pid);  // Also here, so the group exists before the first Signal().
  close(output_pipe[1]);
  close(exec_error_pipe[1]);
  int exec_errno = 0;
  ssize_t got;
  do {
    got = read(exec_error_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (got < 0 && errno == EINTR);
  close(exec_error_pipe[0]);
  if (got == sizeof(exec_errno)) {
    close(output_pipe[0]);
    waitpid(pid, nullptr, 0);
    process->pid_ = -1;
    return absl::NotFoundError(absl::StrCat("cannot run ", opts.argv[0], ": ", strerror(exec_errno),
                                            "; build it (deploy/setup.sh) or fix the path"));
  }
  const int read_fd = output_pipe[0];
  process->stop_reading_fd_ = eventfd(0, EFD_CLOEXEC);
  Subprocess* raw = process.get();
  process->reader_ = std::thread([raw, read_fd] { raw->ForwardOutput(read_fd); });
  return process;
}

void Subprocess::ForwardOutput(int fd) {
  std::string pending;
  char buffer[4096];
  const int log_fd =
      options_.log_path.empty()
          ? -1
          : open(options_.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  auto emit = [this, log_fd](absl::string_view line) {
    if (log_fd >= 0) WriteAll(log_fd, absl::StrCat(line, "\n"));
    if (options_.forward_fd >= 0 && (!options_.forward_if || options_.forward_if(line))) {
      WriteAll(options_.forward_fd, absl::StrCat(options_.output_prefix, line, "\n"));
    }
    if (options_.capture_output) {
      absl::MutexLock lock(&mutex_);
      absl::StrAppend(&output_, line, "\n");
    }
  };
  while (true) {
    pollfd watched[2] = {{.fd = fd, .events = POLLIN, .revents = 0},
                         {.fd = stop_reading_fd_, .events = POLLIN, .revents = 0}};
    const int ready = poll(watched, stop_reading_fd_ >= 0 ? 2 : 1, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (watched[1].revents & POLLIN) != 0) break;
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    pending.append(buffer, static_cast<size_t>(got));
    size_t start = 0;
    for (size_t newline; (newline = pending.find('\n', start)) != std::string::npos;
         start = newline + 1) {
      emit(absl::string_view(pending).substr(start, newline - start));
    }
    pending.erase(0, start);
  }
  if (!pending.empty()) emit(pending);
  if (log_fd >= 0) close(log_fd);
  close(fd);
  output_closed_.Notify();
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !Poll().has_value()) {
    Signal(SIGKILL);
    (void)Wait(absl::InfiniteDuration());
  }
  // Processes the child left behind in its group may still hold the output pipe open.
  if (pid_ > 0 && !output_closed_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    kill(-pid_, SIGKILL);
    // One that left the group (setsid) is out of reach: its output is not waited for.
    if (!output_closed_.WaitForNotificationWithTimeout(absl::Milliseconds(500)) &&
        stop_reading_fd_ >= 0) {
      const uint64_t one = 1;
      (void)!write(stop_reading_fd_, &one, sizeof(one));
    }
  }
  if (reader_.joinable()) reader_.join();
  if (stop_reading_fd_ >= 0) close(stop_reading_fd_);
}

std::optional<ExitInfo> Subprocess::Poll() {
  absl::MutexLock lock(&mutex_);
  if (exit_.has_value() || pid_ <= 0) return exit_;
  int status = 0;
  pid_t reaped;
  do {
    reaped = waitpid(pid_, &status, WNOHANG);
  } while (reaped < 0 && errno == EINTR);
  if (reaped == pid_) exit_ = FromWaitStatus(status);
  return exit_;
}

absl::StatusOr<ExitInfo> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  while (true) {
    if (std::optional<ExitInfo> info = Poll()) {
      // The child is gone; give the reader a moment to forward its last lines (the pipe
      // stays open while a grandchild that inherited it lives on).
      output_closed_.WaitForNotificationWithTimeout(absl::Seconds(1));
      return *info;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(options_.argv[0], " (pid ", pid_,
                                                      ") still running after ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

void Subprocess::Signal(int signal) {
  absl::MutexLock lock(&mutex_);
  // Never signal a reaped pid: the number may belong to another process by now.
  if (pid_ > 0 && !exit_.has_value()) kill(-pid_, signal);
}

ExitInfo Subprocess::Stop(absl::Duration grace) {
  Signal(SIGTERM);
  if (absl::StatusOr<ExitInfo> info = Wait(grace); info.ok()) return *info;
  Signal(SIGKILL);
  return *Wait(absl::InfiniteDuration());
}

std::string Subprocess::output() const {
  absl::MutexLock lock(&mutex_);
  return output_;
}

}  // namespace stratum
