// Transport: how the collectives of a multi-worker job move bytes between ranks. The
// algorithms (ring all-reduce, broadcast, all-gather) see only this interface, never a
// socket, so TCP, an in-process fake and (on GPUs) NCCL swap freely, as in Gloo.
//
// A transport connects `size` ranks; rank r is this process. Messages are framed: each
// Exchange sends one message and receives one, and a message whose length differs from
// what the receiver expects is an error (the ranks disagree about what they reduce), not
// a silent desynchronisation. Every call has a deadline; when it passes, or when a peer
// closes its connection, the error names the peer.
//
// Thread safety: one collective at a time per transport (the calls of one rank are made
// in program order by one thread); distinct transports are independent.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stratum {

// One message to send to `peer`; peer -1 (or bytes 0 with peer -1) sends nothing.
struct SendSpan {
  int peer = -1;
  const void* data = nullptr;
  size_t bytes = 0;
};

// One message to receive from `peer` into `data` (exactly `bytes`); peer -1 receives
// nothing. `on_received(n)` is called as bytes land: bytes [0, n) are in place, so the
// caller can reduce them while the rest is still in flight.
//
// A nonzero `window` (a multiple of 4) makes `data` a ring of that many bytes: byte i of
// the message lands at data[i % window], and no call writes across the ring's end. The
// next bytes overwrite what landed before, so on_received (required then) must consume
// what it is given before it returns. A reduction uses this to receive a large message
// through a buffer small enough to stay in cache, instead of one as large as the message.
struct RecvSpan {
  int peer = -1;
  void* data = nullptr;
  size_t bytes = 0;
  std::function<void(size_t received)> on_received = nullptr;
  size_t window = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "worker:1 at 127.0.0.1:4567": how errors name a peer.
  virtual std::string PeerName(int rank) const = 0;

  // Sends `send` and receives `recv` at the same time (full duplex: neither waits for the
  // other, so two ranks can exchange large messages without deadlock). Errors:
  // DEADLINE_EXCEEDED naming the peer not yet done, UNAVAILABLE when a peer closed its
  // connection (it exited or crashed), DATA_LOSS for a message of the wrong length.
  virtual absl::Status Exchange(const SendSpan& send, const RecvSpan& recv,
                                absl::Time deadline) = 0;

  absl::Status Send(int peer, const void* data, size_t bytes, absl::Time deadline) {
    return Exchange({peer, data, bytes}, {}, deadline);
  }
  absl::Status Recv(int peer, void* data, size_t bytes, absl::Time deadline) {
    return Exchange({}, {peer, data, bytes}, deadline);
  }
};

// Where ranks publish and find each other's addresses before they connect (the
// coordination service's key-value store in a job; an in-memory map in tests).
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for `key`; DEADLINE_EXCEEDED naming the key when it never comes.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // OK, or why the peers will not come (in a job: the coordination service's cluster error,
  // set when a task stopped heartbeating or reported a failure). Collectives poll it while
  // they wait, to stop in seconds rather than at their timeout.
  virtual absl::Status cluster_error() const { return absl::OkStatus(); }
};

// Why a wait for `peer`'s `what` ("collective address") ended in `error`, worded for the
// user. Only a wait that timed out reads DEADLINE_EXCEEDED "worker:2 did not publish its
// collective address within 12.3s: is it running? (...)", with the time waited since
// `started` (the whole timeout when `deadline` passed); any other error (in a job: a peer
// failed or stopped, or the leader was lost) keeps its code and names its own cause:
// "stopped waiting for worker:2's collective address: <error>".
absl::Status RendezvousWaitError(const std::string& peer, const std::string& what,
                                 const absl::Status& error, absl::Time started,
                                 absl::Time deadline);

// A Rendezvous in memory, shared by the ranks of one process (tests, benchmarks).
std::shared_ptr<Rendezvous> NewInMemoryRendezvous();

// `size` transports connected to each other in memory; element r is rank r. Sends never
// block (messages queue); receives wait for their message. Close(r) on the group makes
// rank r look dead to the others (their receives from it fail), for fault tests.
class InProcessTransportGroup {
 public:
  static std::shared_ptr<InProcessTransportGroup> Create(int size);
  virtual ~InProcessTransportGroup() = default;
  virtual std::unique_ptr<Transport> TakeTransport(int rank) = 0;
  virtual void Close(int rank) = 0;
};

}  // namespace stratum
