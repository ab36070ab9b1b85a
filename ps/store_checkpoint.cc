#include "stratum/ps/store_checkpoint.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

constexpr char kSlotInfix[] = "/slot_";
constexpr char kFileFormat[] = "stratum-ps-checkpoint-1";

const Tensor* FindTensor(const TensorFile& file, const std::string& name) {
  for (const auto& [tensor_name, tensor] : file.tensors) {
    if (tensor_name == name) return &tensor;
  }
  return nullptr;
}

// The slot names of `variable` in `file`, in file order.
std::vector<std::string> SlotNames(const TensorFile& file, const std::string& variable) {
  const std::string prefix = variable + kSlotInfix;
  std::vector<std::string> names;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) names.push_back(name.substr(prefix.size()));
  }
  return names;
}

absl::Status NoSuchTensor(const SavedRows& piece, const std::string& name) {
  return absl::DataLossError(absl::StrCat("checkpoint file ", piece.file, " has no \"", name,
                                          "\" to restore shard \"", piece.shard,
                                          "\" from: the checkpoint is damaged"));
}

// Copies `piece`'s rows of the saved tensor `name` into `out`.
absl::Status CopyRows(const TensorFile& file, const SavedRows& piece, const std::string& name,
                      Tensor& out) {
  const Tensor* saved = FindTensor(file, name);
  if (saved == nullptr) return NoSuchTensor(piece, name);
  const bool same_rows =
      saved->shape().rank() == out.shape().rank() &&
      (out.shape().rank() == 0 || saved->shape().WithFirstDim(1) == out.shape().WithFirstDim(1));
  if (!same_rows || piece.first_row < 0 || piece.first_row + piece.num_rows > saved->rows()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file ", piece.file, " holds \"", name, "\" as ", saved->DebugString(),
        ", which has no rows [", piece.first_row, ", ", piece.first_row + piece.num_rows,
        ") for shard \"", piece.shard, "\" (", out.DebugString(), "): the checkpoint is damaged"));
  }
  if (out.shape().rank() == 0) {
    out.CopyFrom(*saved);
  } else {
    out.SliceRows(piece.to_row, piece.to_row + piece.num_rows)
        .CopyFrom(saved->SliceRows(piece.first_row, piece.first_row + piece.num_rows));
  }
  return absl::OkStatus();
}

