// stratum-launch: starts a whole Stratum cluster on this machine, one child process per
// task on free loopback ports, each with its own TF_CONFIG; writes each task's output to
// its log file in a run folder and shows on the console the training progress, the
// warnings and errors of every task and the result (--verbose: every line, prefixed);
// exits with the chief's exit code (worker:0's when there is no chief) after stopping the
// rest. SIGINT/SIGTERM stop every child (TERM, then KILL after --grace_period).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "stratum/job/job_spec.h"
#include "stratum/launch/launch_plan.h"
#include "stratum/launch/task_processes.h"
#include "stratum/util/counted.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/flags.h"
#include "stratum/util/logging.h"
#include "stratum/util/shutdown.h"
#include "stratum/util/status_macros.h"

ABSL_FLAG(int, workers, 2, "Number of worker tasks");
ABSL_FLAG(int, ps, -1,
          "Number of parameter-server tasks (default: 2; none for a multi_worker_mirrored job)");
ABSL_FLAG(bool, chief, false, "Start a chief (stratum-coordinator)");
ABSL_FLAG(bool, evaluator, false, "Start an evaluator (stratum-worker --evaluator)");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address every task listens on");
ABSL_FLAG(std::string, bin_dir, "",
          "Folder with the Stratum binaries; default: the folder of stratum-launch");
ABSL_FLAG(bool, dry_run, false,
          "Print each task's TF_CONFIG and command line instead of starting them");
ABSL_FLAG(absl::Duration, grace_period, absl::Seconds(30),
          "How long children get to exit after SIGTERM before SIGKILL: Kubernetes' default, "
          "longer than every task's own stop deadline, so that the training program saves the "
          "job's state (a second Ctrl-C stops everything at once)");
ABSL_FLAG(std::string, log_level, "info", "Log level handed to every task");
ABSL_FLAG(absl::Duration, cluster_timeout, absl::Minutes(2),
          "Handed to the chief: how long it waits for every task to answer");
ABSL_FLAG(std::string, job, "",
          "A job file. parameter_server: handed to the chief (stratum-coordinator), which "
          "trains it; implies --chief. multi_worker_mirrored: every worker (and the chief, "
          "if --chief) trains it; no ps tasks are started");
ABSL_FLAG(std::string, summary_json, "", "Handed to the chief: where to write the summary");
ABSL_FLAG(int, max_restarts, 3,
          "How many times a server task that fails (a parameter server, a parameter_server "
          "job's worker, an evaluator) is started again, a second after it died; and how many "
          "times a multi_worker_mirrored job whose worker failed is started again as a whole "
          "(its workers train in lock-step), resuming from its checkpoint; 0: never");
ABSL_FLAG(std::string, placement, "",
          "Handed to the chief of a parameter_server job: balanced_bytes (its default) or "
          "round_robin");
ABSL_FLAG(int, closures_per_worker, 0,
          "Handed to the chief of a parameter_server job: closures in flight per worker "
          "(0: the chief's default, 1)");
ABSL_FLAG(std::string, tls_cert, "",
          "Mutual TLS: this cluster's certificate (PEM), handed to every task as "
          "STRATUM_TLS_CERT (default: $STRATUM_TLS_CERT, which the tasks inherit)");
ABSL_FLAG(std::string, tls_key, "", "Mutual TLS: the certificate's key (STRATUM_TLS_KEY)");
ABSL_FLAG(bool, metrics, false,
          "Every task serves Prometheus' /metrics on a free port of its own; their URLs are "
          "printed");
ABSL_FLAG(std::string, tls_ca, "", "Mutual TLS: the cluster's CA certificate (STRATUM_TLS_CA)");
ABSL_FLAG(std::string, tls_server_name, "",
          "Mutual TLS: the name every task's certificate is checked for "
          "(STRATUM_TLS_SERVER_NAME)");
ABSL_FLAG(std::string, log_dir, "",
          "Folder for each task's whole log (<task>.log) and the launcher's (launch.log); "
          "default: a new run-<time> folder under <checkpoint.dir>/logs, or under "
          "$TMPDIR/stratum-logs for a job without checkpoints");
