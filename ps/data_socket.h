// DataSocket: one stream socket of the parameter server's data path (TCP, or a Unix socket
// between processes of one host), with I/O that always has a deadline. Blocking sockets
// with SO_RCVTIMEO/SO_SNDTIMEO and MSG_WAITALL move a whole tensor in one system call
// (fewer wake-ups than a poll loop, which matters on a small VM). Errors say what happened
// (closed by the peer, deadline, errno) and leave naming the peer to the caller.
//
// Thread safety: one thread uses a socket at a time, except Shutdown(), which any thread
// may call to make a blocked call return (a server stopping).
#pragma once

#include <sys/uio.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stratum {

class DataSocket {
 public:
  DataSocket() = default;
  explicit DataSocket(int fd, bool is_unix) : fd_(fd), is_unix_(is_unix) {}
  ~DataSocket();
  DataSocket(DataSocket&& other) noexcept;
  DataSocket& operator=(DataSocket&& other) noexcept;
  DataSocket(const DataSocket&) = delete;
  DataSocket& operator=(const DataSocket&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  bool is_unix() const { return is_unix_; }
  // Who is at the other end, for per-client limits: the peer's IP address, or "this host"
  // for a Unix socket ("unknown" when the socket cannot say).
  std::string PeerHost() const;

  // Sends every byte of `parts`. A Unix socket can pass `fd_to_pass` (>= 0) with them.
  // UNAVAILABLE when the peer closed, DEADLINE_EXCEEDED when `deadline` passed first.
  absl::Status Send(std::vector<iovec> parts, absl::Time deadline, int fd_to_pass = -1);
  // Receives exactly `size` bytes. On a Unix socket, file descriptors that came with them
  // are appended to `fds` (the caller owns them); elsewhere `fds` is ignored.
  // UNAVAILABLE when the peer closed (or Shutdown() was called), DEADLINE_EXCEEDED.
  absl::Status Receive(void* data, size_t size, absl::Time deadline,
                       std::vector<int>* fds = nullptr);
  // Reads and drops `size` bytes (a refused frame's rest), until `deadline`.
  absl::Status Discard(uint64_t size, absl::Time deadline);
  // An idle connection of a pool: false when the peer closed it (or sent something it
  // should not have), so it must not carry another request.
  bool IdleAndOpen() const;
  // Makes blocked and later calls fail at once; the fd stays open until destruction.
  void Shutdown();

 private:
  absl::Status SetTimeout(int option, absl::Time deadline);

  int fd_ = -1;
  bool is_unix_ = false;
};

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

// Connects to `host`:`port` (any address `host` resolves to), with TCP_NODELAY.
absl::StatusOr<DataSocket> ConnectTcp(const std::string& host, int port, absl::Time deadline);
// Connects to the Unix socket in the abstract namespace named `name` (no leading NUL).
// NOT_FOUND when nothing listens under that name in this network namespace: the server
// is on another host (or in another container).
absl::StatusOr<DataSocket> ConnectUnix(const std::string& name, absl::Time deadline);

// Listens on `host`:`port` (port 0: any free one; *bound_port says which).
absl::StatusOr<DataSocket> ListenTcp(const std::string& host, int port, int* bound_port);
// Listens on the abstract Unix socket `name` (no leading NUL).
absl::StatusOr<DataSocket> ListenUnix(const std::string& name);
// Waits for the next connection; UNAVAILABLE once the listener is shut down.
absl::StatusOr<DataSocket> Accept(const DataSocket& listener);

}  // namespace stratum