// One shard of the new layout from its pieces (sorted by to_row), into `out`.
absl::Status ReshardOne(const std::vector<TensorFile>& files,
                        const std::vector<const SavedRows*>& pieces, TensorFile& out) {
  const std::string& shard = pieces.front()->shard;
  int64_t rows = 0;
  for (const SavedRows* piece : pieces) {
    if (piece->file >= files.size() || piece->to_row != rows || piece->num_rows <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the rows to restore shard \"", shard, "\" from do not cover it once each: row ", rows,
          " is followed by rows from ", piece->to_row, " of file ", piece->file));
    }
    rows += piece->num_rows;
  }
  const TensorFile& first_file = files[pieces.front()->file];
  const Tensor* first = FindTensor(first_file, pieces.front()->saved);
  if (first == nullptr) return NoSuchTensor(*pieces.front(), pieces.front()->saved);
  const Shape shape = first->shape().rank() == 0 ? Shape{} : first->shape().WithFirstDim(rows);
  Tensor value(DType::kFloat32, shape);
  const std::vector<std::string> slot_names = SlotNames(first_file, pieces.front()->saved);
  std::vector<Tensor> slots;
  for (size_t s = 0; s < slot_names.size(); ++s) slots.emplace_back(DType::kFloat32, shape);
  // The shards of one variable take every push together, so their update counts agree;
  // should one lag (a PS re-seeded from an older checkpoint), the largest is the variable's.
  int64_t updates = 0;
  for (const SavedRows* piece : pieces) {
    const TensorFile& file = files[piece->file];
    if (absl::Status copied = CopyRows(file, *piece, piece->saved, value); !copied.ok()) {
      return copied;
    }
    for (size_t s = 0; s < slot_names.size(); ++s) {
      const std::string slot = absl::StrCat(piece->saved, kSlotInfix, slot_names[s]);
      if (absl::Status copied = CopyRows(file, *piece, slot, slots[s]); !copied.ok()) {
        return copied;
      }
    }
    auto saved_updates = file.metadata.find(piece->saved + ".updates");
    int64_t piece_updates = 0;
    if (saved_updates == file.metadata.end() ||
        !absl::SimpleAtoi(saved_updates->second, &piece_updates)) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", piece->file,
                                              " lacks the update count of \"", piece->saved,
                                              "\": the checkpoint is damaged"));
    }
    updates = std::max(updates, piece_updates);
  }
  out.tensors.push_back({shard, std::move(value)});
  for (size_t s = 0; s < slot_names.size(); ++s) {
    out.tensors.push_back({absl::StrCat(shard, kSlotInfix, slot_names[s]), std::move(slots[s])});
  }
  out.metadata[shard + ".updates"] = absl::StrCat(updates);
  if (auto optimizer = first_file.metadata.find(pieces.front()->saved + ".optimizer");
      optimizer != first_file.metadata.end()) {
    out.metadata[shard + ".optimizer"] = optimizer->second;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WrittenFile> SaveStore(const VariableStore& store, const std::string& path,
                                      const Confinement& confinement) {
  // What the file holds first (names, shapes, slots; no values), then each variable copied
  // and written in turn: the save holds one variable's copy at a time, not the store's.
  std::vector<VariableSnapshot> layouts;
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata = {{"format", kFileFormat}};
  uint64_t slack = 4096;
  for (const VariableInfo& info : store.List()) {
    STRATUM_ASSIGN_OR_RETURN(VariableSnapshot layout, store.Snapshot(info.name, /*values=*/false));
    entries.push_back({info.name, layout.info.dtype, layout.info.shape});
    for (const std::string& slot : layout.slot_names) {
      entries.push_back(
          {absl::StrCat(info.name, kSlotInfix, slot), layout.info.dtype, layout.info.shape});
    }
    metadata[info.name + ".updates"] = absl::StrCat(std::numeric_limits<int64_t>::min());
    const std::string optimizer = layout.optimizer_config.dump();
    slack += optimizer.size();  // room for a config that changes meanwhile (a new rate)
    metadata[info.name + ".optimizer"] = optimizer;
    layouts.push_back(std::move(layout));
  }
  STRATUM_ASSIGN_OR_RETURN(
      std::unique_ptr<SafetensorsWriter> writer,
      SafetensorsWriter::Open(path, SafetensorsHeaderBytes(entries, metadata) + slack,
                              confinement));
  for (const VariableSnapshot& layout : layouts) {
    const std::string& name = layout.info.name;
    STRATUM_ASSIGN_OR_RETURN(const VariableSnapshot snapshot, store.Snapshot(name));
    if (!(snapshot.info.shape == layout.info.shape) || snapshot.slot_names != layout.slot_names) {
      return absl::AbortedError(
          absl::StrCat("variable \"", name,
                       "\" was created anew while the parameter server saved it: save again"));
    }
    STRATUM_RETURN_IF_ERROR(writer->Add(name, snapshot.value));
    for (size_t s = 0; s < snapshot.slots.size(); ++s) {
      STRATUM_RETURN_IF_ERROR(
          writer->Add(absl::StrCat(name, kSlotInfix, snapshot.slot_names[s]), snapshot.slots[s]));
    }
    metadata[name + ".updates"] = absl::StrCat(snapshot.info.updates);
    metadata[name + ".optimizer"] = snapshot.optimizer_config.dump();
  }
  return writer->Finish(metadata);
}

absl::StatusOr<int> RestoreStoreFromTensorFile(VariableStore& store, const TensorFile& file) {
  std::map<std::string, VariableSnapshot> snapshots;
  for (const auto& [name, tensor] : file.tensors) {
    // Every PS refuses gradients that are not finite, so no save holds such a value: the
    // file is damaged, and nothing of it is restored.
    if (!AllFinite(tensor)) {
      return absl::DataLossError(absl::StrCat("the checkpoint's \"", name,
                                              "\" holds NaN or infinity, which training never "
                                              "saves: the checkpoint is damaged"));
    }
    const size_t slot = name.find(kSlotInfix);
    if (slot == std::string::npos) {
      VariableSnapshot& snapshot = snapshots[name];
      snapshot.info.name = name;
      snapshot.info.shape = tensor.shape();
      snapshot.value = tensor;
      continue;
    }
    VariableSnapshot& snapshot = snapshots[name.substr(0, slot)];
    snapshot.slot_names.push_back(name.substr(slot + sizeof(kSlotInfix) - 1));
    snapshot.slots.push_back(tensor);
  }
  for (auto& [name, snapshot] : snapshots) {
    if (!snapshot.value.valid()) {
      return absl::DataLossError(absl::StrCat("the checkpoint has slots of variable \"", name,
                                              "\" but not the variable itself"));
    }
    auto updates = file.metadata.find(name + ".updates");
    auto optimizer = file.metadata.find(name + ".optimizer");
    if (updates == file.metadata.end() || optimizer == file.metadata.end() ||
        !absl::SimpleAtoi(updates->second, &snapshot.info.updates)) {
      return absl::DataLossError(
          absl::StrCat("the checkpoint lacks the update count or the "
                       "optimizer of variable \"",
                       name, "\""));
    }
    snapshot.optimizer_config =
        nlohmann::json::parse(optimizer->second, nullptr, /*allow_exceptions=*/false);
    if (snapshot.optimizer_config.is_discarded()) {
      return absl::DataLossError(
          absl::StrCat("the checkpoint's optimizer of variable \"", name, "\" is not JSON"));
    }
    if (absl::Status status = store.Restore(snapshot); !status.ok()) return status;
  }
  return static_cast<int>(snapshots.size());
}

absl::StatusOr<TensorFile> ReshardTensorFiles(const std::vector<TensorFile>& files,
                                              const std::vector<SavedRows>& rows) {
  std::map<std::string, std::vector<const SavedRows*>> pieces_of_shard;
  for (const SavedRows& piece : rows) pieces_of_shard[piece.shard].push_back(&piece);
  TensorFile out;
  out.metadata["format"] = kFileFormat;
  for (auto& [shard, pieces] : pieces_of_shard) {
    std::sort(pieces.begin(), pieces.end(),
              [](const SavedRows* a, const SavedRows* b) { return a->to_row < b->to_row; });
    if (absl::Status built = ReshardOne(files, pieces, out); !built.ok()) return built;
  }
  return out;
}

}  // namespace stratum
