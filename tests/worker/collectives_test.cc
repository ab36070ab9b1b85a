// Collectives over N ranks on N threads, once per transport (in-process, TCP on 127.0.0.1,
// and the same-host Unix socket links), as Gloo tests them; plus the failures users hit: a
// dead peer, a stuck peer, ranks that disagree about sizes, a stranger without the token.
#include "stratum/worker/collective/collectives.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stratum/net/tls.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/testing/test_certificates.h"
#include "worker/collective/tcp_transport.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

// kTcp: TCP only; kTls: TCP with the cluster's mutual TLS; kUnix: ConnectTcpTransport with
// its same-host Unix sockets.
enum class Kind { kInProcess, kTcp, kTls, kUnix };

std::string KindName(Kind kind) {
  switch (kind) {
    case Kind::kInProcess:
      return "InProcess";
    case Kind::kTcp:
      return "Tcp";
    case Kind::kTls:
      return "Tls";
    case Kind::kUnix:
      return "Unix";
  }
  return "?";
}

std::shared_ptr<const TlsContext> TlsOf(Kind kind) {
  return kind == Kind::kTls ? testing::TestTlsContext() : nullptr;
}

struct Group {
  std::vector<std::unique_ptr<Collectives>> ranks;
  std::shared_ptr<InProcessTransportGroup> in_process;
};

Group MakeGroup(Kind kind, int n, CommunicationOptions options = {},
                std::function<absl::Status()> abort_check = nullptr,
                const std::string& host = "127.0.0.1") {
  Group group;
  std::vector<std::unique_ptr<Transport>> transports(static_cast<size_t>(n));
  if (kind == Kind::kInProcess) {
    group.in_process = InProcessTransportGroup::Create(n);
    for (int r = 0; r < n; ++r) transports[r] = group.in_process->TakeTransport(r);
  } else {
    std::shared_ptr<Rendezvous> rendezvous = NewInMemoryRendezvous();
    std::vector<std::thread> threads;
    std::vector<absl::Status> statuses(static_cast<size_t>(n));
    TlsOf(kind);  // made before the threads use it
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        TcpTransportOptions tcp{.rank = r,
                                .size = n,
                                .host = host,
                                .connect_timeout = absl::Seconds(10),
                                .same_host_unix_sockets = kind == Kind::kUnix,
                                .abort_check = abort_check,
                                .tls = TlsOf(kind)};
        for (int i = 0; i < n; ++i) tcp.names.push_back(absl::StrCat("worker:", i));
        auto transport = ConnectTcpTransport(tcp, *rendezvous);
        statuses[r] = transport.status();
        if (transport.ok()) transports[r] = *std::move(transport);
      });
    }
    for (auto& thread : threads) thread.join();
    for (const absl::Status& status : statuses) EXPECT_TRUE(status.ok()) << status;
  }
  for (int r = 0; r < n; ++r) {
    auto collectives = Collectives::Create(std::move(transports[r]), options);
    EXPECT_TRUE(collectives.ok()) << collectives.status();
    group.ranks.push_back(*std::move(collectives));
  }
  return group;
}

// Runs fn(rank) on every rank at once; returns each rank's status.
std::vector<absl::Status> OnEveryRank(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> statuses(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { statuses[r] = fn(r); });
  for (auto& thread : threads) thread.join();
  return statuses;
}

// Values whose float sum depends on the order of addition, so identical bits mean one order.
float Value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 0.1 + static_cast<double>(i % 97) * 1e-3 +
                            1.0 / (static_cast<double>(i) + 3.0));
}

class CollectivesTest : public ::testing::TestWithParam<std::tuple<Kind, int>> {};

