// The frames of the parameter server's raw data path (data_path.h): what a PsDataClient
// and a PsDataServer send each other on a data connection, and the checks that turn a
// malformed, truncated or oversized frame into an error naming the problem, never a
// crash or a read out of bounds. Pure functions, no I/O; thread-safe.
//
// A connection starts with a Hello (client) and a HelloReply (server). Then each request
// is a FrameHeader (magic kRequest), `meta_bytes` of meta (the tensors' names, dtypes,
// shapes and where their bytes are), then `inline_bytes` of tensor bytes, back to back in
// the meta's order, for the tensors whose location is kInline. The answer is a FrameHeader
// (magic kResponse, the request's id, an absl::StatusCode), its meta (the error message,
// the variables' update counts, then per value its dtype, shape and location) and its
// inline bytes.
// Tensors located kShared lie in the shared-memory segment of the connection (same-host
// connections only) at `offset`. Integers are little-endian (static_assert'ed).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stratum/tensor/tensor.h"

namespace stratum::data_wire {

static_assert(std::endian::native == std::endian::little,
              "the data path's frames are little-endian, like the hosts it runs on");

inline constexpr uint32_t kHelloMagic = 0x31445053;     // "SPD1"
inline constexpr uint32_t kRequestMagic = 0x51525053;   // "SPRQ"
inline constexpr uint32_t kResponseMagic = 0x53525053;  // "SPRS"
inline constexpr uint32_t kVersion = 2;                 // 2: rows (row gradients and row reads)
// Where tensors start in a shared segment, and how segments grow.
inline constexpr uint64_t kAlignment = 64;

enum class Op : uint32_t { kPush = 1, kPull = 2 };
enum class Location : uint32_t { kInline = 0, kShared = 1 };

// Request flags.
inline constexpr uint32_t kPullAfter = 1;   // a push that also returns the updated values
inline constexpr uint32_t kNewSegment = 2;  // a shared segment's fd rides on this header
// Response flags.
inline constexpr uint32_t kClosing = 4;  // the server closes the connection after this answer

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kVersion;
  uint64_t token = 0;  // the PS's, from its DataPath RPC: proves the client asked it
  uint32_t offer_shared_memory = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(Hello) == 24);

struct HelloReply {
  uint32_t magic = kHelloMagic;
  uint32_t code = 0;  // absl::StatusCode; not OK closes the connection
  uint32_t shared_memory = 0;
  // The server closes a connection that carries no request for this long (0: never; a
  // server before this field sent 0). A client drops a pooled connection idle for half
  // of it, so that it never sends a request into a connection the server is closing.
  uint32_t idle_timeout_ms = 0;
};
static_assert(sizeof(HelloReply) == 16);

struct FrameHeader {
  uint32_t magic = 0;       // kRequestMagic or kResponseMagic
  uint32_t op_or_code = 0;  // a request's Op; a response's absl::StatusCode
  uint64_t id = 0;          // a response carries its request's
  uint32_t flags = 0;       // requests: kPullAfter, kNewSegment; responses: kClosing
  uint32_t timeout_ms = 0;  // requests: the client's deadline, from when it sent the header
  uint32_t meta_bytes = 0;
  uint32_t error_kind = 0;  // responses: the error's ErrorKind (stratum/util/error_kind.h)
  uint64_t inline_bytes = 0;
};
static_assert(sizeof(FrameHeader) == 40);

// One tensor of a frame.
struct TensorRef {
  std::string name;  // requests
  DType dtype = DType::kFloat32;
  Shape shape;
  Location location = Location::kInline;
  uint64_t offset = 0;  // kShared: where in the segment
  // Requests: a read asks for a variable's values and carries no bytes (every entry of a
  // pull is one; a push's come back after its gradients are applied). With has_rows, the
  // entry is rows `rows` of axis 0: a row gradient's, or the rows a read asks for.
  bool read = false;
  bool has_rows = false;
  std::vector<int64_t> rows;

  size_t byte_size() const {
    return read ? 0 : static_cast<size_t>(shape.num_elements()) * DTypeSize(dtype);
  }
};

struct Limits {
  uint64_t max_bytes = 256ull << 20;  // tensor bytes of one frame, as gRPC's message limit
  uint32_t max_tensors = 1 << 16;
  uint32_t max_meta_bytes = 16 << 20;
  uint32_t max_name_bytes = 1 << 12;
  uint32_t max_rank = 16;
};

struct RequestMeta {
  // A push's gradients, then its reads; a pull's reads (names, and rows where has_rows).
  std::vector<TensorRef> tensors;
};

struct ResponseMeta {
  std::string message;            // the error, when the header's code is not OK
  std::vector<int64_t> updates;   // per variable, the updates applied to it so far
  std::vector<TensorRef> values;  // pulled (or pushed and pulled) values, in request order
  // How large a shared segment would have held every value (0: none was needed); a
  // client grows its segment to this for the next request.
  uint64_t shared_bytes_wanted = 0;
};

std::string EncodeRequestMeta(const RequestMeta& meta);
std::string EncodeResponseMeta(const ResponseMeta& meta);

// INVALID_ARGUMENT naming the problem: a bad magic or version, an unknown op or dtype, a
// negative or overflowing dimension, a name or rank over the limits, meta that ends early
// or runs on. RESOURCE_EXHAUSTED when the frame is over `limits` in size.
absl::Status CheckHeader(const FrameHeader& header, uint32_t magic, const Limits& limits);
absl::StatusOr<RequestMeta> ParseRequestMeta(absl::string_view bytes, const Limits& limits);
absl::StatusOr<ResponseMeta> ParseResponseMeta(absl::string_view bytes, const Limits& limits);

// Checks where the tensors' bytes are: the kInline ones must add up to `inline_bytes`
// exactly, the kShared ones must lie inside a segment of `shared_bytes` (0: none) at
// offsets aligned for their dtype. Their total must be within limits.max_bytes.
absl::Status CheckPlacement(const std::vector<TensorRef>& tensors, uint64_t inline_bytes,
                            uint64_t shared_bytes, const Limits& limits);

// `offset` rounded up to kAlignment.
inline uint64_t Align(uint64_t offset) {
  return (offset + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace stratum::data_wire
