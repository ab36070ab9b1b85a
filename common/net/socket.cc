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

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "stratum/net/free_port.h"

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

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

Socket::Socket(Socket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), is_unix_(other.is_unix_) {}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    is_unix_ = other.is_unix_;
  }
  return *this;
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

absl::Status Socket::Receive(void* data, size_t size, absl::Time deadline, std::vector<int>* fds) {
  char* out = static_cast<char*>(data);
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
  pollfd entry{fd_, POLLIN | POLLRDHUP, 0};
  return poll(&entry, 1, 0) == 0;
}

void Socket::Shutdown() {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

void Socket::SetNonBlocking() {
  if (fd_ >= 0) fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
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
