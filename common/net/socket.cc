#include "stratum/net/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "stratum/net/free_port.h"
#include "stratum/net/tls.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

std::string ErrnoText(int error) { return std::strerror(error); }

absl::Status PastDeadline(const char* what) {
  return absl::DeadlineExceededError(absl::StrCat("deadline passed while ", what));
}

// Waits for a non-blocking connect to finish.
absl::Status FinishConnect(int fd, absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return PastDeadline("connecting");
    pollfd entry{fd, POLLOUT, 0};
    const int ready = poll(&entry, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return absl::UnavailableError(ErrnoText(errno));
    if (ready == 0) continue;
    int error = 0;
    socklen_t length = sizeof(error);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) return absl::UnavailableError(ErrnoText(error));
    return absl::OkStatus();
  }
}

// See TcpOptions. With cut_silent_peers a push to a host cut off by the network fails with
// "Connection timed out" within about 8 s, where it would wait out its whole deadline and
// TCP's own retransmissions take about 15 minutes.
void ConfigureTcpConnection(int fd, const TcpOptions& options) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (!options.cut_silent_peers) return;
  const int idle_s = 2, interval_s = 2, probes = 3, unacknowledged_ms = 8000;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacknowledged_ms, sizeof(unacknowledged_ms));
}

absl::StatusOr<Socket> ConnectTo(int family, const sockaddr* address, socklen_t length,
                                 absl::Time deadline, const TcpOptions& options) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  Socket socket(fd, family == AF_UNIX);
  if (connect(fd, address, length) != 0) {
    if (errno != EINPROGRESS) {
      const int error = errno;
      if (family == AF_UNIX && (error == ECONNREFUSED || error == ENOENT)) {
        return absl::NotFoundError(ErrnoText(error));
      }
      return absl::UnavailableError(ErrnoText(error));
    }
    if (absl::Status status = FinishConnect(fd, deadline); !status.ok()) return status;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (family != AF_UNIX) ConfigureTcpConnection(fd, options);
  return socket;
}

// What OpenSSL's reads and writes go through: send() with MSG_NOSIGNAL (a peer that closed
// must give an error, not a SIGPIPE that kills a process that did not ignore it) and
// recv(), remembering why the last one failed.
struct SocketIo {
  int fd = -1;
  bool eof = false;
  int last_errno = 0;
};

SocketIo& IoOf(BIO* bio) { return *static_cast<SocketIo*>(BIO_get_data(bio)); }

int BioWrite(BIO* bio, const char* data, size_t size, size_t* written) {
  SocketIo& io = IoOf(bio);
  BIO_clear_retry_flags(bio);
  for (;;) {
    const ssize_t sent = send(io.fd, data, size, MSG_NOSIGNAL);
    if (sent >= 0) {
      *written = static_cast<size_t>(sent);
      return 1;
    }
    if (errno == EINTR) continue;
    io.last_errno = errno;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(bio);
    return 0;
  }
}

int BioRead(BIO* bio, char* data, size_t size, size_t* read) {
  SocketIo& io = IoOf(bio);
  BIO_clear_retry_flags(bio);
  for (;;) {
    const ssize_t got = recv(io.fd, data, size, 0);
    if (got > 0) {
      *read = static_cast<size_t>(got);
      return 1;
    }
    if (got == 0) {
      io.eof = true;
      return 0;
    }
    if (errno == EINTR) continue;
    io.last_errno = errno;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(bio);
    return 0;
  }
}

long BioControl(BIO* bio, int command, long /*number*/, void* /*pointer*/) {
  if (command == BIO_CTRL_FLUSH) return 1;  // nothing is buffered here
  if (command == BIO_CTRL_EOF) return IoOf(bio).eof ? 1 : 0;
  return 0;
}

