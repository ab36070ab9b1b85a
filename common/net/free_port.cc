#include "stratum/net/free_port.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <string>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace stratum {
namespace {

constexpr int kLowestPort = 20000;
constexpr int kHighestPort = 32767;
constexpr int kAttempts = 200;
// Shared by every process on the machine (and every user: sticky and world-writable).
constexpr char kClaimDir[] = "/tmp/stratum-port-claims";

// 0 when `port` can be bound on `address`, else the errno of the bind (or listen).
int BindError(const in_addr& address, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  // gRPC binds with SO_REUSEADDR, so a port in TIME_WAIT is usable: test it the same way.
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in socket_address{};
  socket_address.sin_family = AF_INET;
  socket_address.sin_addr = address;
  socket_address.sin_port = htons(static_cast<uint16_t>(port));
  const int error =
      bind(fd, reinterpret_cast<sockaddr*>(&socket_address), sizeof(socket_address)) == 0 &&
              listen(fd, 1) == 0
          ? 0
          : errno;
  close(fd);
  return error;
}

}  // namespace

// Once per process: claims are off, so two processes may pick the same port.
void WarnClaimsOff(const std::string& why) {
  static std::once_flag warned;
  std::call_once(warned, [&why] {
    spdlog::warn(
        "ports picked here are not claimed against other processes ({}): two processes may "
        "pick the same port; make {} a folder everyone may write to (mode 1777)",
        why, kClaimDir);
  });
}

bool ClaimPort(int port) {
  static const std::string unusable = []() -> std::string {
    if (mkdir(kClaimDir, 01777) != 0 && errno != EEXIST) {
      return absl::StrCat("cannot create ", kClaimDir, ": ", std::strerror(errno));
    }
    chmod(kClaimDir, 01777);  // mkdir's mode is cut by the umask; ignore failure (not ours)
    struct stat info;
    if (lstat(kClaimDir, &info) != 0 || !S_ISDIR(info.st_mode)) {
      return absl::StrCat(kClaimDir, " is not a folder");
    }
    return "";
  }();
  if (!unusable.empty()) {
    WarnClaimsOff(unusable);
    return true;  // nowhere to claim: the bind check alone decides
  }
  const std::string path = absl::StrCat(kClaimDir, "/", port);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd < 0) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);  // another user's
  if (fd < 0) {
    WarnClaimsOff(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    return true;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return false;  // a live process holds it
  }
  // Deliberately never closed: the lock lasts as long as this process, and the kernel drops
  // it when the process ends, however it ends. Files stay, one per port, for reuse.
  return true;
}

absl::StatusOr<int> PickFreePort(const std::string& host) {
  in_addr address;
  // "localhost" is the loopback, as in TF_CONFIG (a server on it listens on 127.0.0.1 too).
  if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &address) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pick a port on \"", host,
                     "\": give an IPv4 address such as 127.0.0.1, or localhost"));
  }
  std::random_device seed;
  std::mt19937 engine(seed());
  std::uniform_int_distribution<int> ports(kLowestPort, kHighestPort);
  int claimed = 0;  // free, but picked by another live process that has yet to bind them
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const int port = ports(engine);
    const int error = BindError(address, port);
    if (error == 0) {
      if (ClaimPort(port)) return port;
      ++claimed;
      continue;
    }
    if (error == EADDRNOTAVAIL) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot listen on ", host,
                       ": it is not an address of this machine; give one of its own, such as "
                       "127.0.0.1"));
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "found no free port on ", host, " in ", kAttempts, " tries between ", kLowestPort, " and ",
      kHighestPort,
      claimed == 0 ? ""
                   : absl::StrCat(" (", claimed,
                                  " were free but claimed by other live processes, whose locks "
                                  "are in ",
                                  kClaimDir, "/<port>: `fuser` on those files names them)")));
}

absl::StatusCode ListenErrorCode(int error) {
  return error == EADDRNOTAVAIL || error == EACCES ? absl::StatusCode::kInvalidArgument
                                                   : absl::StatusCode::kUnavailable;
}

absl::Status ListenFailure(const std::string& what, const std::string& address,
                           const std::string& fix) {
  const std::string prefix = absl::StrCat(what, " cannot listen on ", address, ": ");
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") host = "127.0.0.1";
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  // Bind as gRPC does (SO_REUSEADDR; "::" takes IPv4 too) to learn what the kernel refuses.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* found = nullptr;
  int error = 0;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    error = -1;  // not a numeric address: nothing to bind here to tell the causes apart
  } else {
    const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = errno;
    } else {
      const int one = 1, zero = 0;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (found->ai_family == AF_INET6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      }
      error = bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, 1) == 0 ? 0 : errno;
      close(fd);
    }
    freeaddrinfo(found);
  }
  switch (error) {
    case EADDRNOTAVAIL:
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, host, " is not an address of this machine; ", fix));
    case EACCES:
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "ports below 1024 need privileges this process lacks; use a port from 1024 up ",
          "(", fix, ")"));
    case EADDRINUSE:
      return absl::UnavailableError(
          absl::StrCat(prefix, "the port is in use; free the port, or ", fix));
    default:
      return absl::UnavailableError(
          absl::StrCat(prefix,
                       "the port is in use or the host is not an address of this machine; free the "
                       "port, or ",
                       fix));
  }
}

absl::StatusOr<std::vector<int>> PickFreePorts(int count, const std::string& host) {
  std::vector<int> picked;
  for (int attempt = 0; static_cast<int>(picked.size()) < count; ++attempt) {
    if (attempt == count + kAttempts) {
      return absl::ResourceExhaustedError(
          absl::StrCat("found only ", picked.size(), " of ", count, " different free ports on ",
                       host, " between ", kLowestPort, " and ", kHighestPort));
    }
    absl::StatusOr<int> port = PickFreePort(host);
    if (!port.ok()) return port.status();
    if (std::find(picked.begin(), picked.end(), *port) == picked.end()) picked.push_back(*port);
  }
  return picked;
}

}  // namespace stratum
