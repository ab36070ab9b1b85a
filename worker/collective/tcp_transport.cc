#include "tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "stratum/net/host_port.h"
#include "stratum/net/socket.h"
#include "stratum/net/tls.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

constexpr uint32_t kHelloMagic = 0x53545254;    // "STRT"
constexpr uint32_t kMessageMagic = 0x4D534754;  // "MSGT"

struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint64_t token;
};

// Every message starts with this, so a receiver can check the length it expects.
struct Frame {
  uint32_t magic;
  uint32_t reserved;
  uint64_t bytes;
};

int MillisecondsUntil(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000 * 1000));
}

// A Unix stream socket holds at most its sender's SO_SNDBUF in flight; the default (about
// 200 KiB) makes a ring step of megabytes wake each side every few hundred KiB. 1 MiB
// measured 1.25x the default's bus bandwidth at 4 ranks on a 2-core VM, and no more from
// 2 or 4 MiB (net.core.wmem_max caps what is granted, so this is a request).
constexpr int kUnixSocketBuffer = 1 << 20;

absl::StatusOr<std::pair<std::string, int>> HostAndPort(const std::string& address) {
  const HostPort split = SplitHostPort(address);
  int port = 0;
  if (!absl::SimpleAtoi(split.port, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", address, "\" is not host:port"));
  }
  return std::make_pair(split.host, port);
}

// Listens on `host`: an IPv4 or IPv6 literal binds that address; a name binds every
// interface, IPv6 and IPv4 both (IPv4 alone where the kernel has no IPv6).
absl::StatusOr<std::pair<Socket, int>> Listen(const std::string& host) {
  std::string literal = host;
  if (literal.size() > 1 && literal.front() == '[' && literal.back() == ']') {
    literal = literal.substr(1, literal.size() - 2);
  }
  in6_addr parsed;
  const bool ip = inet_pton(AF_INET, literal.c_str(), &parsed) == 1 ||
                  inet_pton(AF_INET6, literal.c_str(), &parsed) == 1;
  int port = 0;
  absl::StatusOr<Socket> listener = ListenTcp(ip ? literal : "::", 0, &port);
  if (!listener.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot listen for collective connections on ", host,
                                               ": ", listener.status().message()));
  }
  listener->SetNonBlocking();
  return std::make_pair(*std::move(listener), port);
}

// Collective links have their own timeout: a slower worker may not read for long.
constexpr TcpOptions kCollectiveTcp{.cut_silent_peers = false};

// Connects to `address`, retrying while nothing listens yet, until `deadline`.
absl::StatusOr<Socket> Connect(const std::string& address, absl::Time deadline) {
  STRATUM_ASSIGN_OR_RETURN(auto host_port, HostAndPort(address));
  while (true) {
    // One try at most 5 s, so that a peer that comes up later is tried again.
    absl::StatusOr<Socket> connection =
        ConnectTcp(host_port.first, host_port.second,
                   std::min(deadline, absl::Now() + absl::Seconds(5)), kCollectiveTcp);
    if (connection.ok()) return connection;
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", address, ": ", connection.status().message()));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

class TcpTransport : public Transport {
 public:
  TcpTransport(int rank, std::vector<Socket> peers, std::vector<PeerLink> links,
               std::vector<std::string> names, std::function<absl::Status()> abort_check)
      : rank_(rank),
        peers_(std::move(peers)),
        links_(std::move(links)),
        names_(std::move(names)),
        abort_check_(std::move(abort_check)) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  std::string PeerName(int rank) const override { return names_[static_cast<size_t>(rank)]; }

  absl::Status Exchange(const SendSpan& send, const RecvSpan& recv, absl::Time deadline) override;

  absl::StatusOr<PeerLink> Link(int peer) const {
    STRATUM_RETURN_IF_ERROR(CheckPeer(peer));
    return links_[static_cast<size_t>(peer)];
  }

 private:
  absl::Status CheckPeer(int peer) const {
    if (peer >= 0 && peer < size() && peer != rank_) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, " cannot exchange with rank ", peer, " of ", size()));
  }

  int rank_;
  std::vector<Socket> peers_;  // peers_[rank_] is unused
  std::vector<PeerLink> links_;
  std::vector<std::string> names_;
  std::function<absl::Status()> abort_check_;
};

