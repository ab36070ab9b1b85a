#include "stratum/worker/mirrored_strategy.h"

#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

std::unique_ptr<MirroredStrategy> Mirrored(int replicas, const std::string& ops = "",
                                           absl::Duration timeout = absl::Minutes(1)) {
  MirroredOptions options;
  for (int r = 0; r < replicas; ++r) options.devices.push_back("CPU:" + std::to_string(r));
  options.cross_device_ops = ops;
  options.strategy.collective_timeout = timeout;
  auto strategy = MirroredStrategy::Create(options);
  EXPECT_TRUE(strategy.ok()) << strategy.status();
  return strategy.ok() ? *std::move(strategy) : nullptr;
}

TEST(MirroredStrategyTest, DefaultsToOneCpuReplicaWithoutGpus) {
  auto strategy = MirroredStrategy::Create({});
  ASSERT_OK(strategy);
  EXPECT_GE((*strategy)->NumReplicasInSync(), 1);
}

TEST(MirroredStrategyTest, RefusesDuplicateDevices) {
  MirroredOptions options;
  options.devices = {"CPU:0", "cpu:0"};
  EXPECT_THAT(std::string(MirroredStrategy::Create(options).status().message()),
              HasSubstr("is listed twice"));
}

// NCCL reduces GPU buffers: on CPU replicas it would quietly be another algorithm.
TEST(MirroredStrategyTest, RefusesNcclAllReduceOnCpuReplicas) {
  MirroredOptions options;
  options.devices = {"CPU:0", "CPU:1"};
  options.cross_device_ops = "NcclAllReduce";
  const absl::Status refused = MirroredStrategy::Create(options).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(refused.message()),
            "cross-device op NcclAllReduce all-reduces between GPUs, and these replicas are on "
            "CPU:0, CPU:1: use HierarchicalCopyAllReduce or ReductionToOneDevice (the default on "
            "CPUs)");
}

