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

// The slot names of `variable` in `file`, in file order.
std::vector<std::string> SlotNames(const SafetensorsReader& file, const std::string& variable) {
  const std::string prefix = variable + kSlotInfix;
  std::vector<std::string> names;
  for (const SafetensorsEntry& entry : file.entries()) {
    if (entry.name.rfind(prefix, 0) == 0) names.push_back(entry.name.substr(prefix.size()));
  }
  return names;
}

// A shard to restore: its pieces (sorted by to_row, covering it once each), its shape, its
// slots, and what its saved shards say of it.
struct ShardPlan {
  std::string shard;
  std::vector<const SavedRows*> pieces;
  Shape shape;
  std::vector<std::string> slot_names;
  int64_t updates = 0;
  nlohmann::json optimizer;
};

// OK when `piece`'s rows of the saved tensor `name` exist, in rows of `shape`'s width, and
// hold finite values only (every PS refuses gradients that are not finite, so a save never
// holds such values: they are damage).
absl::Status CheckPiece(const SafetensorsReader& file, const SavedRows& piece,
                        const std::string& name, const Shape& shape) {
  const SafetensorsEntry* saved = file.Find(name);
  if (saved == nullptr) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", file.path(), " has no \"", name,
                                            "\" to restore shard \"", piece.shard,
                                            "\" from: the checkpoint is damaged"));
  }
  const bool same_rows =
      saved->dtype == DType::kFloat32 && saved->shape.rank() == shape.rank() &&
      (shape.rank() == 0 || saved->shape.WithFirstDim(1) == shape.WithFirstDim(1));
  const int64_t rows = saved->shape.rank() == 0 ? 1 : saved->shape.dim(0);
  if (!same_rows || piece.first_row < 0 || piece.first_row + piece.num_rows > rows) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", file.path(), " holds \"", name, "\" as ",
                     DTypeName(saved->dtype), saved->shape.ToString(), ", which has no rows [",
                     piece.first_row, ", ", piece.first_row + piece.num_rows, ") for shard \"",
                     piece.shard, "\" (float32", shape.ToString(), "): the checkpoint is damaged"));
  }
  STRATUM_ASSIGN_OR_RETURN(const bool finite,
                           file.AllFinite(name, piece.first_row, piece.num_rows));
  if (!finite) {
    return absl::DataLossError(absl::StrCat("the checkpoint's \"", name,
                                            "\" holds NaN or infinity, which training never "
                                            "saves: the checkpoint is damaged"));
  }
  return absl::OkStatus();
}

