// A VariableStore as a checkpoint file and back: each variable as a tensor under its own
// name, each optimizer slot as "name/slot_<slot>", and in the metadata the variable's
// update count and optimizer (so Adam's step and moments resume exactly).
#pragma once

#include "absl/status/statusor.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/ps/variable_store.h"

namespace stratum {

absl::StatusOr<TensorFile> StoreToTensorFile(const VariableStore& store);

// Restores every variable of `file`; a variable whose slots do not fit its optimizer is
// an error naming it. A value that is not finite is damage (DATA_LOSS naming the tensor),
// found before anything is restored. Returns how many variables were restored.
absl::StatusOr<int> RestoreStoreFromTensorFile(VariableStore& store, const TensorFile& file);

}  // namespace stratum
