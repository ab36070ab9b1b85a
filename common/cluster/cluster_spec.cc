#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/host_port.h"

#include <algorithm>
#include <charconv>
#include <string>

#include <arpa/inet.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace stratum {
namespace {

// Position of a job in display order; unknown jobs sort after the known ones.
size_t JobRank(absl::string_view type) {
  const auto& valid = ValidTaskTypes();
  return std::find(valid.begin(), valid.end(), type) - valid.begin();
}

std::string TaskTypeList() { return "chief, worker, ps or evaluator"; }

// "0..1" for a dense job, "1, 3" for a sparse one.
std::string DescribeIndices(const ClusterSpec& spec, absl::string_view type) {
  std::vector<int> indices = spec.task_indices(type);
  const bool dense = !indices.empty() && indices.back() == static_cast<int>(indices.size()) - 1;
  if (dense) return absl::StrCat("0..", indices.back());
  return absl::StrJoin(indices, ", ");
}

std::string JsonForMessage(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

absl::StatusOr<int> ParseSparseIndex(absl::string_view key) {
  int index = -1;
  auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), index);
  // Canonical decimal only: "01" would silently alias task 1.
  if (error != std::errc() || end != key.data() + key.size() || index < 0 ||
      (key.size() > 1 && key.front() == '0')) {
    return absl::InvalidArgumentError("not a task index");
  }
  return index;
}

absl::Status AddressField(absl::string_view source, absl::string_view type, absl::string_view slot,
                          const nlohmann::json& value, ClusterSpec::Job& job, int index) {
  if (!value.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " cluster.", type, slot, " is ", JsonForMessage(value),
                     ", which is not an address: write it as a \"host:port\" string"));
  }
  job[index] = value.get<std::string>();
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& ValidTaskTypes() {
  static const std::vector<std::string> kTypes = {kChief, kWorker, kPs, kEvaluator};
  return kTypes;
}

bool IsValidTaskType(absl::string_view type) { return JobRank(type) < ValidTaskTypes().size(); }

std::string TaskKey::ToString() const { return absl::StrCat(type, ":", index); }

namespace {

// Why `host` (not bracketed) is no IPv4 address and no host name (RFC 1123: dot-separated
// parts of letters, digits and '-'; '_' too, as Docker Compose names have), or "".
std::string HostNameProblem(absl::string_view host) {
  if (!std::all_of(host.begin(), host.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ||
               c == '_';
      })) {
    return "its host has a character a host name cannot have";
  }
  const std::string quoted = absl::StrCat("its host \"", host, "\"");
  // All digits and dots: an IPv4 address or nothing (a name's last part is never a number).
  if (host.find_first_not_of("0123456789.") == absl::string_view::npos) {
    in_addr ipv4;
    if (inet_pton(AF_INET, std::string(host).c_str(), &ipv4) == 1) return "";
    return absl::StrCat(quoted,
                        " is not an IPv4 address (four numbers from 0 to 255, like 10.0.0.1), "
                        "and a host name has a letter in its last part");
  }
  if (host.size() > 254 || (host.size() == 254 && host.back() != '.')) {
    return absl::StrCat(quoted, " is longer than 253 characters");
  }
  if (host.back() == '.') host.remove_suffix(1);  // fully qualified
  for (absl::string_view part : absl::StrSplit(host, '.')) {
    if (part.empty()) return absl::StrCat(quoted, " has an empty part between dots");
    if (part.size() > 63) return absl::StrCat(quoted, " has a part longer than 63 characters");
    if (part.front() == '-' || part.back() == '-') {
      return absl::StrCat(quoted, " has a part that starts or ends with '-'");
    }
  }
  return "";
}

// The port of a valid address as a number ("029001" is port 29001).
int PortOf(absl::string_view address) {
  int port = 0;
  const std::string text = SplitHostPort(address).port;
  std::from_chars(text.data(), text.data() + text.size(), port);
  return port;
}

}  // namespace

