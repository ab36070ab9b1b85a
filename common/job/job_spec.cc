#include "stratum/job/job_spec.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stratum/util/json_text.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using json = nlohmann::json;

// Reads the fields of one JSON object, refusing unknown keys by name.
class Fields {
 public:
  Fields(const json& object, std::string path, absl::string_view source)
      : object_(object), path_(std::move(path)), source_(source) {}

  absl::Status CheckObject() const {
    if (object_.is_object()) return absl::OkStatus();
    return Error(path_, absl::StrCat("is ", object_.dump(), ", not an object"),
                 "write it as {...}");
  }

  absl::Status CheckKnown(const std::set<std::string>& known) const {
    for (const auto& [key, value] : object_.items()) {
      if (known.count(key) == 0) {
        return Error(Path(key), "is not a field Stratum knows",
                     absl::StrCat("use ", absl::StrJoin(known, ", ")));
      }
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Get(const std::string& key, T& out) const {
    if (!object_.contains(key)) return absl::OkStatus();
    const json& value = object_.at(key);
    bool fits = false;
    if constexpr (std::is_same_v<T, std::string>) {
      fits = value.is_string();
    } else if constexpr (std::is_same_v<T, bool>) {
      fits = value.is_boolean();
    } else if constexpr (std::is_integral_v<T>) {
      fits = value.is_number_integer() && (std::is_signed_v<T> || value.get<int64_t>() >= 0);
      // Not wrapped around: 4294967297 epochs is not 1 epoch.
      const bool in_range =
          !fits ||
          (value.is_number_unsigned()
               ? value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
               : value.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                     (std::is_same_v<T, uint64_t> ||
                      value.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max())));
      if (fits && !in_range) {
        return Error(Path(key), absl::StrCat("is ", value.dump(), ", which is out of range"),
                     absl::StrCat("write a value up to ", std::numeric_limits<T>::max()));
      }
    } else if constexpr (std::is_floating_point_v<T>) {
      fits = value.is_number();
    } else {
      fits = value.is_array();
      if (fits) {
        for (const json& item : value) fits = fits && item.is_string();
      }
    }
    if (!fits) {
      std::string shown = value.dump();
      if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
      return Error(Path(key), absl::StrCat("is ", shown, ", which has the wrong type"),
                   absl::StrCat("write a ", TypeName<T>()));
    }
    out = value.get<T>();
    return absl::OkStatus();
  }

  absl::Status Error(const std::string& path, const std::string& problem,
                     const std::string& fix) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": job field ", path, " ", problem, ": ", fix));
  }
  std::string Path(const std::string& key) const {
    return path_.empty() ? key : absl::StrCat(path_, ".", key);
  }

 private:
  template <typename T>
  static const char* TypeName() {
    if constexpr (std::is_same_v<T, std::string>) return "string";
    if constexpr (std::is_same_v<T, bool>) return "boolean (true or false)";
    if constexpr (std::is_integral_v<T>) return "non-negative integer";
    if constexpr (std::is_floating_point_v<T>) return "number";
    return "list of strings";
  }

  const json& object_;
  std::string path_;
  absl::string_view source_;
};

std::string Resolve(const std::string& path, absl::string_view base_dir) {
  if (path.empty() || path.front() == '/' || base_dir.empty()) return path;
  return absl::StrCat(base_dir, "/", path);
}

absl::Status ParseSource(const json& object, const std::string& path, absl::string_view source,
                         absl::string_view base_dir, DataSourceSpec& out) {
  Fields fields(object, path, source);
  if (absl::Status s = fields.CheckObject(); !s.ok()) return s;
  if (absl::Status s = fields.CheckKnown({"format", "images", "labels"}); !s.ok()) return s;
  for (absl::Status s : {fields.Get("format", out.format), fields.Get("images", out.images),
                         fields.Get("labels", out.labels)}) {
    if (!s.ok()) return s;
  }
  if (out.format != "idx") {
    return fields.Error(fields.Path("format"), absl::StrCat("is \"", out.format, "\""),
                        "Stratum reads \"idx\" files (gzipped or not)");
  }
  if (out.images.empty() || out.labels.empty()) {
    return fields.Error(path, "needs \"images\" and \"labels\"",
                        "give the paths of the IDX image and label files");
  }
  out.images = Resolve(out.images, base_dir);
  out.labels = Resolve(out.labels, base_dir);
  return absl::OkStatus();
}

