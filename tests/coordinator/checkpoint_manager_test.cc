// CheckpointManager against PS services in this process (InProcessPs): what a save
// commits when a PS has restarted since the job's variables were created on it, and a
// checkpoint resumed by a job with another number of ps tasks (its shards re-split).
#include <unistd.h>

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stratum/coordinator/checkpoint_manager.h"
#include "stratum/testing/in_process_ps.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/error_kind.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::InProcessPs;
using testing::StatusIs;

// A job's variables over `num_ps` PS services in this process, split by `partitioner`.
struct Job {
  std::vector<std::unique_ptr<InProcessPs>> ps;
  std::unique_ptr<ShardedVariables> variables;
};

// A coordinator whose checkpoints go under the temporary folder (TestDir() and the like).
PsClientOptions CoordinatorOptions() {
  return {.timeout = absl::Seconds(5),
          .checkpoint_dir = std::filesystem::temp_directory_path().string()};
}

absl::StatusOr<Job> StartJob(int num_ps, const std::vector<std::string>& names,
                             const std::vector<Shape>& shapes, const PartitionerSpec& partitioner) {
  Job job;
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int task = 0; task < num_ps; ++task) {
    absl::StatusOr<std::unique_ptr<InProcessPs>> ps = InProcessPs::Start();
    if (!ps.ok()) return ps.status();
    clients.push_back(std::make_unique<PsClient>(absl::StrCat("ps:", task), (*ps)->address(),
                                                 CoordinatorOptions()));
    // Claimed, as a coordinator does before anything else: only the holder saves.
    if (absl::Status claimed = clients.back()->Watch(true, false, /*claim=*/true).status();
        !claimed.ok()) {
      return claimed;
    }
    job.ps.push_back(*std::move(ps));
  }
  std::vector<ShardSpec> shards;
  for (size_t v = 0; v < names.size(); ++v) {
    for (ShardSpec& shard : ShardVariable(names[v], shapes[v], partitioner)) {
      shards.push_back(std::move(shard));
    }
  }
  if (absl::Status placed = PlaceShards(shards, num_ps, PlacementPolicy::kRoundRobin);
      !placed.ok()) {
    return placed;
  }
  job.variables =
      std::make_unique<ShardedVariables>(names, shapes, std::move(shards), std::move(clients));
  return job;
}

PartitionerSpec FixedShards(int64_t n) {
  return {.kind = PartitionerSpec::Kind::kFixedShards, .num_shards = n};
}

