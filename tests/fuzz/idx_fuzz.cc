// IDX files, plain or gzip'd (the data sets' files, which a job names by path): any bytes
// are a tensor of the size the header declares, or an error, never a crash or an
// allocation the file's header alone asked for.
#include <cstdint>
#include <cstdlib>

#include "fuzz_file.h"
#include "stratum/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = stratum::fuzz::WriteInput("input-idx3-ubyte.gz", data, size);
  absl::StatusOr<stratum::IdxHeader> header = stratum::ReadIdxHeader(path);
  absl::StatusOr<stratum::Tensor> tensor = stratum::ReadIdxFile(path);
  if (tensor.ok() &&
      (!header.ok() || header->shape != tensor->shape() || header->dtype != tensor->dtype())) {
    std::abort();  // the whole file read, and its header said otherwise
  }
  return 0;
}
