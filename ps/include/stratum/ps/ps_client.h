// PsClient: one parameter-server task as a worker or the coordinator sees it. Every call
// has a deadline (PsClientOptions::timeout) and its errors name the task ("ps:1 at
// host:port: ..."), so a PS that died is reported, not waited for. A PS that is back is
// reached by the next call: one made while the channel's connection is failed retries it
// at once and waits for it a little (up to kReconnectWait, at most half the call's
// deadline), instead of failing on gRPC's remembered error until its back-off ends. Pushes
// and pulls go over the PS's raw data path (data_path.h) when it offers one, else over
// gRPC. The calls travel over a PsTransport (ps_transport.h): gRPC in a job, another
// where PsClientOptions::connect says (a PS in the same process, in tests). Thread-safe
// (transports and the data path's client are).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "proto/ps.pb.h"
#include "stratum/model/initial_fill.h"
#include "stratum/net/channel.h"
#include "stratum/ps/coordinator_lease.h"
#include "stratum/ps/ps_transport.h"
#include "stratum/ps/store_checkpoint.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

class TlsContext;

class PsDataClient;  // the raw data path's client, internal to ps/

struct PsClientOptions {
  absl::Duration timeout = absl::Seconds(30);
  ChannelOptions channel = {};  // TLS and message limits
  // Pushes of at least this many tensor bytes, and pulls, use the PS's raw data path when
  // it offers one (never with TLS: the data path is plaintext); -1: always gRPC.
  int64_t data_path_min_bytes = 0;
  // Through shared memory when the PS runs on this host.
  bool shared_memory = true;
  // How a coordinator names itself to the PS in CreateVariables, Assign, Restore and Watch (see
  // stratum/ps/coordinator_lease.h); "" for "a coordinator with pid N".
  std::string coordinator;
  std::string coordinator_address;  // where it serves, "" when it does not
  // The job's checkpoint folder, declared when the coordinator claims a PS: the PS saves
  // and restores only files inside it ("": the job writes no checkpoints).
  std::string checkpoint_dir;
  // Makes the transport to a PS; unset: gRPC (GrpcPsTransport).
  PsTransportFactory connect;
};

// This process as a coordinator names itself to the parameter servers and workers it
// claims (stratum/ps/coordinator_lease.h).
proto::CoordinatorId ThisCoordinator(const PsClientOptions& options);

// A coordinator as a PS or worker takes it from a request: to claim with, and to prove a
// call is its own (stratum/ps/coordinator_lease.h).
CoordinatorClaimant ClaimantOf(const proto::CoordinatorId& id);
CoordinatorCredential CredentialOf(const proto::CoordinatorId& id);

struct NamedValue {
  std::string name;
  Tensor value;
  // Set for a row gradient or row values: which rows of axis 0 `value` holds (sorted, unique).
  std::optional<std::vector<int64_t>> rows;
};

// A shard whose initial values the PS makes itself from its variable's fill
// (Model::InitialFills): values `first` on of the variable, in `shape`.
struct FilledShard {
  std::string name;
  Shape shape;
  InitialFill fill;
  int64_t first = 0;
};

// A parameter server that cannot be reached (UNAVAILABLE, DEADLINE_EXCEEDED), that shut
// down during the call (CANCELLED), or that lacks a variable the job created on it (it
// restarted between two calls), is the job's problem, not the caller's:
// FAILED_PRECONDITION "a parameter server is unavailable: ..." of ErrorKind kPsUnavailable
// (kPsLostItsVariables when it lost the job's variables), which the coordinator
// answers by waiting for it and re-seeding it from the last checkpoint (a worker must not
// retry such a closure elsewhere). Other errors unchanged.
absl::Status PsFailure(const absl::Status& status);
// How PsFailure words the last case.
inline constexpr char kPsLostItsVariables[] =
    "it has lost the job's variables (it restarted since they were created)";

// How long a call waits for a failed connection to a PS to be made again: a PS on
// another host answers a new connection within a few round trips.
inline constexpr absl::Duration kReconnectWait = absl::Seconds(1);

class PsClient {
 public:
  // `task` names the PS in errors ("ps:0").
  PsClient(std::string task, std::string address, PsClientOptions options = {});

