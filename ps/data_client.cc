// PsDataClient (data_path.h): a pool of data connections to one PS; each call takes one,
// sends a frame from the tensors' own memory (or through the connection's shared segment)
// and receives the values into pooled buffers.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "data_path.h"
#include "spdlog/spdlog.h"
#include "stratum/util/error_kind.h"

namespace stratum {

using data_wire::FrameHeader;
using data_wire::Location;
using data_wire::Op;
using data_wire::TensorRef;

struct PsDataClient::Connection {
  Socket socket;
  bool shared_memory = false;
  std::shared_ptr<SharedSegment> segment;
  uint64_t pull_hint = 0;  // the shared bytes the last pull's values wanted
  bool closing = false;    // the PS said it closes the connection
  // When it went back to the pool, and how long the PS keeps it open without a request.
  absl::Time idle_since;
  absl::Duration idle_timeout = absl::InfiniteDuration();
};

// Memory for received values, handed out as tensors and taken back when the last copy of
// a tensor dies: a training loop that pulls the same variables over and over reuses
// memory that is already mapped.
class PsDataClient::BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  ~BufferPool() {
    for (auto& [size, memory] : free_) std::free(memory);
  }

  Tensor Take(DType dtype, const Shape& shape) {
    const size_t bytes = static_cast<size_t>(shape.num_elements()) * DTypeSize(dtype);
    const size_t size = data_wire::Align(std::max<size_t>(bytes, 1));
    void* memory = nullptr;
    {
      absl::MutexLock lock(&mutex_);
      if (auto it = free_.find(size); it != free_.end()) {
        memory = it->second;
        free_.erase(it);
        free_bytes_ -= size;
      }
    }
    if (memory == nullptr) memory = std::aligned_alloc(data_wire::kAlignment, size);
    if (memory == nullptr) throw std::bad_alloc();
    std::weak_ptr<BufferPool> pool = weak_from_this();
    std::shared_ptr<void> owner(memory, [pool, size](void* p) {
      if (std::shared_ptr<BufferPool> alive = pool.lock()) {
        alive->Give(p, size);
      } else {
        std::free(p);
      }
    });
    return Tensor::FromBuffer(dtype, shape, std::move(owner), memory);
  }

 private:
  void Give(void* memory, size_t size) {
    constexpr size_t kMaxFreeBytes = 512 << 20;
    constexpr size_t kMaxFreeBuffers = 64;
    {
      absl::MutexLock lock(&mutex_);
      if (free_bytes_ + size <= kMaxFreeBytes && free_.size() < kMaxFreeBuffers) {
        free_.emplace(size, memory);
        free_bytes_ += size;
        return;
      }
    }
    std::free(memory);
  }