constexpr int kAbortCheckMs = 200;

absl::Status TcpTransport::Exchange(const SendSpan& send, const RecvSpan& recv,
                                    absl::Time deadline) {
  const bool sending = send.peer >= 0;
  const bool receiving = recv.peer >= 0;
  if (sending) STRATUM_RETURN_IF_ERROR(CheckPeer(send.peer));
  if (receiving) STRATUM_RETURN_IF_ERROR(CheckPeer(recv.peer));
  if (receiving && recv.window > 0 && (recv.window % 4 != 0 || !recv.on_received)) {
    return absl::InvalidArgumentError(absl::StrCat("a receive window of ", recv.window,
                                                   " bytes needs on_received and a multiple of 4"));
  }
  Socket* const send_socket = sending ? &peers_[static_cast<size_t>(send.peer)] : nullptr;
  Socket* const recv_socket = receiving ? &peers_[static_cast<size_t>(recv.peer)] : nullptr;

  const Frame out_frame{kMessageMagic, 0, send.bytes};
  size_t sent = 0;  // of header + payload
  const size_t send_total = sending ? sizeof(Frame) + send.bytes : 0;
  Frame in_frame{};
  size_t received = 0;  // of header + payload
  const size_t recv_total = receiving ? sizeof(Frame) + recv.bytes : 0;

  auto closed = [&](int peer, const absl::Status& why) {
    if (absl::IsUnauthenticated(why)) {  // TLS refused what came: not a peer that went away
      return absl::UnauthenticatedError(
          absl::StrCat("the link to ", PeerName(peer), " failed: ", why.message()));
    }
    return absl::UnavailableError(absl::StrCat(PeerName(peer), " closed the connection (",
                                               why.message(),
                                               "): it exited or crashed; see its log"));
  };

  while (sent < send_total || received < recv_total) {
    bool progress = false;
    if (sent < send_total) {
      iovec parts[2];
      int count = 0;
      if (sent < sizeof(Frame)) {
        parts[count++] = {const_cast<char*>(reinterpret_cast<const char*>(&out_frame)) + sent,
                          sizeof(Frame) - sent};
        if (send.bytes > 0) parts[count++] = {const_cast<void*>(send.data), send.bytes};
      } else {
        parts[count++] = {
            const_cast<char*>(static_cast<const char*>(send.data)) + (sent - sizeof(Frame)),
            send_total - sent};
      }
      absl::StatusOr<size_t> n = send_socket->SendSome(parts, count);
      if (!n.ok()) return closed(send.peer, n.status());
      sent += *n;
      progress |= *n > 0;
    }
    if (received < recv_total) {
      absl::StatusOr<size_t> n;
      if (received < sizeof(Frame)) {
        n = recv_socket->ReceiveSome(reinterpret_cast<char*>(&in_frame) + received,
                                     sizeof(Frame) - received);
      } else {
        // Through a window, a call stops at the ring's end so the next starts at its front.
        const size_t payload = received - sizeof(Frame);
        const size_t at = recv.window > 0 ? payload % recv.window : payload;
        const size_t room = recv.window > 0 ? recv.window - at : recv.bytes - payload;
        n = recv_socket->ReceiveSome(static_cast<char*>(recv.data) + at,
                                     std::min(room, recv_total - received));
      }
      if (!n.ok()) return closed(recv.peer, n.status());
      if (*n > 0) {
        const bool had_header = received >= sizeof(Frame);
        received += *n;
        progress = true;
        if (!had_header && received >= sizeof(Frame)) {
          if (in_frame.magic != kMessageMagic) {
            return absl::DataLossError(
                absl::StrCat(PeerName(recv.peer),
                             " sent a message without Stratum's frame: the stream is "
                             "out of step; restart the job"));
          }
          if (in_frame.bytes != recv.bytes) {
            return absl::DataLossError(absl::StrCat(
                PeerName(recv.peer), " sent ", in_frame.bytes, " bytes where ", recv.bytes,
                " were expected: the workers reduce different tensors (do they run the same "
                "model and job?)"));
          }
        }
        if (received > sizeof(Frame) && recv.on_received) {
          recv.on_received(received - sizeof(Frame));
        } else if (received == recv_total && recv.bytes == 0 && recv.on_received) {
          recv.on_received(0);
        }
      }
    }
    if (progress) continue;

    pollfd fds[2];
    nfds_t count = 0;
    if (sent < send_total) fds[count++] = {send_socket->fd(), send_socket->PollEvents(true), 0};
    if (received < recv_total) {
      if (count == 1 && send_socket == recv_socket) {
        fds[0].events |= recv_socket->PollEvents(false);
      } else {
        fds[count++] = {recv_socket->fd(), recv_socket->PollEvents(false), 0};
      }
    }
    const int wait_ms = MillisecondsUntil(deadline);
    const int ready = poll(fds, count, abort_check_ ? std::min(wait_ms, kAbortCheckMs) : wait_ms);
    const bool waiting_to_receive = received < recv_total;
    const int peer = waiting_to_receive ? recv.peer : send.peer;
    if (ready == 0 && abort_check_) {
      if (absl::Status abort = abort_check_(); !abort.ok()) {
        return absl::Status(abort.code(), absl::StrCat("stopped waiting for ", PeerName(peer), ": ",
                                                       abort.message()));
      }
    }
    if (ready == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out waiting for ", PeerName(peer),
          waiting_to_receive
              ? absl::StrCat(" to send (", received, " of ", recv_total, " bytes arrived)")
              : absl::StrCat(" to take our data (", sent, " of ", send_total, " bytes sent)"),
          ": it is stuck, too slow, or not taking part in this collective; check its log, or "
          "raise the communication timeout"));
    }
  }
  return absl::OkStatus();
}

