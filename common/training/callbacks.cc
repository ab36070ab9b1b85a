#include "stratum/training/callbacks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "stratum/training/event_file.h"
#include "stratum/util/number_text.h"
#include "stratum/util/status_macros.h"

namespace stratum {

bool IsAucMetric(const std::string& metric) { return metric == "auc" || metric == "AUC"; }

bool MeasuresAuc(const std::vector<std::string>& metrics) {
  return std::any_of(metrics.begin(), metrics.end(), IsAucMetric);
}

Logs LogsOf(const EpochLog& log, const std::vector<std::string>& metrics) {
  Logs logs = {{"loss", log.loss}};
  // Keras names the AUC metric "auc" in the logs, whatever case the job gave it in.
  for (const std::string& metric : metrics) {
    if (IsAucMetric(metric)) {
      if (log.auc) logs["auc"] = *log.auc;
    } else {
      logs[metric] = log.accuracy;
    }
  }
  if (log.validated) {
    logs["val_loss"] = log.val_loss;
    for (const std::string& metric : metrics) {
      if (IsAucMetric(metric)) {
        if (log.val_auc) logs["val_auc"] = *log.val_auc;
      } else {
        logs["val_" + metric] = log.val_accuracy;
      }
    }
  }
  return logs;
}

namespace {

using json = nlohmann::json;

// Whether a larger value of `monitor` is better, as Keras' mode "auto" infers it: the
// accuracies and the AUC are, the losses are not.
bool HigherIsBetter(const std::string& mode, const std::string& monitor) {
  if (mode != "auto") return mode == "max";
  return monitor.find("acc") != std::string::npos || monitor.find("auc") != std::string::npos;
}

// keras.callbacks.EarlyStopping.
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(const json& c)
      : monitor_(c["monitor"]),
        higher_(HigherIsBetter(c["mode"], monitor_)),
        min_delta_(std::abs(c["min_delta"].get<double>())),
        patience_(c["patience"]),
        verbose_(c["verbose"].get<int>() > 0),
        has_baseline_(c["baseline"].is_number()),
        baseline_(has_baseline_ ? c["baseline"].get<double>() : 0),
        restore_best_weights_(c["restore_best_weights"]),
        start_from_epoch_(c["start_from_epoch"]),
        best_(higher_ ? -std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::infinity()) {}

  std::string name() const override { return "EarlyStopping"; }
  bool stop_training() const override { return stopped_epoch_ >= 0; }

  absl::Status OnTrainBegin(const std::vector<Logs>& history, CallbackHost& /*host*/) override {
    for (size_t epoch = 0; epoch < history.size(); ++epoch) {
      Watch(static_cast<int>(epoch), history[epoch]);
    }
    stopped_epoch_ = -1;  // a stop in the history ended that run, not this one
    return absl::OkStatus();
  }

  absl::Status OnEpochEnd(int epoch, Logs& logs, const EpochLog& /*figures*/,
                          CallbackHost& host) override {
    const auto current = logs.find(monitor_);
    if (current == logs.end() || epoch < start_from_epoch_) return absl::OkStatus();
    // Keras: when no epoch has improved yet, the current weights are the best so far.
    if (restore_best_weights_ && best_weights_.empty()) {
      STRATUM_ASSIGN_OR_RETURN(best_weights_, host.GetWeights());
      best_epoch_ = epoch;
    }
    if (Watch(epoch, logs) && restore_best_weights_) {
      STRATUM_ASSIGN_OR_RETURN(best_weights_, host.GetWeights());
    }
    return absl::OkStatus();
  }

  absl::Status OnTrainEnd(CallbackHost& host) override {
    if (stopped_epoch_ >= 0 && verbose_) {
      std::fprintf(host.out(), "Epoch %d: early stopping\n", stopped_epoch_ + 1);
    }
    if (!restore_best_weights_ || best_weights_.empty()) return absl::OkStatus();
    if (verbose_) {
      std::fprintf(host.out(), "Restoring model weights from the end of the best epoch: %d.\n",
                   best_epoch_ + 1);
    }
    return host.SetWeights(best_weights_);
  }

 private:
  bool Improves(double value, double reference) const {
    return higher_ ? value - min_delta_ > reference : value + min_delta_ < reference;
  }

