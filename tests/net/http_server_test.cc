// The HTTP server that serves /metrics and the status page, through its client and raw
// sockets: routes, 404 naming what is served, methods other than GET, malformed and
// oversized requests, and a client that sends nothing does not keep others out for long.
#include "stratum/net/http_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<HttpServer> StartServer() {
  auto server = HttpServer::Start(
      "127.0.0.1:0", {{"/metrics", [](const std::string& query) {
                         return HttpResponse{.content_type = "text/plain; version=0.0.4",
                                             .body = "up 1\nquery " + query + "\n"};
                       }}});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// What the server answers to `request` sent as it is on a raw connection.
std::string RawExchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string reply;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) reply.append(buffer, n);
  close(fd);
  return reply;
}

TEST(HttpServerTest, ServesItsRoutesWithTheirContentType) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<HttpResponse> got = HttpGet("127.0.0.1", server->port(), "/metrics?x=1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->content_type, "text/plain; version=0.0.4");
  EXPECT_EQ(got->body, "up 1\nquery ?x=1\n");
}

TEST(HttpServerTest, OtherPathsMethodsAndGarbageGetTheirStatus) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::StatusOr<HttpResponse> missing = HttpGet("127.0.0.1", server->port(), "/nothing");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->body, "no page /nothing; served: /metrics\n");
  EXPECT_THAT(RawExchange(server->port(), "POST /metrics HTTP/1.1\r\n\r\n"),
              HasSubstr("HTTP/1.1 405 Method Not Allowed"));
  EXPECT_THAT(RawExchange(server->port(), "hello\r\n\r\n"), HasSubstr("HTTP/1.1 400 Bad Request"));
  EXPECT_THAT(RawExchange(server->port(),
                          "GET /metrics HTTP/1.1\r\nX: " + std::string(9000, 'a') + "\r\n\r\n"),
              HasSubstr("HTTP/1.1 431"));
  // Still serving after all that.
  absl::StatusOr<HttpResponse> after = HttpGet("127.0.0.1", server->port(), "/metrics");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->status, 200);
}

TEST(HttpServerTest, AClientThatSendsNothingIsDroppedAndTheNextOneServed) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server->port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const absl::Time began = absl::Now();
  absl::StatusOr<HttpResponse> got =
      HttpGet("127.0.0.1", server->port(), "/metrics", absl::Seconds(20));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status, 200);
  EXPECT_LT(absl::Now() - began, absl::Seconds(10));  // the silent one's 5 s, at most
  close(silent);
}

TEST(HttpServerTest, AnAddressInUseOrWithoutAPortIsNamed) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto again = HttpServer::Start("127.0.0.1:" + std::to_string(server->port()), {});
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(),
              HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(server->port())));
  auto no_port = HttpServer::Start("127.0.0.1", {});
  ASSERT_FALSE(no_port.ok());
  EXPECT_THAT(no_port.status().message(), HasSubstr("has no port"));
  EXPECT_FALSE(HttpGet("127.0.0.1", 1, "/", absl::Seconds(2)).ok());
}

}  // namespace
}  // namespace stratum