const BIO_METHOD* SocketBioMethod() {
  static const BIO_METHOD* const method = [] {
    BIO_METHOD* made = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "stratum socket");
    BIO_meth_set_write_ex(made, BioWrite);
    BIO_meth_set_read_ex(made, BioRead);
    BIO_meth_set_ctrl(made, BioControl);
    return made;
  }();
  return method;
}

// How an SSL call that returned `result` <= 0 ended.
enum class TlsOutcome { kWouldBlock, kClosed, kBroken, kFailed };

TlsOutcome Classify(SSL* ssl, const SocketIo& io, int result, short* wait) {
  switch (SSL_get_error(ssl, result)) {
    case SSL_ERROR_WANT_READ:
      *wait = POLLIN;
      return TlsOutcome::kWouldBlock;
    case SSL_ERROR_WANT_WRITE:
      *wait = POLLOUT;
      return TlsOutcome::kWouldBlock;
    case SSL_ERROR_ZERO_RETURN:
      return TlsOutcome::kClosed;
    case SSL_ERROR_SYSCALL:
      return io.eof || io.last_errno == 0 ? TlsOutcome::kClosed : TlsOutcome::kBroken;
    default:
      return TlsOutcome::kFailed;
  }
}

// The error of a TLS call that did not end in kWouldBlock. A session whose certificate the
// peer refused ends here too: in TLS 1.3 the server checks the client's certificate after
// the client's handshake has finished, so the client learns it at its first read.
absl::Status TlsError(TlsOutcome outcome, const SocketIo& io, const char* what) {
  switch (outcome) {
    case TlsOutcome::kClosed:
      return absl::UnavailableError(absl::StrCat("the connection was closed while ", what));
    case TlsOutcome::kBroken:
      return absl::UnavailableError(
          absl::StrCat("the connection broke while ", what, " (", ErrnoText(io.last_errno), ")"));
    default:
      return absl::UnauthenticatedError(
          absl::StrCat("TLS failed while ", what, " (", TakeOpenSslError("no reason given"),
                       "): do both ends hold certificates from the cluster's CA?"));
  }
}

bool IsIpLiteral(const std::string& host) {
  in6_addr parsed;
  return inet_pton(AF_INET, host.c_str(), &parsed) == 1 ||
         inet_pton(AF_INET6, host.c_str(), &parsed) == 1;
}

// Re-arms a blocking socket's timeouts now and then, not before every record: a tensor
// of megabytes is hundreds of TLS records, each its own SSL call.
class TimeoutArming {
 public:
  bool Due() const { return absl::Now() - armed_at_ > absl::Milliseconds(50); }
  void Armed() { armed_at_ = absl::Now(); }
  void Expire() { armed_at_ = absl::InfinitePast(); }

 private:
  absl::Time armed_at_ = absl::InfinitePast();
};
}  // namespace

struct Socket::TlsSession {
  SSL* ssl = nullptr;
  SocketIo io;  // the BIO's state; at a fixed address for as long as the session lives
  ~TlsSession() { SSL_free(ssl); }
};

Socket::Socket() = default;

Socket::Socket(int fd, bool is_unix) : fd_(fd), is_unix_(is_unix) {}

Socket::~Socket() {
  tls_.reset();
  if (fd_ >= 0) close(fd_);
}

Socket::Socket(Socket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      is_unix_(other.is_unix_),
      tls_(std::move(other.tls_)),
      send_wait_(other.send_wait_),
      receive_wait_(other.receive_wait_) {}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    tls_.reset();
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    is_unix_ = other.is_unix_;
    tls_ = std::move(other.tls_);
    send_wait_ = other.send_wait_;
    receive_wait_ = other.receive_wait_;
  }
  return *this;
}

