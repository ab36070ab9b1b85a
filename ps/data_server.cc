// PsDataServer (data_path.h): a thread per data connection; each reads a whole frame,
// checks it, applies it to the VariableStore and answers.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "data_path.h"
#include "stratum/ps/ps_metrics.h"
#include "stratum/util/error_kind.h"

namespace stratum {

using data_wire::FrameHeader;
using data_wire::Location;
using data_wire::Op;
using data_wire::TensorRef;

struct PsDataServer::Connection {
  Socket socket;
  std::string peer;  // Socket::PeerHost
  std::thread thread;
  std::atomic<bool> done{false};
  bool busy = false;  // guarded by the server's mutex_
  bool shared_memory = false;
  std::shared_ptr<SharedSegment> segment;
  AlignedBuffer received;  // inline gradients
  AlignedBuffer to_send;   // inline values
};

namespace {

uint64_t RandomToken() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// Sends a response: header, meta, and `inline_bytes` from `inline_data`.
absl::Status Respond(Socket& socket, uint64_t id, const absl::Status& status,
                     data_wire::ResponseMeta meta, const char* inline_data, uint64_t inline_bytes,
                     absl::Time deadline, bool closing = false) {
  meta.message = std::string(status.message());
  const std::string encoded = data_wire::EncodeResponseMeta(meta);
  FrameHeader header;
  header.magic = data_wire::kResponseMagic;
  header.op_or_code = static_cast<uint32_t>(status.code());
  header.error_kind = static_cast<uint32_t>(ErrorKindOf(status));
  header.id = id;
  header.flags = closing ? data_wire::kClosing : 0;
  header.meta_bytes = static_cast<uint32_t>(encoded.size());
  header.inline_bytes = inline_bytes;
  return socket.Send({{&header, sizeof(header)},
                      {const_cast<char*>(encoded.data()), encoded.size()},
                      {const_cast<char*>(inline_data), inline_bytes}},
                     deadline);
}

absl::Status RespondError(Socket& socket, uint64_t id, const absl::Status& status,
                          absl::Time deadline, bool closing = false) {
  return Respond(socket, id, status, {}, nullptr, 0, deadline, closing);
}

// Where each value of a response goes: the shared segment while it has room, else the
// inline bytes. Tracks how large a segment would have held them all.
class ValuePlacer {
 public:
  // `shared_memory`: the connection could have a segment (it may not have one yet).
  ValuePlacer(bool shared_memory, SharedSegment* segment, uint64_t shared_start,
              AlignedBuffer& inline_buffer)
      : shared_memory_(shared_memory),
        segment_(segment),
        wanted_(data_wire::Align(shared_start)),
        inline_(inline_buffer) {}

  void* Place(const VariableInfo& info, TensorRef* ref) {
    const uint64_t bytes = static_cast<uint64_t>(info.shape.num_elements()) * DTypeSize(info.dtype);
    ref->dtype = info.dtype;
    ref->shape = info.shape;
    const uint64_t at = data_wire::Align(wanted_);
    wanted_ = at + bytes;
    if (segment_ != nullptr && wanted_ <= segment_->size()) {
      ref->location = Location::kShared;
      ref->offset = at;
      return segment_->data() + at;
    }
    ref->location = Location::kInline;
    ref->offset = 0;
    inline_.Reserve(inline_bytes_ + bytes, inline_bytes_);
    void* out = inline_.data() + inline_bytes_;
    inline_bytes_ += bytes;
    return out;
  }

  uint64_t inline_bytes() const { return inline_bytes_; }
  uint64_t shared_wanted() const { return shared_memory_ ? wanted_ : 0; }

