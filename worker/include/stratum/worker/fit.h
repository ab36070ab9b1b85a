// Fit: Keras' model.fit for the strategies that run in one process (Default, OneDevice,
// Mirrored, CentralStorage): epochs over the training data, one training step per global
// batch on every replica, validation on the test set after each epoch, progress output,
// and a summary. Single-threaded API (the strategy runs the replicas). Its data, options,
// summary and errors are stratum/training/'s, which every training binary shares.
#pragma once

#include "absl/status/statusor.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/strategy/strategy.h"
#include "stratum/training/evaluate.h"
#include "stratum/training/fit_options.h"
#include "stratum/training/fit_summary.h"
#include "stratum/training/training_status.h"

namespace stratum {

absl::StatusOr<FitSummary> Fit(Strategy& strategy, const Model& model, const Loss& loss,
                               const Optimizer& optimizer, const FitData& data,
                               const FitOptions& options);

}  // namespace stratum
