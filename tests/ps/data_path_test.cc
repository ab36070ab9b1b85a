// The parameter server's raw data path in one process: a PsDataServer over a VariableStore
// and PsDataClients on loopback, through shared memory, over TCP and over TCP with the
// cluster's mutual TLS (certificates from deploy/make_tls_certs.sh); hand-made
// frames for what a broken or hostile client sends; fake servers that die or go silent.
#include "ps/data_path.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>

#include <sys/resource.h>

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/testing/test_certificates.h"
#include "stratum/util/error_kind.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.5}})");
constexpr int64_t kElements = 1 << 20;  // a 4 MiB variable

std::string Message(const absl::Status& status) { return std::string(status.message()); }

Tensor Filled(int64_t elements, float value) {
  Tensor tensor(DType::kFloat32, {elements});
  tensor.Flat().setConstant(value);
  return tensor;
}

bool AllEqual(const Tensor& tensor, float value) { return (tensor.Flat() == value).all(); }

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

// A raw connection that has said hello, for frames no PsDataClient would send; with `tls`,
// through a TLS session (an invalid socket when the server refused it).
Socket RawConnection(const DataPathEndpoint& endpoint, uint64_t token,
                     const TlsContext* tls = nullptr) {
  absl::StatusOr<Socket> socket = ConnectTcp("127.0.0.1", endpoint.tcp_port, Soon());
  EXPECT_TRUE(socket.ok()) << socket.status();
  if (tls != nullptr && !socket->StartTls(*tls, TlsRole::kClient, "127.0.0.1", Soon()).ok()) {
    return Socket();
  }
  data_wire::Hello hello;
  hello.token = token;
  EXPECT_OK(socket->Send({{&hello, sizeof(hello)}}, Soon()));
  return *std::move(socket);
}

// Reads a response; its status (OK when the server answered OK).
absl::Status ReadResponse(Socket& socket) {
  data_wire::FrameHeader header;
  if (absl::Status status = socket.Receive(&header, sizeof(header), Soon()); !status.ok()) {
    return absl::InternalError(absl::StrCat("no response: ", status.message()));
  }
  std::string meta(header.meta_bytes, '\0');
  if (!socket.Receive(meta.data(), meta.size(), Soon()).ok()) return absl::InternalError("meta");
  absl::StatusOr<data_wire::ResponseMeta> parsed =
      data_wire::ParseResponseMeta(meta, data_wire::Limits());
  if (!parsed.ok()) return parsed.status();
  return absl::Status(static_cast<absl::StatusCode>(header.op_or_code), parsed->message);
}

enum class Link { kSharedMemory, kTcp, kTls };

std::string LinkName(Link link) {
  switch (link) {
    case Link::kSharedMemory:
      return "SharedMemory";
    case Link::kTcp:
      return "Tcp";
    case Link::kTls:
      return "Tls";
  }
  return "?";
}