  absl::Mutex mutex_;
  std::multimap<size_t, void*> free_ ABSL_GUARDED_BY(mutex_);
  size_t free_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

namespace {

size_t TotalBytes(const std::vector<Tensor>& tensors) {
  size_t total = 0;
  for (const Tensor& tensor : tensors) total += tensor.byte_size();
  return total;
}

std::string Describe(Op op, size_t entries, const std::vector<Tensor>& gradients) {
  if (op == Op::kPush) return absl::StrCat("push of ", TotalBytes(gradients), " bytes");
  return absl::StrCat("pull of ", entries, entries == 1 ? " variable" : " variables");
}

// Read entries for the rows `row_reads` names.
void AddRowReads(const std::vector<RowRead>& row_reads, std::vector<TensorRef>& entries) {
  for (const RowRead& read : row_reads) {
    TensorRef& entry = entries.emplace_back();
    entry.name = read.name;
    entry.read = true;
    entry.has_rows = true;
    entry.rows = read.rows;
  }
}

}  // namespace

PsDataClient::PsDataClient(std::string peer, std::string host, DataPathEndpoint endpoint,
                           PsDataClientOptions options)
    : peer_(std::move(peer)),
      host_(std::move(host)),
      endpoint_(std::move(endpoint)),
      options_(std::move(options)),
      buffers_(std::make_shared<BufferPool>()) {}

PsDataClient::~PsDataClient() = default;

std::string PsDataClient::transport() const {
  absl::MutexLock lock(&mutex_);
  return transport_;
}

absl::Status PsDataClient::Push(const std::vector<std::string>& names,
                                const std::vector<Tensor>& gradients, std::vector<Tensor>* pulled,
                                DataCallOutcome* outcome,
                                const std::vector<const std::vector<int64_t>*>& gradient_rows,
                                const std::vector<RowRead>& row_reads) {
  if (outcome != nullptr) *outcome = DataCallOutcome::kNotSent;
  if (names.size() != gradients.size() ||
      (!gradient_rows.empty() && gradient_rows.size() != gradients.size())) {
    return absl::InvalidArgumentError(absl::StrCat("a push with ", names.size(), " names, ",
                                                   gradients.size(), " gradients and ",
                                                   gradient_rows.size(), " row lists"));
  }
  if (pulled == nullptr && !row_reads.empty()) {
    return absl::InvalidArgumentError("a push with row reads needs somewhere to put them (pulled)");
  }
  std::vector<TensorRef> entries(names.size());
  size_t expected = row_reads.size();
  for (size_t i = 0; i < names.size(); ++i) {
    entries[i].name = names[i];
    if (!gradient_rows.empty() && gradient_rows[i] != nullptr) {
      entries[i].has_rows = true;
      entries[i].rows = *gradient_rows[i];
    } else if (pulled != nullptr) {
      ++expected;  // its value comes back
    }
  }
  AddRowReads(row_reads, entries);
  std::vector<Tensor> values;
  absl::Status status =
      Call(Op::kPush, std::move(entries), gradients, pulled != nullptr, expected, &values, outcome);
  if (status.ok() && pulled != nullptr) *pulled = std::move(values);
  return status;
}

absl::StatusOr<std::vector<Tensor>> PsDataClient::Pull(const std::vector<std::string>& names,
                                                       DataCallOutcome* outcome,
                                                       const std::vector<RowRead>& row_reads) {
  std::vector<TensorRef> entries(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    entries[i].name = names[i];
    entries[i].read = true;
  }
  AddRowReads(row_reads, entries);
  const size_t expected = entries.size();
  std::vector<Tensor> values;
  absl::Status status = Call(Op::kPull, std::move(entries), {}, false, expected, &values, outcome);
  if (!status.ok()) return status;
  return values;
}

absl::Status PsDataClient::Call(Op op, std::vector<TensorRef> entries,
                                const std::vector<Tensor>& gradients, bool pull_after,
                                size_t expected, std::vector<Tensor>* values,
                                DataCallOutcome* outcome) {
  DataCallOutcome ignored;
  if (outcome == nullptr) outcome = &ignored;
  *outcome = DataCallOutcome::kAnswered;
  if (const size_t bytes = TotalBytes(gradients); bytes > options_.limits.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        peer_, ": a push of ", bytes, " bytes is over the limit of ", options_.limits.max_bytes,
        " bytes: split the variable (a variable partitioner)"));
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  std::unique_ptr<Connection> connection;
  {
    absl::MutexLock lock(&mutex_);
    while (connection == nullptr && !idle_.empty()) {
      connection = std::move(idle_.back());
      idle_.pop_back();
      // Closed by the PS, or idle long enough that the PS may be closing it right now.
      if (!connection->socket.IdleAndOpen() ||
          absl::Now() - connection->idle_since > connection->idle_timeout / 2) {
        connection.reset();
      }
    }
  }
  if (connection == nullptr) {
    absl::StatusOr<std::unique_ptr<Connection>> made =
        Connect(std::min(deadline, absl::Now() + options_.connect_timeout));
    if (!made.ok()) {
      *outcome = DataCallOutcome::kNotSent;
      return made.status();
    }
    connection = *std::move(made);
  }
  bool answered = false;
  const size_t count = entries.size();
  absl::Status status = Exchange(*connection, op, std::move(entries), gradients, pull_after,
                                 expected, deadline, values, &answered);
  if (!answered) {
    *outcome = DataCallOutcome::kBroken;
    const std::string how = connection->shared_memory ? "shared memory" : "socket";
    const std::string what = Describe(op, count, gradients);
    if (absl::IsDeadlineExceeded(status)) {
      return absl::DeadlineExceededError(
          absl::StrCat(peer_, ": no answer within ", absl::FormatDuration(options_.timeout),
                       " to a ", what, " on the data path (", how, "): ", status.message()));
    }
    return absl::Status(
        status.code(),
        absl::StrCat(peer_, ": the data connection (", how, ") failed during a ", what, ": ",
                     status.message(), "; the parameter server may have stopped or restarted"));
  }
  if (!connection->closing) Release(std::move(connection));  // else the PS closes it now
  return status;
}

