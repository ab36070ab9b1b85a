// MultiWorkerMirroredStrategy in one process: N workers on N threads, each with its own
// strategy over 2 local CPU replicas, connected by in-process transports. Checks the
// cross-worker semantics: replica ids and counts, hierarchical all-reduce, Reduce, the
// chief's broadcast, and variables identical bit for bit on every worker after every step.
#include "stratum/worker/multi_worker_mirrored_strategy.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stratum/checkpoint/checkpoint_reader.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/worker/collective/nccl_across_workers.h"
#include "stratum/worker/fit.h"

namespace stratum {
namespace {

constexpr int kLocalReplicas = 2;

std::vector<std::unique_ptr<MultiWorkerMirroredStrategy>> MakeWorkers(int workers) {
  auto group = InProcessTransportGroup::Create(workers);
  std::vector<std::unique_ptr<MultiWorkerMirroredStrategy>> strategies;
  for (int w = 0; w < workers; ++w) {
    auto collectives = Collectives::Create(group->TakeTransport(w), {});
    EXPECT_OK(collectives);
    MirroredOptions local;
    local.devices = {"CPU:0", "CPU:1"};
    auto strategy = MultiWorkerMirroredStrategy::Create(local, *std::move(collectives));
    EXPECT_TRUE(strategy.ok()) << strategy.status();
    strategies.push_back(*std::move(strategy));
  }
  return strategies;
}

// `inputs` features -> Dense `hidden` relu -> Dense `classes` softmax.
absl::StatusOr<Model> SmallClassifier(int inputs, int hidden, int classes) {
  return Model::FromKerasJson(absl::StrCat(
      R"({"class_name": "Sequential", "config": {"layers": [)",
      R"({"class_name": "InputLayer", "config": {"batch_input_shape": [null, )", inputs, "]}},",
      R"({"class_name": "Dense", "config": {"units": )", hidden, R"(, "activation": "relu"}},)",
      R"({"class_name": "Dense", "config": {"units": )", classes,
      R"(, "activation": "softmax"}}]}})"));
}

void OnEveryWorker(int workers, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) threads.emplace_back(fn, w);
  for (auto& thread : threads) thread.join();
}

TEST(MultiWorkerMirroredStrategyTest, ReplicasAreNumberedOverTheWholeJob) {
  auto workers = MakeWorkers(3);
  EXPECT_EQ(workers[1]->NumReplicasInSync(), 6);
  EXPECT_EQ(workers[1]->NumLocalReplicas(), kLocalReplicas);
  EXPECT_EQ(workers[1]->num_workers(), 3);
  EXPECT_TRUE(workers[0]->is_chief());
  EXPECT_FALSE(workers[2]->is_chief());
  auto ids = workers[2]->Run<int>([](ReplicaContext& context) -> absl::StatusOr<int> {
    return context.replica_id_in_sync_group();
  });
  ASSERT_OK(ids);
  EXPECT_EQ(ids->values(), (std::vector<int>{4, 5}));
}

TEST(MultiWorkerMirroredStrategyTest, AllReduceAndReduceCoverEveryReplicaOfEveryWorker) {
  const int n = 3;
  auto workers = MakeWorkers(n);
  std::vector<std::vector<float>> sums(n), means(n), reduced(n);
  OnEveryWorker(n, [&](int w) {
    auto result = workers[w]->Run<Tensor>([](ReplicaContext& context) -> absl::StatusOr<Tensor> {
      const float id = static_cast<float>(context.replica_id_in_sync_group());
      return context.AllReduce(ReduceOp::kSum, Tensor::FromVector<float>({2}, {id, 1.0f}));
    });
    ASSERT_TRUE(result.ok()) << result.status();
    for (const Tensor& t : result->values()) sums[w].push_back(t.data<float>()[0]);
    // Reduce over an axis: the mean of every element of every replica of every worker.
    std::vector<Tensor> values;
    for (int r = 0; r < kLocalReplicas; ++r) {
      const float id = static_cast<float>(w * kLocalReplicas + r);
      values.push_back(Tensor::FromVector<float>({2}, {id, id}));
    }
    auto mean = workers[w]->Reduce(ReduceOp::kMean, PerReplica<Tensor>(values), 0);
    ASSERT_TRUE(mean.ok()) << mean.status();
    means[w].push_back(mean->data<float>()[0]);
    auto total = workers[w]->Reduce(ReduceOp::kSum, PerReplica<Tensor>(values));
    ASSERT_TRUE(total.ok()) << total.status();
    reduced[w].push_back(total->data<float>()[0]);
  });
  // Replica ids 0..5 sum to 15; their mean is 2.5.
  for (int w = 0; w < n; ++w) {
    EXPECT_EQ(sums[w], (std::vector<float>{15, 15})) << "worker " << w;
    EXPECT_FLOAT_EQ(means[w][0], 2.5f);
    EXPECT_FLOAT_EQ(reduced[w][0], 15.0f);
  }
}

TEST(MultiWorkerMirroredStrategyTest, VariablesStayIdenticalOnEveryWorkerAfterEveryStep) {
  const int n = 2;
  auto workers = MakeWorkers(n);
  auto model = SmallClassifier(8, 16, 3);
  ASSERT_TRUE(model.ok()) << model.status();
  auto loss = Loss::FromKeras("sparse_categorical_crossentropy");
  auto optimizer = Optimizer::FromKeras("adam");
  ASSERT_OK(loss);
  ASSERT_OK(optimizer);
  constexpr int kSteps = 20;
  // per worker, per step: every local copy of every variable, flattened.
  std::vector<std::vector<std::vector<float>>> seen(n, std::vector<std::vector<float>>(kSteps));
  OnEveryWorker(n, [&](int w) {
    Strategy& strategy = *workers[w];
    // Different seeds: the chief's initial values must win.
    std::vector<Tensor> initial = model->InitialVariables(100 + w);
    ASSERT_OK(strategy.BroadcastFromChief(initial));
    DistributedVariables variables = strategy.CreateVariables(initial);
    std::vector<std::vector<std::vector<Tensor>>> slots(kLocalReplicas);
    std::vector<std::unique_ptr<Workspace>> workspaces;
    for (int r = 0; r < kLocalReplicas; ++r) workspaces.push_back(model->NewWorkspace(r));
    PerReplica<std::vector<Tensor>> gradients{std::vector<std::vector<Tensor>>(kLocalReplicas)};
    for (int step = 0; step < kSteps; ++step) {
      auto stats =
          strategy.Run<StepStats>([&](ReplicaContext& context) -> absl::StatusOr<StepStats> {
            const int r = context.local_replica_id();
            // Each replica of each worker gets its own data.
            const int id = context.replica_id_in_sync_group();
            Tensor x(DType::kFloat32, Shape({4, 8}));
            Tensor y(DType::kInt32, Shape({4}));
            for (int64_t i = 0; i < x.num_elements(); ++i) {
              x.data<float>()[i] = static_cast<float>((i * 31 + id * 7 + step * 13) % 17) / 17.0f;
            }
            for (int i = 0; i < 4; ++i) y.data<int32_t>()[i] = (i + id + step) % 3;
            return model->TrainStep(variables.ReplicaValues(r), x, y, *loss, 1.0f / 16.0f,
                                    *workspaces[r], gradients[r]);
          });
      ASSERT_TRUE(stats.ok()) << stats.status();
      ASSERT_TRUE(strategy
                      .ApplyGradients(gradients, variables,
                                      [&](int copy, std::vector<Tensor>& vars,
                                          const std::vector<Tensor>& grads) {
                                        (*optimizer)->Apply(vars, grads, slots[copy], step);
                                        return absl::OkStatus();
                                      })
                      .ok());
      for (int copy = 0; copy < variables.num_copies(); ++copy) {
        for (const Tensor& v : variables.MutableCopy(copy)) {
          seen[w][step].insert(seen[w][step].end(), v.data<float>(),
                               v.data<float>() + v.num_elements());
        }
      }
    }
  });
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float>& chief = seen[0][step];
    const size_t per_copy = chief.size() / kLocalReplicas;
    ASSERT_EQ(std::memcmp(chief.data(), chief.data() + per_copy, per_copy * sizeof(float)), 0)
        << "the chief's local copies differ after step " << step;
    ASSERT_EQ(seen[1][step].size(), chief.size());
    ASSERT_EQ(std::memcmp(chief.data(), seen[1][step].data(), chief.size() * sizeof(float)), 0)
        << "worker 1 differs from the chief after step " << step;
  }
  // Training moved the variables.
  EXPECT_NE(std::memcmp(seen[0][0].data(), seen[0][kSteps - 1].data(), 64), 0);
}