TEST(MirroredStrategyTest, EachReplicaRunsOnItsOwnThread) {
  auto strategy = Mirrored(4);
  absl::Mutex mutex;
  std::set<std::thread::id> threads;
  auto ids = strategy->Run<int>([&](ReplicaContext& context) -> absl::StatusOr<int> {
    absl::MutexLock lock(&mutex);
    threads.insert(std::this_thread::get_id());
    return context.replica_id_in_sync_group();
  });
  ASSERT_OK(ids);
  EXPECT_EQ(strategy->ExperimentalLocalResults(*ids), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(threads.size(), 4u);
}

TEST(MirroredStrategyTest, AllReduceSumsOverReplicasWithBothAlgorithms) {
  for (const char* ops : {"ReductionToOneDevice", "HierarchicalCopyAllReduce"}) {
    auto strategy = Mirrored(3, ops);
    for (int step = 0; step < 50; ++step) {  // repeated meetings reuse the rendezvous
      auto sums = strategy->Run<Tensor>([&](ReplicaContext& context) -> absl::StatusOr<Tensor> {
        const float r = static_cast<float>(context.replica_id_in_sync_group());
        return context.AllReduce(ReduceOp::kSum, Tensor::FromVector<float>({2}, {r, float(step)}));
      });
      ASSERT_TRUE(sums.ok()) << sums.status();
      for (const Tensor& sum : sums->values()) {
        EXPECT_TRUE(sum.BitwiseEqual(Tensor::FromVector<float>({2}, {3, 3.0f * step}))) << ops;
      }
    }
  }
}

TEST(MirroredStrategyTest, AFailingReplicaReleasesTheOthers) {
  auto strategy = Mirrored(3);
  const absl::Time start = absl::Now();
  absl::Status status = strategy->RunEach([](ReplicaContext& context) -> absl::Status {
    if (context.replica_id_in_sync_group() == 1) return absl::InternalError("replica 1 broke");
    std::vector<Tensor> values = {Tensor(DType::kFloat32, {4})};
    return context.AllReduce(ReduceOp::kSum, values);
  });
  EXPECT_THAT(std::string(status.message()), HasSubstr("replica 1 broke"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The strategy still works afterwards.
  auto ok = strategy->Run<Tensor>([](ReplicaContext& context) {
    return context.AllReduce(ReduceOp::kMean, Tensor::Scalar(2));
  });
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*(*ok)[2].data<float>(), 2);
}

TEST(MirroredStrategyTest, AReplicaThatSkipsTheAllReduceIsNamedAfterTheTimeout) {
  auto strategy = Mirrored(3, "", absl::Milliseconds(300));
  // Replica 2 stays busy until the others' all-reduce has returned: one that finished first
  // would release them at once (the next test), not let them time out.
  absl::Mutex mutex;
  int returned = 0;
  absl::Status status = strategy->RunEach([&](ReplicaContext& context) -> absl::Status {
    if (context.replica_id_in_sync_group() == 2) {
      absl::MutexLock lock(&mutex);
      auto others_returned = [&returned]() { return returned == 2; };
      EXPECT_TRUE(mutex.AwaitWithTimeout(absl::Condition(&others_returned), absl::Seconds(30)));
      return absl::OkStatus();  // never joins the collective
    }
    std::vector<Tensor> values = {Tensor(DType::kFloat32, {1})};
    absl::Status reduced = context.AllReduce(ReduceOp::kSum, values);
    absl::MutexLock lock(&mutex);
    ++returned;
    return reduced;
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()), HasSubstr("for replicas 2, which never arrived"));
}

TEST(MirroredStrategyTest, AReplicaThatFinishesWithoutTheAllReduceReleasesTheOthersAtOnce) {
  auto strategy = Mirrored(3);  // a 1-minute collective timeout
  const absl::Time start = absl::Now();
  absl::Status status = strategy->RunEach([](ReplicaContext& context) -> absl::Status {
    if (context.replica_id_in_sync_group() == 0) return absl::OkStatus();
    std::vector<Tensor> values = {Tensor(DType::kFloat32, {1})};
    return context.AllReduce(ReduceOp::kSum, values);
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("replica 0"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(MirroredStrategyTest, MismatchedCollectivesAreNamedNotMixed) {
  auto strategy = Mirrored(2);
  absl::Status status = strategy->RunEach([](ReplicaContext& context) -> absl::Status {
    std::vector<Tensor> values = {Tensor(DType::kFloat32, {1})};
    const ReduceOp op = context.replica_id_in_sync_group() == 0 ? ReduceOp::kSum : ReduceOp::kMean;
    return context.AllReduce(op, values);
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  // Whichever replica arrives second names the mismatch, with both sides' collectives.
  EXPECT_THAT(std::string(status.message()),
              AnyOf(HasSubstr("replica 1 all-reduces MEAN of 1 tensors while replica 0 "
                              "all-reduces SUM"),
                    HasSubstr("replica 0 all-reduces SUM of 1 tensors while replica 1 "
                              "all-reduces MEAN")));
}

TEST(MirroredStrategyTest, RunInsideAReplicaIsRefusedNotHung) {
  auto strategy = Mirrored(2);
  absl::Status status = strategy->RunEach([&](ReplicaContext&) -> absl::Status {
    return strategy->RunEach([](ReplicaContext&) { return absl::OkStatus(); });
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("use its ReplicaContext"));
}

TEST(MirroredStrategyTest, EveryReplicaThreadSeesTheStrategy) {
  auto strategy = Mirrored(3);
  auto counts = strategy->Run<int>(
      [](ReplicaContext&) -> absl::StatusOr<int> { return GetStrategy().NumReplicasInSync(); });
  ASSERT_OK(counts);
  EXPECT_EQ(counts->values(), (std::vector<int>{3, 3, 3}));
}

TEST(MirroredStrategyTest, ReduceWithAxisOverReplicas) {
  auto strategy = Mirrored(2);
  PerReplica<Tensor> values(
      {Tensor::FromVector<float>({2}, {1, 2}), Tensor::FromVector<float>({1}, {6})});
  auto mean = strategy->Reduce(ReduceOp::kMean, values, 0);
  ASSERT_OK(mean);
  EXPECT_EQ(*mean->data<float>(), 3);  // (1 + 2 + 6) / 3 examples
}

TEST(MirroredStrategyTest, ApplyGradientsKeepsMirroredCopiesIdentical) {
  auto strategy = Mirrored(4);
  DistributedVariables variables = strategy->CreateVariables(
      {Tensor::FromVector<float>({3}, {0.1f, 0.2f, 0.3f}), Tensor::Scalar(1)});
  EXPECT_EQ(variables.num_copies(), 4);
  for (int step = 0; step < 20; ++step) {
    PerReplica<std::vector<Tensor>> gradients;
    for (int r = 0; r < 4; ++r) {
      gradients.values().push_back(
          {Tensor::FromVector<float>({3}, {0.37f * r + step, 1.0f / (r + 1), -0.11f * step}),
           Tensor::Scalar(0.013f * r)});
    }
    ASSERT_TRUE(
        strategy
            ->ApplyGradients(gradients, variables,
                             [](int, std::vector<Tensor>& vars, const std::vector<Tensor>& grads) {
                               for (size_t i = 0; i < vars.size(); ++i) {
                                 vars[i].Flat() -= 0.01f * grads[i].Flat();
                               }
                               return absl::OkStatus();
                             })
            .ok());
    for (int r = 1; r < 4; ++r) {
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_TRUE(variables.ReplicaValues(r)[i].BitwiseEqual(variables.ReplicaValues(0)[i]))
            << "step " << step << " replica " << r;
      }
    }
  }
  // 20 steps of lr 0.01 on the summed gradient of element 1: sum_r 1/(r+1) = 25/12.
  EXPECT_NEAR(variables.primary()[0].data<float>()[1], 0.2f - 20 * 0.01f * 25.0f / 12, 1e-5);
}

TEST(CentralStorageStrategyTest, OneCopyReadByEveryReplica) {
  MirroredOptions options;
  options.devices = {"CPU:0", "CPU:1"};
  auto strategy = CentralStorageStrategy::Create(options);
  ASSERT_OK(strategy);
  EXPECT_EQ((*strategy)->NumReplicasInSync(), 2);
  DistributedVariables variables = (*strategy)->CreateVariables({Tensor::Scalar(5)});
  EXPECT_EQ(variables.num_copies(), 1);
  EXPECT_EQ(&variables.ReplicaValues(0), &variables.ReplicaValues(1));
  PerReplica<std::vector<Tensor>> gradients({{Tensor::Scalar(1)}, {Tensor::Scalar(2)}});
  int updates = 0;
  ASSERT_TRUE((*strategy)
                  ->ApplyGradients(
                      gradients, variables,
                      [&](int copy, std::vector<Tensor>& vars, const std::vector<Tensor>& grads) {
                        ++updates;
                        EXPECT_EQ(copy, 0);
                        vars[0].Flat() -= grads[0].Flat();
                        return absl::OkStatus();
                      })
                  .ok());
  EXPECT_EQ(updates, 1);
  EXPECT_EQ(*variables.primary()[0].data<float>(), 2);
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// The first pitfall of tf.distribute: variables created before entering the strategy's
// Scope() (here by the default strategy, one copy) and trained by another strategy.
DistributedVariables CreatedOutsideTheScope() {
  return GetStrategy().CreateVariables({Tensor::Scalar(1)}, {"dense/kernel"});
}

// What a custom loop's replica step does with them: ForReplica in Run.
absl::Status UseInRun(Strategy& strategy, DistributedVariables& variables) {
  return strategy.RunEach([&](ReplicaContext& context) -> absl::Status {
    absl::StatusOr<std::vector<Tensor>*> copy = variables.ForReplica(context);
    if (!copy.ok()) return copy.status();
    (**copy)[0].Flat() += (**copy)[0].Flat() * 0.0f;  // read and write this replica's copy
    return absl::OkStatus();
  });
}

absl::Status Apply(Strategy& strategy, DistributedVariables& variables) {
  PerReplica<std::vector<Tensor>> gradients(std::vector<std::vector<Tensor>>(
      static_cast<size_t>(strategy.NumLocalReplicas()), {Tensor::Scalar(1)}));
  return strategy.ApplyGradients(
      gradients, variables,
      [](int, std::vector<Tensor>&, const std::vector<Tensor>&) { return absl::OkStatus(); });
}

TEST(StrategyScopeTest, MirroredRefusesVariablesMadeOutsideItsScopeNamingThem) {
  DistributedVariables outside = CreatedOutsideTheScope();
  auto strategy = Mirrored(2);
  auto scope = strategy->Scope();
  for (const absl::Status& status : {UseInRun(*strategy, outside), Apply(*strategy, outside)}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("variable \"dense/kernel\" was created by DefaultDistributionStrategy, "
                          "outside MirroredStrategy's Scope(), and has 1 copy, but "
                          "MirroredStrategy keeps 2 (one per replica): create the variables "
                          "with strategy.CreateVariables inside `auto scope = "
                          "strategy.Scope();`"));
  }
  // Inside the scope: its own, one copy per replica.
  DistributedVariables inside = GetStrategy().CreateVariables({Tensor::Scalar(1)});
  EXPECT_OK(UseInRun(*strategy, inside));
  EXPECT_OK(Apply(*strategy, inside));
  // Another Mirrored strategy's copies, for another number of replicas, are refused too.
  auto wider = Mirrored(3);
  EXPECT_EQ(UseInRun(*wider, inside).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StrategyScopeTest, OneCopyStrategiesUseOutsideVariablesAsTensorFlowWould) {
  MirroredOptions options;
  options.devices = {"CPU:0", "CPU:1"};
  auto central = CentralStorageStrategy::Create(options);
  ASSERT_OK(central);
  auto one_device = OneDeviceStrategy::Create("CPU:0");
  ASSERT_OK(one_device);
  for (Strategy* strategy : {static_cast<Strategy*>(central->get()),
                             static_cast<Strategy*>(one_device->get()), &GetStrategy()}) {
    DistributedVariables outside = CreatedOutsideTheScope();
    auto scope = strategy->Scope();
    EXPECT_TRUE(strategy->CheckVariables(outside).ok()) << strategy->name();
    EXPECT_TRUE(Apply(*strategy, outside).ok()) << strategy->name();
  }
}

}  // namespace
}  // namespace stratum