  // Keras' on_epoch_end without the weights: whether `epoch` improved on the best.
  bool Watch(int epoch, const Logs& logs) {
    const auto current = logs.find(monitor_);
    if (current == logs.end() || epoch < start_from_epoch_) return false;
    ++wait_;
    if (Improves(current->second, best_)) {
      best_ = current->second;
      best_epoch_ = epoch;
      // Patience starts again only past the baseline too.
      if (!has_baseline_ || Improves(current->second, baseline_)) wait_ = 0;
      return true;
    }
    if (wait_ >= patience_ && epoch > 0) stopped_epoch_ = epoch;
    return false;
  }

  const std::string monitor_;
  const bool higher_;
  const double min_delta_;
  const int64_t patience_;
  const bool verbose_;
  const bool has_baseline_;
  const double baseline_;
  const bool restore_best_weights_;
  const int64_t start_from_epoch_;
  double best_;
  int64_t wait_ = 0;
  int best_epoch_ = 0;
  int stopped_epoch_ = -1;
  std::vector<Tensor> best_weights_;
};

// keras.callbacks.ReduceLROnPlateau. The rate it sets is a function of the monitored
// values, so a resumed run replays it from the history.
class ReduceLROnPlateau : public Callback {
 public:
  explicit ReduceLROnPlateau(const json& c)
      : monitor_(c["monitor"]),
        higher_(HigherIsBetter(c["mode"], monitor_)),
        factor_(c["factor"]),
        patience_(c["patience"]),
        verbose_(c["verbose"].get<int>() > 0),
        min_delta_(c["min_delta"]),
        cooldown_(c["cooldown"]),
        min_lr_(c["min_lr"]),
        best_(higher_ ? -std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::infinity()) {}

  std::string name() const override { return "ReduceLROnPlateau"; }

  absl::Status OnTrainBegin(const std::vector<Logs>& history, CallbackHost& host) override {
    float rate = host.learning_rate();
    bool reduced = false;
    for (const Logs& logs : history) {
      if (const std::optional<float> lower = Watch(logs, rate)) {
        rate = *lower;
        reduced = true;
      }
    }
    if (!reduced) return absl::OkStatus();
    STRATUM_RETURN_IF_ERROR(host.SetLearningRate(rate));
    std::fprintf(host.out(),
                 "ReduceLROnPlateau: the learning rate goes on at %s, as reduced "
                 "over the epochs before the checkpoint\n",
                 PythonFloat(rate).c_str());
    return absl::OkStatus();
  }

  absl::Status OnEpochEnd(int epoch, Logs& logs, const EpochLog& /*figures*/,
                          CallbackHost& host) override {
    const float rate = host.learning_rate();
    logs["learning_rate"] = rate;
    const std::optional<float> lower = Watch(logs, rate);
    if (!lower) return absl::OkStatus();
    STRATUM_RETURN_IF_ERROR(host.SetLearningRate(*lower));
    if (verbose_) {
      std::fprintf(host.out(), "Epoch %d: ReduceLROnPlateau reducing learning rate to %s.\n",
                   epoch + 1, PythonFloat(*lower).c_str());
    }
    return absl::OkStatus();
  }

 private:
  // Keras' on_epoch_end: the lower rate when this epoch's patience ran out.
  std::optional<float> Watch(const Logs& logs, float rate) {
    const auto current = logs.find(monitor_);
    if (current == logs.end()) return std::nullopt;
    if (cooldown_counter_ > 0) {
      --cooldown_counter_;
      wait_ = 0;
    }
    const bool better =
        higher_ ? current->second > best_ + min_delta_ : current->second < best_ - min_delta_;
    if (better) {
      best_ = current->second;
      wait_ = 0;
      return std::nullopt;
    }
    if (cooldown_counter_ > 0) return std::nullopt;
    if (++wait_ < patience_) return std::nullopt;
    if (!(rate > static_cast<float>(min_lr_))) return std::nullopt;
    cooldown_counter_ = cooldown_;
    wait_ = 0;
    return static_cast<float>(std::max(static_cast<double>(rate) * factor_, min_lr_));
  }

