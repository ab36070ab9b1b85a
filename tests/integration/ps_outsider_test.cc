// Issue 28's hardening cases that an outsider on the network tries, against a real
// stratum-ps: hand-made frames on its raw data path (TCP, and the same-host Unix socket
// with shared memory), hand-made gRPC requests, and a connection flood under a small
// descriptor limit. Each refusal must come without harm: the PS answers its coordinator
// afterwards, and its peak memory stays small.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <grpcpp/client_context.h>

#include <fstream>
#include <set>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "proto/ps.grpc.pb.h"
#include "ps/data_path.h"
#include "stratum/net/channel.h"
#include "stratum/net/host_port.h"
#include "stratum/ps/ps_client.h"
#include "stratum/tensor/tensor_proto.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.5}})");
const std::string kVariable = "w";
// The PS's own descriptor limit (soft and hard: it raises the soft one to the hard one).
constexpr int kPsDescriptors = 256;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// A line of /proc/<pid>/status in KiB, e.g. "VmHWM" (the peak resident memory).
int64_t StatusKib(int pid, absl::string_view field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, absl::StrCat(field, ":"))) continue;
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    int64_t kib = -1;
    if (words.size() >= 2 && absl::SimpleAtoi(words[1], &kib)) return kib;
  }
  return -1;
}

class PsOutsiderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The PS runs under a small descriptor limit, so that a flood can reach it.
    auto cluster =
        LocalCluster::Start({.num_workers = 1,
                             .num_ps = 1,
                             .not_started = {{"worker", 0}},
                             .wrapper_by_task = {{{"ps", 0},
                                                  {"/bin/sh", "-c",
                                                   absl::StrCat("ulimit -n ", kPsDescriptors,
                                                                " && exec \"$0\" \"$@\"")}}},
                             .forward_output = false});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    coordinator_ = std::make_unique<PsClient>("ps:0", Address(), options_);
    ASSERT_OK(
        coordinator_->CreateVariables({{"w", Tensor::FromVector<float>({4}, {1, 2, 3, 4})}}, kSgd));
    auto stub = proto::ParameterServer::NewStub(MakeChannel(Address()));
    grpc::ClientContext context;
    const grpc::Status asked = stub->DataPath(&context, proto::DataPathRequest(), &data_path_);
    ASSERT_TRUE(asked.ok()) << asked.error_message();
    ASSERT_GT(data_path_.tcp_port(), 0);
  }

  std::string Address() const { return cluster_->Address({"ps", 0}); }
  int PsPid() const { return cluster_->Pid({"ps", 0}); }

  // The PS still serves its coordinator, over gRPC and over its data path.
  void ExpectServing() {
    absl::StatusOr<std::vector<Tensor>> pulled = coordinator_->Pull({"w"});
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_TRUE((*pulled)[0].BitwiseEqual(Tensor::FromVector<float>({4}, {1, 2, 3, 4})));
    PsDataClient data("ps:0", "127.0.0.1",
                      {.tcp_port = data_path_.tcp_port(), .token = data_path_.token()},
                      {.shared_memory = false});
    pulled = data.Pull({"w"});
    ASSERT_TRUE(pulled.ok()) << pulled.status();
  }

  // A connection to the data path that has said hello and read the PS's reply.
  Socket Hello(Socket socket, bool offer_shared_memory) {
    data_wire::Hello hello;
    hello.token = data_path_.token();
    hello.offer_shared_memory = offer_shared_memory ? 1 : 0;
    EXPECT_OK(socket.Send({{&hello, sizeof(hello)}}, Soon()));
    data_wire::HelloReply reply;
    EXPECT_OK(socket.Receive(&reply, sizeof(reply), Soon()));
    EXPECT_EQ(reply.code, 0u);
    EXPECT_EQ(reply.shared_memory, offer_shared_memory ? 1u : 0u);
    return socket;
  }

  // Sends a frame and reads the PS's answer: its status, with the message the PS wrote.
  absl::Status Exchange(Socket& socket, data_wire::FrameHeader header,
                        const data_wire::RequestMeta& meta, int fd_to_pass = -1) {
    const std::string encoded = data_wire::EncodeRequestMeta(meta);
    header.magic = data_wire::kRequestMagic;
    header.id = 1;
    header.timeout_ms = 10000;
    header.meta_bytes = static_cast<uint32_t>(encoded.size());
    STRATUM_RETURN_IF_ERROR(socket.Send(
        {{&header, sizeof(header)}, {const_cast<char*>(encoded.data()), encoded.size()}}, Soon(),
        fd_to_pass));
    data_wire::FrameHeader answer;
    STRATUM_RETURN_IF_ERROR(socket.Receive(&answer, sizeof(answer), Soon()));
    std::string meta_bytes(answer.meta_bytes, '\0');
    STRATUM_RETURN_IF_ERROR(socket.Receive(meta_bytes.data(), meta_bytes.size(), Soon()));
    absl::StatusOr<data_wire::ResponseMeta> parsed =
        data_wire::ParseResponseMeta(meta_bytes, data_wire::Limits());
    if (!parsed.ok()) return parsed.status();
    return absl::Status(static_cast<absl::StatusCode>(answer.op_or_code), parsed->message);
  }

  const PsClientOptions options_{.timeout = absl::Seconds(10)};
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<PsClient> coordinator_;
  proto::DataPathResponse data_path_;
};