absl::StatusOr<std::unique_ptr<PsDataClient::Connection>> PsDataClient::Connect(
    absl::Time deadline) {
  auto connection = std::make_unique<Connection>();
  if (options_.shared_memory && !endpoint_.unix_name.empty()) {
    // Answers only on the PS's host (same network namespace); else NOT_FOUND, and TCP.
    absl::StatusOr<Socket> local = ConnectUnix(endpoint_.unix_name, deadline);
    if (local.ok()) connection->socket = *std::move(local);
  }
  if (!connection->socket.valid()) {
    absl::StatusOr<Socket> tcp = ConnectTcp(host_, endpoint_.tcp_port, deadline);
    if (!tcp.ok()) {
      return absl::Status(tcp.status().code(),
                          absl::StrCat(peer_, ": cannot open the data connection to ", host_, ":",
                                       endpoint_.tcp_port, ": ", tcp.status().message()));
    }
    connection->socket = *std::move(tcp);
    if (options_.tls != nullptr) {
      if (absl::Status secured =
              connection->socket.StartTls(*options_.tls, TlsRole::kClient, host_, deadline);
          !secured.ok()) {
        return absl::Status(
            secured.code(),
            absl::StrCat(peer_, ": cannot open the data connection: ", secured.message()));
      }
    }
  }
  data_wire::Hello hello;
  hello.token = endpoint_.token;
  hello.offer_shared_memory = connection->socket.is_unix() && options_.shared_memory ? 1 : 0;
  data_wire::HelloReply reply;
  absl::Status status = connection->socket.Send({{&hello, sizeof(hello)}}, deadline);
  if (status.ok()) status = connection->socket.Receive(&reply, sizeof(reply), deadline);
  if (status.ok() && (reply.magic != data_wire::kHelloMagic || reply.code != 0)) {
    status = absl::UnavailableError(
        absl::StrCat("it refused the connection (code ", reply.code,
                     "): it is not the parameter server that announced this data path"));
  }
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat(peer_, ": cannot open the data connection: ", status.message()));
  }
  connection->shared_memory = reply.shared_memory != 0;
  if (reply.idle_timeout_ms != 0)
    connection->idle_timeout = absl::Milliseconds(reply.idle_timeout_ms);
  const char* transport = connection->shared_memory  ? "shared memory"
                          : connection->socket.tls() ? "tcp+tls"
                                                     : "tcp";
  absl::MutexLock lock(&mutex_);
  if (transport_ != transport) spdlog::info("{}: data path over {}", peer_, transport);
  transport_ = transport;
  return connection;
}

void PsDataClient::Release(std::unique_ptr<Connection> connection) {
  connection->idle_since = absl::Now();
  absl::MutexLock lock(&mutex_);
  if (idle_.size() < options_.max_idle_connections) idle_.push_back(std::move(connection));
}

