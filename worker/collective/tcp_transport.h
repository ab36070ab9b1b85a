// The TCP transport: one direct socket between every pair of ranks (the data path of the
// collectives; gRPC carries only control). Ranks find each other through a Rendezvous:
// each listens on a port of its own host and publishes "host:port"; the lower rank of a
// pair connects, the higher accepts. A connection opens with a hello carrying the job's
// token (drawn by rank 0 and shared through the rendezvous) and the caller's rank, so a
// stray or foreign connection is refused instead of being taken for a peer.
//
// Ranks of one host skip TCP: each rank also listens on an abstract Unix socket under a
// random name, which it publishes beside its address only once bound (so no other process
// can hold that name first and collect the token from a hello). A connecting rank tries
// that name first and falls back to TCP when it does not answer: the peer is on another
// host or in another network namespace. Loopback TCP spends most of its time in the
// kernel's TCP/IP stack and softirqs; a Unix socket only copies, as NCCL's and MPI's
// intra-node transports avoid the network stack. Hello, framing, deadlines and error
// messages are the same on both links.
//
// With a TlsContext the TCP links speak the cluster's mutual TLS (the connecting rank is
// the client and checks the peer's certificate for the host of its address); Unix-socket
// links stay plaintext: they never leave the network namespace, and the token a hello
// must carry travels only through the rendezvous (the coordination service, itself on
// TLS in such a cluster).
//
// Sockets are non-blocking and every Exchange is one poll loop over the two sockets it
// uses, so a send and a receive progress together and the deadline bounds the whole call.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stratum/worker/collective/transport.h"

namespace stratum {

class TlsContext;

struct TcpTransportOptions {
  int rank = 0;
  int size = 1;
  // The host other ranks connect to (this task's host in TF_CONFIG). The port is picked
  // by the kernel. An IP literal is also the address bound; a name binds every interface.
  std::string host = "127.0.0.1";
  // Names of the ranks for messages ("worker:1"); empty: "rank N".
  std::vector<std::string> names;
  // Keys are "<key_prefix>/token" and "<key_prefix>/address/<rank>": a new prefix per
  // group keeps a restarted job from reading a dead one's addresses.
  std::string key_prefix = "collective/tcp";
  // How long to wait for every peer to publish its address and connect.
  absl::Duration connect_timeout = absl::Minutes(2);
  // Reach ranks of this host (same network namespace) over a Unix socket; false: TCP to
  // every rank (to compare the two, or where Unix sockets are not wanted).
  bool same_host_unix_sockets = true;
  // Called about every 200 ms while an Exchange waits; an error from it ends the wait
  // with that error. A job passes its coordination service's cluster error, so a peer
  // that stopped heartbeating (cut off by the network) or reported a failure stops the
  // collective in seconds rather than at its timeout.
  std::function<absl::Status()> abort_check = nullptr;
  // The cluster's mutual TLS for the TCP links; null: plaintext.
  std::shared_ptr<const TlsContext> tls;
};

// The kind of socket a transport uses to reach a peer.
enum class PeerLink { kTcp, kUnix };

// Connects rank `options.rank` to every other rank. DEADLINE_EXCEEDED naming the ranks that
// never connected; UNAVAILABLE naming an address that cannot be reached; UNAUTHENTICATED
// when a peer's TLS handshake fails.
absl::StatusOr<std::unique_ptr<Transport>> ConnectTcpTransport(const TcpTransportOptions& options,
                                                               Rendezvous& rendezvous);

// How `transport` (made by ConnectTcpTransport) reaches `rank`. INVALID_ARGUMENT for
// another kind of transport, for its own rank, or a rank out of range.
absl::StatusOr<PeerLink> TcpPeerLink(const Transport& transport, int rank);

}  // namespace stratum
