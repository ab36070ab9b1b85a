#include "stratum/ps/store_checkpoint.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stratum {
namespace {

constexpr char kSlotInfix[] = "/slot_";

}  // namespace

absl::StatusOr<TensorFile> StoreToTensorFile(const VariableStore& store) {
  TensorFile file;
  file.metadata["format"] = "stratum-ps-checkpoint-1";
  for (const VariableInfo& info : store.List()) {
    absl::StatusOr<VariableSnapshot> snapshot = store.Snapshot(info.name);
    if (!snapshot.ok()) return snapshot.status();
    file.tensors.push_back({info.name, snapshot->value});
    for (size_t s = 0; s < snapshot->slots.size(); ++s) {
      file.tensors.push_back(
          {absl::StrCat(info.name, kSlotInfix, snapshot->slot_names[s]), snapshot->slots[s]});
    }
    file.metadata[info.name + ".updates"] = absl::StrCat(snapshot->info.updates);
    file.metadata[info.name + ".optimizer"] = snapshot->optimizer_config.dump();
  }
  return file;
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

}  // namespace stratum
