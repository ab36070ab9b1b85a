// The memory the parameter server's data path moves tensors through: buffers a
// connection reuses, and segments shared with a process of the same host. The sockets are
// stratum/net/socket.h.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace stratum {

// Aligned memory a connection reuses from call to call, so that a steady stream of
// same-sized tensors touches no new pages (page faults are most of the cost of moving
// fresh buffers on a VM). Grows, keeping what the caller asks to keep; never zero-fills.
class AlignedBuffer {
 public:
  char* data() const { return static_cast<char*>(memory_.get()); }
  size_t capacity() const { return capacity_; }
  // The owner to give tensors over this memory: they keep it alive even when a later
  // Reserve() moves the buffer to new memory.
  const std::shared_ptr<void>& owner() const { return memory_; }
  // At least `bytes` of capacity, with the first `keep` bytes preserved.
  void Reserve(size_t bytes, size_t keep = 0);
  void Release();

 private:
  std::shared_ptr<void> memory_;
  size_t capacity_ = 0;
};

// SharedSegment: memory two processes of one host both map (a sealed memfd), through
// which a same-host data connection moves tensors without the socket copies. The client
// creates it and passes its fd on the connection; the server maps what it was passed only
// when the fd is sealed against shrinking, so a client cannot make the server fault by
// truncating it. Not synchronized: the request/response order of a connection is.
class SharedSegment {
 public:
  // A new segment of `size` bytes, sealed at that size.
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Create(size_t size);
  // Maps a segment a peer passed (takes `fd` and closes it), its pages faulted in as they are
  // used. INVALID_ARGUMENT when it is not a memfd sealed against shrinking and growing;
  // RESOURCE_EXHAUSTED when it is larger than `max_size` (a peer cannot make this process map
  // more than its requests may carry).
  static absl::StatusOr<std::shared_ptr<SharedSegment>> Map(int fd, size_t max_size);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  // The fd to pass to the peer (-1 once Map()ped or released).
  int fd() const { return fd_; }
  void CloseFd();

 private:
  SharedSegment() = default;
  char* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

}  // namespace stratum