TEST_P(CollectivesTest, AllReduceSumsEveryElementIdenticallyOnEveryRank) {
  const auto [kind, n] = GetParam();
  Group group = MakeGroup(kind, n);
  // Empty, fewer elements than ranks, odd, the direct path's edge, ring sizes.
  for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{1001}, size_t{16384}, size_t{16385},
                       size_t{300007}}) {
    std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(count));
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) data[r][i] = Value(r, i);
    }
    auto statuses = OnEveryRank(
        n, [&](int r) { return group.ranks[r]->AllReduce(ReduceOp::kSum, data[r].data(), count); });
    for (const absl::Status& status : statuses) ASSERT_TRUE(status.ok()) << status;
    for (size_t i = 0; i < count; ++i) {
      double expected = 0;
      for (int r = 0; r < n; ++r) expected += Value(r, i);
      ASSERT_NEAR(data[0][i], expected, 1e-4) << "count " << count << " element " << i;
    }
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(std::memcmp(data[0].data(), data[r].data(), count * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0 (count " << count << ")";
    }
  }
}

TEST_P(CollectivesTest, MeanAndPackedTensors) {
  const auto [kind, n] = GetParam();
  Group group = MakeGroup(kind, n, {.bytes_per_pack = 4096});
  std::vector<std::vector<Tensor>> tensors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int64_t elements : {10, 500, 2000, 7, 100000}) {
      Tensor t(DType::kFloat32, Shape({elements}));
      t.Flat().setConstant(static_cast<float>(r + 1));
      tensors[r].push_back(std::move(t));
    }
  }
  auto statuses = OnEveryRank(n, [&](int r) {
    std::vector<Tensor*> pointers;
    for (Tensor& t : tensors[r]) pointers.push_back(&t);
    return group.ranks[r]->AllReduce(ReduceOp::kMean, pointers);
  });
  for (const absl::Status& status : statuses) ASSERT_TRUE(status.ok()) << status;
  const float mean = static_cast<float>(n + 1) / 2.0f;
  for (int r = 0; r < n; ++r) {
    for (const Tensor& t : tensors[r]) {
      for (int64_t i = 0; i < t.num_elements(); ++i) ASSERT_FLOAT_EQ(t.data<float>()[i], mean);
    }
  }
}

TEST_P(CollectivesTest, BroadcastAndAllGather) {
  const auto [kind, n] = GetParam();
  Group group = MakeGroup(kind, n);
  const size_t bytes = (3 << 20) + 17;  // several broadcast chunks and a ragged end
  const int root = n - 1;
  std::vector<std::vector<char>> data(static_cast<size_t>(n), std::vector<char>(bytes, 0));
  for (size_t i = 0; i < bytes; ++i) data[root][i] = static_cast<char>(i * 7 + 1);
  std::vector<std::vector<int32_t>> gathered(static_cast<size_t>(n),
                                             std::vector<int32_t>(static_cast<size_t>(n) * 3));
  auto statuses = OnEveryRank(n, [&](int r) {
    if (absl::Status status = group.ranks[r]->Broadcast(data[r].data(), bytes, root);
        !status.ok()) {
      return status;
    }
    const int32_t mine[3] = {r, r * 10, r * 100};
    return group.ranks[r]->AllGather(mine, sizeof(mine), gathered[r].data());
  });
  for (const absl::Status& status : statuses) ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(data[r], data[root]) << "rank " << r;
    for (int from = 0; from < n; ++from) {
      EXPECT_EQ(gathered[r][from * 3 + 0], from);
      EXPECT_EQ(gathered[r][from * 3 + 2], from * 100);
    }
  }
}

TEST_P(CollectivesTest, RanksThatDisagreeAboutTheSizeGetAnError) {
  const auto [kind, n] = GetParam();
  Group group = MakeGroup(kind, n, {.timeout = absl::Milliseconds(500)});
  std::vector<std::vector<float>> data(static_cast<size_t>(n), std::vector<float>(1000, 1.0f));
  auto statuses = OnEveryRank(n, [&](int r) {
    return group.ranks[r]->AllReduce(ReduceOp::kSum, data[r].data(), r == 0 ? 999 : 1000);
  });
  int failed = 0;
  for (const absl::Status& status : statuses) {
    if (status.ok()) continue;
    ++failed;
    EXPECT_THAT(std::string(status.message()), HasSubstr("all-reduce of"));
  }
  EXPECT_GT(failed, 0);
}

