#include "data_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "stratum/net/free_port.h"
#include "stratum/net/unix_socket.h"

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

// Every TCP connection of the data path, both ends. A peer whose host is cut off by the
// network sends no reset: without these, a push waits out its whole deadline (30 s) and
// TCP's own retransmissions take about 15 minutes. With them the call fails with
// "Connection timed out" within about 8 s: TCP_USER_TIMEOUT when what we sent stays
// unacknowledged, keepalive probes when we wait for an answer. A busy but live peer's
// kernel keeps acknowledging, so only a silent one is cut. (The data path's peers read
// promptly, so its windows do not stay closed for seconds; the collectives, where a
// slower worker may not read for long, have their own timeout instead.)
void ConfigureTcpConnection(int fd) {
  const int one = 1, idle_s = 2, interval_s = 2, probes = 3, unacknowledged_ms = 8000;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacknowledged_ms, sizeof(unacknowledged_ms));
}

absl::StatusOr<DataSocket> ConnectTo(int family, const sockaddr* address, socklen_t length,
                                     absl::Time deadline) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  DataSocket socket(fd, family == AF_UNIX);
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
  if (family != AF_UNIX) ConfigureTcpConnection(fd);
  return socket;
}

}  // namespace

DataSocket::~DataSocket() {
  if (fd_ >= 0) close(fd_);
}

DataSocket::DataSocket(DataSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), is_unix_(other.is_unix_) {}

DataSocket& DataSocket::operator=(DataSocket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    is_unix_ = other.is_unix_;
  }
  return *this;
}

absl::Status DataSocket::SetTimeout(int option, absl::Time deadline) {
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

absl::Status DataSocket::Send(std::vector<iovec> parts, absl::Time deadline, int fd_to_pass) {
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

absl::Status DataSocket::Receive(void* data, size_t size, absl::Time deadline,
                                 std::vector<int>* fds) {
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

absl::Status DataSocket::Discard(uint64_t size, absl::Time deadline) {
  std::vector<char> sink(std::min<uint64_t>(size, 1 << 20));
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, sink.size()));
    if (absl::Status status = Receive(sink.data(), chunk, deadline); !status.ok()) return status;
    size -= chunk;
  }
  return absl::OkStatus();
}

bool DataSocket::IdleAndOpen() const {
  if (fd_ < 0) return false;
  pollfd entry{fd_, POLLIN | POLLRDHUP, 0};
  return poll(&entry, 1, 0) == 0;
}

void DataSocket::Shutdown() {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

void AlignedBuffer::Reserve(size_t bytes, size_t keep) {
  if (bytes <= capacity_) return;
  const size_t capacity = std::max(bytes, capacity_ + capacity_ / 2) / 64 * 64 + 64;
  void* memory = std::aligned_alloc(64, capacity);
  if (memory == nullptr) throw std::bad_alloc();
  std::shared_ptr<void> grown(memory, [](void* p) { std::free(p); });
  if (keep > 0) std::memcpy(grown.get(), memory_.get(), std::min(keep, capacity_));
  memory_ = std::move(grown);
  capacity_ = capacity;
}

void AlignedBuffer::Release() {
  memory_.reset();
  capacity_ = 0;
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Create(size_t size) {
  std::shared_ptr<SharedSegment> segment(new SharedSegment());
  segment->fd_ = memfd_create("stratum-ps-data", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (segment->fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("memfd_create: ", ErrnoText(errno)));
  }
  if (ftruncate(segment->fd_, static_cast<off_t>(size)) != 0 ||
      fcntl(segment->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot size a shared segment of ", size, " bytes: ", ErrnoText(errno)));
  }
  void* data =
      mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, segment->fd_, 0);
  if (data == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("cannot map a shared segment of ", size, " bytes: ", ErrnoText(errno)));
  }
  segment->data_ = static_cast<char*>(data);
  segment->size_ = size;
  return segment;
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Map(int fd, size_t max_size) {
  std::shared_ptr<SharedSegment> segment(new SharedSegment());
  segment->fd_ = fd;
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return absl::InvalidArgumentError(
        "the shared segment passed is not a memfd sealed against shrinking and growing");
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || info.st_size <= 0) {
    return absl::InvalidArgumentError("the shared segment passed is empty");
  }
  const size_t size = static_cast<size_t>(info.st_size);
  if (size > max_size) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the shared segment passed holds ", size, " bytes, more than the ", max_size,
                     " a request and its answer may take: send smaller requests"));
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map the shared segment passed: ", ErrnoText(errno)));
  }
  segment->data_ = static_cast<char*>(data);
  segment->size_ = size;
  segment->CloseFd();
  return segment;
}

SharedSegment::~SharedSegment() {
  if (data_ != nullptr) munmap(data_, size_);
  CloseFd();
}

void SharedSegment::CloseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<DataSocket> ConnectTcp(const std::string& host, int port, absl::Time deadline) {
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
    absl::StatusOr<DataSocket> socket =
        ConnectTo(entry->ai_family, entry->ai_addr, entry->ai_addrlen, deadline);
    if (socket.ok()) {
      freeaddrinfo(found);
      return socket;
    }
    last = socket.status();
  }
  freeaddrinfo(found);
  return last;
}

absl::StatusOr<DataSocket> ConnectUnix(const std::string& name, absl::Time deadline) {
  sockaddr_un address;
  const socklen_t length = AbstractUnixAddress(name, &address);
  return ConnectTo(AF_UNIX, reinterpret_cast<const sockaddr*>(&address), length, deadline);
}

absl::StatusOr<DataSocket> ListenTcp(const std::string& host, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const char* node = host.empty() || host == "::" || host == "[::]" ? nullptr : host.c_str();
  if (node == nullptr) hints.ai_family = AF_INET6;
  if (const int error = getaddrinfo(node, service.c_str(), &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve \"", host, "\" to listen on: ", gai_strerror(error)));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(found);
    return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  }
  DataSocket listener(fd, false);
  const int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (found->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  const int error =
      bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, 64) == 0 ? 0 : errno;
  freeaddrinfo(found);
  if (error != 0) {
    return absl::Status(ListenErrorCode(error),
                        absl::StrCat("cannot listen on ", host,
                                     port == 0 ? " (any free port)" : absl::StrCat(":", port), ": ",
                                     ErrnoText(error)));
  }
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  *bound_port =
      ntohs(address.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  return listener;
}

absl::StatusOr<DataSocket> ListenUnix(const std::string& name) {
  absl::StatusOr<int> fd = ListenAbstractUnix(name);
  if (!fd.ok()) return fd.status();
  return DataSocket(*fd, true);
}

std::string DataSocket::PeerHost() const {
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

absl::StatusOr<DataSocket> Accept(const DataSocket& listener) {
  for (;;) {
    const int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      if (!listener.is_unix()) ConfigureTcpConnection(fd);
      return DataSocket(fd, listener.is_unix());
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
