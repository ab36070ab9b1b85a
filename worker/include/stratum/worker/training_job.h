// A training job of stratum-train, from its JobSpec: the local strategy it trains on. The
// job's data, Fit's options and the checks of the job itself, which the coordinator shares,
// are in stratum/training/fit_job.h (included). Plain functions.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/job/job_spec.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/strategy/strategy.h"
#include "stratum/training/fit_job.h"
#include "stratum/worker/fit.h"

namespace stratum {

// The process-wide device settings of the job, before its devices are resolved: splits
// every GPU into spec.logical_gpus_per_gpu logical GPUs (as tf.config.
// set_logical_device_configuration; warns when no GPU is visible to split: the replicas go
// on the CPU) and sets the intra-op threads (spec.intra_op_parallelism_threads).
void ConfigureLocalDevices(const StrategySpec& spec);

// default, one_device, mirrored or central_storage, on the logical GPUs of
// ConfigureLocalDevices(spec); the cluster strategies (parameter_server,
// multi_worker_mirrored) are refused with how to run them.
absl::StatusOr<std::unique_ptr<Strategy>> MakeLocalStrategy(const StrategySpec& spec);

}  // namespace stratum
