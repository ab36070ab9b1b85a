#include "stratum/training/status_page.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "stratum/net/health.h"

namespace stratum {
namespace {

std::string Escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// One curve of a chart: its name, colour and (epoch, value) points.
struct Curve {
  std::string name;
  std::string colour;
  std::vector<std::pair<double, double>> points;
};

// An SVG line chart of `curves` over the epochs, titled `title`.
std::string Chart(const std::string& title, const std::vector<Curve>& curves) {
  constexpr double kWidth = 460, kHeight = 250, kLeft = 56, kRight = 16, kTop = 30, kBottom = 36;
  double x_max = 1, y_min = INFINITY, y_max = -INFINITY;
  for (const Curve& curve : curves) {
    for (const auto& [x, y] : curve.points) {
      x_max = std::max(x_max, x);
      if (std::isfinite(y)) {
        y_min = std::min(y_min, y);
        y_max = std::max(y_max, y);
      }
    }
  }
  if (!std::isfinite(y_min)) y_min = 0, y_max = 1;
  if (y_max - y_min < 1e-9) y_min -= 0.5, y_max += 0.5;
  const double pad = (y_max - y_min) * 0.08;
  y_min -= pad;
  y_max += pad;
  auto px = [&](double x) {
    return kLeft + (x_max <= 1 ? 0.5 : (x - 1) / (x_max - 1)) * (kWidth - kLeft - kRight);
  };
  auto py = [&](double y) {
    return kTop + (y_max - y) / (y_max - y_min) * (kHeight - kTop - kBottom);
  };
  std::string svg = absl::StrFormat(
      "<svg class=\"chart\" data-title=\"%s\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
      "%.0f\" xmlns=\"http://www.w3.org/2000/svg\">"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\" stroke=\"#d0d7de\"/>"
      "<text x=\"%.0f\" y=\"20\" font-size=\"14\" font-weight=\"bold\">%s</text>",
      Escaped(title), kWidth, kHeight, kWidth, kHeight, kLeft, Escaped(title));
  // Axes, with the value range and the epochs at their ends.
  absl::StrAppendFormat(
      &svg,
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#57606a\"/>"
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#57606a\"/>",
      kLeft, kTop, kLeft, kHeight - kBottom, kLeft, kHeight - kBottom, kWidth - kRight,
      kHeight - kBottom);
  for (const double y : {y_min + pad, y_max - pad}) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.0f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.4g"
                          "</text><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                          "stroke=\"#eaeef2\"/>",
                          kLeft - 4, py(y) + 4, y, kLeft + 1, py(y), kWidth - kRight, py(y));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\">epoch 1</text>"
                        "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"end\">epoch "
                        "%.0f</text>",
                        kLeft, kHeight - kBottom + 16, kWidth - kRight, kHeight - kBottom + 16,
                        x_max);
  double legend_x = kLeft;
  for (const Curve& curve : curves) {
    if (curve.points.empty()) continue;
    std::string points;
    for (const auto& [x, y] : curve.points) {
      if (std::isfinite(y)) absl::StrAppendFormat(&points, "%.1f,%.1f ", px(x), py(y));
    }
    absl::StrAppendFormat(&svg,
                          "<polyline class=\"curve\" data-name=\"%s\" points=\"%s\" fill=\"none\" "
                          "stroke=\"%s\" stroke-width=\"2\"/>",
                          curve.name, points, curve.colour);
    for (const auto& [x, y] : curve.points) {
      if (std::isfinite(y)) {
        absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", px(x),
                              py(y), curve.colour);
      }
    }
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"4\" fill=\"%s\"/>"
                          "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">%s</text>",
                          legend_x, kHeight - 12, curve.colour, legend_x + 16, kHeight - 8,
                          curve.name);
    legend_x += 110;
  }
  return svg + "</svg>";
}