TEST_P(CollectivesTest, AWindowedReceiveDeliversEveryByteInOrder) {
  const auto [kind, n] = GetParam();
  Group group = MakeGroup(kind, n);
  std::string sent(100003, '\0');
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>(i * 7 + i / 251);
  char window[64];
  std::string received;
  auto statuses = OnEveryRank(2, [&](int r) -> absl::Status {
    Transport& transport = group.ranks[r]->transport();
    if (r == 0) return transport.Send(1, sent.data(), sent.size(), absl::Now() + absl::Seconds(10));
    RecvSpan recv{0, window, sent.size(),
                  [&](size_t landed) {
                    // The bytes since the last call, read before the ring overwrites them.
                    for (size_t i = received.size(); i < landed; ++i) {
                      received.push_back(window[i % sizeof(window)]);
                    }
                  },
                  sizeof(window)};
    return transport.Exchange({}, recv, absl::Now() + absl::Seconds(10));
  });
  for (const absl::Status& status : statuses) ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(received == sent) << "the windowed receive reordered or lost bytes";
}

INSTANTIATE_TEST_SUITE_P(Transports, CollectivesTest,
                         ::testing::Combine(::testing::Values(Kind::kInProcess, Kind::kTcp,
                                                              Kind::kTls, Kind::kUnix),
                                            ::testing::Values(2, 3, 4)),
                         [](const auto& info) {
                           return absl::StrCat(KindName(std::get<0>(info.param)),
                                               std::get<1>(info.param), "Ranks");
                         });

// The socket transports, over TCP only (plaintext and TLS) and with same-host Unix sockets.
class SocketCollectivesTest : public ::testing::TestWithParam<Kind> {};

INSTANTIATE_TEST_SUITE_P(Links, SocketCollectivesTest,
                         ::testing::Values(Kind::kTcp, Kind::kTls, Kind::kUnix),
                         [](const auto& info) { return KindName(info.param); });

TEST_P(SocketCollectivesTest, RanksOfOneHostUseTheLinkAskedFor) {
  Group group = MakeGroup(GetParam(), 3);
  const PeerLink expected = GetParam() == Kind::kUnix ? PeerLink::kUnix : PeerLink::kTcp;
  for (int r = 0; r < 3; ++r) {
    for (int peer = 0; peer < 3; ++peer) {
      if (peer == r) continue;
      absl::StatusOr<PeerLink> link = TcpPeerLink(group.ranks[r]->transport(), peer);
      ASSERT_TRUE(link.ok()) << link.status();
      EXPECT_EQ(*link, expected) << "rank " << r << " to rank " << peer;
    }
  }
  EXPECT_FALSE(TcpPeerLink(group.ranks[0]->transport(), 0).ok());
}

