// Checkpoint shards (safetensors files), as a restore reads them: any bytes are tensors
// inside the file or an error that names the file, never a crash or a read past its end.
#include <cstdint>

#include "fuzz_file.h"
#include "stratum/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = stratum::fuzz::WriteInput("shard.safetensors", data, size);
  (void)stratum::ReadSafetensors(path);
  return 0;
}
