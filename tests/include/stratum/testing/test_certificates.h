// Certificates for tests of the cluster's mutual TLS, made as users make them: by
// deploy/make_tls_certs.sh (openssl), a CA of its own and one certificate it signed, for
// the DNS names "stratum" and localhost and the address 127.0.0.1. Each call makes a new
// CA, so two calls give two clusters that must not trust each other. A test target that
// includes this header defines STRATUM_SOURCE_DIR (the checkout, where the script is).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "stratum/net/tls.h"
#include "stratum/util/status_macros.h"
#include "stratum/util/subprocess.h"

namespace stratum::testing {

// Makes the certificates in `dir` (created) and loads them; `server_name` is what clients
// check servers' certificates for instead of the host they dial ("": the host).
inline absl::StatusOr<TlsCredentials> MakeTestCertificates(const std::string& dir,
                                                           const std::string& server_name = "") {
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_SOURCE_DIR) + "/deploy/make_tls_certs.sh", dir};
  options.env = {{"DAYS", "2"}};
  options.forward_fd = -1;
  options.capture_output = true;
  STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> process, Subprocess::Spawn(options));
  STRATUM_ASSIGN_OR_RETURN(ExitInfo exit, process->Wait(absl::Seconds(60)));
  if (!exit.success()) {
    return absl::InternalError(
        absl::StrCat("make_tls_certs.sh ", exit.ToString(), ":\n", process->output()));
  }
  return LoadTlsCredentials({.cert_file = dir + "/tls.crt",
                             .key_file = dir + "/tls.key",
                             .ca_file = dir + "/ca.crt",
                             .server_name = server_name});
}

// A TLS context of the test cluster `cluster`'s certificates (made once per name in this
// process, under its temporary folder); null, failing the test, when they cannot be made.
// Thread-safe.
inline std::shared_ptr<const TlsContext> TestTlsContext(const std::string& cluster = "cluster") {
  static absl::Mutex mutex(absl::kConstInit);
  static auto* const made = new std::map<std::string, std::shared_ptr<const TlsContext>>;
  absl::MutexLock lock(&mutex);
  std::shared_ptr<const TlsContext>& context = (*made)[cluster];
  if (context != nullptr) return context;
  absl::StatusOr<TlsCredentials> credentials =
      MakeTestCertificates((std::filesystem::temp_directory_path() / cluster).string());
  EXPECT_TRUE(credentials.ok()) << credentials.status();
  if (!credentials.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<const TlsContext>> tls = TlsContext::Create(*credentials);
  EXPECT_TRUE(tls.ok()) << tls.status();
  if (tls.ok()) context = *tls;
  return context;
}

}  // namespace stratum::testing
