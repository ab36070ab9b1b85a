#include "stratum/launch/task_processes.h"

#include <signal.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stratum {

absl::StatusOr<std::unique_ptr<Subprocess>> StartTask(const PlannedTask& task,
                                                      const TaskProcessOptions& options) {
  SubprocessOptions process;
  process.argv = task.argv;
  process.env = task.env;
  process.env.insert(process.env.end(), options.env.begin(), options.env.end());
  process.env.emplace_back("TF_CONFIG", task.tf_config);
  process.output_prefix = absl::StrCat("[", task.task.ToString(), "] ");
  process.forward_fd = options.forward_fd;
  process.forward_if = options.forward_if;
  process.log_path = options.log_path;
  process.capture_output = options.capture_output;
  return Subprocess::Spawn(std::move(process));
}

void StopAll(const std::vector<Subprocess*>& processes, absl::Duration grace,
             const SlowStopNotice& notice) {
  StopInStages({processes}, grace, notice);
}

void StopInStages(const std::vector<std::vector<Subprocess*>>& stages, absl::Duration grace,
                  const SlowStopNotice& notice) {
  for (const std::vector<Subprocess*>& stage : stages) {
    for (Subprocess* process : stage) {
      if (process != nullptr) process->Signal(SIGTERM);
    }
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + grace;
    auto wait_until = [](Subprocess* process, absl::Time until) {
      return process->Wait(std::max(until - absl::Now(), absl::ZeroDuration())).ok();
    };
    std::vector<Subprocess*> slow;
    for (Subprocess* process : stage) {
      if (process == nullptr || wait_until(process, std::min(start + kSlowToStop, deadline))) {
        continue;
      }
      slow.push_back(process);
      if (notice && absl::Now() < deadline) notice(*process, /*killed=*/false);
    }
    for (Subprocess* process : slow) {
      if (wait_until(process, deadline)) continue;
      if (notice) notice(*process, /*killed=*/true);
      process->Signal(SIGKILL);
      (void)process->Wait(absl::InfiniteDuration());
    }
  }
}

}  // namespace stratum
