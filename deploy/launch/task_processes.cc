#include "stratum/launch/task_processes.h"

#include <signal.h>

#include "absl/strings/str_cat.h"

namespace stratum {

absl::StatusOr<std::unique_ptr<Subprocess>> StartTask(const PlannedTask& task,
                                                      const TaskProcessOptions& options) {
  SubprocessOptions process;
  process.argv = task.argv;
  process.env = options.env;
  process.env.emplace_back("TF_CONFIG", task.tf_config);
  process.output_prefix = absl::StrCat("[", task.task.ToString(), "] ");
  process.forward_fd = options.forward_fd;
  process.capture_output = options.capture_output;
  return Subprocess::Spawn(std::move(process));
}

void StopAll(const std::vector<Subprocess*>& processes, absl::Duration grace) {
  StopInStages({processes}, grace);
}

void StopInStages(const std::vector<std::vector<Subprocess*>>& stages, absl::Duration grace) {
  for (const std::vector<Subprocess*>& stage : stages) {
    for (Subprocess* process : stage) {
      if (process != nullptr) process->Signal(SIGTERM);
    }
    const absl::Time deadline = absl::Now() + grace;
    for (Subprocess* process : stage) {
      if (process == nullptr) continue;
      if (process->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration())).ok()) continue;
      process->Signal(SIGKILL);
      (void)process->Wait(absl::InfiniteDuration());
    }
  }
}

}  // namespace stratum
