#include "stratum/worker/worker_functions.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/task_main.h"
#include "stratum/worker/worker_service.h"

namespace stratum {
namespace {

template <typename Map>
std::string KeysOf(const Map& map) {
  if (map.empty()) return "none";
  std::vector<std::string> keys;
  for (const auto& [key, value] : map) keys.push_back(key);
  return absl::StrJoin(keys, ", ");
}

absl::Status CheckName(const std::string& name, bool taken, const char* what) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat("a ", what, " needs a name"));
  if (taken) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " \"", name, "\" is registered already: give each one a name of its own"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ClosureArguments::Wrong(int index, const char* wanted) const {
  if (index < 0 || index >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("function \"", function_, "\" wants ", wanted,
                                                   " as argument ", index, ", and the closure has ",
                                                   size(), " argument(s): schedule it with them"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "function \"", function_, "\" wants ", wanted, " as argument ", index, ", and it is ",
      std::holds_alternative<Tensor>(values_[static_cast<size_t>(index)])
          ? "a tensor"
          : "per-worker values (a dataset's iterators)",
      ": schedule it with the arguments it takes"));
}

absl::StatusOr<Tensor> ClosureArguments::tensor(int index) const {
  if (index >= 0 && index < size()) {
    if (const Tensor* tensor = std::get_if<Tensor>(&values_[static_cast<size_t>(index)])) {
      return *tensor;
    }
  }
  return Wrong(index, "a tensor");
}

absl::StatusOr<DistributedIterator*> ClosureArguments::iterator(int index) const {
  if (index >= 0 && index < size()) {
    if (DistributedIterator* const* iterator =
            std::get_if<DistributedIterator*>(&values_[static_cast<size_t>(index)])) {
      return *iterator;
    }
  }
  return Wrong(index, "a per-worker dataset (CreatePerWorkerDataset's values)");
}

absl::Status WorkerFunctions::Register(std::string name, WorkerFunction function) {
  if (name == "train_step") {
    return absl::InvalidArgumentError(
        "function \"train_step\" is the built-in one (it trains on the job's data): give yours "
        "another name");
  }
  if (absl::Status s = CheckName(name, functions_.count(name) > 0, "function"); !s.ok()) return s;
  if (!function)
    return absl::InvalidArgumentError(absl::StrCat("function \"", name, "\" is empty"));
  functions_.emplace(std::move(name), std::move(function));
  return absl::OkStatus();
}

absl::Status WorkerFunctions::RegisterDataset(std::string name, DatasetFunction function) {
  if (absl::Status s = CheckName(name, datasets_.count(name) > 0, "dataset function"); !s.ok()) {
    return s;
  }
  if (!function) {
    return absl::InvalidArgumentError(absl::StrCat("dataset function \"", name, "\" is empty"));
  }
  datasets_.emplace(std::move(name), std::move(function));
  return absl::OkStatus();
}

const WorkerFunction* WorkerFunctions::Find(const std::string& name) const {
  auto it = functions_.find(name);
  return it == functions_.end() ? nullptr : &it->second;
}

const DatasetFunction* WorkerFunctions::FindDataset(const std::string& name) const {
  auto it = datasets_.find(name);
  return it == datasets_.end() ? nullptr : &it->second;
}

std::string WorkerFunctions::Names() const { return KeysOf(functions_); }
std::string WorkerFunctions::DatasetNames() const { return KeysOf(datasets_); }

int ServeWorkerFunctions(const std::string& binary, WorkerFunctions functions,
                         ShutdownWatcher& shutdown) {
  const TaskContext context = ResolveTaskOrExit({.binary = binary, .task_types = {kWorker}});
  WorkerService service(context.channel_options(), absl::Seconds(5), std::move(functions));
  return ServeUntilShutdown(context, shutdown, {&service});
}

}  // namespace stratum