class DataPathTest : public ::testing::TestWithParam<Link> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(*store_.Create("w", Filled(kElements, 1), kSgd));
    ASSERT_TRUE(*store_.Create("b", Tensor::FromVector<float>({2}, {1, 2}), kSgd));
    StartServer({});
  }

  void StartServer(PsDataServerOptions options) {
    server_.reset();
    options.shared_memory = GetParam() == Link::kSharedMemory;
    if (GetParam() == Link::kTls) options.tls = testing::TestTlsContext();
    auto server = PsDataServer::Start(store_, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<PsDataClient> Client(PsDataClientOptions options = {}) {
    options.shared_memory = GetParam() == Link::kSharedMemory;
    if (GetParam() == Link::kTls && options.tls == nullptr) options.tls = testing::TestTlsContext();
    return std::make_unique<PsDataClient>("ps:0 at test", "127.0.0.1", server_->endpoint(),
                                          options);
  }

  // The TLS a raw connection speaks: the cluster's under kTls.
  const TlsContext* Tls() const {
    return GetParam() == Link::kTls ? testing::TestTlsContext().get() : nullptr;
  }

  VariableStore store_;
  std::unique_ptr<PsDataServer> server_;
};

INSTANTIATE_TEST_SUITE_P(Transports, DataPathTest,
                         ::testing::Values(Link::kSharedMemory, Link::kTcp, Link::kTls),
                         [](const auto& info) { return LinkName(info.param); });

TEST_P(DataPathTest, PushesAndPullsALargeTensor) {
  auto client = Client();
  std::vector<Tensor> pulled;
  ASSERT_OK(client->Push({"w"}, {Filled(kElements, 2)}, &pulled));
  EXPECT_EQ(client->transport(), GetParam() == Link::kSharedMemory ? "shared memory"
                                 : GetParam() == Link::kTls        ? "tcp+tls"
                                                                   : "tcp");
  ASSERT_EQ(pulled.size(), 1u);
  EXPECT_EQ(pulled[0].shape(), Shape({kElements}));
  EXPECT_TRUE(AllEqual(pulled[0], 0));  // 1 - 0.5 * 2
  EXPECT_TRUE(store_.Read("w")->BitwiseEqual(pulled[0]));

  // Values handed out stay as they were: later calls reuse memory only once it is free.
  const Tensor first = pulled[0];
  ASSERT_OK(client->Push({"w"}, {Filled(kElements, 2)}, &pulled));
  EXPECT_TRUE(AllEqual(first, 0));
  EXPECT_TRUE(AllEqual(pulled[0], -1));

  ASSERT_OK(client->Push({"w", "b"}, {Filled(kElements, 2), Filled(2, 2)}, nullptr));
  absl::StatusOr<std::vector<Tensor>> values = client->Pull({"b", "w"});
  ASSERT_TRUE(values.ok()) << values.status();
  ASSERT_EQ(values->size(), 2u);
  EXPECT_TRUE((*values)[0].BitwiseEqual(Tensor::FromVector<float>({2}, {0, 1})));
  EXPECT_TRUE(AllEqual((*values)[1], -2));
  EXPECT_EQ(store_.Info("w")->updates, 3);

  // Pulls alone: the first tells the client how much shared memory the values want, the
  // next ones use it.
  auto reader = Client();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::vector<Tensor>> pulled_again = reader->Pull({"w", "b"});
    ASSERT_TRUE(pulled_again.ok()) << pulled_again.status();
    EXPECT_TRUE(AllEqual((*pulled_again)[0], -2));
    EXPECT_TRUE((*pulled_again)[1].BitwiseEqual(Tensor::FromVector<float>({2}, {0, 1})));
  }
}

// An embedding table's rows: read by rows, updated by row gradients, and the next step's
// rows read in the same call as the push, after it; whole variables beside them.
TEST_P(DataPathTest, PushesAndPullsRows) {
  std::vector<float> table;
  for (int i = 0; i < 20; ++i) table.push_back(static_cast<float>(i));
  ASSERT_TRUE(*store_.Create("emb", Tensor::FromVector<float>({10, 2}, table), kSgd));
  auto client = Client();
  for (int call = 0; call < 3; ++call) {  // the later calls find their shared memory sized
    absl::StatusOr<std::vector<Tensor>> rows = client->Pull({"b"}, nullptr, {{"emb", {7, 1}}});
    ASSERT_TRUE(rows.ok()) << rows.status();
    ASSERT_EQ(rows->size(), 2u);
    EXPECT_TRUE((*rows)[1].BitwiseEqual(Tensor::FromVector<float>({2, 2}, {14, 15, 2, 3})));
  }
  const std::vector<int64_t> pushed = {1, 7};
  std::vector<Tensor> back;
  ASSERT_TRUE(client
                  ->Push({"emb", "b"},
                         {Tensor::FromVector<float>({2, 2}, {2, 2, 4, 4}), Filled(2, 2)}, &back,
                         nullptr, {&pushed, nullptr}, {{"emb", {7, 9}}})
                  .ok());
  // The whole gradient's value, then the rows read after the update.
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(back[0].BitwiseEqual(Tensor::FromVector<float>({2}, {0, 1})));
  EXPECT_TRUE(back[1].BitwiseEqual(Tensor::FromVector<float>({2, 2}, {12, 13, 18, 19})));
  EXPECT_TRUE(store_.ReadRows("emb", {0, 1, 2})
                  ->BitwiseEqual(Tensor::FromVector<float>({3, 2}, {0, 1, 1, 2, 4, 5})));
  // Rows out of range, in a read or a gradient, are refused before anything changes.
  EXPECT_THAT(Message(client->Pull({}, nullptr, {{"emb", {10}}}).status()),
              HasSubstr("row 10 of variable \"emb\" is out of range"));
  const std::vector<int64_t> outside = {3, 12};
  EXPECT_THAT(Message(client->Push({"emb"}, {Tensor::FromVector<float>({2, 2}, {1, 1, 1, 1})},
                                   &back, nullptr, {&outside}, {})),
              HasSubstr("row 12 of variable \"emb\" is out of range"));
  EXPECT_THAT(Message(client->Push({"emb"}, {Tensor::FromVector<float>({1, 2}, {1, 1})}, &back,
                                   nullptr, {&pushed}, {})),
              HasSubstr("row gradients for variable \"emb\""));
  EXPECT_EQ(store_.Info("emb")->updates, 1);
}

