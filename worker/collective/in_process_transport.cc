// The in-memory Rendezvous and Transport: queues of messages between ranks of one process.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "stratum/worker/collective/transport.h"

namespace stratum {
namespace {

class InMemoryRendezvous : public Rendezvous {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mutex_);
    values_[key] = value;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mutex_);
    auto present = [this, &key]()
                       ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return values_.count(key) > 0; };
    if (!mutex_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("key \"", key, "\" was not set within ", absl::FormatDuration(timeout)));
    }
    return values_[key];
  }

 private:
  absl::Mutex mutex_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mutex_);
};

class Group : public InProcessTransportGroup, public std::enable_shared_from_this<Group> {
 public:
  explicit Group(int size) : size_(size), closed_(static_cast<size_t>(size), false) {}

  std::unique_ptr<Transport> TakeTransport(int rank) override;

  void Close(int rank) override {
    absl::MutexLock lock(&mutex_);
    closed_[static_cast<size_t>(rank)] = true;
  }

  int size() const { return size_; }

  absl::Status Post(int from, int to, const void* data, size_t bytes) {
    absl::MutexLock lock(&mutex_);
    if (closed_[static_cast<size_t>(from)]) {
      return absl::UnavailableError(absl::StrCat("rank ", from, " is closed"));
    }
    const char* begin = static_cast<const char*>(data);
    queues_[{from, to}].emplace_back(begin, begin + bytes);
    return absl::OkStatus();
  }

  absl::Status Take(int from, int to, const RecvSpan& recv, absl::Time deadline) {
    absl::MutexLock lock(&mutex_);
    std::deque<std::vector<char>>& queue = queues_[{from, to}];
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
      return !queue.empty() || closed_[static_cast<size_t>(from)];
    };
    if (!mutex_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out waiting for rank ", from, " to send"));
    }
    if (queue.empty()) {
      return absl::UnavailableError(
          absl::StrCat("rank ", from, " closed its connection: it exited or crashed"));
    }
    std::vector<char> message = std::move(queue.front());
    queue.pop_front();
    if (message.size() != recv.bytes) {
      return absl::DataLossError(absl::StrCat("rank ", from, " sent ", message.size(),
                                              " bytes where ", recv.bytes, " were expected"));
    }
    if (recv.window == 0) {
      if (!message.empty()) std::memcpy(recv.data, message.data(), message.size());
      if (recv.on_received) recv.on_received(message.size());
      return absl::OkStatus();
    }
    // Through the ring, one window at a time, as the TCP transport delivers it.
    size_t landed = 0;
    do {
      const size_t piece = std::min(recv.window, message.size() - landed);
      if (piece > 0) std::memcpy(recv.data, message.data() + landed, piece);
      landed += piece;
      recv.on_received(landed);
    } while (landed < message.size());
    return absl::OkStatus();
  }

 private:
  const int size_;
  absl::Mutex mutex_;
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> queues_ ABSL_GUARDED_BY(mutex_);
  std::vector<bool> closed_ ABSL_GUARDED_BY(mutex_);
};

class InProcessTransport : public Transport {
 public:
  InProcessTransport(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string PeerName(int rank) const override { return absl::StrCat("rank ", rank); }

  absl::Status Exchange(const SendSpan& send, const RecvSpan& recv, absl::Time deadline) override {
    if (send.peer >= 0) {
      absl::Status posted = group_->Post(rank_, send.peer, send.data, send.bytes);
      if (!posted.ok()) return posted;
    }
    if (recv.peer >= 0) return group_->Take(recv.peer, rank_, recv, deadline);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<Group> group_;
  int rank_;
};

std::unique_ptr<Transport> Group::TakeTransport(int rank) {
  return std::make_unique<InProcessTransport>(shared_from_this(), rank);
}

}  // namespace

std::shared_ptr<Rendezvous> NewInMemoryRendezvous() {
  return std::make_shared<InMemoryRendezvous>();
}

std::shared_ptr<InProcessTransportGroup> InProcessTransportGroup::Create(int size) {
  return std::make_shared<Group>(size);
}

}  // namespace stratum