absl::Status ParseStrategy(const json& object, absl::string_view source, StrategySpec& out) {
  Fields fields(object, "strategy", source);
  if (absl::Status s = fields.CheckObject(); !s.ok()) return s;
  if (absl::Status s = fields.CheckKnown({"type", "devices", "cross_device_ops", "num_packs",
                                          "logical_gpus_per_gpu", "intra_op_parallelism_threads",
                                          "variable_partitioner", "communication"});
      !s.ok()) {
    return s;
  }
  for (absl::Status s :
       {fields.Get("type", out.type), fields.Get("devices", out.devices),
        fields.Get("cross_device_ops", out.cross_device_ops),
        fields.Get("num_packs", out.num_packs),
        fields.Get("logical_gpus_per_gpu", out.logical_gpus_per_gpu),
        fields.Get("intra_op_parallelism_threads", out.intra_op_parallelism_threads)}) {
    if (!s.ok()) return s;
  }
  if (object.contains("variable_partitioner")) {
    out.variable_partitioner = object.at("variable_partitioner");
  }
  if (object.contains("communication")) {
    Fields communication(object.at("communication"), "strategy.communication", source);
    if (absl::Status s = communication.CheckObject(); !s.ok()) return s;
    if (absl::Status s =
            communication.CheckKnown({"implementation", "bytes_per_pack", "timeout_seconds"});
        !s.ok()) {
      return s;
    }
    for (absl::Status s :
         {communication.Get("implementation", out.communication.implementation),
          communication.Get("bytes_per_pack", out.communication.bytes_per_pack),
          communication.Get("timeout_seconds", out.communication.timeout_seconds)}) {
      if (!s.ok()) return s;
    }
    if (out.communication.bytes_per_pack < 0 || out.communication.timeout_seconds <= 0) {
      return communication.Error(
          "strategy.communication",
          "has a negative bytes_per_pack or a timeout that is not positive",
          "use bytes_per_pack >= 0 (0 packs every gradient together) and timeout_seconds > 0");
    }
  }
  static const std::set<std::string> kTypes = {"default",          "one_device",
                                               "mirrored",         "central_storage",
                                               "parameter_server", "multi_worker_mirrored"};
  if (kTypes.count(out.type) == 0) {
    return fields.Error("strategy.type", absl::StrCat("is \"", out.type, "\""),
                        absl::StrCat("use ", absl::StrJoin(kTypes, ", ")));
  }
  if (out.logical_gpus_per_gpu < 1) {
    return fields.Error("strategy.logical_gpus_per_gpu",
                        absl::StrCat("is ", out.logical_gpus_per_gpu), "use 1 (no split) or more");
  }
  if (out.intra_op_parallelism_threads < 1 || out.intra_op_parallelism_threads > 1024) {
    return fields.Error("strategy.intra_op_parallelism_threads",
                        absl::StrCat("is ", out.intra_op_parallelism_threads),
                        "use 1 (each replica on its own thread) up to 1024");
  }
  if (out.type == "default" && !out.devices.empty()) {
    return fields.Error("strategy.devices",
                        "is given for the default strategy, which runs on its one device",
                        "remove \"devices\", or use strategy.type \"one_device\" or \"mirrored\"");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view json_text, absl::string_view source,
                                     absl::string_view base_dir) {
  STRATUM_ASSIGN_OR_RETURN(
      const json root,
      ParseJsonText(json_text, absl::StrCat(source, ": the job"), source, "fix the file"));
  JobSpec job;
  Fields top(root, "", source);
  if (!root.is_object()) {  // the file itself, not a field of it
    std::string shown = root.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the job is ", shown,
        ", not a JSON object: write the job as one object, {\"model\": ..., \"compile\": ..., "
        "\"data\": ..., ...} (see examples/fashion_mnist.json)"));
  }
  if (absl::Status s =
          top.CheckKnown({"strategy", "model", "compile", "data", "fit", "checkpoint"});
      !s.ok()) {
    return s;
  }
  if (root.contains("strategy")) {
    if (absl::Status s = ParseStrategy(root["strategy"], source, job.strategy); !s.ok()) return s;
  }
  if (!root.contains("model")) {
    return top.Error("model", "is missing",
                     "add the Keras model.to_json() of a Sequential model under \"model\"");
  }
  job.model = root["model"];

  if (!root.contains("compile")) {
    return top.Error("compile", "is missing",
                     "add \"compile\": {\"optimizer\": \"adam\", \"loss\": "
                     "\"sparse_categorical_crossentropy\", \"metrics\": [\"accuracy\"]}");
  }
  Fields compile(root["compile"], "compile", source);
  if (absl::Status s = compile.CheckObject(); !s.ok()) return s;
  if (absl::Status s = compile.CheckKnown({"optimizer", "loss", "metrics"}); !s.ok()) return s;
  job.optimizer = root["compile"].value("optimizer", json("rmsprop"));
  if (!root["compile"].contains("loss")) {
    return compile.Error("compile.loss", "is missing",
                         "name a loss, e.g. \"sparse_categorical_crossentropy\"");
  }
  job.loss = root["compile"]["loss"];
  if (absl::Status s = compile.Get("metrics", job.metrics); !s.ok()) return s;
  for (const std::string& metric : job.metrics) {
    static const std::set<std::string> kMetrics = {"accuracy", "acc",
                                                   "sparse_categorical_accuracy"};
    if (kMetrics.count(metric) == 0) {
      return compile.Error("compile.metrics", absl::StrCat("has \"", metric, "\""),
                           "Stratum reports accuracy (\"accuracy\", "
                           "\"sparse_categorical_accuracy\") and the loss");
    }
  }

  if (!root.contains("data")) {
    return top.Error(
        "data", "is missing",
        "add \"data\": {\"train\": {\"images\": ..., \"labels\": ...}, \"test\": {...}}");
  }
  Fields data(root["data"], "data", source);
  if (absl::Status s = data.CheckObject(); !s.ok()) return s;
  if (absl::Status s = data.CheckKnown({"train", "test", "rescale", "auto_shard_policy"});
      !s.ok()) {
    return s;
  }
  if (!root["data"].contains("train")) {
    return data.Error("data.train", "is missing", "give the training images and labels");
  }
  if (absl::Status s =
          ParseSource(root["data"]["train"], "data.train", source, base_dir, job.data.train);
      !s.ok()) {
    return s;
  }
  if (root["data"].contains("test")) {
    if (absl::Status s =
            ParseSource(root["data"]["test"], "data.test", source, base_dir, job.data.test);
        !s.ok()) {
      return s;
    }
  }
  for (absl::Status s : {data.Get("rescale", job.data.rescale),
                         data.Get("auto_shard_policy", job.data.auto_shard_policy)}) {
    if (!s.ok()) return s;
  }
  if (!(job.data.rescale > 0)) {
    return data.Error("data.rescale", absl::StrCat("is ", job.data.rescale),
                      "use a positive factor, such as 0.00392156862745098 (1/255) for pixels");
  }

  if (root.contains("fit")) {
    Fields fit(root["fit"], "fit", source);
    if (absl::Status s = fit.CheckObject(); !s.ok()) return s;
    if (absl::Status s =
            fit.CheckKnown({"epochs", "steps_per_epoch", "batch_size_per_replica", "shuffle_buffer",
                            "seed", "validate", "steps_per_execution"});
        !s.ok()) {
      return s;
    }
    for (absl::Status s :
         {fit.Get("epochs", job.fit.epochs), fit.Get("steps_per_epoch", job.fit.steps_per_epoch),
          fit.Get("batch_size_per_replica", job.fit.batch_size_per_replica),
          fit.Get("shuffle_buffer", job.fit.shuffle_buffer), fit.Get("seed", job.fit.seed),
          fit.Get("validate", job.fit.validate),
          fit.Get("steps_per_execution", job.fit.steps_per_execution)}) {
      if (!s.ok()) return s;
    }
    if (job.fit.epochs < 1) {
      return fit.Error("fit.epochs", absl::StrCat("is ", job.fit.epochs), "train at least 1 epoch");
    }
    if (job.fit.batch_size_per_replica < 1 || job.fit.batch_size_per_replica > (1 << 20)) {
      return fit.Error("fit.batch_size_per_replica",
                       absl::StrCat("is ", job.fit.batch_size_per_replica), "use 1 to 1048576");
    }
    // Counts past 10^12 (years of steps) would only overflow the step arithmetic.
    constexpr int64_t kMost = 1000000000000;
    for (const auto& [name, value, least, fix] :
         {std::tuple{"fit.steps_per_epoch", job.fit.steps_per_epoch, 0,
                     "use 0 (one pass over the training data) or a number of steps up to "
                     "1000000000000"},
          std::tuple{"fit.shuffle_buffer", job.fit.shuffle_buffer, 0,
                     "use 0 (no shuffling) or a number of examples up to 1000000000000"},
          std::tuple{"fit.steps_per_execution", job.fit.steps_per_execution, 1,
                     "use 1 or more steps per closure, up to 1000000000000"}}) {
      if (value < least || value > kMost) return fit.Error(name, absl::StrCat("is ", value), fix);
    }
  }
  if (root.contains("checkpoint")) {
    Fields checkpoint(root["checkpoint"], "checkpoint", source);
    if (absl::Status s = checkpoint.CheckObject(); !s.ok()) return s;
    if (absl::Status s = checkpoint.CheckKnown({"dir", "every_steps", "max_to_keep"}); !s.ok()) {
      return s;
    }
    const json& fields = root["checkpoint"];
    const bool keep_all = fields.contains("max_to_keep") && fields["max_to_keep"].is_null();
    if (keep_all) job.checkpoint.max_to_keep = kKeepEveryCheckpoint;
    for (absl::Status s : {checkpoint.Get("dir", job.checkpoint.dir),
                           checkpoint.Get("every_steps", job.checkpoint.every_steps),
                           keep_all ? absl::OkStatus()
                                    : checkpoint.Get("max_to_keep", job.checkpoint.max_to_keep)}) {
      if (!s.ok()) return s;
    }
    if (job.checkpoint.every_steps < 0) {
      return checkpoint.Error(
          "checkpoint.every_steps", absl::StrCat("is ", job.checkpoint.every_steps),
          "use 0 (a checkpoint at every epoch's end only) or a number of steps");
    }
    if (job.checkpoint.max_to_keep < 1) {
      return checkpoint.Error("checkpoint.max_to_keep",
                              absl::StrCat("is ", job.checkpoint.max_to_keep),
                              "keep at least 1 checkpoint (the latest), or null for every one");
    }
    job.checkpoint.dir = Resolve(job.checkpoint.dir, base_dir);
  }
  return job;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  // Read only a plain file of a job's size: a FIFO would block and /dev/zero never ends.
  constexpr uintmax_t kMaxJobBytes = 64 << 20;
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (!error && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job file ", path,
                     " is not a regular file (a folder, a pipe or a device): pass the "
                     "path of the job's JSON file to --job"));
  }
  if (const uintmax_t bytes = std::filesystem::file_size(path, error);
      !error && bytes > kMaxJobBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job file ", path, " has ", bytes,
                                                   " bytes, more than a job's ", kMaxJobBytes,
                                                   ": pass the path of the job's JSON file"));
  }
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("job file ", path, " cannot be read: check the path passed to --job"));
  }
  std::stringstream text;
  text << file.rdbuf();
  const size_t slash = path.rfind('/');
  const std::string base_dir = slash == std::string::npos ? "." : path.substr(0, slash);
  return ParseJobSpec(text.str(), path, base_dir);
}

}  // namespace stratum
