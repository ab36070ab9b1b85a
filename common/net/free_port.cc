#include "stratum/net/free_port.h"
#include "stratum/net/host_port.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
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

// The errno of binding `port` on the numeric IPv4 or IPv6 `host` and listening, 0 when both
// work, -1 when `host` is not a numeric address. Binds as gRPC does: SO_REUSEADDR (a port in
// TIME_WAIT is usable), and "::" takes IPv4 too.
int BindError(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return -1;
  }
  int error = 0;
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
  return error;
}

// "localhost" is the loopback, as in TF_CONFIG (a server on it listens on 127.0.0.1 too);
// an IPv6 address may come in brackets.
std::string NumericHost(std::string host) {
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" ? "127.0.0.1" : host;
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
  const std::string numeric = NumericHost(host);
  std::random_device seed;
  std::mt19937 engine(seed());
  std::uniform_int_distribution<int> ports(kLowestPort, kHighestPort);
  int claimed = 0;  // free, but picked by another live process that has yet to bind them
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const int port = ports(engine);
    const int error = BindError(numeric, port);
    if (error == -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot pick a port on \"", host,
                       "\": give an IP address such as 127.0.0.1 or ::1, or localhost"));
    }
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
  const HostPort split = SplitHostPort(address);
  const std::string host = NumericHost(split.host);
  int port = 0;
  if (!absl::SimpleAtoi(split.port, &port)) port = 0;
  // -1 (not a numeric address): nothing to bind here to tell the causes apart.
  const int error = BindError(host, port);
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