 private:
  bool shared_memory_;
  SharedSegment* segment_;
  uint64_t wanted_;
  AlignedBuffer& inline_;
  uint64_t inline_bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PsDataServer>> PsDataServer::Start(VariableStore& store,
                                                                  PsDataServerOptions options) {
  std::unique_ptr<PsDataServer> server(new PsDataServer(store, std::move(options)));
  const PsDataServerOptions& opts = server->options_;
  int port = 0;
  absl::StatusOr<Socket> tcp = ListenTcp(opts.host, opts.port, &port);
  if (!tcp.ok()) {
    return absl::Status(
        tcp.status().code(),
        absl::StrCat("the parameter server's data path cannot listen: ", tcp.status().message(),
                     ": it listens on the host of the task's address (or of --listen_address), "
                     "which must be an address of this machine"));
  }
  server->tcp_listener_ = *std::move(tcp);
  server->endpoint_.tcp_port = port;
  server->endpoint_.token = RandomToken();
  server->endpoint_.max_bytes = opts.limits.max_bytes;
  if (opts.shared_memory) {
    const std::string name = absl::StrCat("stratum-ps-data-", getpid(), "-",
                                          absl::Hex(server->endpoint_.token, absl::kZeroPad16));
    absl::StatusOr<Socket> unix_listener = ListenUnix(name);
    if (unix_listener.ok()) {
      server->unix_listener_ = *std::move(unix_listener);
      server->endpoint_.unix_name = name;
    } else {
      spdlog::warn("data path: no shared memory for same-host workers ({}); they use TCP",
                   std::string(unix_listener.status().message()));
    }
  }
  PsDataServer* raw = server.get();
  server->acceptors_.emplace_back([raw] { raw->AcceptLoop(&raw->tcp_listener_); });
  if (server->unix_listener_.valid()) {
    server->acceptors_.emplace_back([raw] { raw->AcceptLoop(&raw->unix_listener_); });
  }
  return server;
}

PsDataServer::PsDataServer(VariableStore& store, PsDataServerOptions options)
    : store_(store), options_(std::move(options)) {}

PsDataServer::~PsDataServer() { Shutdown(); }

void PsDataServer::AcceptLoop(const Socket* listener) {
  absl::Duration backoff = absl::Milliseconds(10);
  bool said = false;
  for (;;) {
    absl::StatusOr<Socket> socket = Accept(*listener);
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;
    ReapFinished();
    if (socket.ok()) ++accept_counts_.accepted;
    if (absl::IsResourceExhausted(socket.status())) {
      ++accept_counts_.exhausted;
      // A flood of connections (or a small descriptor limit): what ended is reaped above;
      // wait a little for more to end, and accept again, so that the data path recovers by
      // itself once the flood stops.
      if (!said) {
        spdlog::warn("data path: {} with {} connections open; accepting again as they end",
                     std::string(socket.status().message()), connections_.size());
      }
      said = true;
      mutex_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
      backoff = std::min(backoff * 2, absl::Seconds(1));
      continue;
    }
    if (!socket.ok()) {
      spdlog::error("data path: {}; no more data connections are accepted",
                    std::string(socket.status().message()));
      return;
    }
    if (said) spdlog::info("data path: accepting connections again");
    said = false;
    backoff = absl::Milliseconds(10);
    if (connections_.size() >= options_.max_connections) {
      // Over the cap: refused at once (closed), so that idle connections cannot take every
      // descriptor of the process (its gRPC server needs some too).
      spdlog::warn(
          "data path: {} connections are open, the most it keeps: a new one is "
          "closed",
          connections_.size());
      continue;  // `socket` closes here
    }
    std::string peer = socket->PeerHost();
    const size_t from_peer = static_cast<size_t>(
        std::count_if(connections_.begin(), connections_.end(),
                      [&peer](const auto& open) { return !open->done && open->peer == peer; }));
    if (from_peer >= options_.max_connections_per_client) {
      // Said once a second at most: a flood would otherwise flood the log too.
      const absl::Time now = absl::Now();
      if (now - last_client_cap_warning_ >= absl::Seconds(1)) {
        last_client_cap_warning_ = now;
        spdlog::warn(
            "data path: {} has {} connections open, the most one client keeps: a new one is "
            "closed",
            peer, from_peer);
      }
      continue;  // `socket` closes here
    }
    auto connection = std::make_unique<Connection>();
    connection->socket = *std::move(socket);
    connection->peer = std::move(peer);
    Connection* raw = connection.get();
    connections_.push_back(std::move(connection));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

PsDataServer::AcceptCounts PsDataServer::accept_counts() {
  absl::MutexLock lock(&mutex_);
  return accept_counts_;
}

bool PsDataServer::AwaitAccepts(const std::function<bool(const AcceptCounts&)>& reached,
                                absl::Duration timeout) {
  absl::MutexLock lock(&mutex_);
  auto holds = [this, &reached]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return reached(accept_counts_); };
  return mutex_.AwaitWithTimeout(absl::Condition(&holds), timeout);
}

void PsDataServer::ReapFinished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void PsDataServer::Shutdown() {
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_) return;
    stopping_ = true;
    tcp_listener_.Shutdown();
    unix_listener_.Shutdown();
    for (auto& connection : connections_) {
      if (!connection->busy) connection->socket.Shutdown();
    }
  }
  for (std::thread& acceptor : acceptors_) acceptor.join();
  // Calls in flight finish within the grace period, or their connections are cut.
  const absl::Time cut = absl::Now() + options_.shutdown_grace;
  for (bool finished = false; !finished;) {
    absl::SleepFor(absl::Milliseconds(2));
    absl::MutexLock lock(&mutex_);
    finished = absl::Now() > cut;
    bool all_done = true;
    for (auto& connection : connections_) all_done = all_done && connection->done;
    finished = finished || all_done;
    if (finished) {
      for (auto& connection : connections_) connection->socket.Shutdown();
    }
  }
  std::list<std::unique_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mutex_);
    connections.swap(connections_);
  }
  for (auto& connection : connections) connection->thread.join();
}