// Each shard `rows` names, checked whole (its rows covered once each, every saved tensor it
// reads present, of its width, finite, with its update count and optimizer) before any is
// restored.
absl::StatusOr<std::vector<ShardPlan>> PlanShards(
    const std::vector<const SafetensorsReader*>& files, const std::vector<SavedRows>& rows) {
  std::map<std::string, std::vector<const SavedRows*>> pieces_of_shard;
  for (const SavedRows& piece : rows) pieces_of_shard[piece.shard].push_back(&piece);
  std::vector<ShardPlan> plans;
  for (auto& [shard, pieces] : pieces_of_shard) {
    std::sort(pieces.begin(), pieces.end(),
              [](const SavedRows* a, const SavedRows* b) { return a->to_row < b->to_row; });
    int64_t covered = 0;
    for (const SavedRows* piece : pieces) {
      if (piece->file >= files.size() || files[piece->file] == nullptr ||
          piece->to_row != covered || piece->num_rows <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the rows to restore shard \"", shard, "\" from do not cover it once each: row ",
            covered, " is followed by rows from ", piece->to_row, " of file ", piece->file));
      }
      covered += piece->num_rows;
    }
    const SavedRows& first = *pieces.front();
    const SafetensorsReader& first_file = *files[first.file];
    const SafetensorsEntry* saved = first_file.Find(first.saved);
    ShardPlan plan{.shard = shard, .pieces = pieces};
    if (saved != nullptr) {
      plan.shape = saved->shape.rank() == 0 ? Shape{} : saved->shape.WithFirstDim(covered);
    }
    plan.slot_names = SlotNames(first_file, first.saved);
    for (const SavedRows* piece : pieces) {
      const SafetensorsReader& file = *files[piece->file];
      STRATUM_RETURN_IF_ERROR(CheckPiece(file, *piece, piece->saved, plan.shape));
      for (const std::string& slot : plan.slot_names) {
        STRATUM_RETURN_IF_ERROR(
            CheckPiece(file, *piece, absl::StrCat(piece->saved, kSlotInfix, slot), plan.shape));
      }
      // The shards of one variable take every push together, so their update counts agree;
      // should one lag (a PS re-seeded from an older checkpoint), the largest is the
      // variable's.
      auto updates = file.metadata().find(piece->saved + ".updates");
      int64_t piece_updates = 0;
      if (updates == file.metadata().end() || !absl::SimpleAtoi(updates->second, &piece_updates)) {
        return absl::DataLossError(absl::StrCat("checkpoint file ", file.path(),
                                                " lacks the update count of \"", piece->saved,
                                                "\": the checkpoint is damaged"));
      }
      plan.updates = std::max(plan.updates, piece_updates);
    }
    auto optimizer = first_file.metadata().find(first.saved + ".optimizer");
    if (optimizer == first_file.metadata().end()) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", first_file.path(),
                                              " lacks the optimizer of \"", first.saved,
                                              "\": the checkpoint is damaged"));
    }
    plan.optimizer = nlohmann::json::parse(optimizer->second, nullptr, /*allow_exceptions=*/false);
    if (plan.optimizer.is_discarded()) {
      return absl::DataLossError(absl::StrCat("the checkpoint's optimizer of \"", first.saved,
                                              "\" is not JSON: the checkpoint is damaged"));
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

// Rows of `plan`'s pieces of the saved tensors named `suffix` after each piece's saved name
// ("" for the value), into a tensor of the shard's shape.
absl::StatusOr<Tensor> ReadShard(const std::vector<const SafetensorsReader*>& files,
                                 const ShardPlan& plan, const std::string& suffix) {
  Tensor out(DType::kFloat32, plan.shape);
  for (const SavedRows* piece : plan.pieces) {
    void* at = plan.shape.rank() == 0
                   ? out.raw_data()
                   : out.SliceRows(piece->to_row, piece->to_row + piece->num_rows).raw_data();
    STRATUM_RETURN_IF_ERROR(
        files[piece->file]->ReadRows(piece->saved + suffix, piece->first_row, piece->num_rows, at));
  }
  return out;
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

absl::StatusOr<int> RestoreStore(VariableStore& store,
                                 const std::vector<const SafetensorsReader*>& files,
                                 const std::vector<SavedRows>& rows) {
  STRATUM_ASSIGN_OR_RETURN(const std::vector<ShardPlan> plans, PlanShards(files, rows));
  // A shard at a time: read, restored, let go.
  for (const ShardPlan& plan : plans) {
    VariableSnapshot snapshot;
    snapshot.info.name = plan.shard;
    snapshot.info.shape = plan.shape;
    snapshot.info.updates = plan.updates;
    snapshot.optimizer_config = plan.optimizer;
    STRATUM_ASSIGN_OR_RETURN(snapshot.value, ReadShard(files, plan, ""));
    for (const std::string& slot : plan.slot_names) {
      snapshot.slot_names.push_back(slot);
      STRATUM_ASSIGN_OR_RETURN(Tensor values,
                               ReadShard(files, plan, absl::StrCat(kSlotInfix, slot)));
      snapshot.slots.push_back(std::move(values));
    }
    STRATUM_RETURN_IF_ERROR(store.Restore(snapshot));
  }
  return static_cast<int>(plans.size());
}

absl::StatusOr<int> RestoreStore(VariableStore& store, const SafetensorsReader& file) {
  std::vector<SavedRows> rows;
  for (const SafetensorsEntry& entry : file.entries()) {
    const size_t slot = entry.name.find(kSlotInfix);
    if (slot != std::string::npos) {
      if (file.Find(entry.name.substr(0, slot)) == nullptr) {
        return absl::DataLossError(absl::StrCat("the checkpoint has slots of variable \"",
                                                entry.name.substr(0, slot),
                                                "\" but not the variable itself"));
      }
      continue;
    }
    rows.push_back({.saved = entry.name,
                    .num_rows = entry.shape.rank() == 0 ? 1 : entry.shape.dim(0),
                    .shard = entry.name});
  }
  return RestoreStore(store, {&file}, rows);
}

}  // namespace stratum
