#include "stratum/strategy/distributed_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/strategy/strategy.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

Tensor Range(int64_t n) {
  Tensor t(DType::kInt32, {n});
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(i);
  return t;
}

std::vector<int32_t> Values(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.num_elements());
}

TEST(DistributedDatasetTest, SplitsEachGlobalBatchOverTheReplicas) {
  const Dataset batches = Dataset::FromTensorSlices({Range(13)}).Batch(8);
  auto distributed = DistributedDataset::FromGlobalBatches(batches, 2);
  ASSERT_TRUE(distributed.ok()) << distributed.status();
  auto iterator = distributed->MakeIterator();
  auto first = iterator->GetNext();
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ(Values((**first)[0][0]), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Values((**first)[1][0]), (std::vector<int32_t>{4, 5, 6, 7}));
  auto last = iterator->GetNext();  // 5 rows: 3 + 2
  ASSERT_TRUE(last.ok() && last->has_value());
  EXPECT_EQ(Values((**last)[0][0]), (std::vector<int32_t>{8, 9, 10}));
  EXPECT_EQ(Values((**last)[1][0]), (std::vector<int32_t>{11, 12}));
  auto end = iterator->GetNext();
  ASSERT_OK(end);
  EXPECT_FALSE(end->has_value());
}

TEST(DistributedDatasetTest, AutoShardsOverWorkersBeforeSplitting) {
  const Dataset examples = Dataset::FromTensorSlices({Range(8)});
  std::vector<int32_t> seen;
  for (int worker = 0; worker < 2; ++worker) {
    auto distributed = DistributedDataset::FromGlobalBatches(
        examples.Batch(2), 1,
        {.auto_shard_policy = AutoShardPolicy::kData, .num_workers = 2, .worker_index = worker});
    ASSERT_TRUE(distributed.ok()) << distributed.status();
    auto iterator = distributed->MakeIterator();
    while (true) {
      auto batch = iterator->GetNext();
      ASSERT_OK(batch);
      if (!batch->has_value()) break;
      for (int32_t v : Values((**batch)[0][0])) seen.push_back(v);
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));  // disjoint and complete
}

TEST(DistributedDatasetTest, EachWorkerTakesItsShareOfTheGlobalBatch) {
  // A global batch of 4 over 2 workers with 2 replicas each: every step a worker takes 2
  // examples (1 per replica), so one step over the cluster is still 4 examples, as
  // tf.distribute rebatches; the rebatch reaches under the Map above the Batch.
  const Dataset global = Dataset::FromTensorSlices({Range(16)})
                             .Batch(4)
                             .Map([](Element batch) -> absl::StatusOr<Element> { return batch; });
  std::vector<int32_t> seen;
  for (int worker = 0; worker < 2; ++worker) {
    auto distributed = DistributedDataset::FromGlobalBatches(
        global, 2,
        {.auto_shard_policy = AutoShardPolicy::kData, .num_workers = 2, .worker_index = worker});
    ASSERT_TRUE(distributed.ok()) << distributed.status();
    auto iterator = distributed->MakeIterator();
    int steps = 0;
    while (true) {
      auto step = iterator->GetNext();
      ASSERT_OK(step);
      if (!step->has_value()) break;
      ++steps;
      for (int replica = 0; replica < 2; ++replica) {
        const std::vector<int32_t> rows = Values((**step)[replica][0]);
        ASSERT_EQ(rows.size(), 1u);
        seen.push_back(rows[0]);
      }
    }
    EXPECT_EQ(steps, 4);  // 8 examples of this worker's shard, 2 per step
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, Values(Range(16)));
}

