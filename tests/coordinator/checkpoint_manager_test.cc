// CheckpointManager against a PS service in this process (InProcessPs): what a save
// commits when a PS has restarted since the job's variables were created on it.
#include <unistd.h>

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stratum/coordinator/checkpoint_manager.h"
#include "stratum/testing/in_process_ps.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::InProcessPs;
using testing::StatusIs;

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.5}})");

// A PS that restarted between the last push and a save (a quick restart, or one that the
// save's call waited out) saves an empty store. Committed, that checkpoint would start its
// shards afresh at the next restore, silently: the save fails instead, as a PS failure, and
// the last checkpoint stays the latest.
TEST(CheckpointManagerTest, ASaveFromAPsThatLostItsShardsIsNotCommitted) {
  absl::StatusOr<std::unique_ptr<InProcessPs>> ps = InProcessPs::Start();
  ASSERT_TRUE(ps.ok()) << ps.status();
  std::vector<std::unique_ptr<PsClient>> clients;
  clients.push_back(std::make_unique<PsClient>("ps:0", (*ps)->address(),
                                               PsClientOptions{.timeout = absl::Seconds(5)}));
  ShardedVariables variables({"w"}, {Shape{2}},
                             {ShardSpec{.name = "w", .variable = "w", .shape = Shape{2}}},
                             std::move(clients));
  ASSERT_TRUE(variables.Create({Tensor::FromVector<float>({2}, {1, 2})}, kSgd).ok());
  const std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                       "/checkpoint_manager_test_", getpid());
  std::filesystem::remove_all(dir);
  CheckpointManager checkpoints(dir, /*max_to_keep=*/3, variables);
  ASSERT_TRUE(checkpoints.Save(10).ok());

  ASSERT_TRUE((*ps)->Restart().ok());
  EXPECT_THAT(checkpoints.Save(20),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("a parameter server is unavailable: "),
                             HasSubstr(kPsLostItsVariables),
                             HasSubstr("ps:0 at " + (*ps)->address() + " saved no \"w\""))));
  const absl::StatusOr<std::optional<std::string>> latest = checkpoints.Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_THAT(**latest, HasSubstr("ckpt-000000000010"));

  // Re-seeded and restored, the PS holds the state of step 10 again.
  ASSERT_TRUE(variables.Create({Tensor::FromVector<float>({2}, {0, 0})}, kSgd).ok());
  const absl::StatusOr<std::optional<int64_t>> restored = checkpoints.RestoreLatest();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, std::optional<int64_t>(10));
  const absl::StatusOr<std::vector<Tensor>> values = variables.Pull();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_TRUE((*values)[0].BitwiseEqual(Tensor::FromVector<float>({2}, {1, 2})));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stratum
