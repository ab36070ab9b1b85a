// The socket layer's mutual TLS, on loopback with certificates made by
// deploy/make_tls_certs.sh: both ends check each other's certificate against the cluster's
// CA and a client checks the server's name; data moves whole through blocking calls and
// through the non-blocking calls a poller makes, both directions at once; a stranger, a
// plaintext peer, a silent peer and a peer that leaves mid-transfer each end in an error
// that says so, within the deadline.
#include "stratum/net/socket.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "stratum/net/tls.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/testing/test_certificates.h"

namespace stratum {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

std::vector<char> Pattern(size_t size, int seed) {
  std::vector<char> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + seed) % 251);
  return bytes;
}

class SocketTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path root = fs::temp_directory_path();
    absl::StatusOr<TlsCredentials> cluster =
        testing::MakeTestCertificates((root / "cluster").string());
    absl::StatusOr<TlsCredentials> other = testing::MakeTestCertificates((root / "other").string());
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    ASSERT_TRUE(other.ok()) << other.status();
    cluster_ = new TlsCredentials(*cluster);
    other_ = new TlsCredentials(*other);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete other_;
  }

  static std::shared_ptr<const TlsContext> Context(const TlsCredentials& credentials) {
    absl::StatusOr<std::shared_ptr<const TlsContext>> context = TlsContext::Create(credentials);
    EXPECT_TRUE(context.ok()) << context.status();
    return context.ok() ? *context : nullptr;
  }

  void SetUp() override {
    absl::StatusOr<Socket> listener = ListenTcp("127.0.0.1", 0, &port_);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
  }

  // Accepts one connection on a thread and hands it to `serve`.
  void Serve(std::function<void(Socket&)> serve) {
    server_ = std::thread([this, serve = std::move(serve)] {
      absl::StatusOr<Socket> accepted = Accept(listener_);
      ASSERT_TRUE(accepted.ok()) << accepted.status();
      serve(*accepted);
    });
  }
  void TearDown() override {
    if (server_.joinable()) server_.join();
  }

  Socket Connect() {
    absl::StatusOr<Socket> socket = ConnectTcp("127.0.0.1", port_, Soon());
    EXPECT_TRUE(socket.ok()) << socket.status();
    return socket.ok() ? *std::move(socket) : Socket();
  }

  static TlsCredentials* cluster_;
  static TlsCredentials* other_;
  Socket listener_;
  int port_ = 0;
  std::thread server_;
};

TlsCredentials* SocketTlsTest::cluster_ = nullptr;
TlsCredentials* SocketTlsTest::other_ = nullptr;

TEST_F(SocketTlsTest, BlockingCallsMoveWholeFramesBothWays) {
  const auto tls = Context(*cluster_);
  const std::vector<char> header = Pattern(16, 1), body = Pattern((4 << 20) + 3, 2);
  absl::Notification checked;  // the server's end stays open until the client has looked
  Serve([&](Socket& socket) {
    ASSERT_OK(socket.StartTls(*tls, TlsRole::kServer, socket.PeerHost(), Soon()));
    std::vector<char> got(header.size() + body.size());
    ASSERT_OK(socket.Receive(got.data(), got.size(), Soon()));
    ASSERT_OK(socket.Send({{got.data(), got.size()}}, Soon()));
    checked.WaitForNotificationWithTimeout(absl::Seconds(10));
  });
  Socket socket = Connect();
  ASSERT_OK(socket.StartTls(*tls, TlsRole::kClient, "127.0.0.1", Soon()));
  EXPECT_TRUE(socket.tls());
  ASSERT_OK(socket.Send({{const_cast<char*>(header.data()), header.size()},
                         {const_cast<char*>(body.data()), body.size()}},
                        Soon()));
  std::vector<char> echoed(header.size() + body.size());
  ASSERT_OK(socket.Receive(echoed.data(), echoed.size(), Soon()));
  EXPECT_TRUE(std::equal(header.begin(), header.end(), echoed.begin()));
  EXPECT_TRUE(std::equal(body.begin(), body.end(), echoed.begin() + header.size()));
  EXPECT_TRUE(socket.IdleAndOpen());
  checked.Notify();
}

// Sends `out` and receives `in.size()` bytes at once, as an Exchange of the collectives
// does: neither side may wait for the other to finish reading first.
absl::Status Pump(Socket& socket, const std::vector<char>& out, std::vector<char>& in) {
  size_t sent = 0, received = 0;
  const absl::Time deadline = Soon();
  while (sent < out.size() || received < in.size()) {
    bool progress = false;
    if (sent < out.size()) {
      iovec part{const_cast<char*>(out.data()) + sent, out.size() - sent};
      absl::StatusOr<size_t> n = socket.SendSome(&part, 1);
      if (!n.ok()) return n.status();
      sent += *n;
      progress |= *n > 0;
    }
    if (received < in.size()) {
      absl::StatusOr<size_t> n = socket.ReceiveSome(in.data() + received, in.size() - received);
      if (!n.ok()) return n.status();
      received += *n;
      progress |= *n > 0;
    }
    if (progress) continue;
    if (absl::Now() > deadline) return absl::DeadlineExceededError("pump");
    pollfd entry{socket.fd(), 0, 0};
    if (sent < out.size()) entry.events |= socket.PollEvents(true);
    if (received < in.size()) entry.events |= socket.PollEvents(false);
    poll(&entry, 1, 100);
  }
  return absl::OkStatus();
}