TEST_P(DataPathTest, APushOfNothingIsAnUpdateOfNothing) {
  // A batch whose ids all lie outside a PS's shards reads none of their rows: the worker's
  // first push to that PS carries no tensor at all (no shared segment sized yet). It once
  // failed to map a segment of 0 bytes and was reported as a parameter server gone.
  ASSERT_TRUE(*store_.Create("emb", Tensor::FromVector<float>({3, 2}, {0, 1, 2, 3, 4, 5}), kSgd));
  auto client = Client();
  std::vector<Tensor> back;
  absl::Status pushed = client->Push({}, {}, &back, nullptr, {}, {});
  ASSERT_TRUE(pushed.ok()) << pushed;
  EXPECT_TRUE(back.empty());
  EXPECT_EQ(store_.Info("emb")->updates, 0);
}

TEST_P(DataPathTest, BadPushesAreRefusedAndChangeNothing) {
  auto client = Client();
  auto expect_refused = [](absl::Status status, absl::StatusCode code, const std::string& text) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(Message(status), StartsWith("ps:0 at test: "));
    EXPECT_THAT(Message(status), HasSubstr(text));
  };
  expect_refused(client->Push({"nope"}, {Filled(4, 1)}, nullptr), absl::StatusCode::kNotFound,
                 "variable \"nope\" does not exist");
  expect_refused(client->Push({"w"}, {Filled(4, 1)}, nullptr), absl::StatusCode::kInvalidArgument,
                 "is float32[4] but the variable is float32[1048576]");
  Tensor nan = Filled(kElements, 1);
  nan.data<float>()[kElements - 1] = std::numeric_limits<float>::quiet_NaN();
  expect_refused(client->Push({"w"}, {nan}, nullptr), absl::StatusCode::kInvalidArgument,
                 "NaN or Inf");
  // One bad gradient: the good one before it is not applied either.
  expect_refused(client->Push({"b", "w"}, {Filled(2, 1), nan}, nullptr),
                 absl::StatusCode::kInvalidArgument, "NaN or Inf");
  expect_refused(client->Pull({"b", "nope"}).status(), absl::StatusCode::kNotFound, "\"nope\"");
  // What the refusal is crosses the data path with it (a restarted PS lacks variables).
  EXPECT_EQ(ErrorKindOf(client->Pull({"nope"}).status()), ErrorKind::kVariableMissing);

  EXPECT_TRUE(store_.Read("b")->BitwiseEqual(Tensor::FromVector<float>({2}, {1, 2})));
  EXPECT_TRUE(AllEqual(*store_.Read("w"), 1));
  EXPECT_EQ(store_.refused_non_finite(), 2);
  // The connection is still good.
  EXPECT_OK(client->Push({"b"}, {Filled(2, 2)}, nullptr));
  EXPECT_EQ(store_.Info("b")->updates, 1);
}

