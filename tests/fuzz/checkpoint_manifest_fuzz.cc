// A checkpoint as a restart and the evaluator read it: the input is the manifest, then
// optionally a NUL and the bytes of the shard file it may name (written as both
// "ps-0.safetensors" and "state.safetensors"). Any bytes are a checkpoint's variables or
// an error naming the file, never a crash or a write past a variable; the same bytes as
// the folder's pointer file are a folder or DATA_LOSS.
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_file.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/checkpoint_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fuzz = stratum::fuzz;
  static const std::string kPointer = R"({"latest": "ckpt-000000000007", "step": 7})";
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t manifest_size = nul != nullptr ? static_cast<size_t>(nul - data) : size;
  const uint8_t* file = nul != nullptr ? nul + 1 : data + size;
  const size_t file_size = static_cast<size_t>(data + size - file);
  fuzz::WriteInput("ckpt/checkpoint", reinterpret_cast<const uint8_t*>(kPointer.data()),
                   kPointer.size());
  fuzz::WriteInput("ckpt/ckpt-000000000007/manifest.json", data, manifest_size);
  fuzz::WriteInput("ckpt/ckpt-000000000007/ps-0.safetensors", file, file_size);
  fuzz::WriteInput("ckpt/ckpt-000000000007/state.safetensors", file, file_size);
  const std::string dir = (fuzz::ScratchDir() / "ckpt").string();
  (void)stratum::ReadLatestCheckpoint(dir);
  (void)stratum::RestoreNewestIntact(dir, [](const std::string&) { return absl::OkStatus(); });
  // The manifest's bytes as the pointer file.
  fuzz::WriteInput("ckpt/checkpoint", data, manifest_size);
  (void)stratum::LatestCheckpointFolder(dir);
  (void)stratum::LatestCheckpointStep(dir);
  return 0;
}
