// BatchNormalization with synchronized: true under MirroredStrategy: the statistics span the
// global batch, so 2 replicas of 32 examples step as 1 replica of 64 does (gradients summed
// over the replicas, and the moving statistics' steps), to float tolerance; without it each
// replica normalizes by its own half and the step differs. A replica that a partial batch
// left without examples still takes part in the sums, so the others neither wait nor
// miscount.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/model/model.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/worker/mirrored_strategy.h"

namespace stratum {
namespace {

using nlohmann::json;

Model ConvBatchNormModel(bool synchronized) {
  json layers = json::array(
      {{{"class_name", "InputLayer"}, {"config", {{"batch_input_shape", {nullptr, 5, 5, 2}}}}},
       {{"class_name", "Conv2D"}, {"config", {{"name", "c"}, {"filters", 3}, {"kernel_size", 2}}}},
       {{"class_name", "BatchNormalization"},
        {"config", {{"name", "bn"}, {"synchronized", synchronized}, {"momentum", 0.9}}}},
       {{"class_name", "Activation"}, {"config", {{"activation", "relu"}}}},
       {{"class_name", "Flatten"}, {"config", json::object()}},
       {{"class_name", "Dense"}, {"config", {{"name", "d"}, {"units", 3}}}},
       {{"class_name", "BatchNormalization"},
        {"config", {{"name", "bn_1"}, {"synchronized", synchronized}}}},
       {{"class_name", "Activation"}, {"config", {{"activation", "softmax"}}}}});
  auto model = Model::FromKerasJson(
      json{{"class_name", "Sequential"}, {"config", {{"name", "m"}, {"layers", layers}}}});
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

struct Batch {
  Tensor x, y;
};

Batch RandomBatch(int64_t examples) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.5f, 2.0f);
  Batch batch{Tensor(DType::kFloat32, Shape({examples, 5, 5, 2})),
              Tensor(DType::kInt64, Shape({examples}))};
  for (int64_t i = 0; i < batch.x.num_elements(); ++i) batch.x.data<float>()[i] = normal(rng);
  for (int64_t i = 0; i < examples; ++i) batch.y.data<int64_t>()[i] = (i * 7) % 3;
  return batch;
}

// One step of `model` on `batch`, split over the replicas of `strategy` at `splits`
// (rows [splits[r], splits[r + 1]) to replica r): the replicas' gradients summed, as the
// strategy's all-reduce sums them.
std::vector<Tensor> SummedGradients(const Model& model, Strategy& strategy,
                                    const std::vector<Tensor>& variables, const Batch& batch,
                                    const std::vector<int64_t>& splits) {
  const int replicas = strategy.NumLocalReplicas();
  std::vector<std::unique_ptr<Workspace>> workspaces;
  for (int r = 0; r < replicas; ++r) {
    workspaces.push_back(model.NewWorkspace(1));
    workspaces.back()->SetReplicaSum(ReplicaSumOf(strategy, r));
  }
  std::vector<std::vector<Tensor>> gradients(static_cast<size_t>(replicas));
  const Loss loss = *Loss::FromKeras("sparse_categorical_crossentropy");
  const float loss_scale = 1.0f / static_cast<float>(batch.y.num_elements());
  auto stats = strategy.Run<StepStats>([&](ReplicaContext& context) {
    const auto r = static_cast<size_t>(context.local_replica_id());
    return model.TrainStep(variables, batch.x.SliceRows(splits[r], splits[r + 1]),
                           batch.y.SliceRows(splits[r], splits[r + 1]), loss, loss_scale,
                           *workspaces[r], gradients[r], 1.0f / static_cast<float>(replicas));
  });
  EXPECT_TRUE(stats.ok()) << stats.status();
  std::vector<Tensor> sum = gradients[0];
  for (size_t r = 1; r < gradients.size(); ++r) {
    for (size_t v = 0; v < sum.size(); ++v) sum[v].Flat() += gradients[r][v].Flat();
  }
  return sum;
}

// The largest difference between two gradient lists, relative to the largest element; the
// variables of `only` alone when given.
double MaxRelativeDifference(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                             const std::vector<bool>& only = {}) {
  double difference = 0, largest = 1e-12;
  for (size_t v = 0; v < a.size(); ++v) {
    if (!only.empty() && !only[v]) continue;
    for (int64_t i = 0; i < a[v].num_elements(); ++i) {
      difference =
          std::max<double>(difference, std::abs(a[v].data<float>()[i] - b[v].data<float>()[i]));
      largest = std::max<double>(largest, std::abs(b[v].data<float>()[i]));
    }
  }
  return difference / largest;
}

std::unique_ptr<MirroredStrategy> TwoCpuReplicas() {
  auto strategy = MirroredStrategy::Create({.devices = {"CPU:0", "CPU:1"}});
  EXPECT_TRUE(strategy.ok()) << strategy.status();
  return *std::move(strategy);
}

TEST(SyncBatchNormTest, TwoReplicasOf32StepAsOneReplicaOf64) {
  const Model model = ConvBatchNormModel(true);
  const std::vector<Tensor> variables = model.InitialVariables(5);
  const Batch batch = RandomBatch(64);
  auto one = MirroredStrategy::Create({.devices = {"CPU:0"}});
  ASSERT_OK(one);
  const std::vector<Tensor> whole = SummedGradients(model, **one, variables, batch, {0, 64});
  auto two = TwoCpuReplicas();
  const std::vector<Tensor> halves = SummedGradients(model, *two, variables, batch, {0, 32, 64});
  EXPECT_LT(MaxRelativeDifference(halves, whole), 1e-5);
  // Every variable moved, the moving statistics included; not the biases, whose gradient
  // the normalization after them removes.
  for (size_t v = 0; v < whole.size(); ++v) {
    if (model.variables()[v].name.ends_with("/bias")) continue;
    EXPECT_GT(whole[v].Flat().abs().maxCoeff(), 1e-6f) << model.variables()[v].name;
  }

  // Without synchronization each half has statistics of its own: another step.
  const Model local = ConvBatchNormModel(false);
  const std::vector<Tensor> local_halves =
      SummedGradients(local, *two, variables, batch, {0, 32, 64});
  EXPECT_GT(MaxRelativeDifference(local_halves, whole), 1e-3);
}

TEST(SyncBatchNormTest, AReplicaWithoutExamplesTakesPartInTheSums) {
  const Model model = ConvBatchNormModel(true);
  const std::vector<Tensor> variables = model.InitialVariables(6);
  const Batch batch = RandomBatch(40);
  auto one = MirroredStrategy::Create({.devices = {"CPU:0"}});
  ASSERT_OK(one);
  const std::vector<Tensor> whole = SummedGradients(model, **one, variables, batch, {0, 40});
  auto two = TwoCpuReplicas();
  EXPECT_LT(
      MaxRelativeDifference(SummedGradients(model, *two, variables, batch, {0, 27, 40}), whole),
      1e-5);
  // All on the first replica: the same gradients. The replica without examples makes no
  // step of the moving statistics, so they move by the other's share alone (half a step):
  // only the last, partial batch of an epoch leaves a replica empty.
  const std::vector<Tensor> alone = SummedGradients(model, *two, variables, batch, {0, 40, 40});
  std::vector<bool> trainable, moving;
  for (const VariableSpec& spec : model.variables()) {
    trainable.push_back(spec.trainable);
    moving.push_back(!spec.trainable);
  }
  EXPECT_LT(MaxRelativeDifference(alone, whole, trainable), 1e-5);
  std::vector<Tensor> half_steps;
  for (const Tensor& g : whole) half_steps.push_back(g.Clone());
  for (Tensor& g : half_steps) g.Flat() *= 0.5f;
  EXPECT_LT(MaxRelativeDifference(alone, half_steps, moving), 1e-5);
}

}  // namespace
}  // namespace stratum