TEST_P(DataPathTest, OversizedPushesAreRefusedAndTheServerLivesOn) {
  StartServer({.limits = {.max_bytes = 1 << 20}});
  auto client = Client();  // its own limit is larger, so it sends
  const absl::Status status = client->Push({"w"}, {Filled(kElements, 2)}, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(Message(status), HasSubstr("over the limit of 1048576"));
  EXPECT_TRUE(AllEqual(*store_.Read("w"), 1));
  EXPECT_OK(client->Push({"b"}, {Filled(2, 2)}, nullptr));

  // A client that knows the limit refuses before sending.
  auto careful = Client({.limits = {.max_bytes = 1 << 20}});
  DataCallOutcome outcome;
  EXPECT_EQ(careful->Push({"w"}, {Filled(kElements, 2)}, nullptr, &outcome).code(),
            absl::StatusCode::kResourceExhausted);
}

// Hardening case 1: a pull that lists a variable 10,000 times (a 90 KB request) is refused,
// not answered with 40 GB of values (the PS aborted with std::bad_alloc), and a pull whose
// answer would be over the frame limit is refused before it is made; the PS lives on.
TEST_P(DataPathTest, APullIsHeldToTheLimitsARequestIs) {
  auto client = Client();
  const std::vector<std::string> repeated(10000, "w");
  absl::StatusOr<std::vector<Tensor>> pulled = client->Pull(repeated);
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kInvalidArgument) << pulled.status();
  EXPECT_THAT(Message(pulled.status()), HasSubstr("names variable \"w\" more than once"));
  StartServer({.limits = {.max_bytes = 1 << 20}});
  client = Client();
  pulled = client->Pull({"w"});  // 4 MiB over a limit of 1 MiB
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kResourceExhausted) << pulled.status();
  EXPECT_THAT(Message(pulled.status()),
              HasSubstr("would answer more than 1048576 bytes, the limit of one message: pull "
                        "fewer variables per request"));
  pulled = client->Pull({"b"});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
}

// Hardening case 5: connections that take every descriptor of the process (here: a soft
// limit a few dozen above what is open) do not stop the data path for good; once they
// close, it accepts again by itself. And a server keeps at most max_connections open.
TEST_P(DataPathTest, ADescriptorFloodIsSurvivedAndTheDataPathRecovers) {
  using Counts = PsDataServer::AcceptCounts;
  // Held back from the flood: closed once the flood has taken every other descriptor, it
  // lets in one more connection, which the server then has no descriptor to accept.
  int reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(reserve, 0);
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  int open_now = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++open_now;
  }
  struct rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(open_now + 40);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  {
    const Counts before = server_->accept_counts();
    std::vector<Socket> flood;
    for (int i = 0; i < 200; ++i) {
      absl::StatusOr<Socket> socket = ConnectTcp("127.0.0.1", server_->endpoint().tcp_port, Soon());
      if (!socket.ok()) break;  // this process is out of descriptors too
      flood.push_back(*std::move(socket));
      // The server accepts it, taking a descriptor (or finds none left).
      const int64_t connected = before.accepted + static_cast<int64_t>(flood.size());
      EXPECT_TRUE(server_->AwaitAccepts(
          [&](const Counts& counts) {
            return counts.accepted >= connected || counts.exhausted > before.exhausted;
          },
          absl::Seconds(10)));
    }
    EXPECT_GT(flood.size(), 10u);
    // The server's accept meets the limit. When this process ran out on a connect instead,
    // every connection is accepted and no descriptor is left: one more takes the reserve's.
    if (server_->accept_counts().exhausted == before.exhausted) {
      close(reserve);
      reserve = -1;
      Socket extra(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), false);
      EXPECT_TRUE(extra.valid()) << "the reserve's descriptor was taken";
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      address.sin_port = htons(static_cast<uint16_t>(server_->endpoint().tcp_port));
      EXPECT_EQ(connect(extra.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
      flood.push_back(std::move(extra));
    }
    EXPECT_TRUE(server_->AwaitAccepts(
        [&](const Counts& counts) { return counts.exhausted > before.exhausted; },
        absl::Seconds(10)))
        << "the server's accept never met the descriptor limit";
  }  // the flood closes
  if (reserve >= 0) close(reserve);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  absl::StatusOr<std::vector<Tensor>> pulled;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  do {
    pulled = Client()->Pull({"b"});
  } while (!pulled.ok() && absl::Now() < deadline);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE((*pulled)[0].BitwiseEqual(Tensor::FromVector<float>({2}, {1, 2})));

  StartServer({.max_connections = 2});
  std::vector<Socket> kept;
  for (int i = 0; i < 2; ++i)
    kept.push_back(RawConnection(server_->endpoint(), server_->endpoint().token, Tls()));
  Socket extra = RawConnection(server_->endpoint(), server_->endpoint().token, Tls());
  data_wire::HelloReply reply;
  EXPECT_FALSE(extra.Receive(&reply, sizeof(reply), Soon()).ok());  // closed, not served
  EXPECT_OK(kept[0].Receive(&reply, sizeof(reply), Soon()));
}

