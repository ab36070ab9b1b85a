// What Stratum writes, read back through paths independent of its own code, by the Python
// readers under tests/ (written from the formats' descriptions, or with the libraries the
// other side uses): TensorBoard event files (tests/training/read_tfevents.py: TFRecord
// framing, CRC-32C and protobuf decoded in Python) and Keras exports
// (tests/integration/keras_export_check.py: h5py and NumPy). Header-only; needs
// STRATUM_SOURCE_DIR defined by the test's build.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace stratum::testing {

// Runs tests/`script` with `args` under Debian's Python; its output. DATA_LOSS with the
// output when it fails (the reader found the file damaged, or wrong).
inline absl::StatusOr<std::string> RunPythonReader(const std::string& script,
                                                   const std::string& args) {
  const std::string command =
      absl::StrCat("/usr/bin/python3 ", STRATUM_SOURCE_DIR, "/tests/", script, " ", args, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("cannot run " + command);
  std::string text;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) text.append(buffer, n);
  const int status = pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return absl::DataLossError(text);
  return text;
}

// The scalars of a TensorBoard log folder, one JSON object each: run ("train",
// "validation"), tag, step, value, wall_time, plugin.
inline absl::StatusOr<std::vector<nlohmann::json>> ReadTensorBoardScalars(
    const std::string& log_dir) {
  absl::StatusOr<std::string> text =
      RunPythonReader("training/read_tfevents.py", absl::StrCat("'", log_dir, "'"));
  if (!text.ok()) return text.status();
  std::vector<nlohmann::json> scalars;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json parsed = nlohmann::json::parse(line, nullptr, false);
    if (parsed.is_discarded()) return absl::InternalError("the decoder wrote: " + *text);
    scalars.push_back(std::move(parsed));
  }
  return scalars;
}

// An export folder (model.json, model.weights.h5, model.safetensors) checked against Keras
// 3's weights layout; with `accuracy` >= 0, its weights must give that test accuracy on
// Fashion-MNIST. The reader's JSON line ({"layers", "variables", "accuracy"}).
inline absl::StatusOr<nlohmann::json> CheckKerasExport(const std::string& dir,
                                                       double accuracy = -1) {
  std::string args = absl::StrCat("'", dir, "'");
  if (accuracy >= 0) absl::StrAppend(&args, " --accuracy ", accuracy);
  absl::StatusOr<std::string> text = RunPythonReader("integration/keras_export_check.py", args);
  if (!text.ok()) return text.status();
  nlohmann::json parsed = nlohmann::json::parse(*text, nullptr, false);
  if (parsed.is_discarded()) return absl::InternalError("the checker wrote: " + *text);
  return parsed;
}

}  // namespace stratum::testing