ABSL_FLAG(bool, verbose, false,
          "Show every task's every line on the console, prefixed with the task, instead of "
          "the training progress, warnings and errors");
ABSL_FLAG(absl::Duration, ps_recovery_timeout, absl::Minutes(5),
          "Handed to the chief of a parameter_server job: how long it waits for a failed "
          "parameter server to come back");

namespace stratum {
namespace {

// The run's log folder and the launcher's own log in it.
struct RunLogs {
  std::string dir;
  int launch_fd = -1;
  bool verbose = false;
};
RunLogs g_logs;

void Write(int fd, const std::string& text) {
  if (fd >= 0) (void)!write(fd, text.data(), text.size());
}

// What the launcher does that the user should see: on the console and in launch.log.
void Say(const std::string& line) {
  const std::string text = absl::StrCat("[launch] ", line, "\n");
  Write(STDERR_FILENO, text);
  Write(g_logs.launch_fd, text);
}

// What it does as a matter of course (a task started): in launch.log, and on the console
// only with --verbose.
void Note(const std::string& line) {
  const std::string text = absl::StrCat("[launch] ", line, "\n");
  if (g_logs.verbose) Write(STDERR_FILENO, text);
  Write(g_logs.launch_fd, text);
}

std::string LogPath(const TaskKey& task) {
  return absl::StrCat(g_logs.dir, "/", task.type, "-", task.index, ".log");
}

// A log line as every Stratum binary writes it ("2026-11-22 07:00:00.123 W worker:1] ..."):
// its level letter, or 0 for a line of other output (progress, a binary's last error).
char LogLevel(absl::string_view line) {
  if (line.size() < 25 || line[4] != '-' || line[10] != ' ' || line[19] != '.' || line[23] != ' ' ||
      !absl::ascii_isdigit(static_cast<unsigned char>(line[0]))) {
    return 0;
  }
  return line[24];
}

// The quiet console: the training program's progress and results, every task's warnings
// and errors, and a binary's closing error sentence ("stratum-ps: ...").
std::function<bool(absl::string_view)> ConsoleFilter(bool main_task) {
  return [main_task](absl::string_view line) {
    const char level = LogLevel(line);
    if (level != 0) return level == 'W' || level == 'E' || level == 'C';
    return main_task || absl::StartsWith(line, "stratum-");
  };
}

// Each task's console filter and log file.
TaskProcessOptions OutputOf(const LaunchPlan& plan, const PlannedTask& task) {
  TaskProcessOptions options;
  options.log_path = LogPath(task.task);
  if (!g_logs.verbose) options.forward_if = ConsoleFilter(task.task == plan.main_task);
  return options;
}

// A task that failed, on the quiet console: the last lines of its log, where the whole is.
// `process` has exited; its last lines are waited for (Wait lets the output thread finish).
void ShowLogTail(const TaskKey& task, Subprocess& process) {
  if (g_logs.verbose) return;
  (void)process.Wait(absl::ZeroDuration());
  std::ifstream file(LogPath(task));
  std::deque<std::string> last;
  for (std::string line; std::getline(file, line);) {
    last.push_back(std::move(line));
    if (last.size() > 12) last.pop_front();
  }
  if (last.empty()) return;
  Say(absl::StrCat("the last lines of ", task.ToString(), "'s log (all of it: ", LogPath(task),
                   "):"));
  for (const std::string& line : last) {
    Write(STDERR_FILENO, absl::StrCat("[", task.ToString(), "] ", line, "\n"));
  }
}

// --log_dir, or a new folder under the job's checkpoint folder, else under $TMPDIR.
absl::Status OpenRunLogs(const std::string& checkpoint_dir) {
  g_logs.verbose = absl::GetFlag(FLAGS_verbose);
  std::string dir = absl::GetFlag(FLAGS_log_dir);
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    const std::string parent =
        !checkpoint_dir.empty()
            ? absl::StrCat(checkpoint_dir, "/logs")
            : absl::StrCat(tmp != nullptr && *tmp != 0 ? tmp : "/tmp", "/stratum-logs");
    dir = absl::StrCat(parent, "/run-",
                       absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()), "-",
                       getpid());
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the log folder ", dir, ": ", error.message(),
                     ": pass --log_dir with a folder you can write"));
  }
  g_logs.dir = dir;
  g_logs.launch_fd = open(absl::StrCat(dir, "/launch.log").c_str(),
                          O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  return absl::OkStatus();
}

