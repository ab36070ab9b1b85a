// BatchNormalization against Keras' definition written out as plain loops: the batch's
// statistics in training (variance divided by the count), the moving statistics in
// inference, the moving statistics' step as a non-trainable variable's gradient, frozen
// layers (trainable false: inference mode, nothing moves), the optimizer's handling of
// non-trainable variables, and the config refusals. Gradients: model_gradient_test;
// synchronized statistics over replicas: worker/sync_batch_norm_test.
#include <cmath>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/testing/functional_json.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// A Sequential model of `layers` on inputs of `input`, flattened at the end.
json Sequential(std::vector<int64_t> input, std::vector<json> layers) {
  json list = json::array({{{"class_name", "InputLayer"},
                            {"config", {{"batch_input_shape", testing::BatchShape(input)}}}}});
  for (json& layer : layers) list.push_back(std::move(layer));
  list.push_back({{"class_name", "Flatten"}, {"config", json::object()}});
  return {{"class_name", "Sequential"}, {"config", {{"name", "m"}, {"layers", list}}}};
}

json BatchNorm(json config) {
  config["name"] = "bn";
  return {{"class_name", "BatchNormalization"}, {"config", std::move(config)}};
}

Model Build(std::vector<int64_t> input, json bn_config) {
  auto model =
      Model::FromKerasJson(Sequential(std::move(input), {BatchNorm(std::move(bn_config))}));
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

std::string Refusal(json bn_config) {
  auto model = Model::FromKerasJson(Sequential({2, 2, 3}, {BatchNorm(std::move(bn_config))}));
  EXPECT_FALSE(model.ok());
  return std::string(model.status().message());
}

Tensor Random(Shape shape, uint32_t seed, float mean = 0, float stddev = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, stddev);
  Tensor t(DType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

// Per channel (the last axis of x [rows, channels]): the mean and the variance divided by
// the count.
struct Moments {
  std::vector<double> mean, variance;
};
Moments MomentsOf(const Tensor& x, int64_t channels) {
  const int64_t rows = x.num_elements() / channels;
  Moments m{std::vector<double>(channels), std::vector<double>(channels)};
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t r = 0; r < rows; ++r) m.mean[c] += x.data<float>()[r * channels + c];
    m.mean[c] /= static_cast<double>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const double d = x.data<float>()[r * channels + c] - m.mean[c];
      m.variance[c] += d * d;
    }
    m.variance[c] /= static_cast<double>(rows);
  }
  return m;
}

TEST(BatchNormalizationTest, DeclaresKerasWeightsWithTheMovingStatisticsNonTrainable) {
  const Model model = Build({4, 4, 3}, json::object());
  ASSERT_EQ(model.variables().size(), 4u);
  const char* names[] = {"bn/gamma", "bn/beta", "bn/moving_mean", "bn/moving_variance"};
  for (size_t v = 0; v < 4; ++v) {
    EXPECT_EQ(model.variables()[v].name, names[v]);
    EXPECT_EQ(model.variables()[v].shape, Shape({3}));
    EXPECT_EQ(model.variables()[v].trainable, v < 2);
  }
  const std::vector<Tensor> initial = model.InitialVariables(1);
  EXPECT_EQ(initial[0].data<float>()[0], 1.0f);  // gamma: ones
  EXPECT_EQ(initial[1].data<float>()[0], 0.0f);  // beta: zeros
  EXPECT_EQ(initial[2].data<float>()[0], 0.0f);  // moving_mean: zeros
  EXPECT_EQ(initial[3].data<float>()[0], 1.0f);  // moving_variance: ones
  EXPECT_EQ(model.num_parameters(), 12);
  EXPECT_EQ(model.num_non_trainable_parameters(), 6);
  EXPECT_THAT(model.Summary(), HasSubstr("Trainable params: 6\nNon-trainable params: 6\n"));

  const Model plain = Build({5}, {{"center", false}, {"scale", false}});
  ASSERT_EQ(plain.variables().size(), 2u);
  EXPECT_EQ(plain.variables()[0].name, "bn/moving_mean");
  EXPECT_EQ(plain.num_non_trainable_parameters(), 10);
  // Keras' tf.keras 2 form writes the axis as a list counting the batch.
  EXPECT_EQ(Build({4, 4, 3}, {{"axis", json::array({3})}}).variables().size(), 4u);
  EXPECT_EQ(Build({5}, {{"axis", 1}}).variables().size(), 4u);
}