absl::Status Socket::StartTls(const TlsContext& context, TlsRole role, const std::string& peer_host,
                              absl::Time deadline) {
  if (fd_ < 0 || is_unix_ || tls_ != nullptr) {
    return absl::FailedPreconditionError("TLS starts once, on a connected TCP socket");
  }
  ERR_clear_error();
  auto session = std::make_unique<TlsSession>();
  session->io.fd = fd_;
  session->ssl = SSL_new(context.native());
  BIO* bio = session->ssl != nullptr ? BIO_new(SocketBioMethod()) : nullptr;
  if (bio == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start a TLS session: ", TakeOpenSslError("out of memory")));
  }
  BIO_set_data(bio, &session->io);
  BIO_set_init(bio, 1);
  SSL_set_bio(session->ssl, bio, bio);
  std::string name = context.server_name().empty() ? peer_host : context.server_name();
  if (name.size() > 1 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  if (role == TlsRole::kClient) {
    SSL_set_connect_state(session->ssl);
    const int named = IsIpLiteral(name) ? X509_VERIFY_PARAM_set1_ip_asc(
                                              SSL_get0_param(session->ssl), name.c_str())
                                        : SSL_set1_host(session->ssl, name.c_str());
    if (named != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", name, "\" cannot be checked against a certificate"));
    }
  } else {
    SSL_set_accept_state(session->ssl);
  }
  for (;;) {
    if (!SetTimeout(SO_RCVTIMEO, deadline).ok() || !SetTimeout(SO_SNDTIMEO, deadline).ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat("the TLS handshake with ", peer_host, " did not finish by its deadline"));
    }
    const int result = SSL_do_handshake(session->ssl);
    if (result == 1) break;
    short wait = 0;
    const TlsOutcome outcome = Classify(session->ssl, session->io, result, &wait);
    if (outcome == TlsOutcome::kWouldBlock) continue;  // the timeout fired: checked above
    if (outcome != TlsOutcome::kFailed) {
      return absl::UnavailableError(absl::StrCat(
          "the peer closed the connection during the TLS handshake (",
          outcome == TlsOutcome::kBroken ? ErrnoText(session->io.last_errno) : "end of stream",
          "): does it speak TLS, and did it refuse our certificate? see its log"));
    }
    const long verified = SSL_get_verify_result(session->ssl);
    const std::string reason = TakeOpenSslError("no reason given");
    return absl::UnauthenticatedError(absl::StrCat(
        "the TLS handshake with ", peer_host, " failed (", reason,
        verified != X509_V_OK ? absl::StrCat(": ", X509_verify_cert_error_string(verified)) : "",
        "): both ends need a certificate from the cluster's CA (--tls_cert, --tls_key, "
        "--tls_ca), and a client checks the server's certificate for the host it dials, or "
        "for --tls_server_name when that is set"));
  }
  tls_ = std::move(session);
  return absl::OkStatus();
}

absl::Status Socket::SetTimeout(int option, absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) {
    const timeval none{0, 0};  // block for as long as it takes
    setsockopt(fd_, SOL_SOCKET, option, &none, sizeof(none));
    return absl::OkStatus();
  }
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return PastDeadline("waiting for the peer");
  const timeval timeout = absl::ToTimeval(std::max(left, absl::Milliseconds(1)));
  setsockopt(fd_, SOL_SOCKET, option, &timeout, sizeof(timeout));
  return absl::OkStatus();
}

