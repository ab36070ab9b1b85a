// A VariableStore as a checkpoint file and back: each variable as a tensor under its own
// name, each optimizer slot as "name/slot_<slot>", and in the metadata the variable's
// update count and optimizer (so Adam's step and moments resume exactly). A checkpoint
// written with another shard layout (another number of ps tasks or partitioner) restores
// from the rows of its saved shards. Saves and restores go a variable at a time.
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

// Restores every variable `file` holds (checked first: nothing is restored from a damaged
// file), a variable at a time: a restore holds one variable's values besides the store,
// not the file. Returns how many variables were restored. A value that is not finite is
// damage (DATA_LOSS naming the tensor), as is a slot without its variable or a variable
// without its update count and optimizer; a variable whose slots do not fit the job's
// optimizer is an error naming it.
absl::StatusOr<int> RestoreStore(VariableStore& store, const SafetensorsReader& file);

// Restores the shards named in `rows` (a checkpoint written with another layout): each
// shard, and each of its optimizer slots, put together from the listed rows of saved
// shards in `files` (files no row names may be null), with the optimizer and update count
// of the saved shards, a shard at a time; everything is checked before anything is
// restored. DATA_LOSS naming the file and tensor when a file lacks a tensor, a slot or the
// rows listed, or holds values that are not finite; INVALID_ARGUMENT when the rows of a
// shard do not cover it exactly.
absl::StatusOr<int> RestoreStore(VariableStore& store,
                                 const std::vector<const SafetensorsReader*>& files,
                                 const std::vector<SavedRows>& rows);

}  // namespace stratum