// The status of every task of `cluster`, asked in parallel (1 s at most), with the
// restarts this page has seen (incarnations after the first).
nlohmann::json TaskStatuses(const ClusterSpec& cluster, const ChannelOptions& channel) {
  static absl::Mutex seen_mutex;
  static auto* seen = new std::map<std::string, std::set<uint64_t>>();
  const std::vector<TaskKey> tasks = cluster.AllTasks();
  std::vector<absl::StatusOr<TaskReport>> reports(tasks.size(), absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < tasks.size(); ++t) {
    threads.emplace_back([&, t] {
      absl::StatusOr<std::string> address = cluster.TaskAddress(tasks[t].type, tasks[t].index);
      reports[t] = address.ok() ? GetTaskReport(*address, absl::Seconds(1), channel)
                                : absl::StatusOr<TaskReport>(address.status());
    });
  }
  for (std::thread& thread : threads) thread.join();
  nlohmann::json list = nlohmann::json::array();
  absl::MutexLock lock(&seen_mutex);
  for (size_t t = 0; t < tasks.size(); ++t) {
    const std::string name = tasks[t].ToString();
    nlohmann::json task = {{"task", name},
                           {"address", *cluster.TaskAddress(tasks[t].type, tasks[t].index)}};
    if (reports[t].ok()) {
      (*seen)[name].insert(reports[t]->incarnation);
      task["healthy"] = true;
      task["binary"] = reports[t]->binary;
      task["incarnation"] = absl::StrFormat("%016x", reports[t]->incarnation);
      task["uptime_s"] = reports[t]->uptime_seconds;
    } else {
      task["healthy"] = false;
      task["error"] = std::string(reports[t].status().message());
    }
    const size_t incarnations = (*seen)[name].size();
    task["restarts"] = incarnations > 0 ? incarnations - 1 : 0;
    list.push_back(std::move(task));
  }
  return list;
}

}  // namespace

StatusBoard& StatusBoard::Global() {
  static auto* board = new StatusBoard();
  return *board;
}

void StatusBoard::StartRun(const std::string& strategy, int epochs, int64_t steps_per_epoch,
                           const std::vector<EpochLog>& history) {
  absl::MutexLock lock(&mutex_);
  strategy_ = strategy;
  epochs_ = epochs;
  steps_per_epoch_ = steps_per_epoch;
  history_ = history;
  epoch_ = static_cast<int>(history.size());
  step_ = 0;
  outcome_.clear();
}

void StatusBoard::SetStep(int epoch, int64_t step) {
  absl::MutexLock lock(&mutex_);
  epoch_ = epoch;
  step_ = step;
}

void StatusBoard::EndEpoch(const EpochLog& log) {
  absl::MutexLock lock(&mutex_);
  while (!history_.empty() && history_.back().epoch >= log.epoch) history_.pop_back();
  history_.push_back(log);
}

void StatusBoard::EndRun(const std::string& outcome) {
  absl::MutexLock lock(&mutex_);
  outcome_ = outcome;
}

nlohmann::json StatusBoard::ToJson() const {
  absl::MutexLock lock(&mutex_);
  nlohmann::json history = nlohmann::json::array();
  for (const EpochLog& log : history_) history.push_back(EpochLogJson(log));
  return {{"strategy", strategy_},
          {"epochs", epochs_},
          {"steps_per_epoch", steps_per_epoch_},
          {"epoch", epoch_},
          {"step", step_},
          {"history", history},
          {"outcome", outcome_.empty() ? nlohmann::json() : nlohmann::json(outcome_)}};
}

