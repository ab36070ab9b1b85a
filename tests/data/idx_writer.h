// Test helpers for the data tests: write small IDX files (plain or gzipped) and raw bytes
// into a fresh temporary folder that is removed with the helper; small tensors and
// status messages.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include "absl/status/status.h"
#include "stratum/tensor/tensor.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

namespace stratum::testing {

// Header (00 00 type ndims, big-endian dims) followed by `data` as given.
inline std::string IdxBytes(uint8_t type, const std::vector<uint32_t>& dims,
                            const std::string& data) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(d >> shift));
  }
  return out + data;
}

inline std::string UbyteIdx(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  return IdxBytes(0x08, dims, std::string(data.begin(), data.end()));
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "stratum_data_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file, std::ios::binary) << bytes;
    return file;
  }
  std::string WriteGz(const std::string& name, const std::string& bytes) const {
    const std::string file = path_ + "/" + name;
    gzFile gz = gzopen(file.c_str(), "wb");
    EXPECT_NE(gz, nullptr);
    EXPECT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(gz);
    return file;
  }

 private:
  std::string path_;
};

inline std::string Message(const absl::Status& status) { return std::string(status.message()); }

// 0, 1, ..., n-1 as int32 [n].
inline Tensor Range(int n) {
  std::vector<int32_t> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), 0);
  return Tensor::FromVector<int32_t>({n}, values);
}

}  // namespace stratum::testing
