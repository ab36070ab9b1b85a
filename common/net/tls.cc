#include "stratum/net/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>
#include <vector>

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

using UniqueBio = std::unique_ptr<BIO, decltype(&BIO_free)>;

UniqueBio MemoryBio(const std::string& pem) {
  return UniqueBio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
}

absl::Status Refused(const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("the TLS ", what, " (OpenSSL: ", TakeOpenSslError("no reason given"),
                   "): give this task's certificate, its own key and the cluster's CA "
                   "(--tls_cert, --tls_key, --tls_ca)"));
}

using UniqueX509 = std::unique_ptr<X509, decltype(&X509_free)>;

// Every certificate of a PEM text, in its order (a chain file: the certificate first, then
// the chain above it). OpenSSL's error queue keeps why when none parses.
std::vector<UniqueX509> ReadCertificates(const std::string& pem) {
  UniqueBio bio = MemoryBio(pem);
  std::vector<UniqueX509> certificates;
  while (X509* certificate = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certificates.emplace_back(certificate, &X509_free);
  }
  if (!certificates.empty()) ERR_clear_error();  // the loop ends on "no start line"
  return certificates;
}

absl::Status UseCertificateChain(SSL_CTX* context, const std::string& pem) {
  const std::vector<UniqueX509> chain = ReadCertificates(pem);
  if (chain.empty()) return Refused("certificate does not parse");
  if (SSL_CTX_use_certificate(context, chain[0].get()) != 1) {
    return Refused("certificate was refused");
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    if (SSL_CTX_add1_chain_cert(context, chain[i].get()) != 1) {
      return Refused("certificate chain was refused");
    }
  }
  return absl::OkStatus();
}

absl::Status UsePrivateKey(SSL_CTX* context, const std::string& pem) {
  UniqueBio bio = MemoryBio(pem);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) return Refused("key does not parse");
  const int used = SSL_CTX_use_PrivateKey(context, key);
  EVP_PKEY_free(key);
  if (used != 1 || SSL_CTX_check_private_key(context) != 1) {
    return Refused("key does not match the certificate");
  }
  return absl::OkStatus();
}

absl::Status TrustOnly(SSL_CTX* context, const std::string& pem) {
  X509_STORE* store = X509_STORE_new();
  SSL_CTX_set_cert_store(context, store);  // the context owns it from here
  const std::vector<UniqueX509> authorities = ReadCertificates(pem);
  if (authorities.empty()) return Refused("CA file holds no certificate that parses");
  for (const UniqueX509& authority : authorities) {
    if (X509_STORE_add_cert(store, authority.get()) != 1) {
      return Refused("CA certificate was refused");
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string TakeOpenSslError(const std::string& fallback) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return fallback;
  const char* reason = ERR_reason_error_string(code);
  return reason != nullptr ? reason : absl::StrCat("OpenSSL error ", code);
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Create(const TlsCredentials& tls) {
  ERR_clear_error();
  SSL_CTX* context = SSL_CTX_new(TLS_method());
  if (context == nullptr) return Refused("context cannot be made");
  std::shared_ptr<const TlsContext> owner(new TlsContext(context, tls.server_name));
  SSL_CTX_set_min_proto_version(context, TLS1_3_VERSION);
  SSL_CTX_set_ciphersuites(context,
                           "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_num_tickets(context, 0);
  SSL_CTX_set_session_cache_mode(context, SSL_SESS_CACHE_OFF);
  // Frames carry their lengths, so a peer that closes without close_notify is a closed
  // connection like any other, not a protocol error.
  SSL_CTX_set_options(context, SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Pollers retry a write with the same bytes from wherever their buffer now is.
  SSL_CTX_set_mode(context, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Read what the socket holds in one system call, several records at a time.
  SSL_CTX_set_read_ahead(context, 1);
  SSL_CTX_set_default_read_buffer_len(context, 256 << 10);
  SSL_CTX_set_verify(context, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  STRATUM_RETURN_IF_ERROR(UseCertificateChain(context, tls.cert_pem));
  STRATUM_RETURN_IF_ERROR(UsePrivateKey(context, tls.key_pem));
  STRATUM_RETURN_IF_ERROR(TrustOnly(context, tls.ca_pem));
  return owner;
}

TlsContext::~TlsContext() { SSL_CTX_free(context_); }

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