std::string OwnFolder() {
  char path[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return ".";
  std::string exe(path, static_cast<size_t>(length));
  return exe.substr(0, exe.rfind('/'));
}

// Children may run elsewhere (--dry-run output is copied to other machines): paths the
// user gave relative to here are made absolute.
std::string AbsolutePath(const std::string& path) {
  if (path.empty() || path.front() == '/') return path;
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

// Where the job keeps what a run leaves: the final lines name them.
struct JobPaths {
  std::string job;
  std::string summary;
  std::string checkpoint_dir;
};

absl::StatusOr<LaunchOptions> OptionsFromFlags(JobPaths& paths) {
  if (absl::GetFlag(FLAGS_max_restarts) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_restarts is ", absl::GetFlag(FLAGS_max_restarts),
                     ", which must not be negative: pass 0 (never restart) or more"));
  }
  if (absl::Status level = CheckLogLevel(absl::GetFlag(FLAGS_log_level)); !level.ok()) {
    return level;
  }
  // Checked here, as the chief would, so that nothing starts only to be stopped.
  STRATUM_RETURN_IF_ERROR(CheckDurationFlag("--cluster_timeout",
                                            absl::GetFlag(FLAGS_cluster_timeout), absl::Seconds(1),
                                            "the tasks need time to answer", "2m"));
  STRATUM_RETURN_IF_ERROR(CheckDurationFlag("--grace_period", absl::GetFlag(FLAGS_grace_period),
                                            absl::ZeroDuration(),
                                            "it is how long children get to exit", "30s"));
  STRATUM_RETURN_IF_ERROR(CheckDurationFlag(
      "--ps_recovery_timeout", absl::GetFlag(FLAGS_ps_recovery_timeout), absl::ZeroDuration(),
      "it is how long the chief waits for a parameter server that died (0: not at all)", "5m"));
  LaunchOptions options;
  options.num_workers = absl::GetFlag(FLAGS_workers);
  options.num_ps = absl::GetFlag(FLAGS_ps);  // -1: not given
  options.chief = absl::GetFlag(FLAGS_chief);
  options.evaluator = absl::GetFlag(FLAGS_evaluator);
  options.host = absl::GetFlag(FLAGS_host);
  options.metrics = absl::GetFlag(FLAGS_metrics);
  options.status_page = !absl::GetFlag(FLAGS_job).empty();
  options.bin_dir =
      absl::GetFlag(FLAGS_bin_dir).empty() ? OwnFolder() : absl::GetFlag(FLAGS_bin_dir);
  options.all_args = {absl::StrCat("--log_level=", absl::GetFlag(FLAGS_log_level))};
  std::vector<std::string> chief_args = {absl::StrCat(
      "--cluster_timeout=", absl::FormatDuration(absl::GetFlag(FLAGS_cluster_timeout)))};
  std::vector<std::string> worker_args;
  const std::string job_path = AbsolutePath(absl::GetFlag(FLAGS_job));
  const std::string summary_path = AbsolutePath(absl::GetFlag(FLAGS_summary_json));
  if (!job_path.empty()) {
    absl::StatusOr<JobSpec> job = LoadJobSpec(job_path);
    if (!job.ok()) return job.status();
    paths = {job_path, summary_path, job->checkpoint.dir};
    if (job->strategy.type == "multi_worker_mirrored") {
      // Every worker runs the training program; the leader hosts the coordination service.
      if (options.num_ps > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            job_path, " is a multi_worker_mirrored job, which has no parameter servers, and --ps ",
            options.num_ps, " asks for some: leave --ps out (or run a parameter_server job)"));
      }
      options.num_ps = 0;
      options.chief_is_worker = true;
      worker_args = {"--job=" + job_path, chief_args.front()};
      if (!summary_path.empty()) worker_args.push_back("--summary_json=" + summary_path);
      chief_args = worker_args;
    } else if (job->strategy.type == "parameter_server") {
      if (options.num_ps == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            job_path,
            " is a parameter_server job, whose variables live on parameter servers, and --ps 0 "
            "starts none: pass --ps 1 or more (2 when left out)"));
      }
      options.chief = true;
      chief_args.push_back("--job=" + job_path);
      if (!absl::GetFlag(FLAGS_placement).empty()) {
        chief_args.push_back("--placement=" + absl::GetFlag(FLAGS_placement));
      }
      if (absl::GetFlag(FLAGS_closures_per_worker) > 0) {
        chief_args.push_back(
            absl::StrCat("--closures_per_worker=", absl::GetFlag(FLAGS_closures_per_worker)));
      }
      chief_args.push_back(
          absl::StrCat("--ps_recovery_timeout=",
                       absl::FormatDuration(absl::GetFlag(FLAGS_ps_recovery_timeout))));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(job_path, " uses strategy \"", job->strategy.type,
                       "\", which trains in one process: run it with stratum-train --job"));
    }
  }
  const bool ps_job_flags =
      !absl::GetFlag(FLAGS_placement).empty() || absl::GetFlag(FLAGS_closures_per_worker) != 0;
  if (ps_job_flags && !(options.chief && !options.chief_is_worker && !job_path.empty())) {
    return absl::InvalidArgumentError(
        "--placement and --closures_per_worker are the chief's settings for a "
        "parameter_server job: pass them with --job of such a job");
  }
  if (absl::GetFlag(FLAGS_closures_per_worker) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--closures_per_worker is ",
                                                   absl::GetFlag(FLAGS_closures_per_worker),
                                                   ": pass 1 or more (0: the chief's default)"));
  }
  // TLS files reach every task through its environment, as paths it can open from anywhere.
  const std::pair<const absl::Flag<std::string>*, const char*> tls_files[] = {
      {&FLAGS_tls_cert, "STRATUM_TLS_CERT"},
      {&FLAGS_tls_key, "STRATUM_TLS_KEY"},
      {&FLAGS_tls_ca, "STRATUM_TLS_CA"}};
  for (const auto& [flag, variable] : tls_files) {
    if (!absl::GetFlag(*flag).empty()) {
      options.env.emplace_back(variable, AbsolutePath(absl::GetFlag(*flag)));
    }
  }
  if (!absl::GetFlag(FLAGS_tls_server_name).empty()) {
    options.env.emplace_back("STRATUM_TLS_SERVER_NAME", absl::GetFlag(FLAGS_tls_server_name));
  }
  if (options.chief && !options.chief_is_worker && options.num_ps == 0) {
    return absl::InvalidArgumentError(
        "--chief starts stratum-coordinator, the chief of a parameter-server cluster, which "
        "needs parameter servers, and --ps 0 starts none: pass --ps 1 or more (2 when left "
        "out), or leave --chief out (a multi_worker_mirrored job's chief is a worker: pass "
        "--job)");
  }
  if (options.num_ps == -1) options.num_ps = 2;  // the default
  if (!summary_path.empty() && !options.chief_is_worker) {
    chief_args.push_back("--summary_json=" + summary_path);
  }
  options.args_by_type = {{kChief, chief_args}, {kWorker, worker_args}};
  // The evaluator side-car evaluates the job's checkpoints (without a job it only serves).
  if (!job_path.empty()) options.args_by_type.push_back({kEvaluator, {"--job=" + job_path}});
  return options;
}