absl::Status ValidateAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError("it has no port");
  }
  absl::string_view host = address.substr(0, colon);
  absl::string_view port_text = address.substr(colon + 1);
  if (host.empty()) return absl::InvalidArgumentError("its host is empty");
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') {
      return absl::InvalidArgumentError("its IPv6 host is not closed by ']'");
    }
    in6_addr ipv6;
    if (inet_pton(AF_INET6, std::string(host.substr(1, host.size() - 2)).c_str(), &ipv6) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("its host \"", host, "\" is not an IPv6 address"));
    }
  } else if (in6_addr ipv6; inet_pton(AF_INET6, std::string(host).c_str(), &ipv6) == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("its IPv6 host is not in brackets (write \"[", host, "]:", port_text, "\")"));
  } else if (std::string problem = HostNameProblem(host); !problem.empty()) {
    return absl::InvalidArgumentError(problem);
  }
  int port = 0;
  auto [end, error] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || error != std::errc() || end != port_text.data() + port_text.size() ||
      port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("its port \"", port_text, "\" is not a number from 1 to 65535"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> ClusterSpec::FromJson(const nlohmann::json& cluster,
                                                  absl::string_view source) {
  if (!cluster.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " cluster is ", JsonForMessage(cluster),
        ", not an object: write it as {\"worker\": [\"host:port\", ...], \"ps\": [...]}"));
  }
  ClusterSpec spec;
  for (const auto& [type, tasks] : cluster.items()) {
    Job& job = spec.jobs_[type];
    if (tasks.is_array()) {
      for (size_t i = 0; i < tasks.size(); ++i) {
        const int index = static_cast<int>(i);
        if (auto status =
                AddressField(source, type, absl::StrCat("[", i, "]"), tasks[i], job, index);
            !status.ok()) {
          return status;
        }
      }
    } else if (tasks.is_object()) {
      for (const auto& [key, address] : tasks.items()) {
        absl::StatusOr<int> index = ParseSparseIndex(key);
        if (!index.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              source, " cluster.", type, " has key \"", key,
              "\", which is not a task index: key each address by its index, like {\"1\": "
              "\"host:port\"}"));
        }
        if (auto status = AddressField(source, type, absl::StrCat(".", key), address, job, *index);
            !status.ok()) {
          return status;
        }
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          source, " cluster.", type, " is ", JsonForMessage(tasks),
          ": write it as a list of \"host:port\" strings, or as an object keyed by task index"));
    }
  }
  if (auto status = ValidateClusterSpec(spec, source); !status.ok()) return status;
  return spec;
}

void ClusterSpec::SetTask(const std::string& type, int index, std::string address) {
  jobs_[type][index] = std::move(address);
}

bool ClusterSpec::HasJob(absl::string_view type) const { return jobs_.find(type) != jobs_.end(); }

bool ClusterSpec::HasTask(absl::string_view type, int index) const {
  auto job = jobs_.find(type);
  return job != jobs_.end() && job->second.count(index) > 0;
}

std::vector<std::string> ClusterSpec::job_names() const {
  std::vector<std::string> names;
  for (const auto& [name, job] : jobs_) names.push_back(name);
  std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return JobRank(a) < JobRank(b);
  });
  return names;
}

int ClusterSpec::num_tasks(absl::string_view type) const {
  auto job = jobs_.find(type);
  return job == jobs_.end() ? 0 : static_cast<int>(job->second.size());
}

std::vector<int> ClusterSpec::task_indices(absl::string_view type) const {
  std::vector<int> indices;
  auto job = jobs_.find(type);
  if (job == jobs_.end()) return indices;
  for (const auto& [index, address] : job->second) indices.push_back(index);
  return indices;
}

absl::StatusOr<std::string> ClusterSpec::TaskAddress(absl::string_view type, int index) const {
  auto job = jobs_.find(type);
  if (job == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("the cluster has no job \"", type, "\""));
  }
  auto task = job->second.find(index);
  if (task == job->second.end()) {
    return absl::NotFoundError(absl::StrCat("the cluster has no task ", type, ":", index));
  }
  return task->second;
}

std::vector<TaskKey> ClusterSpec::AllTasks() const {
  std::vector<TaskKey> tasks;
  for (const std::string& type : job_names()) {
    for (int index : task_indices(type)) tasks.push_back({type, index});
  }
  return tasks;
}

nlohmann::json ClusterSpec::ToJson() const {
  nlohmann::json cluster = nlohmann::json::object();
  for (const auto& [type, job] : jobs_) {
    const bool dense = job.empty() || job.rbegin()->first == static_cast<int>(job.size()) - 1;
    if (dense) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& [index, address] : job) list.push_back(address);
      cluster[type] = std::move(list);
    } else {
      nlohmann::json sparse = nlohmann::json::object();
      for (const auto& [index, address] : job) sparse[std::to_string(index)] = address;
      cluster[type] = std::move(sparse);
    }
  }
  return cluster;
}

namespace {

// What names the socket `address` (valid) stands for, for telling two tasks' apart: host
// names are not case-sensitive, and the loopback has several names. (A server binds a
// loopback name or an IP as given, and a host name on every interface.)
std::string SocketOf(absl::string_view address) {
  std::string host = absl::AsciiStrToLower(HostOf(address));
  // One spelling per IPv6 address ("0:0:0:0:0:0:0:1" is "::1"); an IPv4-mapped one is its
  // IPv4 address, which an IPv6 socket of the host serves too.
  if (in6_addr ipv6; inet_pton(AF_INET6, host.c_str(), &ipv6) == 1) {
    char text[INET6_ADDRSTRLEN] = {};
    if (IN6_IS_ADDR_V4MAPPED(&ipv6)) {
      inet_ntop(AF_INET, &ipv6.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &ipv6, text, sizeof(text));
    }
    host = text;
  }
  const bool loopback = host == "localhost" || host == "127.0.0.1" || host == "::1" ||
                        host == "localhost.localdomain" || host == "ip6-localhost";
  return absl::StrCat(loopback ? "this machine's loopback" : absl::StrCat("host ", host), ", port ",
                      PortOf(address));
}

}  // namespace

