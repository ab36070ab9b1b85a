// Fuzz inputs for readers that open a path: each input is written to a file in a folder
// of the process's own, named as the reader expects, and read from there.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace stratum::fuzz {

// The process's scratch folder under $TMPDIR (or /tmp), removed at exit. Never destroyed,
// so that the exit handler that removes it can still name it.
inline const std::filesystem::path& ScratchDir() {
  static const std::filesystem::path* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/stratum-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("stratum fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(ScratchDir(), ignored);
    });
    return new std::filesystem::path(pattern);
  }();
  return *dir;
}

// Writes `size` bytes to `relative` (folders created) under ScratchDir(); its path.
inline std::string WriteInput(const std::string& relative, const uint8_t* data, size_t size) {
  const std::filesystem::path path = ScratchDir() / relative;
  std::filesystem::create_directories(path.parent_path());
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr || (size > 0 && std::fwrite(data, 1, size, file) != size) ||
      std::fclose(file) != 0) {
    std::perror("stratum fuzz: writing an input");
    std::abort();
  }
  return path.string();
}

}  // namespace stratum::fuzz