// The order children stop in: first the training program (the chief, or every worker of
// a MultiWorkerMirrored job), which saves the job's state; then the other workers and the
// evaluator; the parameter servers last, since the chief's save reads them.
std::vector<std::vector<Subprocess*>> StopOrder(const LaunchPlan& plan,
                                                const std::vector<Subprocess*>& children) {
  std::vector<std::vector<Subprocess*>> stages(3);
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string& type = plan.tasks[i].task.type;
    const bool trains = type == kChief || (plan.workers_train && type == kWorker);
    stages[trains ? 0 : type == kPs ? 2 : 1].push_back(children[i]);
  }
  return stages;
}

// The job is done while an evaluator side-car that failed waits to be started again (it
// died just before the end): the final checkpoint would go unevaluated, so one pass of it
// (--eval_once) runs first, as a running side-car makes one when it is stopped.
void EvaluateOnceIfDown(const LaunchPlan& plan, const std::vector<absl::Time>& restart_at,
                        absl::Duration grace) {
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    if (plan.tasks[i].task.type != kEvaluator || restart_at[i] == absl::InfiniteFuture()) continue;
    PlannedTask once = plan.tasks[i];
    once.argv.push_back("--eval_once");
    Say(absl::StrCat(once.task.ToString(),
                     " is down at the end of the job: evaluating the final checkpoint once"));
    absl::StatusOr<std::unique_ptr<Subprocess>> pass = StartTask(once, OutputOf(plan, once));
    if (!pass.ok()) {
      Say(absl::StrCat("cannot start ", once.task.ToString(), ": ", pass.status().message()));
      continue;
    }
    // Bounded as a stop is: an evaluation takes seconds.
    if (!(*pass)->Wait(grace).ok()) StopAll({pass->get()}, absl::ZeroDuration());
  }
}

