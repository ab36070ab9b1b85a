#include "stratum/checkpoint/checkpoint_reader.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/util/json_depth.h"

namespace stratum {
absl::StatusOr<nlohmann::json> ReadJsonObjectFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  nlohmann::json json = JsonNestingDepth(*text) > kMaxJsonDepth
                            ? nlohmann::json(nlohmann::json::value_t::discarded)
                            : nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::DataLossError(absl::StrCat(path, " is not a JSON object: it is corrupt"));
  }
  return json;
}

absl::StatusOr<std::optional<int64_t>> LatestCheckpointStep(const std::string& dir) {
  absl::StatusOr<nlohmann::json> pointer = ReadJsonObjectFile(dir + "/checkpoint");
  if (absl::IsNotFound(pointer.status())) return std::optional<int64_t>();
  if (!pointer.ok()) return pointer.status();
  if (!pointer->contains("step") || !(*pointer)["step"].is_number_integer()) {
    return absl::DataLossError(absl::StrCat(dir, "/checkpoint names no step: it is corrupt"));
  }
  return std::optional<int64_t>((*pointer)["step"].get<int64_t>());
}

namespace {

absl::StatusOr<CheckpointVariables> ReadLatestCheckpointOrThrow(const std::string& dir) {
  absl::StatusOr<nlohmann::json> pointer = ReadJsonObjectFile(dir + "/checkpoint");
  if (!pointer.ok()) return pointer.status();
  if (!pointer->contains("latest") || !(*pointer)["latest"].is_string()) {
    return absl::DataLossError(absl::StrCat(dir, "/checkpoint names no checkpoint: it is corrupt"));
  }
  CheckpointVariables result;
  result.folder = absl::StrCat(dir, "/", (*pointer)["latest"].get<std::string>());
  absl::StatusOr<nlohmann::json> manifest = ReadCheckpointManifest(result.folder);
  if (!manifest.ok()) return manifest.status();
  result.step = manifest->value("step", int64_t{0});
  const nlohmann::json& files = (*manifest)["files"];
  if (manifest->value("format", "") == kFitCheckpointFormat) {
    // Fit's: the variables by name beside their optimizer slots, in one file.
    if (!files.is_array() || files.size() != 1) {
      return absl::DataLossError(absl::StrCat(result.folder, "/manifest.json lists no state file"));
    }
    absl::StatusOr<TensorFile> read = ReadSafetensors(
        absl::StrCat(result.folder, "/", files[0].value("file", "")), files[0].value("crc32", 0u));
    if (!read.ok()) return read.status();
    for (auto& [name, tensor] : read->tensors) {
      if (name.find("/slot_") == std::string::npos) result.variables[name] = std::move(tensor);
    }
    return result;
  }
  const nlohmann::json& shards = (*manifest)["shards"];
  if (!files.is_array() || !shards.is_array()) {
    return absl::DataLossError(absl::StrCat(result.folder, "/manifest.json lacks files or shards"));
  }
  // Every shard's tensor, by shard name, from the PS files.
  std::map<std::string, Tensor> shard_values;
  for (const nlohmann::json& file : files) {
    const std::string path = absl::StrCat(result.folder, "/", file.value("file", ""));
    absl::StatusOr<TensorFile> read = ReadSafetensors(path, file.value("crc32", 0u));
    if (!read.ok()) return read.status();
    for (auto& [name, tensor] : read->tensors) {
      if (name.find("/slot_") == std::string::npos) shard_values[name] = std::move(tensor);
    }
  }
  // Whole variables: each shard's rows at their place.
  std::map<std::string, std::vector<const nlohmann::json*>> by_variable;
  for (const nlohmann::json& shard : shards)
    by_variable[shard.value("variable", "")].push_back(&shard);
  for (const auto& [variable, parts] : by_variable) {
    int64_t rows = 0;
    std::vector<int64_t> row_dims;
    for (const nlohmann::json* part : parts) {
      const auto value = shard_values.find(part->value("shard", ""));
      if (value == shard_values.end()) {
        return absl::DataLossError(absl::StrCat(result.folder, " lacks shard \"",
                                                part->value("shard", ""), "\" of \"", variable,
                                                "\""));
      }
      if (part->value("first_row", int64_t{0}) < 0) {
        return absl::DataLossError(absl::StrCat(result.folder, "/manifest.json places shard \"",
                                                part->value("shard", ""),
                                                "\" at a negative row: it is corrupt"));
      }
      const Shape& shape = value->second.shape();
      rows =
          std::max(rows, part->value("first_row", int64_t{0}) + (shape.rank() ? shape.dim(0) : 1));
      row_dims.assign(shape.dims().begin() + (shape.rank() ? 1 : 0), shape.dims().end());
    }
    const bool scalar =
        parts.size() == 1 && shard_values[parts[0]->value("shard", "")].shape().rank() == 0;
    std::vector<int64_t> dims = {rows};
    dims.insert(dims.end(), row_dims.begin(), row_dims.end());
    Tensor whole(DType::kFloat32, scalar ? Shape() : Shape(dims));
    for (const nlohmann::json* part : parts) {
      const Tensor& value = shard_values[part->value("shard", "")];
      if (value.row_size() != whole.row_size() && !scalar) {
        return absl::DataLossError(absl::StrCat(result.folder, ": the shards of \"", variable,
                                                "\" have different row shapes"));
      }
      std::memcpy(static_cast<char*>(whole.raw_data()) +
                      static_cast<size_t>(part->value("first_row", int64_t{0}) * whole.row_size()) *
                          sizeof(float),
                  value.raw_data(), value.byte_size());
    }
    result.variables[variable] = std::move(whole);
  }
  return result;
}

}  // namespace

absl::StatusOr<CheckpointVariables> ReadLatestCheckpoint(const std::string& dir) {
  try {
    return ReadLatestCheckpointOrThrow(dir);
  } catch (const nlohmann::json::exception& error) {  // a field of the wrong type
    return absl::DataLossError(absl::StrCat("the latest checkpoint in ", dir,
                                            " has a manifest field Stratum cannot read (",
                                            error.what(), "): it is corrupt"));
  }
}

}  // namespace stratum