TEST_P(SocketCollectivesTest, ADeadPeerIsAnErrorNamingItAtOnce) {
  Group group = MakeGroup(GetParam(), 3, {.timeout = absl::Seconds(30)});
  // worker:2 dies before the all-reduce: its sockets close.
  group.ranks[2].reset();
  std::vector<float> data(1 << 20, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status status = group.ranks[1]->AllReduce(ReduceOp::kSum, data.data(), data.size());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "should not wait for the timeout";
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("worker:2 at 127.0.0.1:"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("exited or crashed"));
}

TEST_P(SocketCollectivesTest, AStuckPeerIsADeadlineNamingIt) {
  Group group = MakeGroup(GetParam(), 2, {.timeout = absl::Milliseconds(500)});
  std::vector<float> data(100, 1.0f);
  // worker:1 is alive but never joins the all-reduce.
  const absl::Time start = absl::Now();
  absl::Status status = group.ranks[0]->AllReduce(ReduceOp::kSum, data.data(), data.size());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("worker:1"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("timeout"));
}

TEST_P(SocketCollectivesTest, TheAbortCheckEndsAWaitLongBeforeTheTimeout) {
  std::atomic<bool> peer_lost{false};
  std::atomic<bool> all_reduce_begun{false};
  std::atomic<bool> checked{false};
  absl::Notification checked_while_waiting;  // the all-reduce asked: it is waiting for worker:1
  Group group = MakeGroup(GetParam(), 2, {.timeout = absl::Seconds(60)}, [&] {
    if (all_reduce_begun && !checked.exchange(true)) checked_while_waiting.Notify();
    return peer_lost ? absl::UnavailableError("worker:1 sent no heartbeat for 11s")
                     : absl::OkStatus();
  });
  std::vector<float> data(1 << 16, 1.0f);
  // worker:1 never joins; a while later (once the all-reduce waits for it) the job learns it
  // is gone.
  std::thread heartbeats([&] {
    EXPECT_TRUE(checked_while_waiting.WaitForNotificationWithTimeout(absl::Seconds(10)));
    peer_lost = true;
  });
  const absl::Time start = absl::Now();
  all_reduce_begun = true;
  absl::Status status = group.ranks[0]->AllReduce(ReduceOp::kSum, data.data(), data.size());
  heartbeats.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "should not wait for the timeout";
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("stopped waiting for worker:1"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("no heartbeat"));
}

// Workers whose TF_CONFIG hosts are IPv6 addresses reach each other over TCP too (the
// transport listened and connected over IPv4 only).
TEST(TcpTransportTest, RanksOnAnIpv6HostConnectAndAllReduce) {
  const int probe = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 loopback{};
  loopback.sin6_family = AF_INET6;
  loopback.sin6_addr = in6addr_loopback;
  const bool has_ipv6 =
      probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&loopback), sizeof(loopback)) == 0;
  if (probe >= 0) close(probe);
  if (!has_ipv6) GTEST_SKIP() << "this machine has no IPv6 loopback (::1)";
  Group group = MakeGroup(Kind::kTcp, 3, {}, nullptr, "::1");
  ASSERT_EQ(group.ranks.size(), 3u);
  std::vector<std::vector<float>> data(3, std::vector<float>(1000));
  for (int r = 0; r < 3; ++r) std::fill(data[r].begin(), data[r].end(), static_cast<float>(r + 1));
  auto statuses = OnEveryRank(3, [&](int r) {
    return group.ranks[r]->AllReduce(ReduceOp::kSum, data[r].data(), data[r].size());
  });
  for (const absl::Status& status : statuses) ASSERT_TRUE(status.ok()) << status;
  for (int r = 0; r < 3; ++r) EXPECT_EQ(data[r][999], 6.0f);
}

TEST(TcpTransportTest, APeerThatNeverStartsIsNamed) {
  std::shared_ptr<Rendezvous> rendezvous = NewInMemoryRendezvous();
  TcpTransportOptions options{.rank = 0,
                              .size = 2,
                              .names = {"worker:0", "worker:1"},
                              .connect_timeout = absl::Milliseconds(300)};
  auto transport = ConnectTcpTransport(options, *rendezvous);
  ASSERT_FALSE(transport.ok());
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(transport.status().message()),
              HasSubstr("worker:1 did not publish its collective address within 300ms"));
}

// A rendezvous whose waits end at once with `error`, as a job's do when a peer failed.
class FailingRendezvous final : public Rendezvous {
 public:
  explicit FailingRendezvous(absl::Status error) : error_(std::move(error)) {}
  absl::Status Set(const std::string&, const std::string&) override { return absl::OkStatus(); }
  absl::StatusOr<std::string> Get(const std::string&, absl::Duration) override { return error_; }

 private:
  const absl::Status error_;
};