absl::Status Socket::Send(std::vector<iovec> parts, absl::Time deadline, int fd_to_pass) {
  if (tls_ != nullptr) return TlsSend(parts, deadline);
  size_t next = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  while (next < parts.size()) {
    if (parts[next].iov_len == 0) {
      ++next;
      continue;
    }
    if (absl::Status status = SetTimeout(SO_SNDTIMEO, deadline); !status.ok()) return status;
    msghdr message{};
    message.msg_iov = &parts[next];
    message.msg_iovlen = std::min<size_t>(parts.size() - next, IOV_MAX);
    if (fd_to_pass >= 0 && is_unix_) {
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(header), &fd_to_pass, sizeof(int));
    }
    const ssize_t sent = sendmsg(fd_, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return PastDeadline("sending");
      return absl::UnavailableError(
          absl::StrCat("the connection broke while sending (", ErrnoText(errno), ")"));
    }
    fd_to_pass = -1;  // it went with the first byte
    size_t left = static_cast<size_t>(sent);
    while (next < parts.size() && left >= parts[next].iov_len) {
      left -= parts[next].iov_len;
      ++next;
    }
    if (left > 0) {
      parts[next].iov_base = static_cast<char*>(parts[next].iov_base) + left;
      parts[next].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status Socket::TlsTransfer(size_t size, absl::Time deadline, const char* what,
                                 absl::FunctionRef<int(size_t done, size_t* moved)> call) {
  TimeoutArming arming;
  size_t done = 0;
  while (done < size) {
    if (arming.Due()) {
      STRATUM_RETURN_IF_ERROR(SetTimeout(SO_SNDTIMEO, deadline));
      STRATUM_RETURN_IF_ERROR(SetTimeout(SO_RCVTIMEO, deadline));
      arming.Armed();
    }
    ERR_clear_error();
    size_t moved = 0;
    const int result = call(done, &moved);
    if (result == 1) {
      done += moved;
      continue;
    }
    short wait = 0;
    const TlsOutcome outcome = Classify(tls_->ssl, tls_->io, result, &wait);
    if (outcome == TlsOutcome::kClosed) {
      return absl::UnavailableError(absl::StrCat("the connection was closed while ", what, " with ",
                                                 size - done, " bytes still to come"));
    }
    if (outcome != TlsOutcome::kWouldBlock) return TlsError(outcome, tls_->io, what);
    arming.Expire();  // a timeout fired: the next arming says whether the deadline passed
  }
  return absl::OkStatus();
}

absl::Status Socket::TlsWrite(const char* data, size_t size, absl::Time deadline) {
  return TlsTransfer(size, deadline, "sending", [&](size_t done, size_t* moved) {
    return SSL_write_ex(tls_->ssl, data + done, size - done, moved);
  });
}

// Small parts (a frame's header, its metadata) go out in one record with their neighbours
// rather than one record and one system call each.
absl::Status Socket::TlsSend(const std::vector<iovec>& parts, absl::Time deadline) {
  constexpr size_t kSmall = 4096, kRecord = 16384;
  std::string staged;
  for (const iovec& part : parts) {
    const char* data = static_cast<const char*>(part.iov_base);
    if (part.iov_len <= kSmall && staged.size() + part.iov_len <= kRecord) {
      staged.append(data, part.iov_len);
      continue;
    }
    if (!staged.empty()) {
      STRATUM_RETURN_IF_ERROR(TlsWrite(staged.data(), staged.size(), deadline));
      staged.clear();
    }
    if (part.iov_len <= kSmall) {
      staged.append(data, part.iov_len);
    } else {
      STRATUM_RETURN_IF_ERROR(TlsWrite(data, part.iov_len, deadline));
    }
  }
  if (staged.empty()) return absl::OkStatus();
  return TlsWrite(staged.data(), staged.size(), deadline);
}

absl::Status Socket::Receive(void* data, size_t size, absl::Time deadline, std::vector<int>* fds) {
  char* out = static_cast<char*>(data);
  if (tls_ != nullptr) {
    return TlsTransfer(size, deadline, "receiving", [&](size_t done, size_t* moved) {
      return SSL_read_ex(tls_->ssl, out + done, size - done, moved);
    });
  }
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  while (size > 0) {
    if (absl::Status status = SetTimeout(SO_RCVTIMEO, deadline); !status.ok()) return status;
    iovec part{out, size};
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    if (is_unix_) {
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
    }
    const ssize_t got = recvmsg(fd_, &message, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return PastDeadline("receiving");
      return absl::UnavailableError(
          absl::StrCat("the connection broke while receiving (", ErrnoText(errno), ")"));
    }
    if (is_unix_ && message.msg_controllen > 0) {
      for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
           header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int fd = -1;
          std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof(int));
          if (fds != nullptr) {
            fds->push_back(fd);
          } else {
            close(fd);
          }
        }
      }
    }
    if (got == 0) {
      return absl::UnavailableError(
          absl::StrCat("the connection was closed with ", size, " bytes still to come"));
    }
    out += got;
    size -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status Socket::Discard(uint64_t size, absl::Time deadline) {
  std::vector<char> sink(std::min<uint64_t>(size, 1 << 20));
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, sink.size()));
    if (absl::Status status = Receive(sink.data(), chunk, deadline); !status.ok()) return status;
    size -= chunk;
  }
  return absl::OkStatus();
}

