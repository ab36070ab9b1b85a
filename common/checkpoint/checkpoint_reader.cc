#include "stratum/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

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

// A shard as the manifest places it.
struct Part {
  std::string name;
  int64_t first_row = 0;
  const Tensor* value = nullptr;
};

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
  // Whole variables: each shard's rows at their place. The shards must tile their variable
  // exactly (rows 0.. without gap or overlap, one row shape, float32), so that a damaged or
  // forged manifest can neither leave rows unset nor place one beyond what the files hold.
  std::map<std::string, std::vector<Part>> by_variable;
  for (const nlohmann::json& shard : shards) {
    const std::string name = shard.value("shard", "");
    const auto value = shard_values.find(name);
    const std::string variable = shard.value("variable", "");
    if (value == shard_values.end()) {
      return absl::DataLossError(
          absl::StrCat(result.folder, " lacks shard \"", name, "\" of \"", variable, "\""));
    }
    if (value->second.dtype() != DType::kFloat32) {
      return absl::DataLossError(absl::StrCat(result.folder, ": shard \"", name, "\" of \"",
                                              variable, "\" is ", DTypeName(value->second.dtype()),
                                              ", not float32: it is corrupt"));
    }
    by_variable[variable].push_back({name, shard.value("first_row", int64_t{0}), &value->second});
  }
  for (auto& [variable, parts] : by_variable) {
    const Shape& first_shape = parts[0].value->shape();
    const bool scalar = parts.size() == 1 && first_shape.rank() == 0;
    std::sort(parts.begin(), parts.end(),
              [](const Part& a, const Part& b) { return a.first_row < b.first_row; });
    int64_t rows = 0;  // the rows placed so far: the next part starts there
    for (const Part& part : parts) {
      const Shape& shape = part.value->shape();
      if (!scalar && (shape.rank() == 0 || shape.rank() != first_shape.rank() ||
                      !std::equal(shape.dims().begin() + 1, shape.dims().end(),
                                  first_shape.dims().begin() + 1))) {
        return absl::DataLossError(absl::StrCat(result.folder, ": the shards of \"", variable,
                                                "\" have different row shapes"));
      }
      if (part.first_row != rows) {
        return absl::DataLossError(absl::StrCat(
            result.folder, "/manifest.json places shard \"", part.name, "\" of \"", variable,
            "\" at row ", part.first_row, " where its shards' rows reach ", rows,
            ": they must cover the variable's rows once each, without gap; it is corrupt"));
      }
      rows += scalar ? 1 : shape.dim(0);
    }
    Tensor whole(DType::kFloat32, scalar ? Shape() : first_shape.WithFirstDim(rows));
    for (const Part& part : parts) {
      std::memcpy(static_cast<char*>(whole.raw_data()) +
                      static_cast<size_t>(part.first_row) * whole.row_size() * sizeof(float),
                  part.value->raw_data(), part.value->byte_size());
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