void PsDataServer::Serve(Connection* connection) {
  Socket& socket = connection->socket;
  const absl::Time deadline = absl::Now() + options_.hello_timeout;
  data_wire::Hello hello;
  data_wire::HelloReply reply;
  absl::Status secured;
  if (options_.tls != nullptr && !socket.is_unix()) {
    secured = socket.StartTls(*options_.tls, TlsRole::kServer, socket.PeerHost(), deadline);
    if (!secured.ok()) {
      spdlog::warn("refused a data connection from {}: {}", socket.PeerHost(),
                   std::string(secured.message()));
    }
  }
  if (secured.ok() && socket.Receive(&hello, sizeof(hello), deadline).ok()) {
    absl::Status refused;
    if (hello.magic != data_wire::kHelloMagic || hello.version != data_wire::kVersion) {
      refused = absl::InvalidArgumentError("not Stratum's data path, or another version");
    } else if (hello.token != endpoint_.token) {
      refused = absl::PermissionDeniedError("the token is not this parameter server's");
    }
    connection->shared_memory = refused.ok() && socket.is_unix() && hello.offer_shared_memory != 0;
    reply.code = static_cast<uint32_t>(refused.code());
    reply.shared_memory = connection->shared_memory ? 1 : 0;
    reply.idle_timeout_ms = static_cast<uint32_t>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(options_.idle_timeout), 1, std::numeric_limits<uint32_t>::max()));
    if (socket.Send({{&reply, sizeof(reply)}}, deadline).ok() && refused.ok()) {
      try {
        while (ServeOne(*connection)) {
        }
      } catch (const std::bad_alloc&) {
        // Nothing may escape this thread (it would abort the PS): the request is dropped
        // with its connection, and the client sees it closed.
        spdlog::warn(
            "a data-path request needed more memory than there is: its connection "
            "is closed");
      }
    }
  }
  socket.Shutdown();
  connection->done = true;
}