TEST(BatchNormalizationTest, InferenceNormalizesByTheMovingStatistics) {
  const Model model = Build({2, 3}, {{"epsilon", 0.01}});
  std::vector<Tensor> vars = {Random(Shape({3}), 1, 1, 0.2f), Random(Shape({3}), 2),
                              Random(Shape({3}), 3), Random(Shape({3}), 4, 2, 0.5f)};
  for (int64_t c = 0; c < 3; ++c) vars[3].data<float>()[c] = std::abs(vars[3].data<float>()[c]);
  const Tensor x = Random(Shape({5, 2, 3}), 5, 0.5f, 2);
  auto ws = model.NewWorkspace(0);
  auto out = model.Predict(vars, x, *ws);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    const int64_t c = i % 3;
    const double expected = vars[0].data<float>()[c] *
                                (x.data<float>()[i] - vars[2].data<float>()[c]) /
                                std::sqrt(vars[3].data<float>()[c] + 0.01) +
                            vars[1].data<float>()[c];
    EXPECT_NEAR(out->data<float>()[i], expected, 1e-5) << i;
  }
}

// Training normalizes by the batch: with the moving statistics set to the batch's, the
// training loss is the inference loss. The moving statistics' gradient slots hold their
// step, (1 - momentum) * (moving - batch statistic), times the replica's share.
TEST(BatchNormalizationTest, TrainingNormalizesByTheBatchAndStepsTheMovingStatistics) {
  const Model model = Build({2, 3}, {{"momentum", 0.9}, {"epsilon", 0.01}});
  const Tensor x = Random(Shape({6, 2, 3}), 7, -1, 3);
  const Tensor y = Random(Shape({6, 6}), 8);
  const Moments batch = MomentsOf(x, 3);
  std::vector<Tensor> vars = {Random(Shape({3}), 1, 1, 0.2f), Random(Shape({3}), 2),
                              Tensor(DType::kFloat32, Shape({3})),
                              Tensor(DType::kFloat32, Shape({3}))};
  for (int64_t c = 0; c < 3; ++c) {
    vars[2].data<float>()[c] = static_cast<float>(batch.mean[c]);
    vars[3].data<float>()[c] = static_cast<float>(batch.variance[c]);
  }
  const Loss loss = Loss::MeanSquaredError();
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> grads;
  auto trained = model.TrainStep(vars, x, y, loss, 1.0f / 6, *ws, grads);
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto evaluated = model.Evaluate(vars, x, y, loss, *ws);
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  EXPECT_NEAR(trained->loss_sum, evaluated->loss_sum, 1e-4 * evaluated->loss_sum);

  // Moving statistics elsewhere: the step moves them 10% of the way to the batch's.
  vars[2] = Random(Shape({3}), 11);
  vars[3] = Random(Shape({3}), 12, 2, 0.1f);
  ASSERT_OK(model.TrainStep(vars, x, y, loss, 1.0f / 6, *ws, grads, 0.25f));
  auto again = model.TrainStep(vars, x, y, loss, 1.0f / 6, *ws, grads, 0.25f);
  ASSERT_OK(again);
  EXPECT_NEAR(again->loss_sum, trained->loss_sum, 1e-4 * trained->loss_sum)
      << "the moving statistics do not enter a training step";
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(grads[2].data<float>()[c], 0.25 * 0.1 * (vars[2].data<float>()[c] - batch.mean[c]),
                1e-6);
    EXPECT_NEAR(grads[3].data<float>()[c],
                0.25 * 0.1 * (vars[3].data<float>()[c] - batch.variance[c]), 1e-5);
  }
  // Applied by any optimizer, the step is subtracted as it is.
  auto adam = Optimizer::FromKeras("adam");
  ASSERT_OK(adam);
  std::vector<Tensor> updated;
  for (const Tensor& v : vars) updated.push_back(v.Clone());
  std::vector<std::vector<Tensor>> slots;
  (*adam)->Apply(updated, grads, slots, 0, model.variables());
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(updated[2].data<float>()[c], vars[2].data<float>()[c] - grads[2].data<float>()[c]);
    EXPECT_EQ(updated[3].data<float>()[c], vars[3].data<float>()[c] - grads[3].data<float>()[c]);
  }
  EXPECT_EQ(slots[0].size(), 2u);  // Adam's m and v for gamma
  EXPECT_TRUE(slots[2].empty());   // none for a moving statistic
}