  const std::string monitor_;
  const bool higher_;
  const double factor_;
  const int64_t patience_;
  const bool verbose_;
  const double min_delta_;
  const int64_t cooldown_;
  const double min_lr_;
  double best_;
  int64_t wait_ = 0;
  int64_t cooldown_counter_ = 0;
};

// keras.callbacks.ModelCheckpoint: the model in Keras' formats after each epoch, or only
// after those that improve on the best (save_best_only), to `filepath` with its
// placeholders filled: a .weights.h5 file (save_weights_only), else an export folder. The
// best value is replayed from a resumed run's history, so a resume saves only what beats
// the epochs before it.
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(const json& c)
      : filepath_(c["filepath"]),
        monitor_(c["monitor"]),
        higher_(HigherIsBetter(c["mode"], monitor_)),
        verbose_(c["verbose"].get<int>() > 0),
        best_only_(c["save_best_only"]),
        weights_only_(c["save_weights_only"]),
        best_(c["initial_value_threshold"].is_number() ? c["initial_value_threshold"].get<double>()
              : higher_                                ? -std::numeric_limits<double>::infinity()
                                                       : std::numeric_limits<double>::infinity()) {}

  std::string name() const override { return "ModelCheckpoint"; }

  absl::Status OnTrainBegin(const std::vector<Logs>& history, CallbackHost& /*host*/) override {
    for (const Logs& logs : history) {
      const auto current = logs.find(monitor_);
      if (best_only_ && current != logs.end() && Improves(current->second)) {
        best_ = current->second;
      }
    }
    return absl::OkStatus();
  }

  absl::Status OnEpochEnd(int epoch, Logs& logs, const EpochLog& /*figures*/,
                          CallbackHost& host) override {
    const std::string path = FormatPythonStyle(filepath_, epoch + 1, logs);
    if (best_only_) {
      const auto current = logs.find(monitor_);
      if (current == logs.end()) return absl::OkStatus();
      const std::string best =
          std::isfinite(best_) ? absl::StrFormat("%.5f", best_) : PythonFloat(best_);
      if (!Improves(current->second)) {
        if (verbose_) {
          std::fprintf(host.out(), "Epoch %d: %s did not improve from %s\n", epoch + 1,
                       monitor_.c_str(), best.c_str());
        }
        return absl::OkStatus();
      }
      if (verbose_) {
        std::fprintf(host.out(), "Epoch %d: %s improved from %s to %.5f, saving model to %s\n",
                     epoch + 1, monitor_.c_str(), best.c_str(), current->second, path.c_str());
      }
      best_ = current->second;
    } else if (verbose_) {
      std::fprintf(host.out(), "Epoch %d: saving model to %s\n", epoch + 1, path.c_str());
    }
    if (!host.writes_files()) return absl::OkStatus();
    return host.SaveModel(path, weights_only_);
  }

 private:
  bool Improves(double value) const { return higher_ ? value > best_ : value < best_; }

  const std::string filepath_;
  const std::string monitor_;
  const bool higher_;
  const bool verbose_;
  const bool best_only_;
  const bool weights_only_;
  double best_;
};

// keras.callbacks.TerminateOnNaN: what every Stratum job does already (a loss or variable
// that is not finite ends training with TrainingDiverged, the last good checkpoint kept).
class TerminateOnNaN : public Callback {
 public:
  std::string name() const override { return "TerminateOnNaN"; }
};

// keras.callbacks.CSVLogger: a row per epoch, "epoch" then the logs' keys sorted, into a
// file whose folder is made when missing (as TensorBoard's log_dir is). A run
// that resumed writes the epochs before it again (with append false), so the file holds
// every epoch either way.
class CSVLogger : public Callback {
 public:
  explicit CSVLogger(const json& c)
      : filename_(c["filename"]), separator_(c["separator"]), append_(c["append"]) {}

  std::string name() const override { return "CSVLogger"; }