// One worker's loss that is not finite stops every worker at the same step with the same
// error (they vote), never that worker alone, which would leave the others waiting on it;
// and nothing that is not finite is saved on the way.
TEST(MultiWorkerMirroredStrategyTest, ALossThatIsNotFiniteOnOneWorkerStopsEveryWorkerAlike) {
  const int n = 2;
  auto workers = MakeWorkers(n);
  auto model = SmallClassifier(4, 8, 2);
  ASSERT_TRUE(model.ok()) << model.status();
  auto optimizer = Optimizer::FromKeras("adam");
  ASSERT_OK(optimizer);
  constexpr int64_t kExamples = 2000;
  Tensor x(DType::kFloat32, Shape({kExamples, 4}));
  Tensor y(DType::kInt32, Shape({kExamples}));
  for (int64_t i = 0; i < kExamples; ++i) {
    for (int j = 0; j < 4; ++j) x.data<float>()[i * 4 + j] = static_cast<float>((i + j) % 5);
    y.data<int32_t>()[i] = static_cast<int32_t>(i % 2);
  }
  x.data<float>()[201 * 4] = INFINITY;  // in worker 1's shard only (odd examples), step 7
  const std::string dir = absl::StrCat(::testing::TempDir(), "/mwms_diverged_", getpid());
  std::filesystem::remove_all(dir);
  auto fit_on_every_worker = [&](const std::string& checkpoint_dir) {
    FitData data;
    data.train = Dataset::FromTensorSlices({x, y});
    data.train_examples = kExamples;
    std::vector<absl::Status> ended(n);
    OnEveryWorker(n, [&](int w) {
      FitOptions options;
      options.epochs = 3;
      options.batch_size_per_replica = 8;
      options.shuffle_buffer = 0;
      options.progress = ProgressStyle::kNone;
      options.checkpoint_dir = checkpoint_dir;
      options.checkpoint_every_steps = 2;
      ended[w] = Fit(*workers[w], *model, Loss::SparseCategoricalCrossentropy(), **optimizer, data,
                     options)
                     .status();
    });
    EXPECT_EQ(ended[0].code(), absl::StatusCode::kFailedPrecondition) << ended[0];
    EXPECT_THAT(std::string(ended[0].message()), ::testing::StartsWith("training diverged: "));
    EXPECT_EQ(ended[0], ended[1]);
    return ended[0];
  };
  // With checkpoints every 2 steps (the save's check of the variables comes first), and
  // without (the vote, or the epoch's end).
  for (const std::string& checkpoint_dir : {dir, std::string()})
    fit_on_every_worker(checkpoint_dir).IgnoreError();  // checked inside
  auto newest = ReadLatestCheckpoint(dir);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_LE(newest->step, 6);
  for (const auto& [name, value] : newest->variables) EXPECT_TRUE(AllFinite(value)) << name;
  std::filesystem::remove_all(dir);
  // In worker 1's first step instead: the first vote (after step 1) finds it and names the
  // worker, and no checkpoint was written before it.
  x.data<float>()[201 * 4] = 0;
  x.data<float>()[1 * 4] = INFINITY;
  EXPECT_THAT(std::string(fit_on_every_worker(dir).message()),
              ::testing::AllOf(
                  ::testing::StartsWith("training diverged: the loss on rank 1 is not finite after "
                                        "step 1 (epoch 1, step 1 of "),
                  ::testing::EndsWith(": it starts from scratch, as no checkpoint was written in " +
                                      dir + " before the divergence")));
  std::filesystem::remove_all(dir);
}