std::string StatusPageHtml(const nlohmann::json& status) {
  const std::string strategy = status.value("strategy", "");
  std::string state;
  if (!status["outcome"].is_null()) {
    state = absl::StrCat("finished: ", status["outcome"].get<std::string>());
  } else if (strategy.empty()) {
    state = "waiting for the job to start";
  } else {
    state = absl::StrFormat("training epoch %d of %d, step %d of %d", status["epoch"].get<int>(),
                            status["epochs"].get<int>(), status["step"].get<int64_t>(),
                            status["steps_per_epoch"].get<int64_t>());
  }
  std::string tasks;
  for (const nlohmann::json& task : status["tasks"]) {
    const bool healthy = task["healthy"];
    absl::StrAppend(&tasks, "<tr><td>", Escaped(task["task"]), "</td><td>",
                    Escaped(task["address"]), "</td><td class=\"", healthy ? "ok" : "down", "\">",
                    healthy ? "SERVING" : "DOWN", "</td><td>", Escaped(task.value("binary", "")),
                    "</td><td><code>", Escaped(task.value("incarnation", "")), "</code></td><td>",
                    task["restarts"].dump(), "</td><td>",
                    healthy ? absl::StrFormat("%.0f s", task["uptime_s"].get<double>())
                            : Escaped(task.value("error", "")),
                    "</td></tr>");
  }
  Curve loss{"train", "#1f77b4", {}}, val_loss{"validation", "#d4552a", {}};
  Curve accuracy{"train", "#1f77b4", {}}, val_accuracy{"validation", "#d4552a", {}};
  for (const nlohmann::json& log : status["history"]) {
    const double epoch = log["epoch"].get<double>();
    loss.points.emplace_back(epoch, log["loss"].get<double>());
    accuracy.points.emplace_back(epoch, log["accuracy"].get<double>());
    if (log.contains("val_loss")) {
      val_loss.points.emplace_back(epoch, log["val_loss"].get<double>());
      val_accuracy.points.emplace_back(epoch, log["val_accuracy"].get<double>());
    }
  }
  return absl::StrCat(
      "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta http-equiv=\"refresh\" content=\"2\"><title>Stratum: ",
      Escaped(strategy.empty() ? "a job" : strategy), "</title><style>",
      "body{font-family:sans-serif;margin:24px;color:#1f2328;background:#f6f8fa}"
      "table{border-collapse:collapse;background:#fff;margin:12px 0}"
      "td,th{border:1px solid #d0d7de;padding:4px 10px;font-size:13px;text-align:left}"
      "th{background:#eaeef2}.ok{color:#1a7f37;font-weight:bold}"
      ".down{color:#cf222e;font-weight:bold}.charts{display:flex;gap:16px;flex-wrap:wrap}"
      "</style></head><body><h1>Stratum</h1><p id=\"state\"><b>",
      Escaped(strategy), "</b> &mdash; ", Escaped(state), "</p>",
      "<table id=\"tasks\"><tr><th>task</th><th>address</th><th>state</th><th>binary</th>"
      "<th>incarnation</th><th>restarts</th><th>uptime</th></tr>",
      tasks, "</table><div class=\"charts\">", Chart("loss", {loss, val_loss}),
      Chart("accuracy", {accuracy, val_accuracy}),
      "</div><p><a href=\"/status.json\">status.json</a></p></body></html>\n");
}

absl::StatusOr<std::unique_ptr<HttpServer>> ServeStatusPageIfAsked(const TaskContext& context,
                                                                   const ClusterSpec& cluster) {
  if (context.status_listen_address.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<HttpServer>> page =
      StartStatusPage(context.status_listen_address, cluster, context.channel_options());
  if (!page.ok()) {
    return absl::Status(page.status().code(),
                        absl::StrCat("the status page ", page.status().message(),
                                     ": choose another --status_port"));
  }
  spdlog::info("status page on http://{}/", context.status_listen_address);
  return page;
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartStatusPage(const std::string& address,
                                                            const ClusterSpec& cluster,
                                                            const ChannelOptions& channel) {
  auto status = [cluster, channel] {
    nlohmann::json json = StatusBoard::Global().ToJson();
    json["tasks"] = TaskStatuses(cluster, channel);
    return json;
  };
  return HttpServer::Start(address, {{"/",
                                      [status](const std::string&) {
                                        return HttpResponse{
                                            .content_type = "text/html; charset=utf-8",
                                            .body = StatusPageHtml(status())};
                                      }},
                                     {"/status.json", [status](const std::string&) {
                                        return HttpResponse{.content_type = "application/json",
                                                            .body = status().dump(2)};
                                      }}});
}

}  // namespace stratum
