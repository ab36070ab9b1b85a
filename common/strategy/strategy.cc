#include "stratum/strategy/strategy.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>

#include "absl/strings/str_cat.h"
#include "common/strategy/replica_pool.h"
#include "spdlog/spdlog.h"
#include "stratum/util/devices.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

thread_local std::vector<Strategy*> scope_stack;

}  // namespace

int ReplicaContext::num_replicas_in_sync() const { return strategy_.NumReplicasInSync(); }

int ReplicaContext::replica_id_in_sync_group() const {
  return strategy_.worker_index() * strategy_.NumLocalReplicas() + local_replica_id_;
}

absl::StatusOr<Tensor> ReplicaContext::AllReduce(ReduceOp op, const Tensor& value) {
  std::vector<Tensor> values = {value.Clone()};
  if (absl::Status status = AllReduce(op, values); !status.ok()) return status;
  return values[0];
}

absl::Status ReplicaContext::AllReduce(ReduceOp op, std::vector<Tensor>& values) {
  return strategy_.CollectiveAllReduce(local_replica_id_, op, values);
}

std::function<absl::Status(std::vector<Tensor>&)> ReplicaSumOf(Strategy& strategy, int replica) {
  return [&strategy, replica](std::vector<Tensor>& values) {
    return ReplicaContext(strategy, replica).AllReduce(ReduceOp::kSum, values);
  };
}

Strategy::ScopeGuard::ScopeGuard(Strategy* strategy) { scope_stack.push_back(strategy); }

Strategy::ScopeGuard::~ScopeGuard() { scope_stack.pop_back(); }

Strategy::Strategy(std::vector<std::string> devices,
                   std::unique_ptr<CrossDeviceOps> cross_device_ops, StrategyOptions options)
    : devices_(std::move(devices)),
      id_([] {
        static std::atomic<uint64_t> next{1};
        return next++;
      }()),
      cross_device_ops_(std::move(cross_device_ops)),
      options_(options) {
  if (devices_.size() > 1) {
    pool_ = std::make_unique<ReplicaPool>(static_cast<int>(devices_.size()),
                                          options_.collective_timeout);
  }
}

Strategy::~Strategy() = default;

absl::Status Strategy::RunEach(const std::function<absl::Status(ReplicaContext&)>& fn) {
  // Every replica thread sees this strategy as GetStrategy(), as the caller's does.
  if (pool_ == nullptr) {
    ScopeGuard scope(this);
    ReplicaContext context(*this, 0);
    return fn(context);
  }
  return pool_->RunAll([&](int replica) {
    ScopeGuard scope(this);
    ReplicaContext context(*this, replica);
    return fn(context);
  });
}

absl::Status Strategy::CollectiveAllReduce(int replica, ReduceOp op, std::vector<Tensor>& values) {
  // Hierarchical: the local replicas reduce first, then one copy crosses the workers,
  // then the result is copied back to every local replica.
  if (pool_ == nullptr) return AllReduceAcrossWorkers(op, values);
  const std::string key = absl::StrCat(ReduceOpName(op), " of ", values.size(), " tensors");
  return pool_->Meet(replica, key, &values, [&](std::vector<void*>& all) {
    std::vector<std::vector<Tensor>*> per_replica;
    for (void* value : all) per_replica.push_back(static_cast<std::vector<Tensor>*>(value));
    STRATUM_RETURN_IF_ERROR(cross_device_ops_->BatchAllReduce(op, per_replica));
    if (num_workers() == 1) return absl::OkStatus();
    STRATUM_RETURN_IF_ERROR(AllReduceAcrossWorkers(op, *per_replica[0]));
    for (size_t r = 1; r < per_replica.size(); ++r) {
      for (size_t i = 0; i < per_replica[0]->size(); ++i) {
        (*per_replica[r])[i].Flat() = (*per_replica[0])[i].Flat();
      }
    }
    return absl::OkStatus();
  });
}

absl::Status Strategy::AllReduceAcrossWorkers(ReduceOp, std::vector<Tensor>&) const {
  return absl::OkStatus();
}

