// PsService: the gRPC face of a VariableStore (proto/ps.proto). It converts messages to
// tensors, checks every gradient of a push before it applies the first (a bad request
// changes nothing), and turns absl::Status into grpc::Status. It also announces where the
// PS's raw data path listens (DataPath), when it has one. Thread-safe.
//
// Stopping (Watch): after SIGTERM, main calls BeginStopping and serves on while
// StopNeedNotWait() is "" (a coordinator that saves checkpoints watches, and has committed
// no checkpoint begun since), so that a PS pod evicted or deleted with its job keeps the
// job's state. Its own shard file written is not enough: the coordinator writes the
// checkpoint's manifest after every PS's file, and that may fail (a full disk, a crash), so
// it hands the save's id back (WatchRequest.committed_save) once the manifest is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps.grpc.pb.h"
#include "stratum/ps/coordinator_lease.h"
#include "stratum/ps/data_path_endpoint.h"
#include "stratum/ps/variable_store.h"
#include "stratum/util/clock.h"
#include "stratum/util/process_info.h"

namespace stratum {

class PsService final : public proto::ParameterServer::Service {
 public:
  // `data_path`: the endpoint of this PS's PsDataServer (a tcp_port of 0 for none).
  // `lease`: how long a coordinator's silence lets another take this PS over.
  // `clock`: the time the lease and the stopping PS's wait are counted in (a test's
  // FakeClock drives it); it must outlive the service.
  explicit PsService(VariableStore& store, DataPathEndpoint data_path = {},
                     absl::Duration lease = absl::Seconds(5), const Clock& clock = Clock::Real())
      : store_(store),
        data_path_(std::move(data_path)),
        clock_(clock),
        lease_(lease, {}, clock),
        next_save_id_(ProcessIncarnation()) {}

  // Claims must declare a checkpoint folder inside `root` ("" bounds nothing). Call before
  // serving.
  void SetCheckpointRoot(std::string root) { checkpoint_root_ = std::move(root); }

  grpc::Status CreateVariables(grpc::ServerContext*, const proto::CreateVariablesRequest* request,
                               proto::CreateVariablesResponse* response) override;
  grpc::Status Pull(grpc::ServerContext*, const proto::PullRequest* request,
                    proto::PullResponse* response) override;
  grpc::Status Push(grpc::ServerContext*, const proto::PushRequest* request,
                    proto::PushResponse* response) override;
  grpc::Status Assign(grpc::ServerContext*, const proto::AssignRequest* request,
                      proto::AssignResponse* response) override;
  grpc::Status SetLearningRate(grpc::ServerContext*, const proto::SetLearningRateRequest* request,
                               proto::SetLearningRateResponse* response) override;
  grpc::Status ListVariables(grpc::ServerContext*, const proto::ListVariablesRequest* request,
                             proto::ListVariablesResponse* response) override;
  grpc::Status Save(grpc::ServerContext*, const proto::SaveRequest* request,
                    proto::SaveResponse* response) override;
  grpc::Status Restore(grpc::ServerContext*, const proto::RestoreRequest* request,
                       proto::RestoreResponse* response) override;
  grpc::Status DataPath(grpc::ServerContext*, const proto::DataPathRequest* request,
                        proto::DataPathResponse* response) override;
  grpc::Status Watch(grpc::ServerContext*, const proto::WatchRequest* request,
                     proto::WatchResponse* response) override;

  // From now on Watch answers stopping, and a checkpoint begun from now on ends the wait
  // once the coordinator says it is committed.
  void BeginStopping();
  // Why a stopping PS need not wait any longer ("" while it should): a checkpoint begun
  // after BeginStopping was committed, or no coordinator that saves checkpoints has watched
  // within `watch_window` and it left or is gone (its address refuses connections), so it
  // commits nothing more. One silent but still there (paused, or too busy to watch) is
  // waited for: the caller's --stop_timeout bounds the wait.
  std::string StopNeedNotWait(absl::Duration watch_window) const;
  // What main says when it stops after waiting `timeout` in vain.
  std::string StopWaitTimedOut(absl::Duration timeout) const;

 private:
  VariableStore& store_;
  const DataPathEndpoint data_path_;
  const Clock& clock_;
  CoordinatorLease lease_;
  std::string checkpoint_root_;
  mutable absl::Mutex stop_mutex_;
  bool stopping_ ABSL_GUARDED_BY(stop_mutex_) = false;
  // The saves begun after BeginStopping whose files are written (their SaveResponse.save_id),
  // and whether the coordinator committed a checkpoint holding one of them.
  std::vector<uint64_t> saves_since_stopping_ ABSL_GUARDED_BY(stop_mutex_);
  bool committed_since_stopping_ ABSL_GUARDED_BY(stop_mutex_) = false;
  // Save ids start at this process's incarnation, so that an id handed back to a restarted
  // PS (another process) names none of its saves.
  uint64_t next_save_id_ ABSL_GUARDED_BY(stop_mutex_);
  // The last Watch of a coordinator that saves checkpoints and has not left.
  absl::Time last_saving_watch_ ABSL_GUARDED_BY(stop_mutex_) = absl::InfinitePast();
  // Where that coordinator serves ("" when it does not say), and when a stopping PS last
  // probed it there.
  std::string saving_coordinator_address_ ABSL_GUARDED_BY(stop_mutex_);
  mutable absl::Time last_probe_ ABSL_GUARDED_BY(stop_mutex_) = absl::InfinitePast();
  static constexpr absl::Duration kProbeInterval = absl::Milliseconds(500);
};

}  // namespace stratum
