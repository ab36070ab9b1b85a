#include "stratum/net/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// Reads `path` and checks that it holds a PEM block whose label ends with `label`
// ("CERTIFICATE", or "PRIVATE KEY", which also matches "RSA PRIVATE KEY" and the like), so
// that a swapped or empty file is named at start-up, not met as a failed handshake.
absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& what,
                                    const std::string& label) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::InvalidArgumentError(absl::StrCat("TLS ", what, " file \"", path,
                                                   "\" cannot be read: check the path and that "
                                                   "this user may read it"));
  }
  std::stringstream text;
  text << file.rdbuf();
  std::string pem = text.str();
  if (!absl::StrContains(pem, "-----BEGIN ") || !absl::StrContains(pem, label + "-----")) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS ", what, " file \"", path, "\" holds no PEM ", label,
                     ": give the PEM file (a \"-----BEGIN ... ", label, "-----\" block)"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<TlsCredentials> LoadTlsCredentials(const TlsFiles& files) {
  TlsCredentials tls;
  STRATUM_ASSIGN_OR_RETURN(tls.cert_pem, ReadPem(files.cert_file, "certificate", "CERTIFICATE"));
  STRATUM_ASSIGN_OR_RETURN(tls.key_pem, ReadPem(files.key_file, "key", "PRIVATE KEY"));
  STRATUM_ASSIGN_OR_RETURN(tls.ca_pem, ReadPem(files.ca_file, "CA", "CERTIFICATE"));
  tls.server_name = files.server_name;
  return tls;
}

std::shared_ptr<grpc::ChannelCredentials> MakeTlsChannelCredentials(const TlsCredentials& tls) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;
  options.pem_private_key = tls.key_pem;
  options.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(options);
}

std::shared_ptr<grpc::ServerCredentials> MakeTlsServerCredentials(const TlsCredentials& tls) {
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls.ca_pem;
  options.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(options);
}

}  // namespace stratum