absl::Status Strategy::BroadcastFromChief(std::vector<Tensor>&) const { return absl::OkStatus(); }

absl::StatusOr<Tensor> Strategy::Reduce(ReduceOp op, const PerReplica<Tensor>& value,
                                        std::optional<int> axis) const {
  if (!axis.has_value()) {
    absl::StatusOr<Tensor> local = cross_device_ops_->Reduce(op, value.values());
    if (!local.ok() || num_workers() == 1) return local;
    std::vector<Tensor> across = {*std::move(local)};
    STRATUM_RETURN_IF_ERROR(AllReduceAcrossWorkers(op, across));
    return std::move(across[0]);
  }
  std::vector<Tensor> sums;
  int64_t count = 0;
  for (const Tensor& replica_value : value.values()) {
    absl::StatusOr<Tensor> sum = ReduceAlongAxis(ReduceOp::kSum, replica_value, *axis);
    if (!sum.ok()) return sum.status();
    sums.push_back(*std::move(sum));
    count += *axis == -1 ? replica_value.num_elements() : replica_value.rows();
  }
  absl::StatusOr<Tensor> total = cross_device_ops_->Reduce(ReduceOp::kSum, sums);
  if (!total.ok()) return total;
  if (num_workers() > 1) {
    // The sums and the element counts of every worker, in one reduction.
    Tensor counted(DType::kFloat32, Shape({1}));
    counted.data<float>()[0] = static_cast<float>(count);
    std::vector<Tensor> across = {*std::move(total), std::move(counted)};
    STRATUM_RETURN_IF_ERROR(AllReduceAcrossWorkers(ReduceOp::kSum, across));
    count = static_cast<int64_t>(across[1].data<float>()[0]);
    total = std::move(across[0]);
  }
  if (op == ReduceOp::kSum) return total;
  total->Flat() /= static_cast<float>(std::max<int64_t>(count, 1));
  return total;
}

DistributedVariables Strategy::CreateVariables(const std::vector<Tensor>& initial,
                                               std::vector<std::string> names) const {
  std::vector<Tensor> copy;
  for (const Tensor& value : initial) copy.push_back(value.Clone());
  return DistributedVariables({std::move(copy)}, /*mirrored=*/false, this, std::move(names));
}

absl::Status Strategy::CheckVariables(const DistributedVariables& variables) const {
  // Its own always fit (ForReplica asks on every replica's every step).
  if (variables.creator_id() == id_) return absl::OkStatus();
  // What this strategy's own variables look like.
  const DistributedVariables own = CreateVariables({});
  const bool fits =
      variables.mirrored() == own.mirrored() && variables.num_copies() == own.num_copies();
  const std::string what =
      variables.names().empty()
          ? std::string("these variables")
          : absl::StrCat("variable \"", variables.names().front(), "\"",
                         variables.names().size() > 1 ? " (and the others made with it)" : "");
  const std::string maker = variables.creator_id() == 0
                                ? std::string("by hand")
                                : absl::StrCat("by ", variables.creator_name());
  if (fits) {
    std::call_once(*variables.warned_, [&] {
      spdlog::warn(
          "{} was created {}, outside {}'s Scope(); it has the copies {} keeps, so it is used "
          "as it is (as TensorFlow would), but create variables inside `auto scope = "
          "strategy.Scope();` so that each strategy places its own",
          what, maker, name(), name());
    });
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " was created ", maker, ", outside ", name(), "'s Scope(), and has ",
      variables.num_copies(), variables.num_copies() == 1 ? " copy" : " copies", ", but ", name(),
      " keeps ", own.num_copies(), own.mirrored() ? " (one per replica)" : "",
      ": create the variables with strategy.CreateVariables inside `auto scope = "
      "strategy.Scope();`, as tf.distribute requires"));
}

DistributedVariables::DistributedVariables(std::vector<std::vector<Tensor>> copies, bool mirrored,
                                           const Strategy* creator, std::vector<std::string> names)
    : copies_(std::move(copies)),
      mirrored_(mirrored),
      creator_id_(creator != nullptr ? creator->id() : 0),
      creator_name_(creator != nullptr ? creator->name() : ""),
      names_(std::move(names)) {}

