#include "stratum/worker/collective/collectives.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "stratum/util/metrics.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

constexpr size_t kDirectMaxBytes = 64 * 1024;
constexpr size_t kBroadcastChunkBytes = 1 << 20;
// The ring's reduce-scatter receives through a buffer this small, so the bytes the kernel
// copies in are still in cache when they are added (a segment-sized buffer, 16 MiB for
// 64 MiB over 4 workers, sends both the copy and the sum out to memory). Measured on
// loopback with 2 cores: CPU per all-reduce of 64 MiB over 4 processes down about 10%,
// which shows in busbw when the CPUs are busy (on an idle machine it is within noise).
constexpr size_t kReduceWindowBytes = 64 << 10;

// Prefixes what was being done to a transport error, keeping its code.
absl::Status Annotate(const absl::Status& status, const std::string& what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

void AddInto(float* sum, const float* part, size_t count) {
  for (size_t i = 0; i < count; ++i) sum[i] += part[i];
}

}  // namespace

absl::StatusOr<CommunicationImplementation> CommunicationImplementationFromName(
    absl::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  if (upper == "AUTO" || upper.empty()) return CommunicationImplementation::kAuto;
  if (upper == "RING") return CommunicationImplementation::kRing;
  if (upper == "NCCL") return CommunicationImplementation::kNccl;
  return absl::InvalidArgumentError(absl::StrCat("communication implementation \"", name,
                                                 "\" is unknown: use AUTO, RING or NCCL"));
}

absl::StatusOr<std::unique_ptr<Collectives>> Collectives::Create(
    std::unique_ptr<Transport> transport, const CommunicationOptions& options) {
  if (options.bytes_per_pack < 0 || options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("communication options need bytes_per_pack >= 0 and a positive timeout; got ",
                     options.bytes_per_pack, " and ", absl::FormatDuration(options.timeout)));
  }
  return std::unique_ptr<Collectives>(new Collectives(std::move(transport), options));
}

absl::Status Collectives::AllReduce(ReduceOp op, float* data, size_t count) {
  if (size() == 1) return absl::OkStatus();
  static Histogram& seconds = MetricsRegistry::Global().GetHistogram(
      "stratum_allreduce_seconds", "Time of one all-reduce across the workers.", SecondsBuckets());
  static Counter& reduced = MetricsRegistry::Global().GetCounter(
      "stratum_allreduce_bytes_total", "Bytes this worker all-reduced across the workers.");
  const absl::Time began = absl::Now();
  const absl::Time deadline = began + options_.timeout;
  const size_t bytes = count * sizeof(float);
  absl::Status status = bytes <= kDirectMaxBytes ? DirectAllReduce(data, count, deadline)
                                                 : RingAllReduce(data, count, deadline);
  seconds.Observe(absl::ToDoubleSeconds(absl::Now() - began));
  reduced.Add(static_cast<double>(bytes));
  STRATUM_RETURN_IF_ERROR(
      Annotate(status, absl::StrCat("all-reduce of ", bytes, " bytes over ", size(), " workers")));
  if (op == ReduceOp::kMean) {
    const float scale = 1.0f / static_cast<float>(size());
    for (size_t i = 0; i < count; ++i) data[i] *= scale;
  }
  return absl::OkStatus();
}

absl::Status Collectives::DirectAllReduce(float* data, size_t count, absl::Time deadline) {
  const int n = size();
  const int r = rank();
  scratch_.resize(count * static_cast<size_t>(n));
  auto buffer = [&](int rank) { return scratch_.data() + count * static_cast<size_t>(rank); };
  std::memcpy(buffer(r), data, count * sizeof(float));
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n;
    const int from = (r - k + n) % n;
    STRATUM_RETURN_IF_ERROR(transport_->Exchange(
        {to, data, count * sizeof(float)}, {from, buffer(from), count * sizeof(float)}, deadline));
  }
  // The same order on every rank, so the same bits.
  std::memcpy(data, buffer(0), count * sizeof(float));
  for (int rank = 1; rank < n; ++rank) AddInto(data, buffer(rank), count);
  return absl::OkStatus();
}

absl::Status Collectives::RingAllReduce(float* data, size_t count, absl::Time deadline) {
  const int n = size();
  const int r = rank();
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  std::vector<size_t> offset(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    const size_t length = count / n + (static_cast<size_t>(i) < count % n ? 1 : 0);
    offset[static_cast<size_t>(i) + 1] = offset[static_cast<size_t>(i)] + length;
  }
  auto begin = [&](int segment) { return offset[static_cast<size_t>(segment)]; };
  auto length = [&](int segment) {
    return offset[static_cast<size_t>(segment) + 1] - offset[static_cast<size_t>(segment)];
  };
  const size_t window = std::min(length(0), kReduceWindowBytes / sizeof(float));
  if (scratch_.size() < window) scratch_.resize(window);

  // Reduce-scatter: after n-1 steps this rank holds the whole sum of segment r+1.
  for (int step = 0; step < n - 1; ++step) {
    const int send_segment = (r - step + n) % n;
    const int recv_segment = (r - step - 1 + n) % n;
    float* target = data + begin(recv_segment);
    size_t reduced = 0;
    RecvSpan recv{left, scratch_.data(), length(recv_segment) * sizeof(float),
                  [&](size_t received) {
                    const size_t ready = received / sizeof(float);
                    while (reduced < ready) {
                      const size_t at = reduced % window;
                      const size_t run = std::min(ready - reduced, window - at);
                      AddInto(target + reduced, scratch_.data() + at, run);
                      reduced += run;
                    }
                  },
                  window * sizeof(float)};
    STRATUM_RETURN_IF_ERROR(transport_->Exchange(
        {right, data + begin(send_segment), length(send_segment) * sizeof(float)}, recv, deadline));
  }
  // All-gather: pass the finished segments around the ring.
  for (int step = 0; step < n - 1; ++step) {
    const int send_segment = (r + 1 - step + n) % n;
    const int recv_segment = (r - step + n) % n;
    STRATUM_RETURN_IF_ERROR(transport_->Exchange(
        {right, data + begin(send_segment), length(send_segment) * sizeof(float)},
        {left, data + begin(recv_segment), length(recv_segment) * sizeof(float)}, deadline));
  }
  return absl::OkStatus();
}

