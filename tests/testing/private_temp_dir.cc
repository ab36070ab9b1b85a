// Gives each test process a temporary folder of its own and removes it when the tests end.
//
// Tests write job files, summaries and checkpoints under ::testing::TempDir() or
// std::filesystem::temp_directory_path(); with a shared /tmp those outlived the run (a
// thousand files after a few CI runs). Linked into every test binary by stratum_add_test:
// the folder is made before the first test and TEST_TMPDIR and TMPDIR point at it, so the
// binaries a test starts write there too. A failed or crashed test binary leaves its folder
// behind for inspection.
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace stratum::testing {
namespace {

class PrivateTempDir : public ::testing::Environment {
 public:
  void SetUp() override {
    std::error_code error;
    const std::filesystem::path base = std::filesystem::temp_directory_path(error);
    std::string pattern = (error ? std::filesystem::path("/tmp") : base) / "stratum-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror(("cannot make a private temporary folder " + pattern).c_str());
      return;  // The tests then use the shared folder, as before.
    }
    dir_ = pattern;
    setenv("TEST_TMPDIR", dir_.c_str(), /*overwrite=*/1);
    setenv("TMPDIR", dir_.c_str(), /*overwrite=*/1);
  }

  void TearDown() override {
    if (dir_.empty()) return;
    if (::testing::UnitTest::GetInstance()->Failed()) {
      std::fprintf(stderr, "A test failed: its files are kept in %s\n", dir_.c_str());
      return;
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

 private:
  std::string dir_;
};

[[maybe_unused]] const auto* const kPrivateTempDir =
    ::testing::AddGlobalTestEnvironment(new PrivateTempDir);

}  // namespace
}  // namespace stratum::testing