absl::StatusOr<std::vector<Tensor>*> DistributedVariables::ForReplica(
    const ReplicaContext& context) {
  STRATUM_RETURN_IF_ERROR(context.strategy().CheckVariables(*this));
  return &copies_[mirrored_ ? static_cast<size_t>(context.local_replica_id()) : 0];
}

absl::Status Strategy::ApplyGradients(PerReplica<std::vector<Tensor>>& gradients,
                                      DistributedVariables& variables, const UpdateFn& update) {
  STRATUM_RETURN_IF_ERROR(CheckVariables(variables));
  if (gradients.size() != NumLocalReplicas()) {
    return absl::InvalidArgumentError(absl::StrCat("gradients from ", gradients.size(),
                                                   " replicas, but this process runs ",
                                                   NumLocalReplicas()));
  }
  if (variables.mirrored()) {
    // Every replica all-reduces and applies the same update to its own copy.
    return RunEach([&](ReplicaContext& context) -> absl::Status {
      const int replica = context.local_replica_id();
      std::vector<Tensor>& grads = gradients[replica];
      if (absl::Status status = context.AllReduce(ReduceOp::kSum, grads); !status.ok()) {
        return status;
      }
      return update(replica, variables.MutableCopy(replica), grads);
    });
  }
  // One copy: reduce onto replica 0's gradients, update once.
  std::vector<Tensor>& total = gradients[0];
  for (int replica = 1; replica < gradients.size(); ++replica) {
    for (size_t i = 0; i < total.size(); ++i) total[i].Flat() += gradients[replica][i].Flat();
  }
  STRATUM_RETURN_IF_ERROR(AllReduceAcrossWorkers(ReduceOp::kSum, total));
  return update(0, variables.MutableCopy(0), total);
}

Strategy& GetStrategy() {
  if (!scope_stack.empty()) return *scope_stack.back();
  static DefaultStrategy default_strategy;
  return default_strategy;
}

bool HasStrategy() { return !scope_stack.empty(); }

// As TensorFlow's default strategy: the first GPU when there is one.
DefaultStrategy::DefaultStrategy()
    : Strategy({VisibleGpuCount() > 0 ? "GPU:0" : "CPU:0"},
               std::make_unique<ReductionToOneDevice>()) {}

OneDeviceStrategy::OneDeviceStrategy(std::string device)
    : Strategy({std::move(device)}, std::make_unique<ReductionToOneDevice>()) {}

absl::StatusOr<std::unique_ptr<OneDeviceStrategy>> OneDeviceStrategy::Create(
    const std::string& device) {
  absl::StatusOr<std::string> canonical = CanonicalDevice(device);
  if (!canonical.ok()) return canonical.status();
  return std::unique_ptr<OneDeviceStrategy>(new OneDeviceStrategy(*canonical));
}

absl::StatusOr<std::string> CanonicalDevice(const std::string& device) {
  std::string name = device;
  if (size_t at = name.rfind("device:"); at != std::string::npos) name = name.substr(at + 7);
  if (!name.empty() && name.front() == '/') name = name.substr(1);
  const size_t colon = name.find(':');
  std::string type = name.substr(0, colon);
  std::transform(type.begin(), type.end(), type.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  int index = -1;
  if (colon != std::string::npos) {
    const std::string digits = name.substr(colon + 1);
    auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (error != std::errc() || end != digits.data() + digits.size()) index = -1;
  }
  if ((type != "CPU" && type != "GPU") || index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", device,
                     "\" is not a device name: write \"CPU:0\" (or \"CPU:1\", ... for "
                     "more logical CPU replicas) or \"GPU:0\""));
  }
  if (type == "GPU" && index >= VisibleGpuCount()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device \"", device, "\" is not available: this process sees ", VisibleGpuCount(),
        " GPUs; use CPU devices (\"CPU:0\", \"CPU:1\") or run where the GPU is"));
  }
  return absl::StrCat(type, ":", index);
}

}  // namespace stratum
