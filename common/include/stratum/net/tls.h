// TLS with mutual authentication for every gRPC connection of a cluster: each process
// holds a certificate and key signed by the cluster's CA and trusts only that CA, so a
// server refuses a client without such a certificate (plaintext or from another CA), and
// a client refuses a server without one. The PEM texts are read once, in main, into a
// TlsCredentials value that ChannelOptions and TaskServerOptions carry; nothing here reads
// the environment. The raw links beside gRPC (the PS's data path, the collectives' TCP
// links) speak the same mutual TLS through a TlsContext made from the same credentials
// (Socket::StartTls). Values are immutable after loading; functions are thread-safe.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace stratum {

// Where the PEM files are (from flags or the environment).
struct TlsFiles {
  std::string cert_file;  // this process's certificate (chain), PEM
  std::string key_file;   // its private key, PEM
  std::string ca_file;    // the CA that signed every member's certificate, PEM
  // When set, clients check a server's certificate for this DNS name instead of the host
  // of the address they dial (one certificate for the whole cluster, whatever the pods'
  // names are).
  std::string server_name;

  bool empty() const { return cert_file.empty() && key_file.empty() && ca_file.empty(); }
};

struct TlsCredentials {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
  std::string server_name;  // see TlsFiles::server_name
};

// Reads and checks the three files (each must exist and hold a PEM block of the right
// kind). INVALID_ARGUMENT naming the file and what is wrong with it.
absl::StatusOr<TlsCredentials> LoadTlsCredentials(const TlsFiles& files);

// Credentials for a client: present our certificate, trust only the cluster's CA.
std::shared_ptr<grpc::ChannelCredentials> MakeTlsChannelCredentials(const TlsCredentials& tls);

// Credentials for a server: require a client certificate signed by the cluster's CA.
std::shared_ptr<grpc::ServerCredentials> MakeTlsServerCredentials(const TlsCredentials& tls);

// OpenSSL's side of the cluster's mutual TLS, for the raw links: TLS 1.3 only, this task's
// certificate for both roles, and only the cluster's CA trusted, so each end refuses a peer
// without a certificate from it. No session tickets (a connection lives as long as its
// link) and AES-128-GCM first (the fastest suite where the CPU has AES instructions).
// Thread-safe: one context serves every connection of a process.
class TlsContext {
 public:
  // INVALID_ARGUMENT naming what OpenSSL could not take (the key does not match the
  // certificate, a PEM block does not parse).
  static absl::StatusOr<std::shared_ptr<const TlsContext>> Create(const TlsCredentials& tls);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  ssl_ctx_st* native() const { return context_; }
  // The name a client checks a server's certificate for instead of the host it dials; "":
  // the host (see TlsFiles::server_name).
  const std::string& server_name() const { return server_name_; }

 private:
  TlsContext(ssl_ctx_st* context, std::string server_name)
      : context_(context), server_name_(std::move(server_name)) {}

  ssl_ctx_st* context_;
  std::string server_name_;
};

// OpenSSL's first queued error as text ("certificate verify failed"), emptying the
// thread's queue; `fallback` when there is none.
std::string TakeOpenSslError(const std::string& fallback);

}  // namespace stratum