std::string TestDir() {
  const std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                       "/checkpoint_manager_test_", getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

const nlohmann::json kAdam =
    nlohmann::json::parse(R"({"class_name": "Adam", "config": {"learning_rate": 0.1}})");

// The same optimizer for each of `variables`.
std::vector<nlohmann::json> Each(const std::vector<Tensor>& variables,
                                 const nlohmann::json& optimizer) {
  return std::vector<nlohmann::json>(variables.size(), optimizer);
}

const std::vector<std::string> kNames = {"dense/kernel", "dense/bias"};
const std::vector<Shape> kShapes = {Shape{7, 3}, Shape{3}};

std::vector<Tensor> Gradients(float scale) {
  std::vector<Tensor> gradients;
  for (const Shape& shape : kShapes) {
    Tensor gradient(DType::kFloat32, shape);
    for (int64_t i = 0; i < gradient.num_elements(); ++i) {
      gradient.data<float>()[i] = scale * static_cast<float>(i % 5 - 2);
    }
    gradients.push_back(std::move(gradient));
  }
  return gradients;
}

// Variable `v`'s optimizer slot `slot` put together from its shards in the job's stores, and
// the update count of each of those shards.
Tensor WholeSlot(Job& job, size_t v, size_t slot, std::vector<int64_t>* updates) {
  Tensor whole(DType::kFloat32, kShapes[v]);
  for (const ShardSpec& shard : job.variables->shards()) {
    if (shard.variable != kNames[v]) continue;
    absl::StatusOr<VariableSnapshot> snapshot =
        job.ps[static_cast<size_t>(shard.ps_task)]->store().Snapshot(shard.name);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    if (!snapshot.ok() || snapshot->slots.size() <= slot) return Tensor();
    const int64_t rows = shard.shape.dim(0);
    whole.SliceRows(shard.first_row, shard.first_row + rows).CopyFrom(snapshot->slots[slot]);
    updates->push_back(snapshot->info.updates);
  }
  return whole;
}

// A job of 2 ps tasks (the kernel in 2 shards) trains with Adam and saves; a job of
// `num_ps` tasks (the kernel in `num_shards`) resumes from that checkpoint. It must hold
// the saved values, and, its Adam slots and step re-split with them, go on exactly as the
// first job does: the same push gives both the same values, bit for bit.
void ExpectResumesWithOtherShards(int num_ps, int64_t num_shards) {
  absl::StatusOr<Job> saved = StartJob(2, kNames, kShapes, FixedShards(2));
  ASSERT_TRUE(saved.ok()) << saved.status();
  std::vector<Tensor> initial;
  for (const Shape& shape : kShapes) {
    Tensor value(DType::kFloat32, shape);
    for (int64_t i = 0; i < value.num_elements(); ++i) {
      value.data<float>()[i] = 0.01f * static_cast<float>(i);
    }
    initial.push_back(std::move(value));
  }
  ASSERT_OK(saved->variables->Create(initial, Each(initial, kAdam)));
  ASSERT_OK(saved->variables->Push(Gradients(1)));
  ASSERT_OK(saved->variables->Push(Gradients(-0.5f)));
  const std::string dir = TestDir();
  CheckpointManager checkpoints(dir, /*max_to_keep=*/3, *saved->variables);
  ASSERT_OK(checkpoints.Save(2));
  const absl::StatusOr<std::vector<Tensor>> at_save = saved->variables->Pull();
  ASSERT_TRUE(at_save.ok()) << at_save.status();

  absl::StatusOr<Job> resumed = StartJob(num_ps, kNames, kShapes, FixedShards(num_shards));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  // The kernel in num_shards, the bias (3 rows) in as many as it has rows for.
  ASSERT_EQ(resumed->variables->shards().size(),
            static_cast<size_t>(num_shards + std::min<int64_t>(num_shards, 3)));
  std::vector<Tensor> zeros;
  for (const Shape& shape : kShapes) zeros.emplace_back(DType::kFloat32, shape);
  ASSERT_OK(resumed->variables->Create(zeros, Each(zeros, kAdam)));
  CheckpointManager resumed_checkpoints(dir, /*max_to_keep=*/3, *resumed->variables);
  const absl::StatusOr<std::optional<int64_t>> step = resumed_checkpoints.RestoreLatest();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, std::optional<int64_t>(2));
  const absl::StatusOr<std::vector<Tensor>> restored = resumed->variables->Pull();
  ASSERT_TRUE(restored.ok()) << restored.status();
  for (size_t v = 0; v < kNames.size(); ++v) {
    EXPECT_TRUE((*restored)[v].BitwiseEqual((*at_save)[v])) << kNames[v];
  }

  // Adam's m and v of each variable as saved, re-split, and its step with them.
  for (size_t v = 0; v < kNames.size(); ++v) {
    for (size_t slot = 0; slot < 2; ++slot) {
      std::vector<int64_t> updates, resumed_updates;
      const Tensor slot_at_save = WholeSlot(*saved, v, slot, &updates);
      const Tensor resumed_slot = WholeSlot(*resumed, v, slot, &resumed_updates);
      ASSERT_TRUE(slot_at_save.valid() && resumed_slot.valid()) << kNames[v];
      EXPECT_TRUE(resumed_slot.BitwiseEqual(slot_at_save)) << kNames[v] << " slot " << slot;
      EXPECT_THAT(updates, ::testing::Each(2));
      EXPECT_THAT(resumed_updates, ::testing::Each(2));
    }
  }

  // Elementwise, a shard's Adam update may differ in its last bit with where its rows fall
  // in the vectorized loop; rows that resumed without their slots and step would be off by
  // about the learning rate.
  std::vector<Tensor> went_on, resumed_went_on;
  ASSERT_OK(saved->variables->Push(Gradients(0.25f), &went_on));
  ASSERT_OK(resumed->variables->Push(Gradients(0.25f), &resumed_went_on));
  for (size_t v = 0; v < kNames.size(); ++v) {
    EXPECT_LT((resumed_went_on[v].Flat() - went_on[v].Flat()).abs().maxCoeff(), 1e-6f) << kNames[v];
    EXPECT_FALSE(went_on[v].BitwiseEqual((*at_save)[v])) << kNames[v];
  }
  std::filesystem::remove_all(dir);
}