bool Socket::IdleAndOpen() const {
  if (fd_ < 0) return false;
  if (tls_ != nullptr && SSL_pending(tls_->ssl) > 0) return false;
  pollfd entry{fd_, POLLIN | POLLRDHUP, 0};
  return poll(&entry, 1, 0) == 0;
}

void Socket::Shutdown() {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

void Socket::SetNonBlocking() {
  if (fd_ >= 0) fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

absl::StatusOr<size_t> Socket::SendSome(const iovec* parts, int count) {
  if (tls_ == nullptr) {
    msghdr message{};
    message.msg_iov = const_cast<iovec*>(parts);
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t sent = sendmsg(fd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent >= 0) return static_cast<size_t>(sent);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return absl::UnavailableError(ErrnoText(errno));
  }
  // One part a call: a retry after 0 then starts with the same bytes, as TLS needs.
  int first = 0;
  while (first < count && parts[first].iov_len == 0) ++first;
  if (first == count) return 0;
  ERR_clear_error();
  size_t written = 0;
  const int result = SSL_write_ex(tls_->ssl, parts[first].iov_base, parts[first].iov_len, &written);
  if (result == 1) return written;
  const TlsOutcome outcome = Classify(tls_->ssl, tls_->io, result, &send_wait_);
  if (outcome == TlsOutcome::kWouldBlock) return 0;
  return TlsError(outcome, tls_->io, "sending");
}

absl::StatusOr<size_t> Socket::ReceiveSome(void* data, size_t size) {
  if (tls_ == nullptr) {
    const ssize_t got = ::recv(fd_, data, size, MSG_DONTWAIT);
    if (got > 0) return static_cast<size_t>(got);
    if (got == 0) return absl::UnavailableError("end of stream");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return absl::UnavailableError(ErrnoText(errno));
  }
  ERR_clear_error();
  size_t got = 0;
  const int result = SSL_read_ex(tls_->ssl, data, size, &got);
  if (result == 1) return got;
  const TlsOutcome outcome = Classify(tls_->ssl, tls_->io, result, &receive_wait_);
  if (outcome == TlsOutcome::kWouldBlock) return 0;
  if (outcome == TlsOutcome::kClosed) return absl::UnavailableError("end of stream");
  return TlsError(outcome, tls_->io, "receiving");
}

void Socket::SetSendBuffer(int bytes) {
  if (fd_ >= 0) setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

absl::StatusOr<Socket> ConnectTcp(const std::string& host, int port, absl::Time deadline,
                                  TcpOptions options) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int error = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve \"", host, "\": ", gai_strerror(error)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("\"", host, "\" has no address"));
  for (addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    absl::StatusOr<Socket> socket =
        ConnectTo(entry->ai_family, entry->ai_addr, entry->ai_addrlen, deadline, options);
    if (socket.ok()) {
      freeaddrinfo(found);
      return socket;
    }
    last = socket.status();
  }
  freeaddrinfo(found);
  return last;
}

absl::StatusOr<Socket> ConnectUnix(const std::string& name, absl::Time deadline) {
  sockaddr_un address;
  const socklen_t length = AbstractUnixAddress(name, &address);
  return ConnectTo(AF_UNIX, reinterpret_cast<const sockaddr*>(&address), length, deadline, {});
}

absl::StatusOr<Socket> ListenTcp(const std::string& host, int port, int* bound_port, int backlog) {
  std::string literal = host;
  if (literal.size() > 1 && literal.front() == '[' && literal.back() == ']') {
    literal = literal.substr(1, literal.size() - 2);
  }
  sockaddr_storage address{};
  socklen_t length = 0;
  auto* ipv4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* ipv6 = reinterpret_cast<sockaddr_in6*>(&address);
  const bool any = literal.empty() || literal == "::";
  if (any) {
    ipv6->sin6_family = AF_INET6;
    ipv6->sin6_addr = in6addr_any;
    length = sizeof(sockaddr_in6);
  } else if (inet_pton(AF_INET, literal.c_str(), &ipv4->sin_addr) == 1) {
    ipv4->sin_family = AF_INET;
    length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, literal.c_str(), &ipv6->sin6_addr) == 1) {
    ipv6->sin6_family = AF_INET6;
    length = sizeof(sockaddr_in6);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    if (const int error = getaddrinfo(literal.c_str(), nullptr, &hints, &found); error != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve \"", host, "\" to listen on: ", gai_strerror(error)));
    }
    std::memcpy(&address, found->ai_addr, found->ai_addrlen);
    length = found->ai_addrlen;
    freeaddrinfo(found);
  }
  if (address.ss_family == AF_INET) {
    ipv4->sin_port = htons(static_cast<uint16_t>(port));
  } else {
    ipv6->sin6_port = htons(static_cast<uint16_t>(port));
  }
  int fd = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 && any && errno == EAFNOSUPPORT) {  // a kernel without IPv6
    address = {};
    ipv4->sin_family = AF_INET;
    ipv4->sin_addr.s_addr = htonl(INADDR_ANY);
    ipv4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  }
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  Socket listener(fd, false);
  const int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (any && address.ss_family == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(fd, backlog) != 0) {
    const int error = errno;
    return absl::Status(ListenErrorCode(error),
                        absl::StrCat("cannot listen on ", host,
                                     port == 0 ? " (any free port)" : absl::StrCat(":", port), ": ",
                                     ErrnoText(error)));
  }
  length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  *bound_port = ntohs(address.ss_family == AF_INET6 ? ipv6->sin6_port : ipv4->sin_port);
  return listener;
}

