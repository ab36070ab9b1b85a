#include "stratum/net/tls.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/net/channel.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

namespace fs = std::filesystem;

class LoadTlsCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("stratum-tls-unit-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    Write("tls.crt", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    Write("tls.key",
          "-----BEGIN EC PARAMETERS-----\nBggq\n-----END EC PARAMETERS-----\n"
          "-----BEGIN EC PRIVATE KEY-----\nBBBB\n-----END EC PRIVATE KEY-----\n");
    Write("ca.crt", "-----BEGIN CERTIFICATE-----\nCCCC\n-----END CERTIFICATE-----\n");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  TlsFiles Files() const {
    return {.cert_file = (dir_ / "tls.crt").string(),
            .key_file = (dir_ / "tls.key").string(),
            .ca_file = (dir_ / "ca.crt").string(),
            .server_name = "stratum"};
  }

  fs::path dir_;
};

TEST_F(LoadTlsCredentialsTest, ReadsThePemFiles) {
  auto tls = LoadTlsCredentials(Files());
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_THAT(tls->cert_pem, HasSubstr("AAAA"));
  EXPECT_THAT(tls->key_pem, HasSubstr("BBBB"));
  EXPECT_THAT(tls->ca_pem, HasSubstr("CCCC"));
  EXPECT_EQ(tls->server_name, "stratum");
}

TEST_F(LoadTlsCredentialsTest, NamesAMissingFile) {
  TlsFiles files = Files();
  files.ca_file = (dir_ / "missing.crt").string();
  auto tls = LoadTlsCredentials(files);
  EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tls.status().message()),
              HasSubstr("TLS CA file \"" + files.ca_file + "\" cannot be read"));
}

TEST_F(LoadTlsCredentialsTest, NamesASwappedFile) {
  TlsFiles files = Files();
  std::swap(files.cert_file, files.key_file);
  auto tls = LoadTlsCredentials(files);
  EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(tls.status().message()),
      HasSubstr("TLS certificate file \"" + files.cert_file + "\" holds no PEM CERTIFICATE"));
}

TEST(TlsFilesTest, EmptyMeansPlaintext) {
  EXPECT_TRUE(TlsFiles{}.empty());
  EXPECT_TRUE(TlsFiles{.server_name = "stratum"}.empty());
  EXPECT_FALSE(TlsFiles{.ca_file = "ca.crt"}.empty());
  EXPECT_FALSE(ChannelOptions{}.tls.has_value());
}

}  // namespace
}  // namespace stratum
