#include "stratum/training/fit_summary.h"

#include <cstdint>

#include "absl/strings/str_format.h"
#include "stratum/util/json_text.h"

namespace stratum {

nlohmann::json EpochLogJson(const EpochLog& log) {
  nlohmann::json json = {{"epoch", log.epoch},
                         {"steps", log.steps},
                         {"loss", log.loss},
                         {"accuracy", log.accuracy},
                         {"examples_per_sec", log.examples_per_sec},
                         {"seconds", log.seconds}};
  if (log.auc) json["auc"] = *log.auc;
  if (log.validated) {  // as Keras' History: no val_ keys for an epoch not validated
    json["val_loss"] = log.val_loss;
    json["val_accuracy"] = log.val_accuracy;
    if (log.val_auc) json["val_auc"] = *log.val_auc;
  }
  if (!log.stopped_by.empty()) json["stopped_by"] = log.stopped_by;
  return json;
}

EpochLog EpochLogFromJson(const nlohmann::json& json) {
  EpochLog log;
  log.epoch = json.value("epoch", 0);
  log.steps = json.value("steps", int64_t{0});
  log.loss = JsonNumberOr(json, "loss", 0);
  log.accuracy = JsonNumberOr(json, "accuracy", 0);
  log.val_loss = JsonNumberOr(json, "val_loss", 0);
  log.val_accuracy = JsonNumberOr(json, "val_accuracy", 0);
  log.validated = json.contains("val_loss");
  if (json.contains("auc")) log.auc = JsonNumberOr(json, "auc", 0);
  if (json.contains("val_auc")) log.val_auc = JsonNumberOr(json, "val_auc", 0);
  log.examples_per_sec = JsonNumberOr(json, "examples_per_sec", 0);
  log.seconds = JsonNumberOr(json, "seconds", 0);
  if (json.contains("stopped_by") && json["stopped_by"].is_string()) {
    log.stopped_by = json["stopped_by"].get<std::string>();
  }
  return log;
}

nlohmann::json FitSummary::ToJson() const {
  nlohmann::json history_json = nlohmann::json::array();
  for (const EpochLog& log : history) history_json.push_back(EpochLogJson(log));
  return {{"test_accuracy", tested ? nlohmann::json(test_accuracy) : nlohmann::json()},
          {"test_loss", tested ? nlohmann::json(test_loss) : nlohmann::json()},
          {"test_auc", tested && test_auc ? nlohmann::json(*test_auc) : nlohmann::json()},
          {"steps", steps},
          {"examples_per_sec", examples_per_sec > 0 ? nlohmann::json(examples_per_sec) : nullptr},
          {"wall_s", wall_s},
          {"strategy", strategy},
          {"num_replicas_in_sync", num_replicas_in_sync},
          {"num_workers", num_workers},
          {"num_ps", num_ps},
          {"resumed_from_step", resumed_from_step},
          {"epochs", static_cast<int64_t>(history.size())},
          {"stopped_by", history.empty() || history.back().stopped_by.empty()
                             ? nlohmann::json()
                             : nlohmann::json(history.back().stopped_by)},
          {"history", history_json}};
}

std::string FitSummary::ResultLine() const {
  return absl::StrFormat(
      "%s, %s, %.1f s",
      tested ? absl::StrFormat("test accuracy %.4f, test loss %.4f%s", test_accuracy, test_loss,
                               test_auc ? absl::StrFormat(", test auc %.4f", *test_auc) : "")
             : "no test accuracy (the job has no data.test)",
      examples_per_sec > 0 ? absl::StrFormat("%.0f examples/s", examples_per_sec)
                           : "nothing left to train",
      wall_s);
}

}  // namespace stratum