// One client (one address) over its cap is closed as it comes while the listener has room,
// and the connections it keeps are served; once one ends, it may connect again.
TEST_P(DataPathTest, OneClientCannotTakeEveryConnection) {
  StartServer({.max_connections = 100, .max_connections_per_client = 2});
  std::vector<Socket> kept;
  for (int i = 0; i < 2; ++i) {
    kept.push_back(RawConnection(server_->endpoint(), server_->endpoint().token, Tls()));
  }
  data_wire::HelloReply reply;
  for (Socket& socket : kept) EXPECT_OK(socket.Receive(&reply, sizeof(reply), Soon()));
  Socket extra = RawConnection(server_->endpoint(), server_->endpoint().token, Tls());
  EXPECT_FALSE(extra.Receive(&reply, sizeof(reply), Soon()).ok());  // closed, not served
  kept.pop_back();  // ends one: its place is free again once the server sees it end
  absl::Status again;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  do {
    // Until the server has seen the connection end, a new one is closed, maybe before the
    // hello is sent: neither step may fail the test.
    absl::StatusOr<Socket> next = ConnectTcp("127.0.0.1", server_->endpoint().tcp_port, Soon());
    if (!next.ok()) continue;
    if (Tls() != nullptr && !next->StartTls(*Tls(), TlsRole::kClient, "127.0.0.1", Soon()).ok()) {
      continue;
    }
    data_wire::Hello hello;
    hello.token = server_->endpoint().token;
    again = next->Send({{&hello, sizeof(hello)}}, Soon());
    if (again.ok()) again = next->Receive(&reply, sizeof(reply), Soon());
  } while (!again.ok() && absl::Now() < deadline);
  EXPECT_OK(again);
}

// A connection that carries no request for idle_timeout is closed (a flood's idle
// connections are reaped), the hello says after how long, and a client's pool leaves its
// connections before then: its calls after any pause succeed.
TEST_P(DataPathTest, IdleConnectionsAreClosedAndClientsReconnect) {
  constexpr absl::Duration kIdle = absl::Milliseconds(400);
  StartServer({.idle_timeout = kIdle});
  Socket idle = RawConnection(server_->endpoint(), server_->endpoint().token, Tls());
  data_wire::HelloReply reply;
  ASSERT_OK(idle.Receive(&reply, sizeof(reply), Soon()));
  EXPECT_EQ(reply.idle_timeout_ms, 400u);
  const absl::Time start = absl::Now();
  data_wire::FrameHeader header;
  EXPECT_FALSE(idle.Receive(&header, sizeof(header), Soon()).ok());  // closed, not answered
  EXPECT_GE(absl::Now() - start, kIdle - absl::Milliseconds(50));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));

  auto client = Client();
  for (const absl::Duration pause :
       {absl::ZeroDuration(), kIdle * 0.6, kIdle * 0.95, kIdle * 1.5}) {
    // Real idle time: the server's idle timeout runs on its socket's real-time deadline.
    absl::SleepFor(pause);
    absl::StatusOr<std::vector<Tensor>> pulled = client->Pull({"b"});
    EXPECT_OK(pulled.status()) << "after a pause of " << pause;
  }
}

