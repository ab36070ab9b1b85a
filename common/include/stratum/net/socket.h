// Stream sockets for Stratum's raw links: the parameter server's data path and the
// collectives' ring. One place for what both need: a descriptor that closes itself,
// connects and accepts with deadlines, TCP or Unix sockets in the abstract namespace, the
// options each kind of link wants, and blocking I/O that always has a deadline.
//
// Blocking I/O uses SO_RCVTIMEO/SO_SNDTIMEO and MSG_WAITALL, so a whole tensor moves in one
// system call (fewer wake-ups than a poll loop, which matters on a small VM). A caller that
// polls several sockets at once (the collectives) makes its sockets non-blocking after the
// hello, polls fd() for PollEvents() and moves bytes with SendSome/ReceiveSome. Errors say what
// happened (closed by the peer, deadline, errno) and leave naming the peer to the caller.
//
// A TCP socket can speak the cluster's mutual TLS (StartTls after connecting or accepting):
// every call below then encrypts and decrypts through OpenSSL, with the same deadlines,
// errors and non-blocking behaviour. Unix sockets stay plaintext: they never leave the
// host's network namespace.
//
// An abstract Unix socket needs no file and vanishes with its socket, but answers only
// inside the network namespace that bound it: a peer in another container (or on another
// host) gets NOT_FOUND, and the caller falls back to TCP.
//
// Thread safety: one thread uses a socket at a time, except Shutdown(), which any thread
// may call to make a blocked call return (a server stopping).
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stratum {

class TlsContext;

// Which end of a TLS handshake: the client checks the server's name, the server demands
// the client's certificate; each checks the other's comes from the cluster's CA.
enum class TlsRole { kClient, kServer };

class Socket {
 public:
  Socket();
  explicit Socket(int fd, bool is_unix);
  ~Socket();
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  bool is_unix() const { return is_unix_; }
  // Who is at the other end, for per-client limits: the peer's IP address, or "this host"
  // for a Unix socket ("unknown" when the socket cannot say).
  std::string PeerHost() const;

  // Runs a TLS handshake on this connected, blocking TCP socket by `deadline`; the calls
  // below then speak TLS. A client checks that the server's certificate is for
  // `peer_host` (an IP address or DNS name), or for the context's server_name when set.
  // UNAUTHENTICATED naming what failed (an unknown CA, a name mismatch, no certificate),
  // DEADLINE_EXCEEDED, UNAVAILABLE when the peer closed; the socket is then unusable.
  absl::Status StartTls(const TlsContext& context, TlsRole role, const std::string& peer_host,
                        absl::Time deadline);
  bool tls() const { return tls_ != nullptr; }

  // Sends every byte of `parts`. A Unix socket can pass `fd_to_pass` (>= 0) with them.
  // UNAVAILABLE when the peer closed, DEADLINE_EXCEEDED when `deadline` passed first.
  absl::Status Send(std::vector<iovec> parts, absl::Time deadline, int fd_to_pass = -1);
  // Receives exactly `size` bytes. On a Unix socket, file descriptors that came with them
  // are appended to `fds` (the caller owns them); elsewhere `fds` is ignored.
  // UNAVAILABLE when the peer closed (or Shutdown() was called), DEADLINE_EXCEEDED.
  absl::Status Receive(void* data, size_t size, absl::Time deadline,
                       std::vector<int>* fds = nullptr);
  // Reads and drops `size` bytes (a refused frame's rest), until `deadline`.
  absl::Status Discard(uint64_t size, absl::Time deadline);
  // An idle connection of a pool: false when the peer closed it (or sent something it
  // should not have), so it must not carry another request.
  bool IdleAndOpen() const;
  // Makes blocked and later calls fail at once; the fd stays open until destruction.
  void Shutdown();
  // For callers that poll: Send and Receive then fail with DEADLINE_EXCEEDED at once when
  // the socket is not ready.
  void SetNonBlocking();
  // Non-blocking partial I/O, for callers that poll several sockets (after SetNonBlocking):
  // moves what can move now and returns how many bytes, 0 when the socket is not ready
  // (then poll for PollEvents()). UNAVAILABLE when the peer closed or the connection broke.
  // After a 0 from SendSome, the next call must start with the same bytes (TLS may hold
  // part of a record).
  absl::StatusOr<size_t> SendSome(const iovec* parts, int count);
  absl::StatusOr<size_t> ReceiveSome(void* data, size_t size);
  // What poll() must wait for before the SendSome (sending) or ReceiveSome that returned 0
  // can progress: POLLOUT to send and POLLIN to receive, except where TLS needs the other.
  short PollEvents(bool sending) const { return sending ? send_wait_ : receive_wait_; }
  // Asks for `bytes` of send buffer (the kernel's net.core.wmem_max caps what is granted).
  void SetSendBuffer(int bytes);

 private:
  struct TlsSession;
  absl::Status SetTimeout(int option, absl::Time deadline);
  absl::Status TlsSend(const std::vector<iovec>& parts, absl::Time deadline);
  // Calls `call` (an SSL read or write of what is left after `done` bytes) until `size`
  // bytes have moved, within `deadline`; `what` names the direction in errors.
  absl::Status TlsTransfer(size_t size, absl::Time deadline, const char* what,
                           absl::FunctionRef<int(size_t done, size_t* moved)> call);
  absl::Status TlsWrite(const char* data, size_t size, absl::Time deadline);

  int fd_ = -1;
  bool is_unix_ = false;
  std::unique_ptr<TlsSession> tls_;
  short send_wait_ = POLLOUT;
  short receive_wait_ = POLLIN;
};

// How a TCP connection is set up, at both ends. TCP_NODELAY is always on.
struct TcpOptions {
  // Cut a peer whose host went silent (cut off by the network: no reset comes) in about
  // 8 s, by TCP_USER_TIMEOUT while what we sent stays unacknowledged and keepalive probes
  // while we wait for an answer. A busy but live peer's kernel keeps acknowledging, so only
  // a silent one is cut. Right for request/response links whose peers read promptly (the
  // data path); the collectives, where a slower worker may not read for long, have their
  // own timeout instead.
  bool cut_silent_peers = true;
};

// Connects to `host`:`port` (each address `host` resolves to in turn) by `deadline`.
absl::StatusOr<Socket> ConnectTcp(const std::string& host, int port, absl::Time deadline,
                                  TcpOptions options = {});
// Connects to the Unix socket in the abstract namespace named `name` (no leading NUL).
// NOT_FOUND when nothing listens under that name in this network namespace: the server
// is on another host (or in another container).
absl::StatusOr<Socket> ConnectUnix(const std::string& name, absl::Time deadline);

// Listens on `host`:`port` (port 0: any free one; *bound_port says which). `host` "", "::"
// or "[::]" is every interface, IPv6 and IPv4 (IPv4 alone where the kernel has no IPv6); an
// IP literal is that address; a name, the first address it resolves to.
absl::StatusOr<Socket> ListenTcp(const std::string& host, int port, int* bound_port,
                                 int backlog = 128);
// Listens on the abstract Unix socket `name` (no leading NUL). UNAVAILABLE naming "@name"
// when it cannot be bound (the name is taken).
absl::StatusOr<Socket> ListenUnix(const std::string& name, int backlog = 128);
// Waits for the next connection (on a blocking listener; a non-blocking one answers
// UNAVAILABLE when none is waiting), a blocking socket set up with `options` when TCP.
// UNAVAILABLE once the listener is shut down; RESOURCE_EXHAUSTED when the process is out
// of descriptors or memory (the listener is fine: back off and try again).
absl::StatusOr<Socket> Accept(const Socket& listener, TcpOptions options = {});

// Fills `address` with the abstract-namespace address of `name` (no leading NUL; cut to
// what sun_path holds) and returns the length to pass to bind() or connect().
socklen_t AbstractUnixAddress(const std::string& name, sockaddr_un* address);

}  // namespace stratum