TEST(MultiWorkerMirroredStrategyTest, ADeadWorkerFailsTheStepInsteadOfHangingIt) {
  auto group = InProcessTransportGroup::Create(2);
  auto collectives = Collectives::Create(group->TakeTransport(0), {.timeout = absl::Seconds(30)});
  ASSERT_OK(collectives);
  auto strategy = MultiWorkerMirroredStrategy::Create({}, *std::move(collectives));
  ASSERT_OK(strategy);
  group->Close(1);
  std::vector<Tensor> values = {Tensor::FromVector<float>({1}, {1.0f})};
  const absl::Time start = absl::Now();
  absl::Status status = (*strategy)->AllReduceAcrossWorkers(ReduceOp::kSum, values);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("rank 1"));
}

TEST(NcclRanksTest, EachWorkersReplicasFollowThoseOfTheWorkersBeforeIt) {
  const std::vector<std::vector<std::string>> gpus = {
      {"host-a 0000:1A:00.0", "host-a 0000:1B:00.0"},
      {"host-b 0000:1A:00.0", "host-b 0000:1B:00.0"},
      {"host-c 0000:1A:00.0"}};
  const std::vector<std::string> names = {"chief:0", "worker:0", "worker:1"};
  const int expected_first[] = {0, 2, 4};
  for (int w = 0; w < 3; ++w) {
    auto ranks = PlanNcclRanks(gpus, names, w);
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    EXPECT_EQ(ranks->first_rank, expected_first[w]);
    EXPECT_EQ(ranks->num_ranks, 5);
  }
}

