// Running the tasks of a LaunchPlan as child processes: start one with its TF_CONFIG and
// a "[worker:1] " prefix on its output, and stop many at once. Shared by stratum-launch
// and the LocalCluster test fixture.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stratum/launch/launch_plan.h"
#include "stratum/util/subprocess.h"

namespace stratum {

struct TaskProcessOptions {
  int forward_fd = 1;  // where the prefixed output goes; -1 for nowhere
  // Only the lines it accepts are forwarded (null: all); see SubprocessOptions.
  std::function<bool(absl::string_view line)> forward_if;
  std::string log_path;  // every line also appended here (empty: no log file)
  bool capture_output = false;
  // Set in the task's environment besides TF_CONFIG.
  std::vector<std::pair<std::string, std::string>> env;
};

absl::StatusOr<std::unique_ptr<Subprocess>> StartTask(const PlannedTask& task,
                                                      const TaskProcessOptions& options);

// Told of a process that is slow to stop: `killed` false when it has not exited
// kSlowToStop after SIGTERM (the grace period goes on), true just before it is SIGKILLed
// at the end of the grace period. A frozen task would otherwise hold the stop up silently.
using SlowStopNotice = std::function<void(const Subprocess& process, bool killed)>;
inline constexpr absl::Duration kSlowToStop = absl::Seconds(2);

// Sends SIGTERM to every process still running, gives them `grace` in all to exit, then
// SIGKILLs the rest and reaps them all. Null entries are skipped.
void StopAll(const std::vector<Subprocess*>& processes, absl::Duration grace,
             const SlowStopNotice& notice = nullptr);
// The same, stage after stage, each with `grace` of its own: a stage is signalled once the
// one before has exited (so the training program can save while the servers are up).
void StopInStages(const std::vector<std::vector<Subprocess*>>& stages, absl::Duration grace,
                  const SlowStopNotice& notice = nullptr);

}  // namespace stratum
