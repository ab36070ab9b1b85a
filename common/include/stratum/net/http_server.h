// A small HTTP/1.1 server for what people and tools read from a task with a plain HTTP GET:
// Prometheus' /metrics and the status page. GET only, one request per connection
// (Connection: close), requests of at most 8 KiB read within 5 s, served one at a time
// from one thread: enough for scrapers and a browser, and a stalled client delays the next
// one by 5 s at most. HttpGet is its client, for tests and probes. Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stratum {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  // Answers GET `path` (the target without its query) from its handler; the query string
  // ("?a=1", or empty) is the handler's argument.
  using Handler = std::function<HttpResponse(const std::string& query)>;

  // Listens on `address` ("host:port"; port 0: any free one) and serves `routes`; other
  // paths get 404, other methods 405, malformed requests 400. Errors name the address.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           std::map<std::string, Handler> routes);
  ~HttpServer();  // stops serving; a request in progress is finished first
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  HttpServer(int listener, int port, std::map<std::string, Handler> routes);
  void Serve();
  void Answer(int connection);

  const int listener_;
  const int port_;
  const std::map<std::string, Handler> routes_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// GET http://host:port/target (HTTP/1.0: the body ends with the connection); the response's
// status, content type and body. UNAVAILABLE when it cannot connect, DEADLINE_EXCEEDED past
// `timeout`.
absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& target,
                                     absl::Duration timeout = absl::Seconds(10));

}  // namespace stratum