TEST(NcclRanksTest, TwoReplicasOnOneGpuAreRefusedNamingBoth) {
  const std::vector<std::string> names = {"worker:0", "worker:1"};
  // Two workers on one host's only GPU (the usual mistake on a laptop).
  EXPECT_THAT(
      PlanNcclRanks({{"host-a 0000:1A:00.0"}, {"host-a 0000:1A:00.0"}}, names, 1).status(),
      testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                        ::testing::AllOf(::testing::HasSubstr("worker:0 (replica 0) and worker:1 "
                                                              "(replica 0) both use GPU \"host-a "
                                                              "0000:1A:00.0\""),
                                         ::testing::HasSubstr("RING or AUTO"))));
  // Logical GPUs: two replicas of one worker on one physical GPU.
  EXPECT_THAT(
      PlanNcclRanks({{"host-a 0000:1A:00.0", "host-a 0000:1A:00.0"}, {"host-b x"}}, names, 0)
          .status(),
      testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                        ::testing::HasSubstr("worker:0 (replica 0) and worker:0 (replica 1)")));
  // The same bus id on two hosts is two GPUs.
  EXPECT_OK(PlanNcclRanks({{"host-a 0000:1A:00.0"}, {"host-b 0000:1A:00.0"}}, names, 0));
  EXPECT_EQ(PlanNcclRanks({{"a"}}, names, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// Each worker names its peers with their address and itself without: the refusal must
// read the same on every worker, or the job prints it once per worker.
TEST(NcclRanksTest, TheRefusalReadsTheSameOnEveryWorker) {
  const std::vector<std::vector<std::string>> gpus = {{"host-a 0000:1A:00.0"},
                                                      {"host-a 0000:1A:00.0"}};
  const absl::Status on_0 =
      PlanNcclRanks(gpus, {"worker:0", "worker:1 at 127.0.0.1:2"}, 0).status();
  const absl::Status on_1 =
      PlanNcclRanks(gpus, {"worker:0 at 127.0.0.1:1", "worker:1"}, 1).status();
  EXPECT_THAT(on_0, testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                      ::testing::HasSubstr("worker:0 (replica 0) and worker:1 "
                                                           "(replica 0)")));
  EXPECT_EQ(on_0, on_1);
}

// Variables made outside the strategy's Scope() (one copy, by the default strategy) are
// refused where the strategy first meets them, naming them.
TEST(MultiWorkerMirroredStrategyTest, VariablesMadeOutsideItsScopeAreRefusedNamingThem) {
  DistributedVariables outside = GetStrategy().CreateVariables({Tensor::Scalar(1)}, {"w"});
  auto group = InProcessTransportGroup::Create(1);
  auto collectives = Collectives::Create(group->TakeTransport(0), {});
  ASSERT_TRUE(collectives.ok()) << collectives.status();
  MirroredOptions local;
  local.devices = {"CPU:0", "CPU:1"};
  auto strategy = MultiWorkerMirroredStrategy::Create(local, *std::move(collectives));
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  const absl::Status status = (*strategy)->CheckVariables(outside);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("variable \"w\" was created by DefaultDistributionStrategy, "
                                   "outside MultiWorkerMirroredStrategy's Scope()"));
  EXPECT_OK((*strategy)->CheckVariables((*strategy)->CreateVariables({Tensor::Scalar(1)})));
}

// NCCL sums GPU tensors: a job on the CPU asking for it is refused with the fix, instead of
// quietly running the ring.
TEST(MultiWorkerMirroredStrategyTest, NcclOnCpuReplicasIsRefusedWithTheFix) {
  auto group = InProcessTransportGroup::Create(1);
  auto collectives = Collectives::Create(group->TakeTransport(0),
                                         {.implementation = CommunicationImplementation::kNccl});
  ASSERT_TRUE(collectives.ok()) << collectives.status();
  MirroredOptions local;
  local.devices = {"CPU:0"};
  auto strategy = MultiWorkerMirroredStrategy::Create(local, *std::move(collectives));
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  const Model model = *Model::FromKerasJson(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 2]}},
      {"class_name": "Dense", "config": {"units": 2, "activation": "softmax"}}]}})");
  auto optimizer = *Optimizer::FromKeras(nlohmann::json::parse(R"({"class_name": "SGD"})"));
  FitData data;
  data.train = Dataset::FromTensorSlices(
      {Tensor::FromVector<float>({2, 2}, {0, 1, 1, 0}), Tensor::FromVector<int32_t>({2}, {0, 1})});
  data.train_examples = 2;
  FitOptions options;
  options.progress = ProgressStyle::kNone;
  options.batch_size_per_replica = 1;
  EXPECT_THAT(
      Fit(**strategy, model, Loss::SparseCategoricalCrossentropy(), *optimizer, data, options)
          .status(),
      testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                        ::testing::AllOf(::testing::HasSubstr("NCCL sums GPU tensors"),
                                         ::testing::HasSubstr("replicas are on the CPU"),
                                         ::testing::HasSubstr("RING or AUTO"))));
}

}  // namespace
}  // namespace stratum