  absl::Status OnTrainBegin(const std::vector<Logs>& history, CallbackHost& host) override {
    if (!host.writes_files()) return absl::OkStatus();
    std::error_code error;
    const bool had_rows = append_ && std::filesystem::file_size(filename_, error) > 0 && !error;
    if (const auto folder = std::filesystem::path(filename_).parent_path(); !folder.empty()) {
      std::filesystem::create_directories(folder, error);  // a failure is the open's
    }
    file_.open(filename_, append_ ? std::ios::app : std::ios::trunc);
    if (!file_) {
      return absl::FailedPreconditionError(
          absl::StrCat("CSVLogger cannot write its file ", filename_, " (", std::strerror(errno),
                       "): give a filename in a folder this process can write"));
    }
    write_header_ = !had_rows;
    if (!append_) history_ = history;
    return absl::OkStatus();
  }

  absl::Status OnEpochEnd(int epoch, Logs& logs, const EpochLog& /*figures*/,
                          CallbackHost& host) override {
    if (!host.writes_files()) return absl::OkStatus();
    if (keys_.empty()) {
      for (const auto& [key, value] : logs) keys_.push_back(key);
      if (write_header_) file_ << "epoch" << separator_ << absl::StrJoin(keys_, separator_) << "\n";
      for (size_t before = 0; before < history_.size(); ++before) {
        WriteRow(static_cast<int>(before), history_[before]);
      }
    }
    WriteRow(epoch, logs);
    file_.flush();
    if (!file_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("CSVLogger cannot write its file ", filename_, ": free space on its disk"));
    }
    return absl::OkStatus();
  }

 private:
  void WriteRow(int epoch, const Logs& logs) {
    file_ << epoch;
    for (const std::string& key : keys_) {
      const auto value = logs.find(key);
      file_ << separator_ << (value == logs.end() ? "NA" : PythonFloat(value->second));
    }
    file_ << "\n";
  }

  const std::string filename_;
  const std::string separator_;
  const bool append_;
  std::ofstream file_;
  bool write_header_ = true;
  std::vector<std::string> keys_;
  std::vector<Logs> history_;
};

// keras.callbacks.TensorBoard: the epochs' scalars as Keras writes them, "epoch_<key>" at
// step epoch (from 0), the training ones (and the learning rate, and examples/s) under
// log_dir/train, the validation ones (val_ dropped) under log_dir/validation; with
// update_freq N, "batch_<key>" every N steps, at the step count.
class TensorBoard : public Callback {
 public:
  explicit TensorBoard(const json& c)
      : log_dir_(c["log_dir"]),
        update_freq_(c["update_freq"].is_number() ? c["update_freq"].get<int64_t>() : 0),
        steps_per_second_(c["write_steps_per_second"]) {}

  std::string name() const override { return "TensorBoard"; }

  absl::Status OnTrainBegin(const std::vector<Logs>& /*history*/, CallbackHost& host) override {
    if (!host.writes_files()) return absl::OkStatus();
    STRATUM_ASSIGN_OR_RETURN(train_, EventFileWriter::Create(log_dir_ + "/train"));
    STRATUM_ASSIGN_OR_RETURN(validation_, EventFileWriter::Create(log_dir_ + "/validation"));
    if (update_freq_ > 0 && !host.has_step_logs()) {
      std::fprintf(host.out(),
                   "TensorBoard: this job's steps report their figures at each epoch's end "
                   "(parameter-server closures, the GPU path): update_freq %lld writes the "
                   "epochs' scalars only\n",
                   static_cast<long long>(update_freq_));
    }
    return absl::OkStatus();
  }

  absl::Status OnTrainBatchEnd(int64_t iteration, const Logs& logs, CallbackHost& host) override {
    if (train_ == nullptr || update_freq_ <= 0 || (iteration + 1) % update_freq_ != 0) {
      return absl::OkStatus();
    }
    for (const auto& [key, value] : logs) {
      STRATUM_RETURN_IF_ERROR(train_->WriteScalar("batch_" + key, value, iteration + 1));
    }
    return train_->WriteScalar("batch_learning_rate", host.learning_rate(), iteration + 1);
  }