bool PsDataServer::ServeOne(Connection& connection) {
  Socket& socket = connection.socket;
  {
    absl::MutexLock lock(&mutex_);
    connection.busy = false;
    if (stopping_) return false;
  }
  FrameHeader header;
  std::vector<int> passed;  // file descriptors that came with the header: closed unless mapped
  const absl::Status received =
      socket.Receive(&header, sizeof(header), absl::Now() + options_.idle_timeout, &passed);
  auto close_passed = [&passed] {
    for (int fd : passed) close(fd);
    passed.clear();
  };
  if (!received.ok()) {
    close_passed();
    // The client went away between requests, sent nothing for idle_timeout (its pool
    // left this connection already), or we are stopping.
    return false;
  }
  bool stopping = false;
  {
    absl::MutexLock lock(&mutex_);
    stopping = stopping_;
    connection.busy = !stopping;
  }
  const absl::Duration asked =
      header.timeout_ms > 0 ? absl::Milliseconds(header.timeout_ms) : options_.max_request_time;
  const absl::Time deadline = absl::Now() + std::min(asked, options_.max_request_time);
  if (stopping) {
    close_passed();
    const absl::Status refused = absl::UnavailableError("the parameter server is shutting down");
    RespondError(socket, header.id, refused, deadline, /*closing=*/true).IgnoreError();
    return false;
  }
  // A frame that will not be applied: answer why, then read and drop the rest of it (the
  // client may still be sending, and reads the answer only when it is done), then close.
  auto refuse = [&](const absl::Status& status, uint64_t unread) {
    close_passed();
    if (RespondError(socket, header.id, status, deadline, /*closing=*/true).ok()) {
      socket.Discard(unread, deadline).IgnoreError();
    }
    return false;
  };
  if (absl::Status status =
          data_wire::CheckHeader(header, data_wire::kRequestMagic, options_.limits);
      !status.ok()) {
    // An oversized frame is drained up to a bound; a garbled header says nothing
    // trustworthy about what follows it.
    const uint64_t rest = uint64_t{header.meta_bytes} + header.inline_bytes;
    const uint64_t max_drain = std::max<uint64_t>(4 * options_.limits.max_bytes, 1ull << 30);
    const bool drain = absl::IsResourceExhausted(status) && rest <= max_drain;
    return refuse(status, drain ? rest : 0);
  }
  if ((header.flags & data_wire::kNewSegment) != 0) {
    if (!connection.shared_memory || passed.size() != 1) {
      return refuse(absl::InvalidArgumentError(absl::StrCat(
                        "the request announces a shared segment but carries ", passed.size(),
                        " file descriptors on a connection ",
                        connection.shared_memory ? "with" : "without", " shared memory")),
                    header.meta_bytes + header.inline_bytes);
    }
    // A request and its answer, each within the frame limit, with room for the client's
    // rounding and alignment (saturating: a limit near the top of size_t stays one).
    const size_t max_bytes = options_.limits.max_bytes;
    const size_t max_segment =
        max_bytes > (SIZE_MAX - (64u << 20)) / 2 ? SIZE_MAX : 2 * max_bytes + (64u << 20);
    absl::StatusOr<std::shared_ptr<SharedSegment>> segment =
        SharedSegment::Map(passed[0], max_segment);
    passed.clear();  // Map() owns the fd now
    if (!segment.ok()) return refuse(segment.status(), header.meta_bytes + header.inline_bytes);
    connection.segment = *std::move(segment);
  }
  close_passed();

  std::string meta_bytes(header.meta_bytes, '\0');
  if (!socket.Receive(meta_bytes.data(), meta_bytes.size(), deadline).ok()) return false;
  absl::StatusOr<data_wire::RequestMeta> meta =
      data_wire::ParseRequestMeta(meta_bytes, options_.limits);
  if (!meta.ok()) return refuse(meta.status(), header.inline_bytes);
  const Op op = static_cast<Op>(header.op_or_code);
  static Histogram& pull_seconds = PsRequestSeconds("pull", "data");
  static Histogram& push_seconds = PsRequestSeconds("push", "data");
  ScopedTimer timer(op == Op::kPull ? &pull_seconds : op == Op::kPush ? &push_seconds : nullptr);
  SharedSegment* segment = connection.segment.get();
  // A push's gradients (its entries that are not reads), and what the call answers with:
  // a pull's entries; a push's whole gradients' variables (kPullAfter), then its reads.
  std::vector<TensorRef> pushed;
  std::vector<const TensorRef*> answered;
  for (const TensorRef& ref : meta->tensors) {
    if (op == Op::kPush && !ref.read) pushed.push_back(ref);
  }
  if (op == Op::kPull) {
    for (const TensorRef& ref : meta->tensors) answered.push_back(&ref);
  } else {
    if ((header.flags & data_wire::kPullAfter) != 0) {
      for (const TensorRef& ref : meta->tensors) {
        if (!ref.read && !ref.has_rows) answered.push_back(&ref);
      }
    }
    for (const TensorRef& ref : meta->tensors) {
      if (ref.read) answered.push_back(&ref);
    }
  }
  if (op == Op::kPush) {
    if (absl::Status status = data_wire::CheckPlacement(
            pushed, header.inline_bytes, segment != nullptr ? segment->size() : 0, options_.limits);
        !status.ok()) {
      return refuse(status, header.inline_bytes);
    }
  } else if (header.inline_bytes != 0) {
    return refuse(absl::InvalidArgumentError("a pull carries tensor bytes"), header.inline_bytes);
  }

  // Receive the inline gradients, each at an aligned place of the reused buffer; nothing
  // is applied until the whole frame is in.
  std::vector<Tensor> gradients;
  uint64_t shared_end = 0;
  if (op == Op::kPush) {
    uint64_t needed = 0;
    for (const TensorRef& ref : pushed) {
      if (ref.location == Location::kInline) needed = data_wire::Align(needed) + ref.byte_size();
    }
    connection.received.Reserve(needed);
    uint64_t at = 0;
    for (const TensorRef& ref : pushed) {
      if (ref.location == Location::kShared) {
        gradients.push_back(Tensor::FromBuffer(ref.dtype, ref.shape,
                                               std::shared_ptr<void>(connection.segment),
                                               segment->data() + ref.offset));
        shared_end = std::max<uint64_t>(shared_end, ref.offset + ref.byte_size());
        continue;
      }
      at = data_wire::Align(at);
      char* into = connection.received.data() + at;
      if (!socket.Receive(into, ref.byte_size(), deadline).ok()) {
        return false;  // truncated: the client died or gave up; nothing was applied
      }
      gradients.push_back(
          Tensor::FromBuffer(ref.dtype, ref.shape, connection.received.owner(), into));
      at += ref.byte_size();
    }
  }

  // Apply, as PsService::Push does: all gradients checked before the first is applied,
  // and the values asked back checked before that.
  data_wire::ResponseMeta response;
  absl::Status status;
  if (!answered.empty()) {
    std::vector<std::string> names;
    std::vector<RowRead> row_reads;
    for (const TensorRef* ref : answered) {
      if (ref->has_rows) {
        row_reads.push_back({ref->name, ref->rows});
      } else {
        names.push_back(ref->name);
      }
    }
    status = store_.CheckPull(names, options_.limits.max_bytes, row_reads);
  }
  auto rows_of = [](const TensorRef& ref) { return ref.has_rows ? &ref.rows : nullptr; };
  if (op == Op::kPush && status.ok()) {
    std::vector<VariableStore::PushedGradient> applied;
    for (size_t i = 0; i < gradients.size(); ++i) {
      applied.push_back({&pushed[i].name, &gradients[i], rows_of(pushed[i])});
    }
    absl::StatusOr<std::vector<int64_t>> updates = store_.ApplyPush(applied);
    status = updates.status();
    if (updates.ok()) response.updates = *std::move(updates);
  }
  gradients.clear();
  ValuePlacer placer(connection.shared_memory, segment, shared_end, connection.to_send);
  for (size_t i = 0; status.ok() && i < answered.size(); ++i) {
    TensorRef& ref = response.values.emplace_back();
    absl::StatusOr<VariableInfo> info = store_.ReadInto(
        answered[i]->name, [&](const VariableInfo& info) { return placer.Place(info, &ref); },
        rows_of(*answered[i]));
    status = info.status();
    if (info.ok() && op == Op::kPull) response.updates.push_back(info->updates);
  }
  if (!status.ok()) {
    response = {};
    return RespondError(socket, header.id, status, deadline).ok();
  }
  response.shared_bytes_wanted = placer.shared_wanted();
  const bool sent = Respond(socket, header.id, absl::OkStatus(), std::move(response),
                            connection.to_send.data(), placer.inline_bytes(), deadline)
                        .ok();
  // A connection keeps its buffers for the next call, but not huge ones.
  constexpr size_t kKeep = 64 << 20;
  if (connection.received.capacity() > kKeep) connection.received.Release();
  if (connection.to_send.capacity() > kKeep) connection.to_send.Release();
  return sent;
}

}  // namespace stratum
