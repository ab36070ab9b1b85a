// The parameter server's raw data path: large pushes and pulls travel on a plain stream
// socket beside gRPC, which stays the control path (the PS announces the data path's
// endpoint in its DataPath RPC). gRPC moves a 4 MiB tensor several times slower than the
// socket under it (bench/transport_bench.cc); the data path sends a tensor's bytes from
// the tensor's own memory and receives them into reused, already-mapped buffers.
//
// Two transports, picked per connection as TensorPipe picks them for PyTorch's RPC: a
// client on the PS's host (its abstract Unix socket answers, which only happens in the same
// network namespace) moves tensors through a shared-memory segment, one copy each way;
// any other client uses TCP. Both carry the same frames (data_wire.h) and get the same
// checks as the gRPC service: every gradient of a push is validated before the first is
// applied (a bad push changes nothing), NaN/Inf is refused, a frame over the size limit
// is refused, and the server applies nothing from a frame that did not arrive whole.
//
// Every call has a deadline (PsDataClientOptions::timeout, sent to the server too) and its
// errors name the PS. In a cluster with mutual TLS, TCP connections speak it too (the
// cluster's certificates, checked both ways as gRPC checks them); same-host connections
// stay on the Unix socket and shared memory, which never leave the host. A client must
// present the token the PS announced (over gRPC, so under TLS only holders of the
// cluster's certificates learn it), and a same-host client could still rewrite its shared
// segment while the PS reads it (after the NaN check), which only its own pushes would
// suffer from.
//
// Thread safety: PsDataServer and PsDataClient are thread-safe; a client keeps a small
// pool of connections, one per concurrent call.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "data_memory.h"
#include "data_wire.h"
#include "stratum/net/socket.h"
#include "stratum/net/tls.h"
#include "stratum/ps/data_path_endpoint.h"
#include "stratum/ps/variable_store.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

struct PsDataServerOptions {
  std::string host = "127.0.0.1";  // where the TCP listener binds; "::" for all
  int port = 0;                    // 0: any free port
  bool shared_memory = true;       // also serve same-host clients through shared memory
  data_wire::Limits limits;
  // Caps the deadline a client sends; a frame must arrive whole within it.
  absl::Duration max_request_time = absl::Minutes(10);
  absl::Duration hello_timeout = absl::Seconds(10);
  // A connection with no request for this long is closed (its client reconnects when it
  // needs one), so that idle connections, a flood's or a vanished client's, are reaped.
  // Clients learn it in the hello and leave such connections first.
  absl::Duration idle_timeout = absl::Minutes(5);
  // The cluster's mutual TLS for TCP connections; null: plaintext.
  std::shared_ptr<const TlsContext> tls;
  // On Shutdown, how long calls in flight may finish before their connections are cut.
  absl::Duration shutdown_grace = absl::Seconds(3);
  // Open connections at most (a worker keeps one or two per PS): more are closed as they
  // come, and when the process runs out of descriptors the server waits for connections
  // to end and accepts again.
  size_t max_connections = 512;
  // Open connections from one client (one IP address; Unix sockets count as one client) at
  // most: a flood from one host is closed as it comes, leaving room for the others.
  size_t max_connections_per_client = 64;
};

class PsDataServer {
 public:
  // Listens and serves `store` (which must outlive the server). UNAVAILABLE naming the
  // address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<PsDataServer>> Start(VariableStore& store,
                                                             PsDataServerOptions options);
  ~PsDataServer();
  PsDataServer(const PsDataServer&) = delete;
  PsDataServer& operator=(const PsDataServer&) = delete;

  const DataPathEndpoint& endpoint() const { return endpoint_; }
  // Stops accepting; idle connections close at once, calls in flight get the grace period
  // (a call arriving now is refused as UNAVAILABLE). Idempotent.
  void Shutdown();

  // What the acceptors have done so far: connections taken from the listeners (kept, or
  // closed at once over a cap), and accepts that failed for want of descriptors or memory
  // (the acceptor then waits for connections to end and accepts again).
  struct AcceptCounts {
    int64_t accepted = 0;
    int64_t exhausted = 0;
  };
  AcceptCounts accept_counts();
  // Waits until `reached` holds for the counts or `timeout` passes; true when it holds. Lets
  // a test act once its connections are provably accepted, or a flood has provably met the
  // descriptor limit, instead of sleeping.
  bool AwaitAccepts(const std::function<bool(const AcceptCounts&)>& reached,
                    absl::Duration timeout);

 private:
  struct Connection;
  PsDataServer(VariableStore& store, PsDataServerOptions options);
  void AcceptLoop(const Socket* listener);
  void Serve(Connection* connection);
  // One request; false when the connection must close.
  bool ServeOne(Connection& connection);
  void ReapFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  VariableStore& store_;
  const PsDataServerOptions options_;
  DataPathEndpoint endpoint_;
  Socket tcp_listener_;
  Socket unix_listener_;
  std::vector<std::thread> acceptors_;

  absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mutex_);
  absl::Time last_client_cap_warning_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  AcceptCounts accept_counts_ ABSL_GUARDED_BY(mutex_);
};