// Case 1: a raw pull that lists the variable 10,000 times (the PS answered with gigabytes,
// or aborted with std::bad_alloc) is refused, and costs the PS no memory.
TEST_F(PsOutsiderTest, APullThatNamesAVariable10000TimesIsRefused) {
  absl::StatusOr<Socket> connected = ConnectTcp("127.0.0.1", data_path_.tcp_port(), Soon());
  ASSERT_TRUE(connected.ok()) << connected.status();
  Socket socket = Hello(*std::move(connected), /*offer_shared_memory=*/false);
  data_wire::TensorRef read_w;
  read_w.name = kVariable;
  read_w.read = true;
  data_wire::RequestMeta meta;
  meta.tensors.assign(10000, read_w);
  data_wire::FrameHeader header;
  header.op_or_code = static_cast<uint32_t>(data_wire::Op::kPull);
  const absl::Status answer = Exchange(socket, header, meta);
  EXPECT_EQ(answer.code(), absl::StatusCode::kInvalidArgument) << answer;
  EXPECT_THAT(std::string(answer.message()), HasSubstr("names variable \"w\" more than once"));
  EXPECT_LT(StatusKib(PsPid(), "VmHWM"), 256 << 10);
  ExpectServing();
}

// Case 2: a 16-byte gRPC push whose tensor declares 2^29 elements and carries none is
// refused before anything is allocated (it zero-filled 2 GiB).
TEST_F(PsOutsiderTest, AGrpcPushThatDeclaresGigabytesItDoesNotCarryCostsNothing) {
  auto stub = proto::ParameterServer::NewStub(MakeChannel(Address()));
  proto::PushRequest request;
  proto::NamedTensor* gradient = request.add_gradients();
  gradient->set_name("w");
  gradient->mutable_tensor()->set_dtype(proto::DT_FLOAT);
  gradient->mutable_tensor()->add_dims(int64_t{1} << 29);
  EXPECT_LT(request.ByteSizeLong(), 32u);
  grpc::ClientContext context;
  proto::PushResponse response;
  const grpc::Status status = stub->Push(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_LT(StatusKib(PsPid(), "VmHWM"), 256 << 10);
  ExpectServing();
}

// Case 5: more idle connections than the PS has descriptors, on its data port and its
// gRPC port, do not stop it for good: once they close, it serves again by itself.
TEST_F(PsOutsiderTest, ADescriptorFloodIsSurvivedAndThePsRecoversByItself) {
  const int grpc_port = std::stoi(SplitHostPort(Address()).port);
  {
    std::vector<Socket> flood;
    // A port whose connect does not complete is full: the PS, out of descriptors, accepts
    // no more there and its listen queue is full (its SYNs are dropped), which is the
    // refusing this test allows; the flood goes on at the other port.
    std::set<int> full;
    for (int i = 0; i < kPsDescriptors + 100; ++i) {
      for (int port : {data_path_.tcp_port(), grpc_port}) {
        if (full.count(port) > 0) continue;
        absl::StatusOr<Socket> socket =
            ConnectTcp("127.0.0.1", port, absl::Now() + absl::Seconds(2));
        if (absl::IsDeadlineExceeded(socket.status())) {
          full.insert(port);
          continue;
        }
        ASSERT_TRUE(socket.ok()) << socket.status();
        flood.push_back(*std::move(socket));
      }
    }
    // The PS's accepts meet its limit and it says so (its gRPC server does, at least: the
    // data path closes a client's connections beyond 64 at once).
    EXPECT_TRUE(cluster_->WaitForOutput({"ps", 0}, "Too many open files", absl::Seconds(10)));
    // Meanwhile the PS lives (refusing is fine; crashing is not).
    EXPECT_NE(PsPid(), 0);
  }  // the flood closes
  absl::Status served;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    served = coordinator_->Pull({"w"}).status();
    if (!served.ok()) absl::SleepFor(absl::Milliseconds(200));
  } while (!served.ok() && absl::Now() < deadline);
  ASSERT_OK(served);
  ExpectServing();
  // The flood did reach the PS's limit.
  EXPECT_THAT(cluster_->Output({"ps", 0}), HasSubstr("Too many open files"));
}

// Case 7: a same-host client's 2 GiB shared segment is refused, not mapped (it was mapped
// with MAP_POPULATE and stayed pinned after the client left).
TEST_F(PsOutsiderTest, AHugeSharedSegmentIsNotMapped) {
  ASSERT_FALSE(data_path_.unix_socket().empty());
  absl::StatusOr<Socket> connected = ConnectUnix(data_path_.unix_socket(), Soon());
  ASSERT_TRUE(connected.ok()) << connected.status();
  Socket socket = Hello(*std::move(connected), /*offer_shared_memory=*/true);
  // Sealed as the PS wants it (an unsealed one is refused before its size is looked at).
  const int memfd = memfd_create("outsider", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(ftruncate(memfd, int64_t{2} << 30), 0);  // sparse: costs this test nothing
  ASSERT_EQ(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  data_wire::TensorRef gradient;
  gradient.name = kVariable;
  gradient.shape = Shape({4});
  gradient.location = data_wire::Location::kShared;
  data_wire::RequestMeta meta;
  meta.tensors = {gradient};
  data_wire::FrameHeader header;
  header.op_or_code = static_cast<uint32_t>(data_wire::Op::kPush);
  header.flags = data_wire::kNewSegment;
  const absl::Status answer = Exchange(socket, header, meta, memfd);
  close(memfd);
  EXPECT_EQ(answer.code(), absl::StatusCode::kResourceExhausted) << answer;
  EXPECT_THAT(std::string(answer.message()), HasSubstr("holds 2147483648 bytes, more than the"));
  EXPECT_LT(StatusKib(PsPid(), "VmRSS"), 256 << 10);
  // Nothing of it stays mapped.
  std::ifstream maps(absl::StrCat("/proc/", PsPid(), "/maps"));
  std::string line;
  while (std::getline(maps, line)) EXPECT_THAT(line, ::testing::Not(HasSubstr("outsider")));
  ExpectServing();
}

}  // namespace
}  // namespace stratum
