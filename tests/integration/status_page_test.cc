// The live status page as a user sees it: a parameter-server cluster trains on loopback,
// its coordinator serves the page (--status_port), and a real browser (Debian's Chromium,
// headless, installed by the test's set-up fixture) loads it once the curves have two
// epochs: the DOM holds the tasks and curves of at least two points, and a screenshot of
// it is not blank (tests/integration/png_stats.py decodes the PNG).
#include <filesystem>
#include <fstream>
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "stratum/net/free_port.h"
#include "stratum/net/http_server.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using testing::RemoveFolder;
using testing::TempPath;

// Runs `argv` to its end (60 s at most); its exit code and output.
std::pair<int, std::string> RunToEnd(std::vector<std::string> argv) {
  SubprocessOptions options;
  options.argv = std::move(argv);
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  if (!process.ok()) return {-1, std::string(process.status().message())};
  auto exit = (*process)->Wait(absl::Seconds(60));
  return {exit.ok() ? exit->exit_code : -1, (*process)->output()};
}

// Chromium, headless, on `url`, with `what` ("--dump-dom", "--screenshot=...").
std::pair<int, std::string> Chromium(const std::string& url, const std::string& what,
                                     const std::string& profile) {
  return RunToEnd({"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
                   "--disable-dev-shm-usage", "--user-data-dir=" + profile,
                   "--window-size=1100,900", "--hide-scrollbars", what, url});
}

TEST(StatusPageTest, ABrowserShowsTheClusterAndCurvesThatGrowWhileItTrains) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_ps.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job.erase("checkpoint");
  job["fit"]["epochs"] = 100000;  // stopped once the page has been seen
  job["fit"]["steps_per_epoch"] = 40;
  const std::string job_path = TempPath("status_page_job.json");
  std::ofstream(job_path) << job.dump();
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 2,
       .chief = true,
       .args_by_type = {{"chief", {"--job=" + job_path, absl::StrCat("--status_port=", *port)}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // The page's JSON, once two epochs are in.
  nlohmann::json status;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(300))) {
    absl::StatusOr<HttpResponse> got = HttpGet("127.0.0.1", *port, "/status.json");
    if (!got.ok() || got->status != 200) continue;
    status = nlohmann::json::parse(got->body, nullptr, false);
    if (!status.is_discarded() && status["history"].size() >= 2) break;
  }
  ASSERT_TRUE(status.is_object() && status["history"].size() >= 2)
      << status.dump() << (*cluster)->Output({"chief", 0});
  EXPECT_EQ(status["strategy"], "ParameterServerStrategy");
  ASSERT_EQ(status["tasks"].size(), 5u);
  for (const nlohmann::json& task : status["tasks"]) {
    EXPECT_TRUE(task["healthy"].get<bool>()) << task.dump();
    EXPECT_EQ(task["restarts"], 0) << task.dump();
    EXPECT_EQ(task["incarnation"].get<std::string>().size(), 16u) << task.dump();
  }

  const std::string url = absl::StrCat("http://127.0.0.1:", *port, "/");
  const std::string profile = TempPath("chromium_profile");
  const auto [dom_code, dom] = Chromium(url, "--dump-dom", profile);
  ASSERT_EQ(dom_code, 0) << dom;
  EXPECT_THAT(dom, HasSubstr("ParameterServerStrategy"));
  for (const char* task : {"chief:0", "worker:0", "worker:1", "ps:0", "ps:1"}) {
    EXPECT_THAT(dom, HasSubstr(absl::StrCat("<td>", task, "</td>")));
  }
  // Every curve (loss and accuracy, train and validation) has two points or more.
  const std::regex curve("<polyline class=\"curve\" data-name=\"([a-z]+)\" points=\"([^\"]*)\"");
  int curves = 0;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), curve); it != std::sregex_iterator();
       ++it) {
    const std::vector<std::string> points =
        absl::StrSplit((*it)[2].str(), ' ', absl::SkipWhitespace());
    EXPECT_GE(points.size(), 2u) << (*it)[1];
    ++curves;
  }
  EXPECT_EQ(curves, 4) << dom;

  const std::string shot = TempPath("status_page") + ".png";
  const auto [shot_code, shot_output] = Chromium(url, "--screenshot=" + shot, profile);
  ASSERT_EQ(shot_code, 0) << shot_output;
  const auto [stats_code, stats_text] =
      RunToEnd({"/usr/bin/python3",
                std::string(STRATUM_SOURCE_DIR) + "/tests/integration/png_stats.py", shot});
  ASSERT_EQ(stats_code, 0) << stats_text;
  const nlohmann::json stats = nlohmann::json::parse(stats_text);
  EXPECT_EQ(stats["width"], 1100);
  // Text, a table and coloured curves: many colours, and a fair share not white.
  EXPECT_GT(stats["colours"].get<int>(), 20) << stats_text;
  EXPECT_GT(stats["non_white"].get<double>(), 0.02) << stats_text;
  RemoveFolder(profile);
  std::filesystem::remove(shot);
}

TEST(StatusPageTest, APortInUseIsRefusedWithTheFlagToChange) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_OK(port);
  auto holder = HttpServer::Start(absl::StrCat("127.0.0.1:", *port), {});
  ASSERT_TRUE(holder.ok()) << holder.status();
  auto cluster =
      LocalCluster::Start({.num_workers = 1,
                           .num_ps = 1,
                           .chief = true,
                           .not_started = {{"worker", 0}, {"ps", 0}},
                           .args_by_type = {{"chief",
                                             {"--job=" + std::string(STRATUM_SOURCE_DIR) +
                                                  "/examples/fashion_mnist_ps.json",
                                              absl::StrCat("--status_port=", *port)}}},
                           .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_NE(exit->exit_code, 0);
  EXPECT_THAT((*cluster)->Output({"chief", 0}),
              HasSubstr(absl::StrCat("the status page cannot listen on 127.0.0.1:", *port)));
  EXPECT_THAT((*cluster)->Output({"chief", 0}), HasSubstr("choose another --status_port"));
}

}  // namespace
}  // namespace stratum