TEST(TcpTransportTest, AWaitEndedByAFailureElsewhereKeepsItsCodeAndCause) {
  FailingRendezvous rendezvous(
      absl::FailedPreconditionError("worker:1 failed: this worker's job differs"));
  TcpTransportOptions options{
      .rank = 0, .size = 2, .names = {"worker:0", "worker:1"}, .connect_timeout = absl::Minutes(2)};
  auto transport = ConnectTcpTransport(options, rendezvous);
  ASSERT_FALSE(transport.ok());
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kFailedPrecondition) << transport.status();
  EXPECT_THAT(std::string(transport.status().message()),
              HasSubstr("stopped waiting for worker:1's collective address: worker:1 failed: "
                        "this worker's job differs"));
  EXPECT_THAT(std::string(transport.status().message()),
              ::testing::Not(HasSubstr("did not publish")));
}

TEST_P(SocketCollectivesTest, AStrangerWithoutTheTokenIsNotTakenForAPeer) {
  const bool unix_sockets = GetParam() == Kind::kUnix;
  std::shared_ptr<Rendezvous> rendezvous = NewInMemoryRendezvous();
  // A rank-0 impostor that publishes a token but connects with another one.
  TcpTransportOptions options{.rank = 1,
                              .size = 2,
                              .connect_timeout = absl::Seconds(1),
                              .same_host_unix_sockets = unix_sockets,
                              .tls = TlsOf(GetParam())};
  ASSERT_OK(rendezvous->Set("collective/tcp/token", "12345"));
  absl::StatusOr<PeerLink> impostor_link = absl::UnknownError("the impostor did not connect");
  std::thread impostor([&] {
    auto address = rendezvous->Get("collective/tcp/address/1", absl::Seconds(5));
    if (!address.ok()) return;
    // Under TLS it even holds the cluster's certificate: the token still keeps it out.
    TcpTransportOptions fake{.rank = 0,
                             .size = 2,
                             .key_prefix = "other",
                             .connect_timeout = absl::Seconds(1),
                             .same_host_unix_sockets = unix_sockets,
                             .tls = TlsOf(GetParam())};
    // Connects with a different token (over the link the test asks for): rank 1 must keep
    // waiting, then time out.
    auto other = NewInMemoryRendezvous();
    (void)other->Set("other/address/1", *address);
    (void)other->Set("other/unix/1",
                     rendezvous->Get("collective/tcp/unix/1", absl::ZeroDuration()).value_or(""));
    auto transport = ConnectTcpTransport(fake, *other);
    if (transport.ok()) impostor_link = TcpPeerLink(**transport, 1);
  });
  auto transport = ConnectTcpTransport(options, *rendezvous);
  impostor.join();
  ASSERT_FALSE(transport.ok());
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(transport.status().message()), HasSubstr("rank 0"));
  ASSERT_TRUE(impostor_link.ok()) << impostor_link.status();
  EXPECT_EQ(*impostor_link, unix_sockets ? PeerLink::kUnix : PeerLink::kTcp)
      << "the stranger did not come over the link under test";
}

// Under TLS a rank whose certificate comes from another CA cannot join: the rank that dials
// it refuses its certificate and says so, and it never gets a link.
TEST(TlsCollectivesTest, ARankWithAnotherCasCertificateIsRefused) {
  std::shared_ptr<Rendezvous> rendezvous = NewInMemoryRendezvous();
  const std::shared_ptr<const TlsContext> ours = testing::TestTlsContext(),
                                          theirs = testing::TestTlsContext("other");
  std::vector<absl::Status> statuses = OnEveryRank(2, [&](int r) {
    TcpTransportOptions options{.rank = r,
                                .size = 2,
                                .names = {"worker:0", "worker:1"},
                                .connect_timeout = absl::Seconds(2),
                                .same_host_unix_sockets = false,
                                .tls = r == 0 ? ours : theirs};
    return ConnectTcpTransport(options, *rendezvous).status();
  });
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kUnauthenticated) << statuses[0];
  EXPECT_THAT(std::string(statuses[0].message()), HasSubstr("cannot reach worker:1"));
  EXPECT_THAT(std::string(statuses[0].message()), HasSubstr("certificate verify failed"));
  EXPECT_FALSE(statuses[1].ok());
}

}  // namespace
}  // namespace stratum