TEST_P(DataPathTest, ConcurrentCallsShareOneClient) {
  auto client = Client();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        std::vector<Tensor> pulled;
        EXPECT_OK(client->Push({"b"}, {Filled(2, 0.5)}, &pulled));
        EXPECT_EQ(pulled.size(), 1u);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(store_.Info("b")->updates, 100);
  EXPECT_TRUE(store_.Read("b")->BitwiseEqual(Tensor::FromVector<float>({2}, {-24, -23})));
}

TEST_P(DataPathTest, ShutdownClosesIdleConnectionsAndRefusesNewCalls) {
  auto client = Client();
  ASSERT_OK(client->Push({"b"}, {Filled(2, 1)}, nullptr));
  const absl::Time start = absl::Now();
  server_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  DataCallOutcome outcome;
  const absl::Status status = client->Push({"b"}, {Filled(2, 1)}, nullptr, &outcome);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(outcome, DataCallOutcome::kNotSent);
  EXPECT_THAT(Message(status), HasSubstr("ps:0 at test: cannot open the data connection"));
  EXPECT_EQ(store_.Info("b")->updates, 1);
}

// Under the cluster's TLS, only holders of its certificates reach the data: a client of
// another CA and a plaintext client are refused before their hello (so before any token
// is checked), nothing is applied, and the server goes on serving its own.
TEST(DataPathTlsTest, StrangersAreRefusedAndTheClustersClientsServed) {
  VariableStore store;
  ASSERT_TRUE(*store.Create("b", Tensor::FromVector<float>({2}, {1, 2}), kSgd));
  auto server =
      PsDataServer::Start(store, {.shared_memory = false, .tls = testing::TestTlsContext()});
  ASSERT_TRUE(server.ok()) << server.status();
  const DataPathEndpoint endpoint = (*server)->endpoint();
  using Stranger = std::pair<std::string, std::shared_ptr<const TlsContext>>;
  for (const auto& [who, tls] : {Stranger{"another CA's client", testing::TestTlsContext("other")},
                                 Stranger{"a plaintext client", nullptr}}) {
    PsDataClient stranger("ps:0 at test", "127.0.0.1", endpoint,
                          {.shared_memory = false, .tls = tls});
    DataCallOutcome outcome;
    const absl::Status status = stranger.Push({"b"}, {Filled(2, 1)}, nullptr, &outcome);
    EXPECT_FALSE(status.ok()) << who;
    EXPECT_EQ(outcome, DataCallOutcome::kNotSent) << who << ": " << status;
    EXPECT_THAT(Message(status), HasSubstr("cannot open the data connection")) << who;
  }
  EXPECT_EQ(store.Info("b")->updates, 0);
  PsDataClient member("ps:0 at test", "127.0.0.1", endpoint,
                      {.shared_memory = false, .tls = testing::TestTlsContext()});
  ASSERT_OK(member.Push({"b"}, {Filled(2, 1)}, nullptr));
  EXPECT_EQ(member.transport(), "tcp+tls");
  EXPECT_EQ(store.Info("b")->updates, 1);
}

using DataPathFramesTest = DataPathTest;
INSTANTIATE_TEST_SUITE_P(Tcp, DataPathFramesTest, ::testing::Values(Link::kTcp));

TEST_P(DataPathFramesTest, ATruncatedPushAppliesNothing) {
  {
    Socket socket = RawConnection(server_->endpoint(), server_->endpoint().token, Tls());
    data_wire::HelloReply reply;
    ASSERT_OK(socket.Receive(&reply, sizeof(reply), Soon()));
    ASSERT_EQ(reply.code, 0u);
    data_wire::RequestMeta meta;
    meta.tensors.push_back({.name = "w", .shape = Shape({kElements})});
    const std::string encoded = data_wire::EncodeRequestMeta(meta);
    data_wire::FrameHeader header;
    header.magic = data_wire::kRequestMagic;
    header.op_or_code = static_cast<uint32_t>(data_wire::Op::kPush);
    header.meta_bytes = static_cast<uint32_t>(encoded.size());
    header.inline_bytes = kElements * 4;
    header.timeout_ms = 5000;
    const Tensor half = Filled(kElements / 2, 2);
    ASSERT_TRUE(socket
                    .Send({{&header, sizeof(header)},
                           {const_cast<char*>(encoded.data()), encoded.size()},
                           {const_cast<void*>(half.raw_data()), half.byte_size()}},
                          Soon())
                    .ok());
  }  // the client dies here, half-way
  auto client = Client();
  ASSERT_OK(client->Push({"b"}, {Filled(2, 1)}, nullptr));
  EXPECT_EQ(store_.Info("w")->updates, 0);
  EXPECT_TRUE(AllEqual(*store_.Read("w"), 1));
}