struct PsDataClientOptions {
  absl::Duration timeout = absl::Seconds(30);
  // Opening a connection gives up sooner (a firewall that drops packets), and the caller
  // falls back to gRPC.
  absl::Duration connect_timeout = absl::Seconds(5);
  bool shared_memory = true;  // offer it to a PS on this host
  data_wire::Limits limits;
  size_t max_idle_connections = 4;
  // The cluster's mutual TLS for a TCP connection (the PS's certificate is checked for its
  // host, or the context's server_name); null: plaintext.
  std::shared_ptr<const TlsContext> tls;
};

// How a data call ended, for a caller deciding whether to fall back to gRPC.
enum class DataCallOutcome {
  kAnswered,  // the PS answered (the status is its answer)
  kNotSent,   // no connection could be made: nothing reached the PS
  kBroken,    // the connection failed during the call: the PS may or may not have applied it
};

class PsDataClient {
 public:
  // `peer` names the PS in errors ("ps:0 at host:port"); `host` is where it runs.
  PsDataClient(std::string peer, std::string host, DataPathEndpoint endpoint,
               PsDataClientOptions options = {});
  ~PsDataClient();

  // Applies `gradients` (one per name: whole, or a row gradient where `gradient_rows` has
  // the rows); with `pulled` the updated values of the variables with whole gradients come
  // back, then the rows `row_reads` names (read after the update).
  absl::Status Push(const std::vector<std::string>& names, const std::vector<Tensor>& gradients,
                    std::vector<Tensor>* pulled, DataCallOutcome* outcome = nullptr,
                    const std::vector<const std::vector<int64_t>*>& gradient_rows = {},
                    const std::vector<RowRead>& row_reads = {});
  // The values of `names`, then the rows `row_reads` names.
  absl::StatusOr<std::vector<Tensor>> Pull(const std::vector<std::string>& names,
                                           DataCallOutcome* outcome = nullptr,
                                           const std::vector<RowRead>& row_reads = {});
  // "shared memory", "tcp" or "tcp+tls": how the newest connection moves tensors ("" before any).
  std::string transport() const;

 private:
  struct Connection;
  class BufferPool;
  // `entries`: the request's (a push's gradients first, one per tensor of `gradients`, then
  // its reads); `expected`: how many values the answer carries.
  absl::Status Call(data_wire::Op op, std::vector<data_wire::TensorRef> entries,
                    const std::vector<Tensor>& gradients, bool pull_after, size_t expected,
                    std::vector<Tensor>* values, DataCallOutcome* outcome);
  absl::StatusOr<std::unique_ptr<Connection>> Connect(absl::Time deadline);
  absl::Status Exchange(Connection& connection, data_wire::Op op,
                        std::vector<data_wire::TensorRef> entries,
                        const std::vector<Tensor>& gradients, bool pull_after, size_t expected,
                        absl::Time deadline, std::vector<Tensor>* values, bool* answered);
  void Release(std::unique_ptr<Connection> connection);

  const std::string peer_;
  const std::string host_;
  const DataPathEndpoint endpoint_;
  const PsDataClientOptions options_;
  std::shared_ptr<BufferPool> buffers_;
  std::atomic<uint64_t> next_id_{1};
  mutable absl::Mutex mutex_;
  std::vector<std::unique_ptr<Connection>> idle_ ABSL_GUARDED_BY(mutex_);
  std::string transport_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace stratum