TEST(CheckpointManagerTest, ACheckpointOf2PsTasksResumesOn3WithItsShardsSplitAgain) {
  ExpectResumesWithOtherShards(/*num_ps=*/3, /*num_shards=*/3);
}

TEST(CheckpointManagerTest, ACheckpointOf2PsTasksResumesOn1WithItsShardsJoined) {
  ExpectResumesWithOtherShards(/*num_ps=*/1, /*num_shards=*/1);
}

// A model that changed is no placement to re-split: the refusal names the first variable
// that differs and how, before any PS is touched.
TEST(CheckpointManagerTest, ACheckpointOfAnotherModelIsRefusedNamingTheVariable) {
  absl::StatusOr<Job> saved = StartJob(2, kNames, kShapes, FixedShards(2));
  ASSERT_TRUE(saved.ok()) << saved.status();
  std::vector<Tensor> zeros;
  for (const Shape& shape : kShapes) zeros.emplace_back(DType::kFloat32, shape);
  ASSERT_OK(saved->variables->Create(zeros, Each(zeros, kAdam)));
  const std::string dir = TestDir();
  CheckpointManager checkpoints(dir, /*max_to_keep=*/3, *saved->variables);
  ASSERT_OK(checkpoints.Save(5));

  absl::StatusOr<Job> wider = StartJob(3, kNames, {Shape{7, 4}, Shape{4}}, FixedShards(3));
  ASSERT_TRUE(wider.ok()) << wider.status();
  EXPECT_THAT(CheckpointManager(dir, 3, *wider->variables).RestoreLatest().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("ckpt-000000000005 holds \"dense/kernel\" as [7, 3], but "
                                       "this job's model has [7, 4]"),
                             HasSubstr("another checkpoint.dir"))));

  // The coordinator says so before it waits for its cluster.
  EXPECT_THAT(CheckLatestCheckpointHoldsModel(dir, kNames, {Shape{7, 4}, Shape{4}}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("holds \"dense/kernel\" as [7, 3], but this job's model has "
                                 "[7, 4]")));
  EXPECT_OK(CheckLatestCheckpointHoldsModel(dir, kNames, kShapes));

  absl::StatusOr<Job> renamed =
      StartJob(2, {"dense/kernel", "dense_1/bias"}, kShapes, FixedShards(2));
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_THAT(CheckpointManager(dir, 3, *renamed->variables).RestoreLatest().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("holds no variable \"dense_1/bias\", which this job's model "
                                 "has")));
  std::filesystem::remove_all(dir);
}

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
  clients.push_back(std::make_unique<PsClient>("ps:0", (*ps)->address(), CoordinatorOptions()));
  ASSERT_OK(clients.back()->Watch(true, false, /*claim=*/true));
  ShardedVariables variables({"w"}, {Shape{2}},
                             {ShardSpec{.name = "w", .variable = "w", .shape = Shape{2}}},
                             std::move(clients));
  ASSERT_TRUE(
      variables.Create({Tensor::FromVector<float>({2}, {1, 2})}, std::vector<nlohmann::json>{kSgd})
          .ok());
  const std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                       "/checkpoint_manager_test_", getpid());
  std::filesystem::remove_all(dir);
  CheckpointManager checkpoints(dir, /*max_to_keep=*/3, variables);
  ASSERT_OK(checkpoints.Save(10));

  ASSERT_OK((*ps)->Restart());
  EXPECT_THAT(checkpoints.Save(20),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("a parameter server is unavailable: "),
                             HasSubstr(kPsLostItsVariables),
                             // The restarted PS is held by no coordinator: it refuses the save.
                             HasSubstr(kNoCoordinatorHoldsIt))));
  // Typed, through the save's own wording: the job waits for the PS and re-seeds it.
  EXPECT_EQ(ErrorKindOf(checkpoints.Save(30)), ErrorKind::kPsLostItsVariables);
  const absl::StatusOr<std::optional<std::string>> latest = checkpoints.Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_THAT(**latest, HasSubstr("ckpt-000000000010"));

  // Claimed again, re-seeded and restored (as the coordinator recovers), the PS holds the
  // state of step 10 again.
  ASSERT_OK(variables.client(0).Watch(true, false, /*claim=*/true));
  ASSERT_TRUE(
      variables.Create({Tensor::FromVector<float>({2}, {0, 0})}, std::vector<nlohmann::json>{kSgd})
          .ok());
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