TEST_P(DataPathFramesTest, MalformedFramesAreAnsweredWithTheProblem) {
  const DataPathEndpoint& endpoint = server_->endpoint();
  {
    Socket socket = RawConnection(endpoint, endpoint.token);
    data_wire::HelloReply reply;
    ASSERT_OK(socket.Receive(&reply, sizeof(reply), Soon()));
    const char http[] = "GET / HTTP/1.1\r\nHost: ps\r\n\r\n\r\n\r\n";
    ASSERT_OK(socket.Send({{const_cast<char*>(http), 40}}, Soon()));
    const absl::Status status = ReadResponse(socket);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(Message(status), HasSubstr("does not speak Stratum's data path"));
    char byte;
    EXPECT_FALSE(socket.Receive(&byte, 1, Soon()).ok());  // and the connection is closed
  }
  {
    Socket socket = RawConnection(endpoint, endpoint.token);
    data_wire::HelloReply reply;
    ASSERT_OK(socket.Receive(&reply, sizeof(reply), Soon()));
    data_wire::RequestMeta meta;
    meta.tensors.push_back({.name = "w", .shape = Shape({-4})});
    const std::string encoded = data_wire::EncodeRequestMeta(meta);
    data_wire::FrameHeader header;
    header.magic = data_wire::kRequestMagic;
    header.op_or_code = static_cast<uint32_t>(data_wire::Op::kPush);
    header.meta_bytes = static_cast<uint32_t>(encoded.size());
    header.inline_bytes = 8;
    const uint64_t junk = 0;
    ASSERT_TRUE(socket
                    .Send({{&header, sizeof(header)},
                           {const_cast<char*>(encoded.data()), encoded.size()},
                           {const_cast<uint64_t*>(&junk), sizeof(junk)}},
                          Soon())
                    .ok());
    const absl::Status status = ReadResponse(socket);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(Message(status), HasSubstr("dimension -4, which is negative"));
  }
  {
    Socket socket = RawConnection(endpoint, endpoint.token + 1);
    data_wire::HelloReply reply;
    ASSERT_OK(socket.Receive(&reply, sizeof(reply), Soon()));
    EXPECT_EQ(reply.code, static_cast<uint32_t>(absl::StatusCode::kPermissionDenied));
  }
  EXPECT_TRUE(AllEqual(*store_.Read("w"), 1));
  EXPECT_OK(Client()->Push({"b"}, {Filled(2, 1)}, nullptr));
}

TEST(SharedSegmentTest, OnlySealedSegmentsAreMapped) {
  const int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  absl::StatusOr<std::shared_ptr<SharedSegment>> mapped = SharedSegment::Map(fd, 1 << 20);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(mapped.status()), HasSubstr("not a memfd sealed"));

  absl::StatusOr<std::shared_ptr<SharedSegment>> made = SharedSegment::Create(1 << 20);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_NE(ftruncate((*made)->fd(), 0), 0);  // it cannot shrink under a peer
  (*made)->data()[5] = 42;
  absl::StatusOr<std::shared_ptr<SharedSegment>> peer =
      SharedSegment::Map(dup((*made)->fd()), 1 << 20);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ((*peer)->size(), size_t{1} << 20);
  EXPECT_EQ((*peer)->data()[5], 42);
}

