// The ceilings under the parameter server's data path on this machine: a unary gRPC echo
// of N bytes (generic service, raw ByteBuffers, no protobuf) against a plain TCP socket
// moving the same bytes each way, between two processes on loopback. Prints round trips/s
// and GB/s (both directions) per size; no goal, these are what ps_bench's figures sit on.
//
//   build/bin/transport_bench [--seconds=2] [--sizes=4096,4194304,16777216]
//                             [--transports=grpc,tcp] [--socket_buffer=BYTES]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <string>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "stratum/net/free_port.h"
#include "stratum/util/flags.h"
#include "stratum/util/subprocess.h"

ABSL_FLAG(double, seconds, 2, "Seconds per measurement");
ABSL_FLAG(std::string, sizes, "4096,1048576,4194304,16777216", "Message sizes in bytes");
ABSL_FLAG(std::vector<std::string>, transports, std::vector<std::string>({"grpc", "tcp"}),
          "What to measure: grpc, tcp");
ABSL_FLAG(std::string, serve, "", "Internal: serve echoes (grpc or tcp) on --port");
ABSL_FLAG(int, port, 0, "Internal: the port to serve on");
ABSL_FLAG(int, socket_buffer, 0, "SO_SNDBUF and SO_RCVBUF of the TCP sockets (0: the kernel's)");

namespace stratum {
namespace {

constexpr int kMaxMessage = 256 << 20;

// Echoes each unary call's request bytes back.
class EchoService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { StartRead(&buffer_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
          return;
        }
        StartWriteAndFinish(&buffer_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      grpc::ByteBuffer buffer_;
    };
    return new Reactor;
  }
};

int ServeGrpc(int port) {
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(kMaxMessage);
  builder.SetMaxSendMessageSize(kMaxMessage);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  server->Wait();
  return 0;
}

void SetBuffers(int fd) {
  const int size = absl::GetFlag(FLAGS_socket_buffer);
  if (size <= 0) return;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

bool ReadFull(int fd, char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = read(fd, data, size);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool WriteFull(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Per connection: an 8-byte size, then that many bytes, echoed back; until EOF.
int ServeTcp(int port) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener, 16) != 0) {
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::vector<char> buffer;
  for (;;) {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SetBuffers(fd);
    uint64_t size = 0;
    while (ReadFull(fd, reinterpret_cast<char*>(&size), sizeof(size))) {
      buffer.resize(size);
      if (!ReadFull(fd, buffer.data(), size) || !WriteFull(fd, buffer.data(), size)) break;
    }
    close(fd);
  }
}

double MeasureGrpc(int port, size_t bytes, double seconds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessage);
  args.SetMaxSendMessageSize(kMaxMessage);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                           grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub stub(channel);
  std::vector<char> payload(bytes, 1);
  // The request points at `payload` without a copy, as a tensor's memory would be.
  grpc::Slice slice(payload.data(), payload.size(), grpc::Slice::STATIC_SLICE);
  grpc::ByteBuffer request(&slice, 1);
  auto call = [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/echo/Echo", grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status status) { done.set_value(status); });
    grpc::Status status = done.get_future().get();
    return status.ok() && response.Length() == bytes;
  };
  if (!call()) return -1;
  int64_t calls = 0;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(seconds)) {
    if (!call()) return -1;
    ++calls;
  }
  return static_cast<double>(calls) / absl::ToDoubleSeconds(absl::Now() - start);
}

double MeasureTcp(int port, size_t bytes, double seconds) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  SetBuffers(fd);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int attempt = 0; connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0;
       ++attempt) {
    if (attempt > 50) return -1;
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::vector<char> payload(bytes, 1), back(bytes);
  const uint64_t size = bytes;
  auto call = [&] {
    return WriteFull(fd, reinterpret_cast<const char*>(&size), sizeof(size)) &&
           WriteFull(fd, payload.data(), bytes) && ReadFull(fd, back.data(), bytes);
  };
  if (!call()) return -1;
  int64_t calls = 0;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(seconds)) {
    if (!call()) return -1;
    ++calls;
  }
  const double rate = static_cast<double>(calls) / absl::ToDoubleSeconds(absl::Now() - start);
  close(fd);
  return rate;
}

std::string SelfPath() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return std::string(path, static_cast<size_t>(std::max<ssize_t>(length, 0)));
}

int Run() {
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::vector<size_t> sizes;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t size = 0;
    if (!absl::SimpleAtoi(text, &size)) return 2;
    sizes.push_back(size);
  }
  for (const std::string& transport : absl::GetFlag(FLAGS_transports)) {
    absl::StatusOr<int> port = PickFreePort();
    if (!port.ok()) return 1;
    SubprocessOptions options;
    options.argv = {SelfPath(), "--serve=" + transport, absl::StrCat("--port=", *port),
                    absl::StrCat("--socket_buffer=", absl::GetFlag(FLAGS_socket_buffer))};
    options.forward_fd = -1;
    options.capture_output = true;
    auto server = Subprocess::Spawn(std::move(options));
    if (!server.ok()) return 1;
    while ((*server)->output().find("ready") == std::string::npos) {
      if ((*server)->Poll()) return 1;
      absl::SleepFor(absl::Milliseconds(10));
    }
    for (size_t bytes : sizes) {
      const double rate = transport == "grpc" ? MeasureGrpc(*port, bytes, seconds)
                                              : MeasureTcp(*port, bytes, seconds);
      const std::string setup =
          absl::StrCat(transport, " echo of ", bytes, " B between two processes on loopback");
      bench::PrintFigure(absl::StrCat(transport, "_echo_", bytes, "B"), rate, "round trips/s",
                         nullptr, "", setup);
      bench::PrintFigure(absl::StrCat(transport, "_echo_", bytes, "B_gbps"),
                         rate * 2 * static_cast<double>(bytes) / 1e9, "GB/s", nullptr, "", setup);
    }
    (*server)->Stop(absl::Seconds(2));
  }
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv,
                            "transport_bench: gRPC and raw TCP echo ceilings on loopback, as JSON");
  const std::string serve = absl::GetFlag(FLAGS_serve);
  if (serve == "grpc") return stratum::ServeGrpc(absl::GetFlag(FLAGS_port));
  if (serve == "tcp") return stratum::ServeTcp(absl::GetFlag(FLAGS_port));
  return stratum::Run();
}
