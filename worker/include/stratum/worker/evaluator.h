// The evaluator side-car of a parameter-server job (`stratum-worker --evaluator --job`):
// it watches the job's checkpoint folder and evaluates every new complete checkpoint on
// the test set, logging the result and writing <checkpoint.dir>/evaluation.json
// atomically. It never talks to the other tasks, so it can never hold a job up (unlike
// TensorFlow's evaluator in TF_CONFIG, issue #46169).
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "stratum/job/job_spec.h"
#include "stratum/util/shutdown.h"

namespace stratum {

// Runs until `shutdown` is requested (`once`: one pass over the latest checkpoint, the pass
// a stopped side-car makes, then returns). Errors in the job (no checkpoint.dir, a bad model,
// missing test data) end it. A damaged latest checkpoint (corrupt, lacking a file, or
// holding NaN or infinity) is reported once, naming it and the damage, and skipped until a
// newer one comes; one it cannot read for another reason is logged (once) and retried.
// `after_pass`, when set, is called after every pass over the folder, so that a test can
// wait for passes instead of sleeping through them.
absl::Status RunEvaluator(const JobSpec& job, const ShutdownWatcher& shutdown,
                          absl::Duration poll_interval, bool once = false,
                          const std::function<void()>& after_pass = nullptr);

}  // namespace stratum