absl::Status Collectives::AllReduce(ReduceOp op, const std::vector<Tensor*>& tensors) {
  for (const Tensor* tensor : tensors) {
    if (tensor->dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("cannot all-reduce ", tensor->DebugString(),
                                                     ": only float32 tensors are reduced"));
    }
  }
  const size_t limit = options_.bytes_per_pack > 0 ? static_cast<size_t>(options_.bytes_per_pack)
                                                   : static_cast<size_t>(-1);
  size_t first = 0;
  while (first < tensors.size()) {
    // The pack: consecutive tensors while they fit (always at least one).
    size_t last = first + 1;
    size_t bytes = tensors[first]->byte_size();
    while (last < tensors.size() && bytes + tensors[last]->byte_size() <= limit) {
      bytes += tensors[last]->byte_size();
      ++last;
    }
    if (last == first + 1) {
      STRATUM_RETURN_IF_ERROR(AllReduce(op, tensors[first]->data<float>(),
                                        static_cast<size_t>(tensors[first]->num_elements())));
    } else {
      pack_.resize(bytes / sizeof(float));
      size_t at = 0;
      for (size_t i = first; i < last; ++i) {
        std::memcpy(pack_.data() + at, tensors[i]->raw_data(), tensors[i]->byte_size());
        at += static_cast<size_t>(tensors[i]->num_elements());
      }
      STRATUM_RETURN_IF_ERROR(AllReduce(op, pack_.data(), pack_.size()));
      at = 0;
      for (size_t i = first; i < last; ++i) {
        std::memcpy(tensors[i]->raw_data(), pack_.data() + at, tensors[i]->byte_size());
        at += static_cast<size_t>(tensors[i]->num_elements());
      }
    }
    first = last;
  }
  return absl::OkStatus();
}

absl::Status Collectives::Broadcast(void* data, size_t bytes, int root) {
  const int n = size();
  if (root < 0 || root >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not a rank of ", n));
  }
  if (n == 1) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + options_.timeout;
  const int position = (rank() - root + n) % n;  // along the chain root -> root+1 -> ...
  const int right = (rank() + 1) % n;
  const int left = (rank() - 1 + n) % n;
  const bool forwards = position < n - 1;
  char* bytes_data = static_cast<char*>(data);
  const size_t chunks =
      std::max<size_t>(1, (bytes + kBroadcastChunkBytes - 1) / kBroadcastChunkBytes);
  auto chunk = [&](size_t c) {
    const size_t begin = c * kBroadcastChunkBytes;
    return std::make_pair(bytes_data + begin,
                          std::min(bytes, begin + kBroadcastChunkBytes) - begin);
  };
  const std::string what = absl::StrCat("broadcast of ", bytes, " bytes from rank ", root);
  // Each step forwards the previous chunk while the next one arrives.
  for (size_t c = 0; c <= chunks; ++c) {
    SendSpan send;
    RecvSpan recv;
    const size_t send_chunk = position == 0 ? c : c - 1;
    if (forwards && (position == 0 ? c < chunks : c >= 1)) {
      auto [at, length] = chunk(send_chunk);
      send = {right, at, length};
    }
    if (position > 0 && c < chunks) {
      auto [at, length] = chunk(c);
      recv = {left, at, length};
    }
    STRATUM_RETURN_IF_ERROR(Annotate(transport_->Exchange(send, recv, deadline), what));
  }
  return absl::OkStatus();
}

absl::Status Collectives::Broadcast(const std::vector<Tensor*>& tensors, int root) {
  for (Tensor* tensor : tensors) {
    STRATUM_RETURN_IF_ERROR(Broadcast(tensor->raw_data(), tensor->byte_size(), root));
  }
  return absl::OkStatus();
}

absl::Status Collectives::AllGather(const void* input, size_t bytes, void* output) {
  const int n = size();
  const int r = rank();
  char* out = static_cast<char*>(output);
  if (bytes > 0) std::memcpy(out + bytes * static_cast<size_t>(r), input, bytes);
  const absl::Time deadline = absl::Now() + options_.timeout;
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  for (int step = 0; step < n - 1; ++step) {
    const int send_block = (r - step + n) % n;
    const int recv_block = (r - step - 1 + n) % n;
    STRATUM_RETURN_IF_ERROR(
        Annotate(transport_->Exchange({right, out + bytes * static_cast<size_t>(send_block), bytes},
                                      {left, out + bytes * static_cast<size_t>(recv_block), bytes},
                                      deadline),
                 absl::StrCat("all-gather of ", bytes, " bytes per worker")));
  }
  return absl::OkStatus();
}

}  // namespace stratum