TEST(DistributedDatasetTest, AGlobalBatchThatDoesNotDivideOverTheWorkersIsRefused) {
  auto distributed = DistributedDataset::FromGlobalBatches(
      Dataset::FromTensorSlices({Range(9)}).Batch(3), 1,
      {.auto_shard_policy = AutoShardPolicy::kOff, .num_workers = 2, .worker_index = 0});
  ASSERT_FALSE(distributed.ok());
  EXPECT_THAT(std::string(distributed.status().message()),
              AllOf(HasSubstr("global batch of 3"), HasSubstr("multiple of 2")));
  auto unbatched = DistributedDataset::FromGlobalBatches(
      Dataset::FromTensorSlices({Range(9)}), 1,
      {.auto_shard_policy = AutoShardPolicy::kOff, .num_workers = 2, .worker_index = 1});
  ASSERT_FALSE(unbatched.ok());
  EXPECT_THAT(std::string(unbatched.status().message()), HasSubstr("Batch(global_batch_size)"));
}

TEST(DistributedDatasetTest, FromFunctionGetsTheInputContextAndGroupsPerReplicaBatches) {
  InputContext received;
  auto distributed = DistributedDataset::FromFunction(
      [&](const InputContext& context) -> absl::StatusOr<Dataset> {
        received = context;
        auto per_replica = context.GetPerReplicaBatchSize(6);
        if (!per_replica.ok()) return per_replica.status();
        return Dataset::FromTensorSlices({Range(9)}).Batch(*per_replica);
      },
      2);
  ASSERT_TRUE(distributed.ok()) << distributed.status();
  EXPECT_EQ(received.num_replicas_in_sync, 2);
  EXPECT_EQ(received.num_input_pipelines, 1);
  auto iterator = distributed->MakeIterator();
  auto first = iterator->GetNext();
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ(Values((**first)[0][0]), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(Values((**first)[1][0]), (std::vector<int32_t>{3, 4, 5}));
  auto second = iterator->GetNext();  // one batch left: the second replica gets none
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ(Values((**second)[0][0]), (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ((**second)[1][0].rows(), 0);
}

TEST(DistributedDatasetTest, FromFunctionErrorsReachTheCaller) {
  auto distributed = DistributedDataset::FromFunction(
      [](const InputContext& context) -> absl::StatusOr<Dataset> {
        auto per_replica = context.GetPerReplicaBatchSize(5);
        if (!per_replica.ok()) return per_replica.status();
        return Dataset::FromTensorSlices({Range(4)});
      },
      2);
  ASSERT_FALSE(distributed.ok());
  EXPECT_THAT(std::string(distributed.status().message()), ::testing::HasSubstr("5"));
}

TEST(DistributedDatasetTest, UnbatchedDataIsRefusedWithTheFix) {
  auto parts = SplitRowsOverReplicas({Range(4), Tensor::Scalar(1)}, 2);
  ASSERT_FALSE(parts.ok());
  EXPECT_THAT(std::string(parts.status().message()),
              ::testing::HasSubstr("component 1 is float32[], which has no batch axis: batch "
                                   "the dataset (.Batch(global_batch_size)) before distributing "
                                   "it"));
  // An unbatched element (every component a scalar) names its component once.
  parts = SplitRowsOverReplicas({Tensor::Scalar(1)}, 2);
  EXPECT_THAT(std::string(parts.status().message()),
              ::testing::AllOf(::testing::HasSubstr("component 0 is float32[]"),
                               ::testing::Not(::testing::HasSubstr("and component 0"))));
  parts = SplitRowsOverReplicas({Range(4), Range(3)}, 2);
  EXPECT_THAT(std::string(parts.status().message()),
              ::testing::HasSubstr("component 1 is int32[3]"));
}

TEST(DistributedDatasetTest, StrategyMethodsUseItsReplicaCount) {
  DefaultStrategy strategy;
  auto distributed =
      strategy.ExperimentalDistributeDataset(Dataset::FromTensorSlices({Range(4)}).Batch(4));
  ASSERT_OK(distributed);
  EXPECT_EQ(distributed->num_replicas(), 1);
}

}  // namespace
}  // namespace stratum