// Hardening case 7: a peer's segment larger than its requests may carry is not mapped (a
// same-host client could otherwise make a PS map, and keep, gigabytes).
TEST(SharedSegmentTest, ASegmentLargerThanTheLimitIsRefused) {
  absl::StatusOr<std::shared_ptr<SharedSegment>> made = SharedSegment::Create(4 << 20);
  ASSERT_TRUE(made.ok()) << made.status();
  absl::StatusOr<std::shared_ptr<SharedSegment>> mapped =
      SharedSegment::Map(dup((*made)->fd()), 1 << 20);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(mapped.status()), HasSubstr("holds 4194304 bytes, more than the 1048576"));
}

// A fake PS data endpoint: says hello, then does what `after_hello` says.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(Socket&)> after_hello) {
    auto listener = ListenTcp("127.0.0.1", 0, &port_);
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    thread_ = std::thread([this, after_hello = std::move(after_hello)] {
      absl::StatusOr<Socket> socket = Accept(listener_);
      if (!socket.ok()) return;
      data_wire::Hello hello;
      data_wire::HelloReply reply;
      if (!socket->Receive(&hello, sizeof(hello), Soon()).ok() ||
          !socket->Send({{&reply, sizeof(reply)}}, Soon()).ok()) {
        return;
      }
      after_hello(*socket);
    });
  }
  ~FakeServer() {
    listener_.Shutdown();
    thread_.join();
  }
  DataPathEndpoint endpoint() const { return {.tcp_port = port_, .token = 7}; }

 private:
  int port_ = 0;
  Socket listener_;
  std::thread thread_;
};

TEST(DataPathPeerTest, APsThatDiesMidTransferIsNamedAtOnce) {
  FakeServer server([](Socket& socket) {
    std::vector<char> some(100 << 10);
    socket.Receive(some.data(), some.size(), Soon()).IgnoreError();
  });  // then closes, with most of the push unread
  PsDataClient client("ps:0 at 127.0.0.1:2222", "127.0.0.1", server.endpoint(),
                      {.shared_memory = false});
  const absl::Time start = absl::Now();
  DataCallOutcome outcome;
  const absl::Status status = client.Push({"w"}, {Filled(kElements, 1)}, nullptr, &outcome);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(outcome, DataCallOutcome::kBroken);
  EXPECT_THAT(Message(status),
              HasSubstr("ps:0 at 127.0.0.1:2222: the data connection (socket) failed during a "
                        "push of 4194304 bytes"));
  EXPECT_THAT(Message(status), HasSubstr("may have stopped or restarted"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(DataPathPeerTest, APsThatNeverAnswersIsNamedAtTheDeadline) {
  absl::Notification done;
  FakeServer server([&done](Socket& socket) {
    std::vector<char> all(kElements * 4);
    socket.Receive(all.data(), 40, Soon()).IgnoreError();
    done.WaitForNotificationWithTimeout(absl::Seconds(10));
  });
  PsDataClient client("ps:0 at 127.0.0.1:2222", "127.0.0.1", server.endpoint(),
                      {.timeout = absl::Milliseconds(500), .shared_memory = false});
  const absl::Time start = absl::Now();
  const absl::Status status = client.Pull({"w"}).status();
  done.Notify();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(Message(status), HasSubstr("ps:0 at 127.0.0.1:2222: no answer within 500ms to a "
                                         "pull of 1 variable on the data path"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(DataPathPeerTest, NothingListeningIsNotSent) {
  int port = 0;
  { ASSERT_OK(ListenTcp("127.0.0.1", 0, &port)); }  // free again
  PsDataClient client("ps:0 at 127.0.0.1:2222", "127.0.0.1", {.tcp_port = port, .token = 1},
                      {.shared_memory = false});
  DataCallOutcome outcome;
  const absl::Status status = client.Push({"b"}, {Filled(2, 1)}, nullptr, &outcome);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(outcome, DataCallOutcome::kNotSent);
  EXPECT_THAT(Message(status),
              HasSubstr(absl::StrCat("ps:0 at 127.0.0.1:2222: cannot open the data connection to "
                                     "127.0.0.1:",
                                     port)));
}

}  // namespace
}  // namespace stratum
