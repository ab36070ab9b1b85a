// PsWatcher: the coordinator's heartbeat to its parameter servers (PsClient::Watch, about
// every 0.5 s, one thread per PS), which keeps its claim on them (a PS refuses a coordinator
// that another took it over from: Lost()) and learns of their stops.
//
// A PS that got SIGTERM answers "stopping" and, when this coordinator saves checkpoints,
// serves on until it is told that a checkpoint begun after its signal is committed (its
// manifest written; its own shard file is not enough, the commit may fail). The training
// loop asks TakeStopping() for the stops to save for and saves at once; after each committed
// save, Committed() tells the stopping PSs at once, and every later heartbeat carries the
// newest committed save of its PS, so that one told in vain is told again. Per PS, a stop is
// one of its process incarnations: a PS restarted and signalled again is a new stop, even
// when no heartbeat saw it serving between the two. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"
#include "stratum/ps/sharded_variables.h"

namespace stratum {

struct PsWatcherOptions {
  // This coordinator writes checkpoints: a stopping PS waits for one (WatchRequest).
  bool saves_checkpoints = false;
  // Between two heartbeats to one PS; under the PSs' 2 s window for a gone coordinator.
  absl::Duration interval = absl::Milliseconds(500);
};

class PsWatcher {
 public:
  // `variables` (its PS clients) must outlive the watcher.
  PsWatcher(ShardedVariables& variables, PsWatcherOptions options);
  // Tells every PS that this coordinator is done with it: a stop need not wait for it.
  ~PsWatcher();
  PsWatcher(const PsWatcher&) = delete;
  PsWatcher& operator=(const PsWatcher&) = delete;

  // Claims every PS for this coordinator (stratum/ps/coordinator_lease.h) before variables
  // are created or re-seeded there, and starts the heartbeats that keep the claims. When a
  // PS refuses (another coordinator holds it), the ones claimed are released again.
  absl::Status Claim();

  // The parameter servers stopping for which no save was asked since their stop began and
  // none committed holds them ("ps:1, ps:0"), or "": the caller saves for them now.
  std::string TakeStopping();
  // A checkpoint was committed: `save_ids[t]` is PS t's save in it (SaveResponse.save_id),
  // `stopping` the PSs ("ps:1") whose save began after their signal. Those are told at once
  // (they go then) and need no save of their own.
  void Committed(const std::vector<uint64_t>& save_ids, const std::vector<std::string>& stopping);
  // The save asked for `tasks` (as TakeStopping named them) failed: TakeStopping names them
  // again, so that the next chance saves for them.
  void SaveFailed(const std::string& tasks);

  // FAILED_PRECONDITION once a PS refuses this coordinator (another one holds it now): then
  // this one must stop.
  absl::Status Lost();
  // Lost() after a heartbeat to every PS now, for what must not happen once the PSs are
  // another coordinator's (a save, setting a worker up again).
  absl::Status CheckHold();

 private:
  // What the heartbeats heard of one PS's stop.
  struct Stop {
    bool stopping = false;
    uint64_t incarnation = 0;  // the stopping PS process
    bool saved = false;        // it said a committed checkpoint holds its state
    bool asked = false;        // a save was asked for (or committed) since the stop began
  };

  // The heartbeat to one PS, on a thread of its own, so that a PS that does not answer
  // (1 s per try) does not delay the others' past the lease.
  void Run(int task);
  // One Watch of PS `task` that carries its newest committed save; notes the answer.
  absl::Status WatchOnce(int task, bool claim = false);
  // Notes PS `task`'s answer to a Watch that carried `committed_sent`.
  void Observed(int task, const proto::WatchResponse& answer, uint64_t committed_sent);
  // Notes a heartbeat refused because another coordinator holds the PS now.
  void Heard(const absl::Status& watched);

  ShardedVariables& variables_;
  const PsWatcherOptions options_;
  absl::Mutex mutex_;
  std::vector<Stop> stops_ ABSL_GUARDED_BY(mutex_);          // per PS task
  std::vector<uint64_t> committed_ ABSL_GUARDED_BY(mutex_);  // per PS task; 0: none yet
  absl::Status lost_ ABSL_GUARDED_BY(mutex_);
  absl::Notification done_;
  std::vector<std::thread> threads_;  // one per PS, once the PSs are claimed
};

}  // namespace stratum