uint64_t RandomToken() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// Accepts connections on the TCP listener and (when >= 0) the Unix one until every rank
// below `rank` has said hello with the token; `links` records which listener each came by.
absl::Status AcceptLowerRanks(const TcpTransportOptions& options, const Socket& tcp_listener,
                              const Socket& unix_listener, uint64_t token,
                              std::vector<Socket>& peers, std::vector<PeerLink>& links,
                              absl::Time deadline) {
  int missing = options.rank;
  while (missing > 0) {
    pollfd fds[2] = {{tcp_listener.fd(), POLLIN, 0}, {unix_listener.fd(), POLLIN, 0}};
    const nfds_t count = unix_listener.valid() ? 2 : 1;
    const int wait_ms = MillisecondsUntil(deadline);
    const int ready =
        poll(fds, count, options.abort_check ? std::min(wait_ms, kAbortCheckMs) : wait_ms);
    auto absent = [&] {
      std::vector<std::string> names;
      for (int r = 0; r < options.rank; ++r) {
        if (!peers[static_cast<size_t>(r)].valid()) names.push_back(options.names[r]);
      }
      return absl::StrJoin(names, ", ");
    };
    if (ready == 0 && options.abort_check) {
      if (absl::Status abort = options.abort_check(); !abort.ok()) {
        return absl::Status(abort.code(),
                            absl::StrCat("stopped waiting for ", absent(),
                                         " to connect for collectives: ", abort.message()));
      }
    }
    if (ready == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out after ", absl::FormatDuration(options.connect_timeout), " waiting for ",
          absent(), " to connect for collectives: is it running, and can it reach this host?"));
    }
    for (nfds_t i = 0; i < count; ++i) {
      if ((fds[i].revents & POLLIN) == 0) continue;
      absl::StatusOr<Socket> connection =
          Accept(i == 0 ? tcp_listener : unix_listener, kCollectiveTcp);
      if (!connection.ok()) continue;
      const absl::Time hello_deadline = std::min(deadline, absl::Now() + absl::Seconds(5));
      if (i == 0 && options.tls != nullptr) {
        if (absl::Status secured = connection->StartTls(*options.tls, TlsRole::kServer,
                                                        connection->PeerHost(), hello_deadline);
            !secured.ok()) {
          spdlog::warn("refused a collective connection from {}: {}", connection->PeerHost(),
                       std::string(secured.message()));
          continue;
        }
      }
      Hello hello{};
      if (!connection->Receive(&hello, sizeof(hello), hello_deadline).ok()) continue;
      // A stranger (wrong magic or token, a rank we do not expect) is dropped.
      if (hello.magic != kHelloMagic || hello.token != token ||
          hello.rank >= static_cast<uint32_t>(options.rank) || peers[hello.rank].valid()) {
        continue;
      }
      peers[hello.rank] = *std::move(connection);
      links[hello.rank] = i == 0 ? PeerLink::kTcp : PeerLink::kUnix;
      --missing;
    }
  }
  return absl::OkStatus();
}

