// Collectives: all-reduce, broadcast and all-gather across the workers of a job, over a
// Transport. tf.distribute's CommunicationOptions choose the implementation (RING on CPU,
// NCCL for GPU tensors, AUTO) and how tensors are packed (bytes_per_pack); every call has
// the options' timeout as its deadline and fails naming the peer it waited for.
//
// Algorithms:
// - All-reduce, large: ring (reduce-scatter, then all-gather) over n balanced segments;
//   each step sends one segment to the right neighbour while receiving one from the left
//   and reduces it as it lands. Small (<= 64 KiB): every rank sends its buffer to every
//   other and sums the n buffers in rank order (one round trip for two ranks).
//   Either way one rank computes each element's sum and every rank ends with those same
//   bits, so mirrored variables stay identical across workers.
// - Broadcast: a chain from the root in 1 MiB chunks, pipelined.
// - All-gather: ring.
//
// Thread safety: one collective at a time (calls are made in the same order on every
// rank by one thread each).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "stratum/strategy/reduce.h"
#include "stratum/tensor/tensor.h"
#include "stratum/worker/collective/transport.h"

namespace stratum {

enum class CommunicationImplementation { kAuto, kRing, kNccl };

// "AUTO", "RING", "NCCL" (tf.distribute.experimental.CommunicationImplementation).
absl::StatusOr<CommunicationImplementation> CommunicationImplementationFromName(
    absl::string_view name);

struct CommunicationOptions {
  CommunicationImplementation implementation = CommunicationImplementation::kAuto;
  // Tensors of one all-reduce are packed into buffers of at most this many bytes (a
  // larger tensor goes alone); 0 packs them all together.
  int64_t bytes_per_pack = 0;
  // The deadline of each collective. A dead peer is noticed at once (its connection
  // closes); a stuck one when this passes.
  absl::Duration timeout = absl::Minutes(5);
};

class Collectives {
 public:
  // These collectives work on host memory (over the transport) whatever the implementation;
  // with NCCL, GPU gradients go through an NCCL group instead (nccl_across_workers.h).
  static absl::StatusOr<std::unique_ptr<Collectives>> Create(std::unique_ptr<Transport> transport,
                                                             const CommunicationOptions& options);

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  const CommunicationOptions& options() const { return options_; }
  Transport& transport() { return *transport_; }

  // In place: every rank's `data` becomes the SUM (or MEAN) over ranks.
  absl::Status AllReduce(ReduceOp op, float* data, size_t count);
  // In place over float32 tensors, packed by bytes_per_pack.
  absl::Status AllReduce(ReduceOp op, const std::vector<Tensor*>& tensors);
  // Every rank's `data` becomes the root's.
  absl::Status Broadcast(void* data, size_t bytes, int root);
  absl::Status Broadcast(const std::vector<Tensor*>& tensors, int root);
  // `output` (size() * bytes) holds every rank's `input`, in rank order.
  absl::Status AllGather(const void* input, size_t bytes, void* output);

 private:
  Collectives(std::unique_ptr<Transport> transport, const CommunicationOptions& options)
      : transport_(std::move(transport)), options_(options) {}

  absl::Status DirectAllReduce(float* data, size_t count, absl::Time deadline);
  absl::Status RingAllReduce(float* data, size_t count, absl::Time deadline);

  std::unique_ptr<Transport> transport_;
  CommunicationOptions options_;
  std::vector<float> scratch_;
  std::vector<float> pack_;
};

}  // namespace stratum