  absl::Status OnEpochEnd(int epoch, Logs& logs, const EpochLog& figures,
                          CallbackHost& host) override {
    if (train_ == nullptr) return absl::OkStatus();
    for (const auto& [key, value] : logs) {
      const bool validation = key.rfind("val_", 0) == 0;
      EventFileWriter& writer = validation ? *validation_ : *train_;
      const std::string tag = "epoch_" + (validation ? key.substr(4) : key);
      STRATUM_RETURN_IF_ERROR(writer.WriteScalar(tag, value, epoch));
    }
    if (logs.count("learning_rate") == 0) {
      STRATUM_RETURN_IF_ERROR(
          train_->WriteScalar("epoch_learning_rate", host.learning_rate(), epoch));
    }
    STRATUM_RETURN_IF_ERROR(
        train_->WriteScalar("epoch_examples_per_second", figures.examples_per_sec, epoch));
    if (steps_per_second_ && figures.seconds > 0) {
      STRATUM_RETURN_IF_ERROR(train_->WriteScalar(
          "epoch_steps_per_second", static_cast<double>(figures.steps) / figures.seconds, epoch));
    }
    return absl::OkStatus();
  }

 private:
  const std::string log_dir_;
  const int64_t update_freq_;  // 0: "epoch"
  const bool steps_per_second_;
  std::unique_ptr<EventFileWriter> train_;
  std::unique_ptr<EventFileWriter> validation_;
};

}  // namespace

std::string FormatPythonStyle(const std::string& text, int epoch, const Logs& logs) {
  std::string out;
  for (size_t at = 0; at < text.size(); ++at) {
    if ((text[at] == '{' || text[at] == '}') && at + 1 < text.size() && text[at + 1] == text[at]) {
      out += text[at++];
      continue;
    }
    const size_t end = text[at] == '{' ? text.find('}', at) : std::string::npos;
    if (end == std::string::npos) {
      out += text[at];
      continue;
    }
    const std::string field = text.substr(at + 1, end - at - 1);
    const size_t colon = field.find(':');
    const std::string name = field.substr(0, colon);
    std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    at = end;
    if (name == "epoch") {
      if (!spec.empty() && spec.back() == 'd') spec.pop_back();
      // Python's {epoch:02d}: padded to the width, with zeros when the width starts with 0.
      const bool zero = !spec.empty() && spec[0] == '0';
      const int width = spec.empty() ? 0 : std::atoi(spec.c_str());
      std::string digits = std::to_string(epoch);
      if (static_cast<int>(digits.size()) < width) {
        digits.insert(0, static_cast<size_t>(width) - digits.size(), zero ? '0' : ' ');
      }
      out += digits;
      continue;
    }
    const auto value = logs.find(name);
    const double number = value == logs.end() ? std::nan("") : value->second;
    if (spec.empty()) {
      out += PythonFloat(number);
      continue;
    }
    char type = 'g';
    if (std::isalpha(static_cast<unsigned char>(spec.back())) || spec.back() == '%') {
      type = spec.back();
      spec.pop_back();
    }
    char buffer[64];
    const std::string format = absl::StrCat("%", spec, std::string(1, type == '%' ? 'f' : type));
    std::snprintf(buffer, sizeof(buffer), format.c_str(), type == '%' ? number * 100 : number);
    out += buffer;
    if (type == '%') out += '%';
  }
  return out;
}

absl::StatusOr<std::vector<std::unique_ptr<Callback>>> MakeCallbacks(
    const std::vector<CallbackSpec>& specs) {
  std::vector<std::unique_ptr<Callback>> callbacks;
  for (const CallbackSpec& spec : specs) {
    const json& c = spec.config;
    if (spec.class_name == "EarlyStopping") {
      callbacks.push_back(std::make_unique<EarlyStopping>(c));
    } else if (spec.class_name == "ReduceLROnPlateau") {
      callbacks.push_back(std::make_unique<ReduceLROnPlateau>(c));
    } else if (spec.class_name == "ModelCheckpoint") {
      callbacks.push_back(std::make_unique<ModelCheckpoint>(c));
    } else if (spec.class_name == "TerminateOnNaN") {
      callbacks.push_back(std::make_unique<TerminateOnNaN>());
    } else if (spec.class_name == "CSVLogger") {
      callbacks.push_back(std::make_unique<CSVLogger>(c));
    } else if (spec.class_name == "TensorBoard") {
      callbacks.push_back(std::make_unique<TensorBoard>(c));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("the callback ", spec.class_name, " is not one Stratum runs"));
    }
  }
  return callbacks;
}

}  // namespace stratum
