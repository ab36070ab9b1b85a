#include "stratum/cluster/cluster_resolver.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "stratum/util/devices.h"
#include "stratum/util/json_text.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

constexpr char kExample[] =
    "{\"cluster\": {\"worker\": [\"host1:2222\"]}, \"task\": {\"type\": \"worker\", "
    "\"index\": 0}}";

std::string Shorten(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text) {
  return ParseJsonText(text, "TF_CONFIG", "TF_CONFIG",
                       absl::StrCat("set it to a JSON object such as ", kExample));
}

struct ParsedTask {
  std::optional<std::string> type;
  std::optional<int> index;
};

absl::StatusOr<ParsedTask> ParseTask(const nlohmann::json& task) {
  ParsedTask parsed;
  if (!task.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_CONFIG task is ", Shorten(task),
                     ", not an object: write it as {\"type\": \"worker\", \"index\": 0}"));
  }
  for (const auto& [key, value] : task.items()) {
    if (key == "type") {
      if (!value.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("TF_CONFIG task.type is ", Shorten(value),
                         ", not a string: use \"chief\", \"worker\", \"ps\" or \"evaluator\""));
      }
      parsed.type = value.get<std::string>();
    } else if (key == "index") {
      // Some tools write the index as a string ("1"); TensorFlow accepts only integers.
      if (!value.is_number_integer() || value.get<long long>() < 0 ||
          value.get<long long>() > 1'000'000) {
        return absl::InvalidArgumentError(
            absl::StrCat("TF_CONFIG task.index is ", Shorten(value),
                         ", not a task index: use a non-negative integer such as 0"));
      }
      parsed.index = value.get<int>();
    } else if (key != "trial" && key != "cloud") {
      // "trial" and "cloud" are written by some cloud schedulers and carry nothing for us.
      return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG task has unknown key \"", key,
                                                     "\": a task has only \"type\" and \"index\""));
    }
  }
  return parsed;
}

// Kubeflow's training operator writes, for a TFJob with enableDynamicWorker, a
// "sparseCluster" instead of "cluster": a worker sees itself ({"worker": {"1": address}})
// and every ps; a ps sees only itself, as a list of one address whatever its index; the
// chief sees nothing ({"worker": {}, "ps": []}). Empty jobs are left out and a ps's own
// address is keyed by its index, so the cluster holds exactly what the task was told.
absl::StatusOr<ClusterSpec> FromKubeflowSparseCluster(const nlohmann::json& sparse,
                                                      const ParsedTask& task) {
  if (!sparse.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TF_CONFIG sparseCluster is ", Shorten(sparse),
        ", not an object: write it as Kubeflow does, {\"worker\": {\"1\": \"host:port\"}, "
        "\"ps\": [\"host:port\"]}"));
  }
  nlohmann::json cluster = nlohmann::json::object();
  for (const auto& [type, tasks] : sparse.items()) {
    if ((tasks.is_array() || tasks.is_object()) && tasks.empty()) continue;
    if (tasks.is_array() && tasks.size() == 1 && task.type == type && task.index.value_or(0) > 0) {
      cluster[type] = {{std::to_string(*task.index), tasks[0]}};
    } else {
      cluster[type] = tasks;
    }
  }
  const std::string own =
      task.type ? absl::StrCat(*task.type, ":", task.index.value_or(0)) : std::string("this task");
  if (cluster.empty() || (task.type && !cluster.contains(*task.type))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TF_CONFIG sparseCluster (written by Kubeflow for a TFJob with enableDynamicWorker) "
        "does not list ",
        own, ", and a Stratum ", task.type.value_or("task"),
        " needs the whole cluster: set enableDynamicWorker to false in the TFJob"));
  }
  return ClusterSpec::FromJson(cluster, "TF_CONFIG (sparse)");
}

}  // namespace

std::string ClusterResolver::master() const {
  if (!has_task()) return "";
  absl::StatusOr<std::string> own = master(task_type(), task_id());
  return own.ok() ? *own : "";
}

absl::StatusOr<std::string> ClusterResolver::master(absl::string_view type, int index) const {
  STRATUM_ASSIGN_OR_RETURN(std::string address, cluster_spec().TaskAddress(type, index));
  const std::string& layer = rpc_layer();
  return layer.empty() ? address : absl::StrCat(layer, "://", address);
}

int ClusterResolver::num_accelerators() const { return VisibleGpuCount(); }

absl::Status ValidateRpcLayer(absl::string_view rpc_layer, absl::string_view source) {
  if (rpc_layer.empty() || rpc_layer == "grpc" || rpc_layer == "grpc+tls") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, " rpc_layer \"", rpc_layer,
                   "\" is not supported: use \"grpc\" (plaintext) or \"grpc+tls\""));
}