absl::Status ValidateClusterSpec(const ClusterSpec& spec, absl::string_view source) {
  if (spec.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     " cluster is empty: list the tasks, for example \"cluster\": {\"worker\": "
                     "[\"host1:2222\", \"host2:2222\"], \"ps\": [\"host3:2222\"]}"));
  }
  struct Owner {
    std::string task;
    std::string address;
  };
  std::map<std::string, Owner> owner_of_socket;
  for (const std::string& type : spec.job_names()) {
    if (!IsValidTaskType(type)) {
      return absl::InvalidArgumentError(absl::StrCat(source, " cluster has job \"", type,
                                                     "\", which is not a task type: name jobs ",
                                                     TaskTypeList()));
    }
    const int count = spec.num_tasks(type);
    if (count == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " cluster.", type,
                       " is empty: list at least one \"host:port\" or remove the "
                       "job"));
    }
    if ((type == kChief || type == kEvaluator) && count > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, " cluster.", type, " has ", count, " tasks, but a cluster has at most one ", type,
          ": keep one", type == kChief ? " and list the others under \"worker\"" : ""));
    }
    for (const auto& [index, address] : spec.jobs().find(type)->second) {
      if (auto status = ValidateAddress(address); !status.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, " cluster address \"", address, "\" of ", type, ":", index,
                         " is not valid because ", status.message(),
                         ": write it as host:port, for example \"localhost:2222\""));
      }
      const std::string task = absl::StrCat(type, ":", index);
      const std::string socket = SocketOf(address);
      auto [it, inserted] = owner_of_socket.emplace(socket, Owner{task, address});
      if (inserted) continue;
      if (it->second.address == address) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, " cluster address \"", address, "\" is given to both ",
                         it->second.task, " and ", task, ": give every task its own host:port"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat(source, " cluster addresses \"", it->second.address, "\" of ",
                       it->second.task, " and \"", address, "\" of ", task, " are one socket (",
                       socket, "): give every task its own host:port"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTask(const ClusterSpec& spec, absl::string_view type, int index,
                          absl::string_view source) {
  if (!IsValidTaskType(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " task.type \"", type, "\" is not a task type: use ", TaskTypeList()));
  }
  if (index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " task.index ", index, " is negative: task indices count from 0"));
  }
  if (!spec.HasJob(type)) {
    // TensorFlow lets an evaluator stay outside the cluster it evaluates.
    if (type == kEvaluator) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        source, " task.type \"", type,
        "\" is not a job of the cluster (jobs: ", absl::StrJoin(spec.job_names(), ", "),
        "): add a \"", type, "\" job to cluster or fix task.type"));
  }
  if (!spec.HasTask(type, index)) {
    const int count = spec.num_tasks(type);
    return absl::InvalidArgumentError(absl::StrCat(
        source, " task.index ", index, " is out of range: job \"", type, "\" has ", count,
        count == 1 ? " task" : " tasks", " (", DescribeIndices(spec, type), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TaskKey> ChiefTask(const ClusterSpec& spec) {
  if (spec.HasJob(kChief)) return TaskKey{kChief, spec.task_indices(kChief).front()};
  if (spec.HasTask(kWorker, 0)) return TaskKey{kWorker, 0};
  return absl::NotFoundError("the cluster has no chief: it has neither a chief job nor worker:0");
}

bool IsChief(const ClusterSpec& spec, absl::string_view type, int index) {
  absl::StatusOr<TaskKey> chief = ChiefTask(spec);
  return chief.ok() && chief->type == type && chief->index == index;
}

absl::StatusOr<int> IdInCluster(const ClusterSpec& spec, absl::string_view type, int index) {
  if (type == kChief) return 0;
  if (type == kWorker) {
    // Its place among the workers, so that a sparse job ({"0": ..., "2": ...}, as Kubeflow
    // may write it) still numbers them 0..n-1; the index itself when they are dense.
    const std::vector<int> indices = spec.task_indices(kWorker);
    const auto at = std::lower_bound(indices.begin(), indices.end(), index);
    const int place =
        at != indices.end() && *at == index ? static_cast<int>(at - indices.begin()) : index;
    return place + (spec.HasJob(kChief) ? 1 : 0);
  }
  if (type == kEvaluator) return index;
  return absl::InvalidArgumentError(absl::StrCat("a task of type \"", type,
                                                 "\" has no id in the cluster: only chief, "
                                                 "worker and evaluator tasks do"));
}

absl::StatusOr<int> WorkerCount(const ClusterSpec& spec, absl::string_view type) {
  if (type == kEvaluator) return spec.num_tasks(kEvaluator);
  if (type == kChief || type == kWorker) return spec.num_tasks(kChief) + spec.num_tasks(kWorker);
  return absl::InvalidArgumentError(absl::StrCat("worker count asked for task type \"", type,
                                                 "\": ask for chief, worker or evaluator"));
}

}  // namespace stratum
