// The scalars of a TensorBoard log folder as tests/training/read_tfevents.py reads them: a
// decoder of the TFRecord framing, CRC-32C and protobuf wire format written in Python from
// their descriptions, independent of Stratum's writer. Header-only; needs
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

// One JSON object per scalar: run ("train", "validation"), tag, step, value, wall_time,
// plugin. DATA_LOSS with the decoder's words when a file is damaged (a CRC, a truncation).
inline absl::StatusOr<std::vector<nlohmann::json>> ReadTensorBoardScalars(
    const std::string& log_dir) {
  const std::string command = absl::StrCat("/usr/bin/python3 ", STRATUM_SOURCE_DIR,
                                           "/tests/training/read_tfevents.py '", log_dir, "' 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("cannot run " + command);
  std::string text;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) text.append(buffer, n);
  const int status = pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return absl::DataLossError(text);
  std::vector<nlohmann::json> scalars;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json parsed = nlohmann::json::parse(line, nullptr, false);
    if (parsed.is_discarded()) return absl::InternalError("the decoder wrote: " + text);
    scalars.push_back(std::move(parsed));
  }
  return scalars;
}

}  // namespace stratum::testing