// trainable false freezes the layer as Keras does: inference mode in training too, and no
// variable moves; the layers before it still train through it.
TEST(BatchNormalizationTest, AFrozenLayerRunsInInferenceModeAndNothingMoves) {
  auto model_or = Model::FromKerasJson(
      Sequential({4}, {{{"class_name", "Dense"}, {"config", {{"name", "d"}, {"units", 3}}}},
                       BatchNorm({{"trainable", false}})}));
  ASSERT_TRUE(model_or.ok()) << model_or.status();
  const Model& model = *model_or;
  EXPECT_EQ(model.num_non_trainable_parameters(), 12);
  std::vector<Tensor> vars = model.InitialVariables(3);
  vars[4] = Random(Shape({3}), 4);
  vars[5] = Random(Shape({3}), 5, 2, 0.1f);
  const Tensor x = Random(Shape({5, 4}), 6);
  const Tensor y = Random(Shape({5, 3}), 7);
  const Loss loss = Loss::MeanSquaredError();
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> grads;
  auto trained = model.TrainStep(vars, x, y, loss, 1.0f / 5, *ws, grads);
  auto evaluated = model.Evaluate(vars, x, y, loss, *ws);
  ASSERT_OK(trained);
  ASSERT_OK(evaluated);
  EXPECT_NEAR(trained->loss_sum, evaluated->loss_sum, 1e-5 * evaluated->loss_sum);
  for (size_t v = 2; v < 6; ++v) {
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(grads[v].data<float>()[c], 0.0f);
  }
  EXPECT_NE(grads[0].data<float>()[0], 0.0f);  // the Dense kernel trains
}

TEST(BatchNormalizationTest, RefusesWhatStratumDoesNotImplementByName) {
  EXPECT_THAT(Refusal({{"axis", 1}}), HasSubstr("has axis 1, but Stratum normalizes the last"));
  EXPECT_THAT(Refusal({{"axis", json::array({1, 2})}}),
              HasSubstr("has axis [1,2], but Stratum normalizes the last axis alone"));
  EXPECT_THAT(Refusal({{"renorm", true}}), HasSubstr("sets renorm to true"));
  EXPECT_THAT(Refusal({{"virtual_batch_size", 8}}), HasSubstr("sets virtual_batch_size to 8"));
  EXPECT_THAT(Refusal({{"gamma_constraint", "non_neg"}}), HasSubstr("sets gamma_constraint"));
  EXPECT_THAT(Refusal({{"momentum", 1.5}}), HasSubstr("has momentum 1.5: use a number"));
  EXPECT_THAT(Refusal({{"epsilon", 0}}), HasSubstr("has epsilon 0: use a number"));
  EXPECT_THAT(Refusal({{"center", "yes"}}),
              HasSubstr("has center \"yes\", which is not a boolean"));
  EXPECT_THAT(Refusal({{"momentun", 0.9}}), HasSubstr("has config key \"momentun\""));
  EXPECT_THAT(Refusal({{"gamma_regularizer", "orthogonal"}}),
              HasSubstr("has gamma_regularizer \"orthogonal\""));
}

TEST(BatchNormalizationTest, SyncBatchNormalizationIsTheSynchronizedLayer) {
  json layer = BatchNorm(json::object());
  layer["class_name"] = "SyncBatchNormalization";
  auto model = Model::FromKerasJson(Sequential({3}, {layer}));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->variables().size(), 4u);
  layer["config"]["synchronized"] = true;
  EXPECT_THAT(Model::FromKerasJson(Sequential({3}, {layer})).status().message(),
              HasSubstr("SyncBatchNormalization is always synchronized"));
  EXPECT_OK(Model::FromKerasJson(Sequential({3}, {BatchNorm({{"synchronized", true}})})));
  // Regularizers on gamma and beta count as on any variable.
  const Model regularized = Build({3}, {{"gamma_regularizer", "l2"}, {"beta_regularizer", "l1"}});
  EXPECT_EQ(regularized.variables()[0].l2, 0.01);
  EXPECT_EQ(regularized.variables()[1].l1, 0.01);
  // Local statistics run on GPUs; statistics synchronized over GPU replicas do not yet: such
  // a model trains on the CPU, saying why. Frozen, the layer syncs nothing.
  EXPECT_OK(Build({3}, json::object()).CheckRunsOnGpu());
  EXPECT_THAT(Build({3}, {{"synchronized", true}}).CheckRunsOnGpu().message(),
              HasSubstr("\"bn\" (BatchNormalization) has no CUDA kernel yet"));
  EXPECT_OK(Build({3}, {{"synchronized", true}, {"trainable", false}}).CheckRunsOnGpu());
}

}  // namespace
}  // namespace stratum