// The run's last lines: where its checkpoints, summary and logs are, and how to resume.
void SayWhereThingsAre(const JobPaths& paths) {
  if (!paths.checkpoint_dir.empty()) {
    Say(absl::StrCat("checkpoints: ", paths.checkpoint_dir,
                     " (the same command again resumes from the last one, or evaluates the "
                     "job when it is complete)"));
  }
  if (!paths.summary.empty()) Say(absl::StrCat("summary: ", paths.summary));
  Say(absl::StrCat("logs of every task: ", g_logs.dir));
}

int Launch(const LaunchPlan& plan, const JobPaths& paths, ShutdownWatcher& shutdown) {
  const absl::Duration grace = absl::GetFlag(FLAGS_grace_period);
  std::vector<std::unique_ptr<Subprocess>> children;
  std::vector<Subprocess*> raw;
  auto who = [&](size_t i) {
    return absl::StrCat(plan.tasks[i].task.ToString(), " (pid ", children[i]->pid(), ")");
  };
  const SlowStopNotice slow_to_stop = [&](const Subprocess& process, bool killed) {
    const auto found = std::find(raw.begin(), raw.end(), &process);
    const std::string name = found == raw.end() ? absl::StrCat("pid ", process.pid())
                                                : who(static_cast<size_t>(found - raw.begin()));
    Say(killed ? absl::StrCat(name, " did not exit within the grace period of ",
                              absl::FormatDuration(grace), ": killing it (SIGKILL)")
               : absl::StrCat(name, " has not exited ", absl::FormatDuration(kSlowToStop),
                              " after SIGTERM: waiting for it up to the grace period of ",
                              absl::FormatDuration(grace), " (--grace_period), then killing it"));
  };
  auto stop_all = [&] { StopInStages(StopOrder(plan, raw), grace, slow_to_stop); };

  for (const PlannedTask& task : plan.tasks) {
    absl::StatusOr<std::unique_ptr<Subprocess>> child = StartTask(task, OutputOf(plan, task));
    if (!child.ok()) {
      Say(absl::StrCat("cannot start ", task.task.ToString(), ": ", child.status().message()));
      stop_all();
      return ExitCodeFor(child.status());
    }
    Note(absl::StrCat("started ", task.task.ToString(), " on ", task.address, " (pid ",
                      (*child)->pid(), ")"));
    raw.push_back(child->get());
    children.push_back(*std::move(child));
  }

  // A failed server task is started again (as a cluster manager would) unless it failed
  // on its configuration (exit 2: it would fail the same way again). The workers of a
  // MultiWorkerMirrored job train in lock-step, so one that fails takes the job down: they
  // are all stopped and started again, and the job resumes from its checkpoint.
  const int max_restarts = absl::GetFlag(FLAGS_max_restarts);
  std::vector<int> restarts(children.size(), 0);
  std::vector<absl::Time> restart_at(children.size(), absl::InfiniteFuture());
  std::map<size_t, bool> reported;
  int job_restarts = 0;
  auto trains = [&](size_t i) {
    return plan.workers_train && plan.tasks[i].task.type != kEvaluator;
  };
  while (true) {
    if (shutdown.WaitFor(absl::Milliseconds(50))) {
      Say(absl::StrCat("signal ", shutdown.signal_number(), ": stopping ", children.size(),
                       " tasks"));
      stop_all();
      return 128 + shutdown.signal_number();
    }
    // Every exit of this pass first: a worker killed and the peer it took down end within
    // one poll, and what happens must not depend on which is looked at first.
    std::vector<std::pair<size_t, ExitInfo>> exits;
    for (size_t i = 0; i < children.size(); ++i) {
      std::optional<ExitInfo> exit = children[i]->Poll();
      if (!exit.has_value() || reported[i]) continue;
      reported[i] = true;
      exits.emplace_back(i, *exit);
    }
    // A MultiWorkerMirrored worker that failed (not on its configuration) takes the job
    // down; the one a signal ended is named, since the others failed for want of it.
    const std::pair<size_t, ExitInfo>* job_failure = nullptr;
    for (const auto& exit : exits) {
      if (!trains(exit.first) || exit.second.success() || exit.second.exit_code == 2) continue;
      if (job_failure == nullptr || (exit.second.signal != 0 && job_failure->second.signal == 0)) {
        job_failure = &exit;
      }
    }
    if (job_failure != nullptr) {
      const auto& [failed, exit] = *job_failure;
      ShowLogTail(plan.tasks[failed].task, *children[failed]);
      if (job_restarts == max_restarts) {
        Say(absl::StrCat(who(failed), " stopped unexpectedly: it ", exit.ToString(),
                         "; the job is not started again (it failed ",
                         Counted(max_restarts + 1, "time", "times"), "): stopping the others"));
        // The launcher's exit code is the main task's (worker:0's), as --help says: it
        // notices the failed peer within seconds and exits with its own code; one that
        // does not within the grace period is stopped, and the job's code is 1.
        int code = 1;
        for (size_t m = 0; m < children.size(); ++m) {
          if (plan.tasks[m].task != plan.main_task) continue;
          absl::StatusOr<ExitInfo> main_exit = children[m]->Wait(grace);
          if (main_exit.ok()) code = main_exit->ShellCode();
        }
        stop_all();
        SayWhereThingsAre(paths);
        return code;
      }
      ++job_restarts;
      Say(absl::StrCat(who(failed), " stopped unexpectedly: it ", exit.ToString(),
                       "; the workers train in lock-step, so every one is stopped and the job "
                       "starts again 1s after they have stopped (restart ",
                       job_restarts, " of ", max_restarts,
                       "), resuming from its last checkpoint (from the start when the job has "
                       "no checkpoint.dir)"));
      std::vector<Subprocess*> training;
      for (size_t t = 0; t < children.size(); ++t) {
        if (!trains(t)) continue;
        training.push_back(raw[t]);
        reported[t] = true;  // their exits now are this stop's
      }
      StopAll(training, grace, slow_to_stop);
      for (size_t t = 0; t < children.size(); ++t) {
        if (trains(t)) restart_at[t] = absl::Now() + absl::Seconds(1);
      }
      exits.clear();
    }
    for (const auto& [i, exit] : exits) {
      const PlannedTask& task = plan.tasks[i];
      if (task.task == plan.main_task) {
        if (!exit.success()) ShowLogTail(task.task, *children[i]);
        Say(absl::StrCat(task.task.ToString(), " ", exit.ToString(), "; stopping the others"));
        if (exit.success()) EvaluateOnceIfDown(plan, restart_at, grace);
        stop_all();
        SayWhereThingsAre(paths);
        return exit.ShellCode();
      }
      // MultiWorkerMirrored workers train and leave when the job is done; servers stop only
      // when told to, so one that stopped cleanly was stopped from outside (a SIGTERM, as
      // an evicted pod gets) and the job still needs it, as much as one that failed.
      const bool finished = trains(i) && exit.success();
      const bool server = !trains(i) && task.task.type != kEvaluator;
      const bool restart = !trains(i) && (server || !exit.success()) && exit.exit_code != 2 &&
                           restarts[i] < max_restarts;
      std::string what = restart ? absl::StrCat("; starting it again in 1s (restart ",
                                                restarts[i] + 1, " of ", max_restarts, ")")
                                 : "";
      if (server && exit.success()) {
        what = absl::StrCat(" (it was stopped from outside this launcher, and the job needs it)",
                            what);
      }
      if (!restart && (server || !exit.success()) && !trains(i) && max_restarts > 0) {
        what = exit.exit_code == 2 ? "; not started again: it would fail the same way"
                                   : absl::StrCat("; not started again: it failed ",
                                                  Counted(max_restarts + 1, "time", "times"));
      }
      if (finished) {
        Note(absl::StrCat(who(i), " finished: it ", exit.ToString(), what));
      } else {
        ShowLogTail(task.task, *children[i]);
        Say(absl::StrCat(who(i), " stopped unexpectedly: it ", exit.ToString(), what));
      }
      if (restart) restart_at[i] = absl::Now() + absl::Seconds(1);
    }
    for (size_t i = 0; i < children.size(); ++i) {
      if (restart_at[i] > absl::Now()) continue;
      restart_at[i] = absl::InfiniteFuture();
      ++restarts[i];
      const PlannedTask& task = plan.tasks[i];
      absl::StatusOr<std::unique_ptr<Subprocess>> child = StartTask(task, OutputOf(plan, task));
      if (!child.ok()) {
        Say(absl::StrCat("cannot start ", task.task.ToString(),
                         " again: ", child.status().message()));
        continue;
      }
      Say(absl::StrCat("started ", task.task.ToString(), " on ", task.address, " (pid ",
                       (*child)->pid(), ") again"));
      raw[i] = child->get();
      children[i] = *std::move(child);
      reported[i] = false;
    }
  }
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ShutdownWatcher shutdown;
  stratum::ParseFlagsOrExit(
      argc, argv,
      "stratum-launch: starts a Stratum cluster on this machine.\n"
      "  stratum-launch --chief --workers 2 --ps 2 [--evaluator] [--dry-run]\n"
      "  stratum-launch --job examples/fashion_mnist_ps.json [--summary-json PATH]\n"
      "  stratum-launch --job examples/fashion_mnist_mwms.json --workers 2\n"
      "Each task gets a free port on --host and its own TF_CONFIG. Exit code: the chief's "
      "(worker:0's without a chief); 2 for a usage error.");
  stratum::JobPaths paths;
  absl::StatusOr<stratum::LaunchOptions> options = stratum::OptionsFromFlags(paths);
  if (!options.ok()) {
    std::fprintf(stderr, "stratum-launch: %s\n", std::string(options.status().message()).c_str());
    return stratum::ExitCodeFor(options.status());
  }
  absl::StatusOr<stratum::LaunchPlan> plan = stratum::PlanLocalCluster(*options);
  if (!plan.ok()) {
    std::fprintf(stderr, "stratum-launch: %s\n", std::string(plan.status().message()).c_str());
    return stratum::ExitCodeFor(plan.status());
  }
  if (absl::GetFlag(FLAGS_dry_run)) {
    std::printf("%s", stratum::FormatDryRun(*plan).c_str());
    return stratum::kExitSuccess;
  }
  if (absl::Status logs = stratum::OpenRunLogs(paths.checkpoint_dir); !logs.ok()) {
    std::fprintf(stderr, "stratum-launch: %s\n", std::string(logs.message()).c_str());
    return stratum::ExitCodeFor(logs);
  }
  stratum::Say(absl::StrCat(
      "logs of every task: ", stratum::g_logs.dir,
      absl::GetFlag(FLAGS_verbose)
          ? ""
          : " (here: the training progress, warnings and errors; --verbose shows every line)"));
  if (!plan->status_address.empty()) {
    stratum::Say(absl::StrCat("status page: http://", plan->status_address, "/"));
  }
  for (const stratum::PlannedTask& task : plan->tasks) {
    if (task.metrics_address.empty()) continue;
    stratum::Say(absl::StrCat("metrics of ", task.task.ToString(), ": http://",
                              task.metrics_address, "/metrics"));
  }
  return stratum::Launch(*plan, paths, shutdown);
}
