// A parameter-server worker's functions: what a user's worker program registers and
// serves, as a tf.distribute.Server with tf.functions does, so that the user's coordinator
// program can schedule them by name (ClusterCoordinator::Schedule) with arguments and get
// RemoteValues back. Closures travel by name, never as code.
//
//   WorkerFunctions functions;
//   functions.RegisterDataset("train", [](const InputContext& input) { ... return dataset; });
//   functions.Register("step_fn", [](WorkerContext& worker, const ClosureArguments& args)
//                                     -> absl::StatusOr<std::vector<Tensor>> { ... });
//   return ServeWorkerFunctions("my-worker", std::move(functions), shutdown);
//
// A function runs on the worker the coordinator picked, one closure at a time, with the
// job's model, loss and local replicas, and the job's variables on the parameter servers
// (pulled and pushed through WorkerContext). It has the built-in train_step's semantics:
// a worker that dies or restarts mid-closure has the closure run again elsewhere (at least
// once); any other error is the closure's own and is raised to the coordinator program.
//
// Thread safety: WorkerFunctions is filled before serving and read-only after; a function
// is never called concurrently with another on the same worker.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stratum/data/dataset.h"
#include "stratum/data/input_context.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/strategy/distributed_dataset.h"
#include "stratum/strategy/strategy.h"
#include "stratum/tensor/tensor.h"
#include "stratum/util/shutdown.h"

namespace stratum {

// The worker side of one job, as a function sees it.
class WorkerContext {
 public:
  virtual ~WorkerContext() = default;
  virtual const Model& model() const = 0;
  virtual const Loss& loss() const = 0;
  // This worker's local replicas (a MirroredStrategy over its devices).
  virtual Strategy& strategy() = 0;
  // Scratch for replica `replica`'s steps (its dropout seed is its own).
  virtual Workspace& workspace(int replica) = 0;
  virtual int worker_index() const = 0;
  virtual int num_workers() const = 0;
  // The model's variables as the parameter servers hold them now (every shard, from every
  // PS in parallel). A PS that fails: FAILED_PRECONDITION "a parameter server is
  // unavailable: ...", raised to the coordinator program.
  virtual absl::StatusOr<std::vector<Tensor>> PullVariables() = 0;
  // Gradients of every model variable (in the model's order), summed over this worker's
  // replicas; the parameter servers apply the job's optimizer to them. Errors as above.
  virtual absl::Status PushGradients(const std::vector<Tensor>& gradients) = 0;
};

// A closure's arguments as the worker that runs it sees them: a per-worker value is this
// worker's own.
class ClosureArguments {
 public:
  using Value = std::variant<Tensor, DistributedIterator*>;
  ClosureArguments(std::string function, std::vector<Value> values)
      : function_(std::move(function)), values_(std::move(values)) {}

  int size() const { return static_cast<int>(values_.size()); }
  // INVALID_ARGUMENT naming the function and the argument when there is no such argument
  // or it is of the other kind.
  absl::StatusOr<Tensor> tensor(int index) const;
  // This worker's iterator of a per-worker dataset (CreatePerWorkerDataset).
  absl::StatusOr<DistributedIterator*> iterator(int index) const;

 private:
  absl::Status Wrong(int index, const char* wanted) const;

  std::string function_;
  std::vector<Value> values_;
};

using WorkerFunction =
    std::function<absl::StatusOr<std::vector<Tensor>>(WorkerContext&, const ClosureArguments&)>;
// Builds a worker's dataset of batches: each element one step's batch for the worker's
// local replicas together (input.num_replicas_in_sync of them), which the worker splits
// among them. `input` says which worker this is of how many (shard by it, or not).
using DatasetFunction = std::function<absl::StatusOr<Dataset>(const InputContext& input)>;

class WorkerFunctions {
 public:
  // INVALID_ARGUMENT for an empty or taken name; "train_step" is the built-in one.
  absl::Status Register(std::string name, WorkerFunction function);
  absl::Status RegisterDataset(std::string name, DatasetFunction function);

  // nullptr when none is registered under `name`.
  const WorkerFunction* Find(const std::string& name) const;
  const DatasetFunction* FindDataset(const std::string& name) const;
  // "eval_step, step_fn" (sorted), for messages; "none" when there are none.
  std::string Names() const;
  std::string DatasetNames() const;

 private:
  std::map<std::string, WorkerFunction> functions_;
  std::map<std::string, DatasetFunction> datasets_;
};

// Runs this process as a parameter-server worker serving `functions` (beside the built-in
// train_step) until SIGTERM: reads TF_CONFIG (task type "worker") and the task flags
// (--listen_address, --tls_*, ...) as stratum-worker does. Returns main's exit code.
// `binary` names the program in its messages. Call after ParseFlagsOrExit.
int ServeWorkerFunctions(const std::string& binary, WorkerFunctions functions,
                         ShutdownWatcher& shutdown);

}  // namespace stratum