absl::StatusOr<TFConfigClusterResolver> TFConfigClusterResolver::Create(
    absl::string_view tf_config, const TaskOverrides& overrides) {
  TFConfigClusterResolver resolver;
  ParsedTask task;
  std::optional<nlohmann::json> sparse_cluster;
  if (!tf_config.empty()) {
    STRATUM_ASSIGN_OR_RETURN(nlohmann::json config, ParseJson(tf_config));
    if (!config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG is ", Shorten(config),
                                                     ", not a JSON object: set it to an "
                                                     "object such as ",
                                                     kExample));
    }
    for (const auto& [key, value] : config.items()) {
      if (key == "cluster") {
        STRATUM_ASSIGN_OR_RETURN(resolver.spec_, ClusterSpec::FromJson(value, "TF_CONFIG"));
      } else if (key == "sparseCluster") {
        sparse_cluster = value;  // read once the task is known
      } else if (key == "task") {
        STRATUM_ASSIGN_OR_RETURN(task, ParseTask(value));
      } else if (key == "rpc_layer" || key == "environment") {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "TF_CONFIG ", key, " is ", Shorten(value), ", not a string: ",
              key == "environment" ? "write it as \"cloud\" (Kubeflow's value) or leave it out"
                                   : "write it as \"grpc\""));
        }
        (key == "rpc_layer" ? resolver.rpc_layer_ : resolver.environment_) =
            value.get<std::string>();
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "TF_CONFIG has unknown key \"", key,
            "\": the keys are \"cluster\", \"task\", \"rpc_layer\" and \"environment\""));
      }
    }
    if (sparse_cluster) {
      if (config.contains("cluster")) {
        return absl::InvalidArgumentError(
            "TF_CONFIG has both \"cluster\" and \"sparseCluster\": keep one");
      }
      ParsedTask effective = task;
      if (overrides.task_type) effective.type = overrides.task_type;
      if (overrides.task_index) effective.index = overrides.task_index;
      STRATUM_ASSIGN_OR_RETURN(resolver.spec_,
                               FromKubeflowSparseCluster(*sparse_cluster, effective));
    } else if (!config.contains("cluster")) {
      return absl::InvalidArgumentError(
          absl::StrCat("TF_CONFIG has no \"cluster\": add one, as in ", kExample));
    }
  }
  if (overrides.task_type) task.type = overrides.task_type;
  if (overrides.task_index) task.index = overrides.task_index;
  if (overrides.rpc_layer) resolver.rpc_layer_ = *overrides.rpc_layer;
  STRATUM_RETURN_IF_ERROR(ValidateRpcLayer(resolver.rpc_layer_));

  if (task.type.has_value() != task.index.has_value()) {
    return absl::InvalidArgumentError(
        task.type ? absl::StrCat("TF_CONFIG task has a type (\"", *task.type,
                                 "\") but no index: add \"index\": 0 (or the task's index)")
                  : "TF_CONFIG task has an index but no type: add \"type\": \"worker\" (or the "
                    "task's type)");
  }
  if (task.type) {
    STRATUM_RETURN_IF_ERROR(ValidateTask(resolver.spec_, *task.type, *task.index));
    resolver.task_type_ = *task.type;
    resolver.task_id_ = *task.index;
  }
  return resolver;
}

absl::StatusOr<SimpleClusterResolver> SimpleClusterResolver::Create(ClusterSpec spec,
                                                                    std::string task_type,
                                                                    int task_id,
                                                                    std::string rpc_layer) {
  STRATUM_RETURN_IF_ERROR(ValidateClusterSpec(spec, "cluster spec"));
  STRATUM_RETURN_IF_ERROR(ValidateRpcLayer(rpc_layer, "cluster spec"));
  if (!task_type.empty()) {
    STRATUM_RETURN_IF_ERROR(ValidateTask(spec, task_type, task_id, "cluster spec"));
  }
  SimpleClusterResolver resolver;
  resolver.spec_ = std::move(spec);
  resolver.task_type_ = std::move(task_type);
  resolver.task_id_ = task_id;
  resolver.rpc_layer_ = std::move(rpc_layer);
  return resolver;
}

std::string MakeTfConfig(const ClusterSpec& spec, const TaskKey& task,
                         absl::string_view rpc_layer) {
  // Ordered, so that the text reads as people write TF_CONFIG.
  nlohmann::ordered_json config = {{"cluster", nlohmann::ordered_json::parse(spec.ToJson().dump())},
                                   {"task", {{"type", task.type}, {"index", task.index}}}};
  if (!rpc_layer.empty()) config["rpc_layer"] = rpc_layer;
  return config.dump();
}

}  // namespace stratum
