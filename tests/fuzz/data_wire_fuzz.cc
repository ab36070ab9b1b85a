// The parameter server's raw data-path frames, parsed as a PS (requests) and a worker
// (responses) parse them: a 40-byte header, then its meta. Any bytes are a frame whose
// tensors lie inside the frame's limits, or an error; a request that parses encodes back
// to the very same bytes.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include "absl/strings/string_view.h"

#include "ps/data_wire.h"

namespace wire = stratum::data_wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  wire::FrameHeader header;
  if (size < sizeof(header)) return 0;
  std::memcpy(&header, data, sizeof(header));
  const absl::string_view meta(reinterpret_cast<const char*>(data) + sizeof(header),
                               size - sizeof(header));
  wire::Limits limits;
  limits.max_bytes = 1 << 20;  // small, so that the fuzzer meets the limits
  limits.max_tensors = 64;
  const uint64_t shared_bytes = header.id & 0xffffff;  // some inputs have a segment

  (void)wire::CheckHeader(header, wire::kRequestMagic, limits);
  absl::StatusOr<wire::RequestMeta> request = wire::ParseRequestMeta(meta, limits);
  if (request.ok()) {
    if (wire::EncodeRequestMeta(*request) != meta) std::abort();  // not canonical
    absl::Status placed =
        wire::CheckPlacement(request->tensors, header.inline_bytes, shared_bytes, limits);
    if (placed.ok()) {
      // Placement promises every tensor's bytes lie inside the frame or the segment.
      uint64_t inline_total = 0;
      for (const wire::TensorRef& tensor : request->tensors) {
        if (tensor.location == wire::Location::kInline) {
          inline_total += tensor.byte_size();
        } else if (tensor.offset + tensor.byte_size() > shared_bytes) {
          std::abort();
        }
      }
      if (inline_total != header.inline_bytes) std::abort();
    }
  }
  (void)wire::CheckHeader(header, wire::kResponseMagic, limits);
  absl::StatusOr<wire::ResponseMeta> response = wire::ParseResponseMeta(meta, limits);
  if (response.ok()) {
    if (wire::EncodeResponseMeta(*response) != meta) std::abort();
    (void)wire::CheckPlacement(response->values, header.inline_bytes, shared_bytes, limits);
  }
  return 0;
}
