// How a task of a MultiWorkerMirrored job uses the cluster's coordination service (see
// coordination_service.h): CoordinationClient is the narrow interface collective code sees;
// CoordinationAgent implements it over gRPC against the leader task and sends heartbeats;
// LocalCoordinationClient implements it over a CoordinationService in the same process,
// for tests that run N tasks as N threads.
//
// Every call has a deadline; its errors say what was waited for and name the leader.
// Thread-safe: all methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordination.grpc.pb.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/channel.h"
#include "stratum/worker/coordination_service.h"

namespace stratum {

class CoordinationClient {
 public:
  virtual ~CoordinationClient() = default;

  // This task.
  virtual const TaskKey& task() const = 0;
  // Sets `key` for every task (replacing a value set before).
  virtual absl::Status SetKeyValue(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for `key` to be set. DEADLINE_EXCEEDED naming the key and the
  // tasks not registered yet; the cluster error.
  virtual absl::StatusOr<std::string> GetKeyValue(const std::string& key,
                                                  absl::Duration timeout) = 0;
  // The value of `key` now; NOT_FOUND when it is not set.
  virtual absl::StatusOr<std::string> TryGetKeyValue(const std::string& key) = 0;
  // Waits up to `timeout` until every task arrived at barrier `id` (ids are single-use).
  // DEADLINE_EXCEEDED naming the tasks that did not arrive; the cluster error.
  virtual absl::Status WaitAtBarrier(const std::string& id, absl::Duration timeout) = 0;
  // Reports that this task failed: the error becomes the cluster error every task sees,
  // unless another task failed first; either way cluster_error() returns it afterwards.
  virtual absl::Status ReportError(const absl::Status& error) = 0;
  // OK, or why the cluster cannot go on (another task failed, or the leader was lost).
  // Collective code polls it while it waits for peers.
  virtual absl::Status cluster_error() const = 0;
};

// A CoordinationClient for a task whose service lives in the same process (no heartbeats:
// the test drives CoordinationService::CheckHeartbeats itself). Registers on construction;
// RegisterTask's error, if any, is returned by every call.
class LocalCoordinationClient final : public CoordinationClient {
 public:
  // `service` must outlive the client. `incarnation` 0 draws a random one.
  LocalCoordinationClient(CoordinationService& service, TaskKey task, uint64_t incarnation = 0);

  const TaskKey& task() const override { return task_; }
  absl::Status SetKeyValue(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> GetKeyValue(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<std::string> TryGetKeyValue(const std::string& key) override;
  absl::Status WaitAtBarrier(const std::string& id, absl::Duration timeout) override;
  absl::Status ReportError(const absl::Status& error) override;
  absl::Status cluster_error() const override;
  uint64_t incarnation() const { return incarnation_; }

 private:
  CoordinationService& service_;
  const TaskKey task_;
  const uint64_t incarnation_;
  const absl::Status registered_;
};

struct CoordinationAgentOptions {
  std::string leader_address;            // host:port of the leader's TaskServer
  std::string leader_name = "worker:0";  // the leader task, for messages
  TaskKey task;
  uint64_t incarnation = 0;  // 0: draw a random one
  // How long Connect waits for the leader to come up and accept the registration.
  absl::Duration connect_timeout = absl::Minutes(2);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Deadline of the calls that do not wait for other tasks (SetKeyValue, ReportError, ...).
  absl::Duration rpc_timeout = absl::Seconds(30);
  ChannelOptions channel;
};

// The gRPC CoordinationClient each task of a MultiWorkerMirrored job holds, the leader
// included. A heartbeat thread tells the service this task lives and learns the cluster
// error from its answers, or declares the leader lost when it stays silent longer than the
// service's heartbeat timeout.
class CoordinationAgent final : public CoordinationClient {
 public:
  // Registers with the service (waiting up to connect_timeout for the leader to come up)
  // and starts the heartbeat thread.
  //   DEADLINE_EXCEEDED naming the leader and its address when it did not answer in time;
  //   UNIMPLEMENTED when the address serves no coordination service; the service's errors
  //   (unknown task, the task restarted, the cluster error).
  static absl::StatusOr<std::unique_ptr<CoordinationAgent>> Connect(
      CoordinationAgentOptions options);
  // Stops the heartbeats, without leaving the cluster: the service reports this task dead
  // after its heartbeat timeout unless Disconnect was called.
  ~CoordinationAgent() override;

  const TaskKey& task() const override { return options_.task; }
  absl::Status SetKeyValue(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> GetKeyValue(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<std::string> TryGetKeyValue(const std::string& key) override;
  absl::Status WaitAtBarrier(const std::string& id, absl::Duration timeout) override;
  absl::Status ReportError(const absl::Status& error) override;
  absl::Status cluster_error() const override;

  // Leaves the cluster cleanly at the end of the job and stops the heartbeats; barriers
  // that still need this task then fail at once instead of timing out. The call waits up to
  // `timeout` (options' rpc_timeout when zero).
  absl::Status Disconnect(absl::Duration timeout = absl::ZeroDuration());
  uint64_t incarnation() const { return options_.incarnation; }

 private:
  explicit CoordinationAgent(CoordinationAgentOptions options);

  absl::Status Register();
  void HeartbeatLoop();
  void StopHeartbeats();
  // `what` is what the call did or waited for ("waiting at barrier \"init\"").
  absl::Status CallStatus(const std::string& what, const grpc::ClientContext& context,
                          const grpc::Status& status) const;
  std::string Leader() const;  // "coordination service on worker:0 at host:port"
  void SetClusterError(absl::Status error);

  CoordinationAgentOptions options_;  // incarnation filled in
  std::unique_ptr<proto::CoordinationService::Stub> stub_;
  uint64_t service_incarnation_ = 0;  // set by Register
  absl::Duration heartbeat_timeout_;  // the service's, set by Register

  mutable absl::Mutex mutex_;
  absl::CondVar stop_changed_;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  grpc::ClientContext* heartbeat_call_ ABSL_GUARDED_BY(mutex_) = nullptr;
  absl::Status cluster_error_ ABSL_GUARDED_BY(mutex_);
  std::thread heartbeats_;
};

}  // namespace stratum