// Connects to a peer over its Unix socket `unix_name` when not empty and answering, else
// over TCP to `tcp_address` (retrying until `deadline`), with TLS when `tls` is set.
absl::StatusOr<std::pair<Socket, PeerLink>> ConnectPeer(const std::string& tcp_address,
                                                        const std::string& unix_name,
                                                        const TlsContext* tls,
                                                        absl::Time deadline) {
  if (!unix_name.empty()) {
    absl::StatusOr<Socket> connection = ConnectUnix(unix_name, deadline);
    if (connection.ok()) return std::make_pair(*std::move(connection), PeerLink::kUnix);
  }
  STRATUM_ASSIGN_OR_RETURN(Socket connection, Connect(tcp_address, deadline));
  if (tls != nullptr) {
    STRATUM_RETURN_IF_ERROR(
        connection.StartTls(*tls, TlsRole::kClient, SplitHostPort(tcp_address).host, deadline));
  }
  return std::make_pair(std::move(connection), PeerLink::kTcp);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> ConnectTcpTransport(const TcpTransportOptions& options,
                                                               Rendezvous& rendezvous) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in a group of ", options.size));
  }
  TcpTransportOptions named = options;
  if (named.names.size() != static_cast<size_t>(options.size)) {
    named.names.clear();
    for (int r = 0; r < options.size; ++r) named.names.push_back(absl::StrCat("rank ", r));
  }
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  STRATUM_ASSIGN_OR_RETURN(auto listening, Listen(options.host));
  Socket listener = std::move(listening.first);
  const std::string address = JoinHostPort(options.host, absl::StrCat(listening.second));
  // Published as "" when off or when the name cannot be bound: peers then use TCP.
  Socket unix_listener;
  std::string unix_name;
  if (options.same_host_unix_sockets) {
    const std::string name = absl::StrCat("stratum-collective-", getpid(), "-", listening.second,
                                          "-", absl::Hex(RandomToken()));
    absl::StatusOr<Socket> bound = ListenUnix(name);
    if (bound.ok()) {
      unix_listener = *std::move(bound);
      unix_listener.SetNonBlocking();
      unix_name = name;
    }
  }

  const std::string token_key = absl::StrCat(options.key_prefix, "/token");
  uint64_t token = 0;
  if (options.rank == 0) {
    token = RandomToken();
    STRATUM_RETURN_IF_ERROR(rendezvous.Set(token_key, std::to_string(token)));
  } else {
    STRATUM_ASSIGN_OR_RETURN(std::string text, rendezvous.Get(token_key, options.connect_timeout));
    if (!absl::SimpleAtoi(text, &token)) {
      return absl::DataLossError(absl::StrCat("the collective token \"", text, "\" is corrupt"));
    }
  }
  // The Unix name goes first: a peer that reads the address finds it without waiting.
  STRATUM_RETURN_IF_ERROR(
      rendezvous.Set(absl::StrCat(options.key_prefix, "/unix/", options.rank), unix_name));
  STRATUM_RETURN_IF_ERROR(
      rendezvous.Set(absl::StrCat(options.key_prefix, "/address/", options.rank), address));

  std::vector<Socket> peers(static_cast<size_t>(options.size));
  std::vector<PeerLink> links(static_cast<size_t>(options.size), PeerLink::kTcp);
  // Connect to every higher rank first: connections complete in the peers' listen
  // backlogs, so no rank waits for another to accept.
  for (int peer = options.rank + 1; peer < options.size; ++peer) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::StatusOr<std::string> peer_address =
        rendezvous.Get(absl::StrCat(options.key_prefix, "/address/", peer), left);
    if (!peer_address.ok()) {
      return RendezvousWaitError(named.names[peer], "collective address", peer_address.status(),
                                 deadline - options.connect_timeout, deadline);
    }
    std::string peer_unix_name;
    if (options.same_host_unix_sockets) {
      peer_unix_name =
          rendezvous.Get(absl::StrCat(options.key_prefix, "/unix/", peer), absl::ZeroDuration())
              .value_or("");
    }
    absl::StatusOr<std::pair<Socket, PeerLink>> connection =
        ConnectPeer(*peer_address, peer_unix_name, options.tls.get(), deadline);
    if (!connection.ok()) {
      return absl::Status(
          connection.status().code() == absl::StatusCode::kUnauthenticated
              ? absl::StatusCode::kUnauthenticated
              : absl::StatusCode::kUnavailable,
          absl::StrCat("cannot reach ", named.names[peer], ": ", connection.status().message()));
    }
    Hello hello{kHelloMagic, static_cast<uint32_t>(options.rank), token};
    if (absl::Status said = connection->first.Send({{&hello, sizeof(hello)}}, deadline);
        !said.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot greet ", named.names[peer], " at ",
                                                 *peer_address, ": ", said.message()));
    }
    peers[static_cast<size_t>(peer)] = std::move(connection->first);
    links[static_cast<size_t>(peer)] = connection->second;
  }
  STRATUM_RETURN_IF_ERROR(
      AcceptLowerRanks(named, listener, unix_listener, token, peers, links, deadline));
  // Errors name a peer by task and address: "worker:1 at 10.0.0.7:41234".
  std::vector<std::string> names;
  for (int r = 0; r < options.size; ++r) {
    std::string name = named.names[static_cast<size_t>(r)];
    if (r != options.rank) {
      // Every exchange polls both of its sockets: no call may block on one.
      Socket& peer = peers[static_cast<size_t>(r)];
      peer.SetNonBlocking();
      if (links[static_cast<size_t>(r)] == PeerLink::kUnix) peer.SetSendBuffer(kUnixSocketBuffer);
      absl::StatusOr<std::string> at =
          rendezvous.Get(absl::StrCat(options.key_prefix, "/address/", r), absl::ZeroDuration());
      if (at.ok()) absl::StrAppend(&name, " at ", *at);
    }
    names.push_back(std::move(name));
  }
  return std::unique_ptr<Transport>(new TcpTransport(
      options.rank, std::move(peers), std::move(links), std::move(names), options.abort_check));
}

absl::StatusOr<PeerLink> TcpPeerLink(const Transport& transport, int rank) {
  const auto* tcp = dynamic_cast<const TcpTransport*>(&transport);
  if (tcp == nullptr) {
    return absl::InvalidArgumentError("the transport was not made by ConnectTcpTransport");
  }
  return tcp->Link(rank);
}

}  // namespace stratum
