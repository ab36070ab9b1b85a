// A real PsDataServer, fed over a real connection: the input is what a client sends after
// its hello (frames, as many as it holds), over TCP or over the Unix socket with shared
// memory offered (the first byte picks), then the client's side closes and every answer is
// read. The server must answer or close, never crash, hang or run out of memory.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "nlohmann/json.hpp"
#include "ps/data_path.h"
#include "ps/data_wire.h"
#include "stratum/ps/variable_store.h"

namespace {

struct Server {
  stratum::VariableStore store;
  std::unique_ptr<stratum::PsDataServer> data;
};

// Variables of each kind a job has (a kernel, a bias, an embedding table), each with
// another optimizer, so that pushes reach every optimizer's update.
Server& TheServer() {
  static Server* server = [] {
    auto* made = new Server;
    const auto create = [&](const char* name, stratum::Shape shape, const char* optimizer) {
      stratum::Tensor initial(stratum::DType::kFloat32, shape);
      initial.Flat().setConstant(0.5f);
      if (!made->store.Create(name, initial, nlohmann::json::parse(optimizer)).ok()) std::abort();
    };
    create("dense/kernel", {8, 4}, R"({"class_name": "Adam", "config": {"learning_rate": 0.01}})");
    create("dense/bias", {4},
           R"({"class_name": "SGD", "config": {"learning_rate": 0.1, "momentum": 0.9}})");
    create("embedding", {64, 4}, R"({"class_name": "Adagrad", "config": {"learning_rate": 0.1}})");
    create("rms", {16}, R"({"class_name": "RMSprop", "config": {"learning_rate": 0.001}})");
    stratum::PsDataServerOptions options;
    options.limits.max_bytes = 1 << 20;  // small, so that the fuzzer meets the limits
    options.max_request_time = absl::Seconds(5);
    options.hello_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<stratum::PsDataServer>> started =
        stratum::PsDataServer::Start(made->store, options);
    if (!started.ok()) std::abort();
    made->data = *std::move(started);
    return made;
  }();
  return *server;
}

[[noreturn]] void Fail(const char* what) {
  std::perror(what);
  std::abort();
}

// A connection to the server; closing it resets it (no TIME_WAIT), so that thousands of
// inputs a second do not run the host out of ephemeral ports.
int Connect(const stratum::DataPathEndpoint& endpoint, bool unix_socket) {
  if (unix_socket) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, endpoint.unix_name.data(), endpoint.unix_name.size());
    const socklen_t length = offsetof(sockaddr_un, sun_path) + 1 + endpoint.unix_name.size();
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), length) != 0)
      Fail("data_path_fuzz: connecting to the Unix socket");
    return fd;
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const linger reset{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(endpoint.tcp_port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    Fail("data_path_fuzz: connecting over TCP");
  }
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Server& server = TheServer();
  const stratum::DataPathEndpoint& endpoint = server.data->endpoint();
  const bool unix_socket = (data[0] & 1) != 0 && !endpoint.unix_name.empty();
  const int fd = Connect(endpoint, unix_socket);
  stratum::data_wire::Hello hello;
  hello.token = endpoint.token;
  hello.offer_shared_memory = unix_socket ? 1 : 0;
  std::string sent(reinterpret_cast<const char*>(&hello), sizeof(hello));
  sent.append(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Sends while reading answers (a server that answers a large pull before reading on
  // must not deadlock with this client), then closes the sending side.
  size_t offset = 0;
  bool write_open = true;
  char buffer[1 << 16];
  // libFuzzer's timers interrupt system calls (EINTR): those are tried again.
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    pollfd watch{fd, static_cast<short>(POLLIN | (write_open ? POLLOUT : 0)), 0};
    const int ready = poll(&watch, 1, 1000);
    if (ready < 0 && errno != EINTR) Fail("data_path_fuzz: poll");
    if (ready <= 0) {
      // The server's deadlines are 5 s: 30 s without an end is a hang.
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
        Fail("data_path_fuzz: the server neither answered nor closed for 30 s");
      }
      continue;
    }
    if ((watch.revents & POLLOUT) != 0 && write_open) {
      const ssize_t n = send(fd, sent.data() + offset, sent.size() - offset, MSG_NOSIGNAL);
      if (n > 0) offset += static_cast<size_t>(n);
      if ((n < 0 && errno != EINTR) || offset == sent.size()) {
        shutdown(fd, SHUT_WR);
        write_open = false;
      }
    }
    if ((watch.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n == 0 || (n < 0 && errno != EINTR)) break;  // the server closed: every answer is read
    }
  }
  close(fd);
  return 0;
}
