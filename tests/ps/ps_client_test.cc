// PsClient against a PS service in this process over real gRPC (InProcessPs), which the
// test stops and starts again on the same port as a PS process restarts, only faster.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/ps/ps_client.h"
#include "stratum/testing/in_process_ps.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using testing::InProcessPs;

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.5}})");

// gRPC remembers a failed connection: the channel backs off before it connects again (up
// to ChannelOptions::max_reconnect_backoff_ms) and fails calls at once meanwhile, with the
// old "Connection refused". A PS that is back must be reached by the next call, or its
// callers take it for still down (QA: workers failed their first closures after the chief
// had re-seeded a restarted PS, and the chief then said that no PS had restarted).
TEST(PsClientTest, APsThatIsBackIsReachedAtOnceByAClientWhoseConnectionFailed) {
  absl::StatusOr<std::unique_ptr<InProcessPs>> ps = InProcessPs::Start();
  ASSERT_TRUE(ps.ok()) << ps.status();
  const std::string address = (*ps)->address();
  PsClient client("ps:0", address, {.timeout = absl::Seconds(5)});
  const std::vector<NamedValue> initial = {{"w", Tensor::FromVector<float>({2}, {1, 2})}};
  ASSERT_OK(client.CreateVariables(initial, kSgd));
  (*ps)->Stop();
  const absl::Time stopped = absl::Now();
  const absl::Status down = client.Pull({"w"}).status();
  // Still reported as down, and soon: a pull waits at most for its two calls' reconnects
  // (the data path's address, then the pull itself).
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_THAT(std::string(down.message()), ::testing::HasSubstr("ps:0 at " + address));
  EXPECT_LT(absl::Now() - stopped, 2 * kReconnectWait + absl::Milliseconds(500));
  // Real time: gRPC's own reconnect back-off grows to its longest while the PS is down.
  absl::SleepFor(absl::Seconds(2));
  ASSERT_OK((*ps)->Restart());
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::vector<bool>> created = client.CreateVariables(initial, kSgd);
  EXPECT_TRUE(created.ok()) << created.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(300));
}

}  // namespace
}  // namespace stratum