absl::Status PsDataClient::Exchange(Connection& connection, Op op, std::vector<TensorRef> entries,
                                    const std::vector<Tensor>& gradients, bool pull_after,
                                    size_t expected, absl::Time deadline,
                                    std::vector<Tensor>* values, bool* answered) {
  data_wire::RequestMeta meta;
  meta.tensors = std::move(entries);
  FrameHeader header;
  header.magic = data_wire::kRequestMagic;
  header.op_or_code = static_cast<uint32_t>(op);
  header.id = next_id_++;
  header.flags = pull_after ? data_wire::kPullAfter : 0;
  std::vector<iovec> parts(2);
  int fd_to_pass = -1;
  if (op == Op::kPush && connection.shared_memory) {
    // Gradients, then room for the values coming back, in the connection's segment.
    uint64_t at = 0;
    for (size_t i = 0; i < gradients.size(); ++i) {
      at = data_wire::Align(at);
      meta.tensors[i].offset = at;
      at += gradients[i].byte_size();
    }
    uint64_t needed = at;
    for (size_t i = 0; pull_after && i < gradients.size(); ++i) {
      if (!meta.tensors[i].has_rows) needed = data_wire::Align(needed) + gradients[i].byte_size();
    }
    // Rows read back: as large as the PS said the last answer wanted (a batch that reads
    // more rows than the last gets the rest inline, and the segment grows for the next).
    needed = std::max<uint64_t>(needed, connection.pull_hint);
    // A push of nothing (no tensors, or empty ones) before any answer sized a segment has no
    // bytes to place, and a segment of 0 bytes cannot be mapped: it goes inline, empty.
    if (needed > 0 && (connection.segment == nullptr || connection.segment->size() < needed)) {
      constexpr uint64_t kGrain = 1 << 20;
      absl::StatusOr<std::shared_ptr<SharedSegment>> segment =
          SharedSegment::Create((needed + kGrain - 1) / kGrain * kGrain);
      if (!segment.ok()) return segment.status();
      connection.segment = *std::move(segment);
      header.flags |= data_wire::kNewSegment;
      fd_to_pass = connection.segment->fd();
    }
    for (size_t i = 0; needed > 0 && i < gradients.size(); ++i) {
      meta.tensors[i].location = Location::kShared;
      if (gradients[i].byte_size() > 0) {
        std::memcpy(connection.segment->data() + meta.tensors[i].offset, gradients[i].raw_data(),
                    gradients[i].byte_size());
      }
    }
  } else if (op == Op::kPull && connection.shared_memory && connection.pull_hint > 0 &&
             (connection.segment == nullptr || connection.segment->size() < connection.pull_hint)) {
    absl::StatusOr<std::shared_ptr<SharedSegment>> segment =
        SharedSegment::Create(connection.pull_hint);
    if (!segment.ok()) return segment.status();
    connection.segment = *std::move(segment);
    header.flags |= data_wire::kNewSegment;
    fd_to_pass = connection.segment->fd();
  } else {
    for (const Tensor& gradient : gradients) {
      parts.push_back({const_cast<void*>(gradient.raw_data()), gradient.byte_size()});
      header.inline_bytes += gradient.byte_size();
    }
  }
  for (size_t i = 0; i < gradients.size(); ++i) {
    meta.tensors[i].dtype = gradients[i].dtype();
    meta.tensors[i].shape = gradients[i].shape();
  }
  const std::string encoded = data_wire::EncodeRequestMeta(meta);
  header.meta_bytes = static_cast<uint32_t>(encoded.size());
  header.timeout_ms = static_cast<uint32_t>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(deadline - absl::Now()), 1, std::numeric_limits<int32_t>::max()));
  parts[0] = {&header, sizeof(header)};
  parts[1] = {const_cast<char*>(encoded.data()), encoded.size()};
  if (absl::Status status = connection.socket.Send(std::move(parts), deadline, fd_to_pass);
      !status.ok()) {
    return status;
  }
  if (fd_to_pass >= 0) connection.segment->CloseFd();  // the PS holds its own now

  FrameHeader response;
  if (absl::Status status = connection.socket.Receive(&response, sizeof(response), deadline);
      !status.ok()) {
    return status;
  }
  connection.closing = (response.flags & data_wire::kClosing) != 0;
  if (response.magic != data_wire::kResponseMagic || response.id != header.id) {
    return absl::DataLossError(absl::StrCat("the answer is not a response to request ", header.id));
  }
  if (response.meta_bytes > options_.limits.max_meta_bytes ||
      response.inline_bytes > options_.limits.max_bytes) {
    return absl::DataLossError(absl::StrCat("the answer announces ", response.meta_bytes,
                                            " bytes of meta and ", response.inline_bytes,
                                            " of tensors, over the limits"));
  }
  std::string response_meta(response.meta_bytes, '\0');
  if (absl::Status status =
          connection.socket.Receive(response_meta.data(), response_meta.size(), deadline);
      !status.ok()) {
    return status;
  }
  absl::StatusOr<data_wire::ResponseMeta> parsed =
      data_wire::ParseResponseMeta(response_meta, options_.limits);
  if (!parsed.ok()) return absl::DataLossError(parsed.status().message());
  if (response.op_or_code != 0) {
    if (response.inline_bytes > 0) return absl::DataLossError("an error answer carries tensors");
    *answered = true;
    return WithErrorKind(absl::Status(static_cast<absl::StatusCode>(response.op_or_code),
                                      absl::StrCat(peer_, ": ", parsed->message)),
                         static_cast<ErrorKind>(response.error_kind));
  }
  if (parsed->values.size() != expected) {
    return absl::DataLossError(absl::StrCat("the answer carries ", parsed->values.size(),
                                            " values for ", expected, " variables"));
  }
  const uint64_t shared_size = connection.segment != nullptr ? connection.segment->size() : 0;
  if (absl::Status status = data_wire::CheckPlacement(parsed->values, response.inline_bytes,
                                                      shared_size, options_.limits);
      !status.ok()) {
    return absl::DataLossError(status.message());
  }
  values->clear();
  for (const TensorRef& ref : parsed->values) {
    Tensor value = buffers_->Take(ref.dtype, ref.shape);
    if (ref.location == Location::kInline) {
      if (absl::Status status =
              connection.socket.Receive(value.raw_data(), value.byte_size(), deadline);
          !status.ok()) {
        return status;
      }
    } else if (value.byte_size() > 0) {
      std::memcpy(value.raw_data(), connection.segment->data() + ref.offset, value.byte_size());
    }
    values->push_back(std::move(value));
  }
  connection.pull_hint = parsed->shared_bytes_wanted;
  *answered = true;
  return absl::OkStatus();
}

}  // namespace stratum