  const std::string& task() const { return task_; }
  const std::string& address() const { return address_; }

  // Creates variables (idempotent for identical specs; `replace`: existing ones start
  // afresh, see VariableStore::Create); returns which were new.
  absl::StatusOr<std::vector<bool>> CreateVariables(const std::vector<NamedValue>& initial,
                                                    const nlohmann::json& optimizer,
                                                    bool replace = false);
  // The same, the PS making the values from their fills: only the fills travel.
  absl::StatusOr<std::vector<bool>> CreateVariables(const std::vector<FilledShard>& shards,
                                                    const nlohmann::json& optimizer,
                                                    bool replace = false);
  // The values of `names`, then the rows `row_reads` name (an embedding table's that a batch
  // reads), in order.
  absl::StatusOr<std::vector<Tensor>> Pull(const std::vector<std::string>& names,
                                           const std::vector<RowRead>& row_reads = {});
  // Applies the gradients (whole, or rows: NamedValue::rows); with `pulled` the updated values
  // of the variables with whole gradients come back in the same call, then the rows
  // `row_reads` name, read after the update (the next batch's).
  absl::Status Push(const std::vector<NamedValue>& gradients, std::vector<Tensor>* pulled = nullptr,
                    const std::vector<RowRead>& row_reads = {});
  // Sets variables to `values` (VariableStore::Assign): whole, or the rows a value names.
  absl::Status Assign(const std::vector<NamedValue>& values);
  // VariableStore::SetLearningRate on this PS.
  absl::Status SetLearningRate(float rate);
  absl::StatusOr<proto::ListVariablesResponse> ListVariables();
  // Checkpoints: the PS writes / reads `path` on its own file system.
  absl::StatusOr<proto::SaveResponse> Save(const std::string& path);
  absl::Status Restore(const std::string& path, uint32_t crc32);
  // Restores a checkpoint written with another shard layout: the PS builds its shards from
  // the saved rows `rows` lists, reading (and checking) the `files` they are in.
  absl::Status Restore(const std::vector<CheckpointFileRef>& files,
                       const std::vector<SavedRows>& rows);
  // The coordinator's heartbeat (proto::WatchRequest); the answer says whether the PS is
  // stopping. A short deadline of its own: it runs beside training, every 0.5 s. `claim`:
  // takes the PS for this coordinator (stratum/ps/coordinator_lease.h), with the usual
  // deadline. `committed_save`: the newest of its saves in a committed checkpoint (0: none).
  absl::StatusOr<proto::WatchResponse> Watch(bool saves_checkpoints, bool leaving = false,
                                             bool claim = false, uint64_t committed_save = 0);
  // How pushes and pulls travel now: "grpc", "tcp" or "shared memory" (the data path's,
  // once it has carried a call).
  std::string transport() const;

 private:
  std::string Peer() const;
  // Sends `request` (either kind of CreateVariables) as this coordinator.
  absl::StatusOr<std::vector<bool>> SendCreate(proto::CreateVariablesRequest& request,
                                               const nlohmann::json& optimizer, bool replace);
  // Sends `request` (either kind of Restore) as this coordinator.
  absl::Status SendRestore(proto::RestoreRequest& request);
  // The PS's data path, asked for on first use; null: use gRPC.
  std::shared_ptr<PsDataClient> DataClient();
  // After a data call that got no answer: ask the PS again for its data path, next time
  // (it may have restarted with another endpoint), or with `back_off` (connecting to its
  // data path timed out: a firewall?) only after a while, using gRPC until then.
  void ForgetDataClient(bool back_off);

  std::string task_;
  std::string address_;
  PsClientOptions options_;
  std::unique_ptr<PsTransport> transport_;
  mutable absl::Mutex data_mutex_;
  bool data_asked_ ABSL_GUARDED_BY(data_mutex_) = false;
  std::shared_ptr<PsDataClient> data_ ABSL_GUARDED_BY(data_mutex_);
  absl::Time data_retry_after_ ABSL_GUARDED_BY(data_mutex_) = absl::InfinitePast();
  // The cluster's TLS for the data path's TCP connections, made at the first data call.
  std::shared_ptr<const TlsContext> data_tls_ ABSL_GUARDED_BY(data_mutex_);
};

}  // namespace stratum
