#include "stratum/net/http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "stratum/net/free_port.h"
#include "stratum/net/host_port.h"

namespace stratum {
namespace {

constexpr size_t kMaxRequestBytes = 8 << 10;
constexpr int kRequestMillis = 5000;

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Internal Server Error";
  }
}

void SendAll(int fd, const std::string& data) {
  for (size_t sent = 0; sent < data.size();) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went: nothing to tell it
    sent += static_cast<size_t>(n);
  }
}

// Waits up to `millis` for `fd` to be readable (or writable); false on timeout or error.
bool WaitFor(int fd, short events, int millis) {
  pollfd p{.fd = fd, .events = events, .revents = 0};
  int ready;
  do {
    ready = poll(&p, 1, millis);
  } while (ready < 0 && errno == EINTR);
  return ready > 0;
}

// A socket of `host`:`port` (host empty: every interface), bound and listening, or connected.
absl::StatusOr<int> OpenSocket(const std::string& host, int port, bool listen_on) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = listen_on ? AI_PASSIVE : 0;
  const bool any = host.empty() || host == "::" || host == "0.0.0.0";
  if (listen_on && host.empty()) hints.ai_family = AF_INET6;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int error = getaddrinfo(listen_on && host.empty() ? nullptr : host.c_str(),
                                    service.c_str(), &hints, &found);
      error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve \"", host, "\": ", gai_strerror(error)));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(found);
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  int error = 0;
  if (listen_on) {
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (found->ai_family == AF_INET6 && any) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    error = bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, 16) == 0 ? 0 : errno;
  } else {
    error = connect(fd, found->ai_addr, found->ai_addrlen) == 0 ? 0 : errno;
  }
  freeaddrinfo(found);
  if (error != 0) {
    close(fd);
    return absl::Status(listen_on ? ListenErrorCode(error) : absl::StatusCode::kUnavailable,
                        absl::StrCat(listen_on ? "cannot listen on " : "cannot connect to ", host,
                                     ":", port, ": ", std::strerror(error)));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, std::map<std::string, Handler> routes) {
  const HostPort host_port = SplitHostPort(address);
  int port = 0;
  if (!absl::SimpleAtoi(host_port.port, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP address ", address, " has no port: write host:port"));
  }
  std::string host = host_port.host;
  if (host == "[::]") host = "";
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  absl::StatusOr<int> listener = OpenSocket(host, port, /*listen_on=*/true);
  if (!listener.ok()) return listener.status();
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(*listener, reinterpret_cast<sockaddr*>(&bound), &length);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<HttpServer>(new HttpServer(*listener, bound_port, std::move(routes)));
}

HttpServer::HttpServer(int listener, int port, std::map<std::string, Handler> routes)
    : listener_(listener), port_(port), routes_(std::move(routes)) {
  thread_ = std::thread([this] { Serve(); });
}

HttpServer::~HttpServer() {
  stopping_ = true;
  thread_.join();
  close(listener_);
}

void HttpServer::Serve() {
  while (!stopping_) {
    if (!WaitFor(listener_, POLLIN, 100)) continue;
    const int connection = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Answer(connection);
    close(connection);
  }
}

void HttpServer::Answer(int connection) {
  std::string request;
  HttpResponse response;
  char buffer[2048];
  for (size_t end;
       (end = request.find("\r\n\r\n")) == std::string::npos || end > kMaxRequestBytes;) {
    if (request.size() > kMaxRequestBytes) {
      response = {.status = 431, .body = "request headers over 8 KiB\n"};
      break;
    }
    if (!WaitFor(connection, POLLIN, kRequestMillis)) return;  // a stalled client: drop it
    const ssize_t n = recv(connection, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  if (response.status == 200) {
    const std::string line = request.substr(0, request.find("\r\n"));
    const std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 3 || parts[2].rfind("HTTP/1.", 0) != 0 || parts[1].empty() ||
        parts[1][0] != '/') {
      response = {.status = 400, .body = "not an HTTP/1 request line\n"};
    } else if (parts[0] != "GET") {
      response = {.status = 405, .body = "only GET is served\n"};
    } else {
      const size_t question = parts[1].find('?');
      const std::string path = parts[1].substr(0, question);
      const auto route = routes_.find(path);
      if (route == routes_.end()) {
        std::string known;
        for (const auto& [served, handler] : routes_) absl::StrAppend(&known, " ", served);
        response = {.status = 404,
                    .body = absl::StrCat("no page ", path, "; served:", known, "\n")};
      } else {
        response = route->second(question == std::string::npos ? "" : parts[1].substr(question));
      }
    }
  }
  SendAll(connection,
          absl::StrCat("HTTP/1.1 ", response.status, " ", Reason(response.status),
                       "\r\nContent-Type: ", response.content_type,
                       "\r\nContent-Length: ", response.body.size(),
                       "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n", response.body));
}

absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& target,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<int> fd = OpenSocket(host, port, /*listen_on=*/false);
  if (!fd.ok()) return fd.status();
  SendAll(*fd, absl::StrCat("GET ", target, " HTTP/1.0\r\nHost: ", host, ":", port,
                            "\r\nAccept: */*\r\n\r\n"));
  std::string reply;
  char buffer[16384];
  for (;;) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0 || !WaitFor(*fd, POLLIN, static_cast<int>(left))) {
      close(*fd);
      return absl::DeadlineExceededError(absl::StrCat("GET http://", host, ":", port, target,
                                                      " got no whole answer within ",
                                                      absl::FormatDuration(timeout)));
    }
    const ssize_t n = recv(*fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  close(*fd);
  const size_t head_end = reply.find("\r\n\r\n");
  const std::vector<std::string> status_line =
      absl::StrSplit(reply.substr(0, reply.find("\r\n")), absl::MaxSplits(' ', 2));
  HttpResponse response;
  if (head_end == std::string::npos || status_line.size() < 2 ||
      !absl::SimpleAtoi(status_line[1], &response.status)) {
    return absl::DataLossError(absl::StrCat("GET http://", host, ":", port, target,
                                            " got no HTTP answer: ", reply.substr(0, 80)));
  }
  response.content_type.clear();
  for (absl::string_view header :
       absl::StrSplit(absl::string_view(reply).substr(0, head_end), "\r\n")) {
    if (absl::StartsWithIgnoreCase(header, "content-type:")) {
      response.content_type = std::string(absl::StripAsciiWhitespace(header.substr(13)));
    }
  }
  response.body = reply.substr(head_end + 4);
  return response;
}

}  // namespace stratum
