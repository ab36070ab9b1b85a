// A VariableStore as a checkpoint file and back: each variable as a tensor under its own
// name, each optimizer slot as "name/slot_<slot>", and in the metadata the variable's
// update count and optimizer (so Adam's step and moments resume exactly). A checkpoint
// written with another shard layout (another number of ps tasks or partitioner) restores
// through ReshardTensorFiles, which builds the file this PS would have saved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/ps/variable_store.h"

namespace stratum {

// Writes the store's variables to `path` (atomically, as WriteSafetensors), each copied
// under its lock in turn and written before the next is copied: a save takes one variable's
// memory besides the store, not the store's. ABORTED when a variable is created anew
// meanwhile.
absl::StatusOr<WrittenFile> SaveStore(const VariableStore& store, const std::string& path,
                                      const Confinement& confinement = {});

// Restores every variable of `file`; a variable whose slots do not fit its optimizer is
// an error naming it. A value that is not finite is damage (DATA_LOSS naming the tensor),
// found before anything is restored. Returns how many variables were restored.
absl::StatusOr<int> RestoreStoreFromTensorFile(VariableStore& store, const TensorFile& file);

// A checkpoint file by path, with its checksum from the manifest.
struct CheckpointFileRef {
  std::string path;
  uint32_t crc32 = 0;
};

// Rows [first_row, first_row + num_rows) of the saved shard `saved` in the checkpoint's
// files[file], which become rows [to_row, to_row + num_rows) of the shard `shard`.
struct SavedRows {
  size_t file = 0;
  std::string saved;
  int64_t first_row = 0;
  int64_t num_rows = 0;
  std::string shard;
  int64_t to_row = 0;
};

// The file a PS holding the shards named in `rows` would have saved: each shard, and each
// of its optimizer slots, put together from the listed rows of saved shards in `files`
// (files no row names may be empty), with the optimizer and update count of the saved
// shards. DATA_LOSS naming the file index and tensor when a file lacks a tensor, a slot or
// the rows listed; INVALID_ARGUMENT when the rows of a shard do not cover it exactly.
absl::StatusOr<TensorFile> ReshardTensorFiles(const std::vector<TensorFile>& files,
                                              const std::vector<SavedRows>& rows);

}  // namespace stratum