TEST_F(SocketTlsTest, NonBlockingCallsSendAndReceiveAtOnce) {
  const auto tls = Context(*cluster_);
  // More than both sockets' buffers hold: each side must read while it writes.
  const std::vector<char> up = Pattern(16 << 20, 3), down = Pattern((16 << 20) + 5, 4);
  Serve([&](Socket& socket) {
    ASSERT_OK(socket.StartTls(*tls, TlsRole::kServer, socket.PeerHost(), Soon()));
    socket.SetNonBlocking();
    std::vector<char> got(up.size());
    ASSERT_OK(Pump(socket, down, got));
    EXPECT_EQ(got, up);
  });
  Socket socket = Connect();
  ASSERT_OK(socket.StartTls(*tls, TlsRole::kClient, "127.0.0.1", Soon()));
  socket.SetNonBlocking();
  std::vector<char> got(down.size());
  ASSERT_OK(Pump(socket, up, got));
  EXPECT_EQ(got, down);
}

TEST_F(SocketTlsTest, AServerFromAnotherCaIsRefused) {
  const auto theirs = Context(*other_);
  Serve([&](Socket& socket) {
    EXPECT_FALSE(socket.StartTls(*theirs, TlsRole::kServer, socket.PeerHost(), Soon()).ok());
  });
  Socket socket = Connect();
  const absl::Status status =
      socket.StartTls(*Context(*cluster_), TlsRole::kClient, "127.0.0.1", Soon());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(status.message(), HasSubstr("certificate verify failed"));
  EXPECT_THAT(status.message(), HasSubstr("cluster's CA"));
}

TEST_F(SocketTlsTest, AClientFromAnotherCaIsRefused) {
  // It trusts our CA, but its own certificate comes from another.
  TlsCredentials stranger = *other_;
  stranger.ca_pem = cluster_->ca_pem;
  Serve([&](Socket& socket) {
    const absl::Status status =
        socket.StartTls(*Context(*cluster_), TlsRole::kServer, socket.PeerHost(), Soon());
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
    EXPECT_THAT(status.message(), HasSubstr("certificate verify failed"));
  });
  Socket socket = Connect();
  // TLS 1.3 finishes a client's handshake before the server checks its certificate: the
  // client learns of the refusal at its first read.
  absl::Status status = socket.StartTls(*Context(stranger), TlsRole::kClient, "127.0.0.1", Soon());
  if (status.ok()) {
    char byte;
    status = socket.Receive(&byte, 1, Soon());
  }
  EXPECT_THAT(status.code(),
              AnyOf(absl::StatusCode::kUnauthenticated, absl::StatusCode::kUnavailable))
      << status;
}

TEST_F(SocketTlsTest, AClientChecksTheServersName) {
  Serve([&](Socket& socket) {
    (void)socket.StartTls(*Context(*cluster_), TlsRole::kServer, socket.PeerHost(), Soon());
  });
  Socket socket = Connect();
  // The certificate names 127.0.0.1, localhost and "stratum", not 127.0.0.2.
  const absl::Status status =
      socket.StartTls(*Context(*cluster_), TlsRole::kClient, "127.0.0.2", Soon());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(status.message(), HasSubstr("mismatch"));
  EXPECT_THAT(status.message(), HasSubstr("--tls_server_name"));
}

TEST_F(SocketTlsTest, AServerNameOverridesTheHost) {
  TlsCredentials named = *cluster_;
  named.server_name = "stratum";
  Serve([&](Socket& socket) {
    ASSERT_OK(socket.StartTls(*Context(*cluster_), TlsRole::kServer, socket.PeerHost(), Soon()));
    char byte = 0;
    ASSERT_OK(socket.Receive(&byte, 1, Soon()));
    EXPECT_EQ(byte, 'x');
  });
  Socket socket = Connect();
  ASSERT_OK(socket.StartTls(*Context(named), TlsRole::kClient, "10.1.2.3", Soon()));
  char byte = 'x';
  ASSERT_OK(socket.Send({{&byte, 1}}, Soon()));
}

TEST_F(SocketTlsTest, APlaintextClientIsRefusedAtOnce) {
  Serve([&](Socket& socket) {
    const absl::Time start = absl::Now();
    EXPECT_FALSE(
        socket.StartTls(*Context(*cluster_), TlsRole::kServer, socket.PeerHost(), Soon()).ok());
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  });
  Socket socket = Connect();
  const std::vector<char> hello = Pattern(64, 5);
  ASSERT_OK(socket.Send({{const_cast<char*>(hello.data()), hello.size()}}, Soon()));
  char byte;
  EXPECT_FALSE(socket.Receive(&byte, 1, Soon()).ok());
}

TEST_F(SocketTlsTest, ASilentServerEndsTheHandshakeAtItsDeadline) {
  absl::Notification done;
  Serve([&](Socket&) { done.WaitForNotificationWithTimeout(absl::Seconds(10)); });
  Socket socket = Connect();
  const absl::Time start = absl::Now();
  const absl::Status status = socket.StartTls(*Context(*cluster_), TlsRole::kClient, "127.0.0.1",
                                              absl::Now() + absl::Milliseconds(300));
  done.Notify();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("TLS handshake"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST_F(SocketTlsTest, APeerThatLeavesMidTransferIsAClosedConnection) {
  const auto tls = Context(*cluster_);
  Serve([&](Socket& socket) {
    ASSERT_OK(socket.StartTls(*tls, TlsRole::kServer, socket.PeerHost(), Soon()));
    const std::vector<char> half = Pattern(1 << 20, 6);
    ASSERT_OK(socket.Send({{const_cast<char*>(half.data()), half.size()}}, Soon()));
  });  // and closes, without close_notify
  Socket socket = Connect();
  ASSERT_OK(socket.StartTls(*tls, TlsRole::kClient, "127.0.0.1", Soon()));
  std::vector<char> got(2 << 20);
  const absl::Status status = socket.Receive(got.data(), got.size(), Soon());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("closed"));
}

}  // namespace
}  // namespace stratum