absl::StatusOr<Socket> ListenUnix(const std::string& name, int backlog) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  Socket listener(fd, true);
  sockaddr_un address;
  const socklen_t length = AbstractUnixAddress(name, &address);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      listen(fd, backlog) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on the Unix socket @", name, ": ", ErrnoText(errno)));
  }
  return listener;
}

socklen_t AbstractUnixAddress(const std::string& name, sockaddr_un* address) {
  std::memset(address, 0, sizeof(*address));
  address->sun_family = AF_UNIX;
  const size_t length = std::min(name.size(), sizeof(address->sun_path) - 1);
  std::memcpy(address->sun_path + 1, name.data(), length);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length);
}

std::string Socket::PeerHost() const {
  if (is_unix_) return "this host";
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "unknown";
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof(host), nullptr,
                  0, NI_NUMERICHOST) != 0) {
    return "unknown";
  }
  return host;
}

absl::StatusOr<Socket> Accept(const Socket& listener, TcpOptions options) {
  for (;;) {
    const int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      if (!listener.is_unix()) ConfigureTcpConnection(fd, options);
      return Socket(fd, listener.is_unix());
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    // Out of descriptors or memory: the listener is fine, and connections that end free
    // what a later accept needs (the caller backs off and tries again).
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      return absl::ResourceExhaustedError(absl::StrCat("accept: ", ErrnoText(errno)));
    }
    return absl::UnavailableError(absl::StrCat("accept: ", ErrnoText(errno)));
  }
}

}  // namespace stratum
