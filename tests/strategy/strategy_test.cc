#include "stratum/strategy/strategy.h"
#include "stratum/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum {
namespace {

using ::testing::HasSubstr;

TEST(StrategyTest, DefaultStrategyOutsideAnyScope) {
  EXPECT_FALSE(HasStrategy());
  EXPECT_EQ(GetStrategy().name(), "DefaultDistributionStrategy");
  EXPECT_EQ(GetStrategy().NumReplicasInSync(), 1);
}

TEST(StrategyTest, ScopeSetsTheCurrentStrategyAndNests) {
  auto one = OneDeviceStrategy::Create("CPU:0");
  ASSERT_TRUE(one.ok()) << one.status();
  {
    auto scope = (*one)->Scope();
    EXPECT_EQ(&GetStrategy(), one->get());
    DefaultStrategy inner;
    {
      auto inner_scope = inner.Scope();
      EXPECT_EQ(&GetStrategy(), &inner);
    }
    EXPECT_EQ(&GetStrategy(), one->get());
  }
  EXPECT_EQ(GetStrategy().name(), "DefaultDistributionStrategy");
}

TEST(StrategyTest, OneDeviceRunsOnceAndAllReduceIsIdentity) {
  auto strategy = OneDeviceStrategy::Create("/job:localhost/replica:0/task:0/device:CPU:0");
  ASSERT_OK(strategy);
  EXPECT_EQ((*strategy)->devices(), std::vector<std::string>{"CPU:0"});
  auto result = (*strategy)->Run<Tensor>([](ReplicaContext& context) -> absl::StatusOr<Tensor> {
    return context.AllReduce(ReduceOp::kSum, Tensor::FromVector<float>({2}, {1, 2}));
  });
  ASSERT_OK(result);
  ASSERT_EQ(result->size(), 1);
  EXPECT_EQ((*result)[0].data<float>()[1], 2);
}

TEST(StrategyTest, DeviceNamesAreChecked) {
  EXPECT_EQ(*CanonicalDevice("cpu:1"), "CPU:1");
  EXPECT_EQ(*CanonicalDevice("/device:CPU:3"), "CPU:3");
  EXPECT_THAT(std::string(CanonicalDevice("TPU:0").status().message()),
              HasSubstr("device \"TPU:0\" is not a device name"));
  EXPECT_FALSE(CanonicalDevice("CPU:x").ok());
  EXPECT_FALSE(OneDeviceStrategy::Create("CPU").ok());
}

TEST(StrategyTest, ReduceAcrossReplicasAndAlongAnAxis) {
  DefaultStrategy strategy;
  PerReplica<Tensor> values({Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4})});
  auto sum = strategy.Reduce(ReduceOp::kSum, values);
  ASSERT_OK(sum);
  EXPECT_TRUE(sum->BitwiseEqual(values[0]));
  auto column_mean = strategy.Reduce(ReduceOp::kMean, values, 0);
  ASSERT_OK(column_mean);
  EXPECT_TRUE(column_mean->BitwiseEqual(Tensor::FromVector<float>({2}, {2, 3})));
  auto all = strategy.Reduce(ReduceOp::kSum, values, -1);
  ASSERT_OK(all);
  EXPECT_EQ(*all->data<float>(), 10);
  EXPECT_FALSE(strategy.Reduce(ReduceOp::kSum, values, 1).ok());
}

TEST(StrategyTest, DistributeValuesFromFunction) {
  DefaultStrategy strategy;
  auto values = strategy.ExperimentalDistributeValuesFromFunction<int>(
      [](const ValueContext& context) -> absl::StatusOr<int> {
        return context.replica_id_in_sync_group * 10 + context.num_replicas_in_sync;
      });
  ASSERT_OK(values);
  EXPECT_EQ(strategy.ExperimentalLocalResults(*values), std::vector<int>{1});
}

TEST(CrossDeviceOpsTest, BothAlgorithmsGiveEveryReplicaTheSameSum) {
  for (const char* name : {"ReductionToOneDevice", "HierarchicalCopyAllReduce"}) {
    auto ops = MakeCrossDeviceOps(name);
    ASSERT_OK(ops);
    std::vector<std::vector<Tensor>> data;
    for (int r = 0; r < 5; ++r) {
      data.push_back({Tensor::FromVector<float>({3}, {float(r), 1, float(r * r)})});
    }
    std::vector<std::vector<Tensor>*> per_replica;
    for (auto& d : data) per_replica.push_back(&d);
    ASSERT_TRUE((*ops)->BatchAllReduce(ReduceOp::kSum, per_replica).ok()) << name;
    for (auto& d : data) {
      EXPECT_TRUE(d[0].BitwiseEqual(Tensor::FromVector<float>({3}, {10, 5, 30}))) << name;
    }
    for (int r = 0; r < 5; ++r) data[r][0].data<float>()[0] = float(r);
    ASSERT_OK((*ops)->BatchAllReduce(ReduceOp::kMean, per_replica));
    EXPECT_EQ(data[4][0].data<float>()[0], 2);  // (0 + 1 + 2 + 3 + 4) / 5
  }
  EXPECT_THAT(std::string(MakeCrossDeviceOps("Magic").status().message()),
              HasSubstr("cross-device op \"Magic\" is not one Stratum has"));
}

TEST(CrossDeviceOpsTest, MismatchedShapesAreRefused) {
  ReductionToOneDevice ops;
  std::vector<Tensor> a = {Tensor(DType::kFloat32, {2})};
  std::vector<Tensor> b = {Tensor(DType::kFloat32, {3})};
  std::vector<std::vector<Tensor>*> per_replica = {&a, &b};
  EXPECT_THAT(std::string(ops.BatchAllReduce(ReduceOp::kSum, per_replica).message()),
              HasSubstr("replica 1 tensor 0 is float32[3] but replica 0's is float32[2]"));
}

}  // namespace
}  // namespace stratum
