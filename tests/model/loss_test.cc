// Loss: Keras names and objects, values against hand computation, the fused softmax
// cross-entropy on huge logits, accuracy, and target validation.
#include "stratum/model/loss.h"

#include <cmath>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/model/model.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

Loss MustParse(const json& spec) {
  auto loss = Loss::FromKeras(spec);
  EXPECT_TRUE(loss.ok()) << loss.status();
  return loss.ok() ? *loss : Loss::MeanSquaredError();
}

std::string Refusal(const json& spec) {
  auto loss = Loss::FromKeras(spec);
  EXPECT_FALSE(loss.ok()) << spec.dump();
  return loss.ok() ? "" : std::string(loss.status().message());
}

TEST(LossTest, ParsesKerasNamesAndObjects) {
  EXPECT_EQ(MustParse("sparse_categorical_crossentropy").kind(),
            Loss::Kind::kSparseCategoricalCrossentropy);
  EXPECT_EQ(MustParse("categorical_crossentropy").kind(), Loss::Kind::kCategoricalCrossentropy);
  EXPECT_EQ(MustParse("mse").kind(), Loss::Kind::kMeanSquaredError);
  EXPECT_EQ(MustParse("mean_squared_error").kind(), Loss::Kind::kMeanSquaredError);
  const Loss keras2 = MustParse(json::parse(R"({"class_name": "SparseCategoricalCrossentropy",
      "config": {"reduction": "auto", "name": "sparse_categorical_crossentropy",
      "from_logits": true, "ignore_class": null}})"));
  EXPECT_EQ(keras2.kind(), Loss::Kind::kSparseCategoricalCrossentropy);
  EXPECT_TRUE(keras2.from_logits());
  const Loss keras3 = MustParse(json::parse(R"({"module": "keras.losses",
      "class_name": "CategoricalCrossentropy", "config": {"name": "categorical_crossentropy",
      "reduction": "sum_over_batch_size", "from_logits": false, "label_smoothing": 0.0,
      "axis": -1}, "registered_name": null})"));
  EXPECT_EQ(keras3.kind(), Loss::Kind::kCategoricalCrossentropy);
  EXPECT_FALSE(keras3.from_logits());
  EXPECT_EQ(MustParse(json::parse(R"({"module": "keras.losses", "class_name": "function",
      "config": "mean_squared_error", "registered_name": "mean_squared_error"})"))
                .kind(),
            Loss::Kind::kMeanSquaredError);
  EXPECT_EQ(MustParse(MustParse("sparse_categorical_crossentropy").ToKeras()).name(),
            "sparse_categorical_crossentropy");
}

// Keras' binary_crossentropy: -(t log p + (1 - t) log(1 - p)) on clipped probabilities, or
// sigmoid_cross_entropy_with_logits; the mean over the outputs; binary_accuracy at 0.5 (a
// logit at 0); 0/1 labels as ids for one output.
TEST(LossTest, BinaryCrossentropyMatchesKeras) {
  auto loss = Loss::FromKeras("binary_crossentropy");
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->ToKeras()["class_name"], "BinaryCrossentropy");
  // On a sigmoid output it takes the logits (below); on other probabilities it clips them.
  EXPECT_EQ(loss->fused_activation(), ActivationKind::kSigmoid);
  // Probabilities 0.8 (label 1) and 0.3 (label 1), ids as uint8.
  const Tensor p = Tensor::FromVector<float>({2, 1}, {0.8f, 0.3f});
  const Tensor ids = Tensor::FromVector<uint8_t>({2}, {1, 1});
  ASSERT_OK(loss->ValidateTargets(ids, 2, 1));
  std::vector<float> grad(2);
  StepStats stats = loss->Compute(p.Matrix(), nullptr, ids, 0.5f, grad.data());
  EXPECT_NEAR(stats.loss_sum, -std::log(0.8) - std::log(0.3), 1e-6);
  EXPECT_EQ(stats.correct, 1);
  EXPECT_NEAR(grad[0], 0.5f * -1 / 0.8f, 1e-6);
  EXPECT_NEAR(grad[1], 0.5f * -1 / 0.3f, 1e-6);
  // Two outputs with float targets: the mean over them; correct only when both agree.
  const Tensor p2 = Tensor::FromVector<float>({1, 2}, {0.9f, 0.4f});
  const Tensor t2 = Tensor::FromVector<float>({1, 2}, {1, 1});
  stats = loss->Compute(p2.Matrix(), nullptr, t2, 1, grad.data());
  EXPECT_NEAR(stats.loss_sum, (-std::log(0.9) - std::log(0.4)) / 2, 1e-6);
  EXPECT_EQ(stats.correct, 0);
  // On logits: max(z, 0) - z t + log(1 + exp(-|z|)), its gradient sigmoid(z) - t.
  auto logits = Loss::FromKeras(
      json{{"class_name", "BinaryCrossentropy"}, {"config", {{"from_logits", true}}}});
  ASSERT_TRUE(logits.ok()) << logits.status();
  const Tensor z = Tensor::FromVector<float>({2, 1}, {0.5f, -30.0f});
  const Tensor labels = Tensor::FromVector<float>({2}, {0, 0});
  ASSERT_OK(logits->ValidateTargets(labels, 2, 1));
  stats = logits->Compute(z.Matrix(), nullptr, labels, 1, grad.data());
  EXPECT_NEAR(stats.loss_sum, 0.5 + std::log1p(std::exp(-0.5)) + std::log1p(std::exp(-30.0)), 1e-6);
  EXPECT_EQ(stats.correct, 1);  // 0.5 > 0 says 1; -30 says 0
  EXPECT_NEAR(grad[0], 1 / (1 + std::exp(-0.5f)), 1e-6);
  // A sigmoid output's logits, given beside its probabilities, as Keras takes the logits it
  // caches on a sigmoid: a saturated wrong output keeps its gradient, p - t, where clipped
  // probabilities would give none.
  const Tensor saturated = Tensor::FromVector<float>({2, 1}, {1.0f, 0.5f});
  const std::vector<float> saturated_logits = {40.0f, 0.0f};
  stats = loss->Compute(saturated.Matrix(), saturated_logits.data(), labels, 1, grad.data());
  EXPECT_NEAR(stats.loss_sum, 40 + std::log1p(std::exp(-40.0)) + std::log(2.0), 1e-5);
  EXPECT_EQ(stats.correct, 1);
  EXPECT_FLOAT_EQ(grad[0], 1.0f);
  EXPECT_FLOAT_EQ(grad[1], 0.5f);
  // Labels other than 0 and 1 are refused, naming the example.
  EXPECT_THAT(
      std::string(loss->ValidateTargets(Tensor::FromVector<uint8_t>({2}, {1, 7}), 2, 1).message()),
      HasSubstr("y[1] is 7, but binary_crossentropy takes labels 0 and 1"));
  EXPECT_THAT(
      std::string(loss->ValidateTargets(Tensor::FromVector<float>({2}, {1, 0}), 2, 3).message()),
      HasSubstr("takes float32 targets of shape [2, 3]"));
}

TEST(LossTest, RefusesUnsupportedLossesByName) {
  EXPECT_EQ(Refusal("hinge"),
            "loss \"hinge\" is not supported by Stratum: use sparse_categorical_crossentropy, "
            "categorical_crossentropy, binary_crossentropy or mean_squared_error");
  EXPECT_THAT(Refusal(json{{"class_name", "CategoricalCrossentropy"},
                           {"config", {{"label_smoothing", 0.1}}}}),
              HasSubstr("sets label_smoothing 0.1"));
  EXPECT_THAT(Refusal(json{{"class_name", "SparseCategoricalCrossentropy"},
                           {"config", {{"ignore_class", 0}}}}),
              HasSubstr("sets ignore_class 0"));
  EXPECT_THAT(Refusal(json{{"class_name", "MeanSquaredError"}, {"config", {{"reduction", "sum"}}}}),
              HasSubstr("has reduction \"sum\", which Stratum does not support"));
  EXPECT_THAT(Refusal(json{{"class_name", "SparseCategoricalCrossentropy"},
                           {"config", {{"from_logits", "yes"}}}}),
              HasSubstr("which is not a boolean"));
  EXPECT_EQ(Refusal(json{{"class_name", "SparseCategoricalCrossentropy"},
                         {"config", {{"from_logit", true}}}}),
            "loss SparseCategoricalCrossentropy has config key \"from_logit\", which Keras' "
            "losses do not have: check its spelling (from_logits, reduction, name, ...) or "
            "remove it");
  EXPECT_THAT(Refusal(json{{"class_name", "Huber"}, {"config", json::object()}}),
              HasSubstr("loss \"Huber\" is not supported by Stratum"));
  EXPECT_THAT(Refusal(7), HasSubstr("neither a loss name nor a Keras loss object"));
}

TEST(LossTest, SparseProbabilitiesAreClippedLikeKeras) {
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  const Tensor p = Tensor::FromVector<float>(Shape({2, 3}), {0.2f, 0.7f, 0.1f, 1.0f, 0.0f, 0.0f});
  const Tensor y = Tensor::FromVector<int64_t>(Shape({2}), {1, 1});
  ASSERT_OK(loss.ValidateTargets(y, 2, 3));
  std::vector<float> grad(6);
  const StepStats stats = loss.Compute(p.Matrix(), nullptr, y, 0.5f, grad.data());
  // Example 1: the label's probability 0 is clipped to 1e-7: -log(1e-7 / (1 - 1e-7 + 2e-7)).
  const double expected = -std::log(0.7) + -std::log(1e-7 / (1 - 1e-7 + 2e-7));
  EXPECT_NEAR(stats.loss_sum, expected, 1e-4);
  EXPECT_TRUE(std::isfinite(stats.loss_sum));
  EXPECT_EQ(stats.correct, 1);
  EXPECT_EQ(stats.examples, 2);
  for (float g : grad) EXPECT_TRUE(std::isfinite(g));
}

TEST(LossTest, CategoricalOnProbabilitiesNormalizesLikeKeras) {
  const Loss loss = Loss::CategoricalCrossentropy();
  // Keras' docstring example: [0.10536, 0.11653, 0.06188].
  const Tensor t = Tensor::FromVector<float>(Shape({3, 3}), {1, 0, 0, 0, 1, 0, 0, 0, 1});
  const Tensor p = Tensor::FromVector<float>(
      Shape({3, 3}), {0.9f, 0.05f, 0.05f, 0.05f, 0.89f, 0.06f, 0.05f, 0.01f, 0.94f});
  const StepStats stats = loss.Compute(p.Matrix(), nullptr, t, 1, nullptr);
  EXPECT_NEAR(stats.loss_sum, 0.10536 + 0.11653 + 0.06188, 1e-4);
  EXPECT_EQ(stats.correct, 3);
}

TEST(LossTest, MeanSquaredErrorAndBinaryAccuracy) {
  const Loss loss = Loss::MeanSquaredError();
  const Tensor p = Tensor::FromVector<float>(Shape({2, 1}), {0.8f, 0.4f});
  const Tensor t = Tensor::FromVector<float>(Shape({2}), {1.0f, 1.0f});
  ASSERT_OK(loss.ValidateTargets(t, 2, 1));
  std::vector<float> grad(2);
  const StepStats stats = loss.Compute(p.Matrix(), nullptr, t, 0.5f, grad.data());
  EXPECT_NEAR(stats.loss_sum, 0.04 + 0.36, 1e-6);
  EXPECT_EQ(stats.correct, 1);  // 0.8 > 0.5 matches 1; 0.4 does not
  EXPECT_NEAR(grad[0], 0.5f * 2 * -0.2f, 1e-6);
  EXPECT_NEAR(grad[1], 0.5f * 2 * -0.6f, 1e-6);
}

// Dense(3, softmax) on a 2-wide input whose kernel makes huge logits.
Model SoftmaxModel() {
  auto model = Model::FromKerasJson(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 2]}},
      {"class_name": "Dense", "config": {"name": "out", "units": 3, "activation": "softmax"}}]}})");
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

TEST(LossTest, FusedSoftmaxCrossEntropyStaysFiniteOnHugeLogits) {
  const Model model = SoftmaxModel();
  std::vector<Tensor> vars = {Tensor::FromVector<float>(Shape({2, 3}), {1000, -1000, 0, 0, 0, 500}),
                              Tensor::FromVector<float>(Shape({3}), {0, 0, 0})};
  const Tensor x = Tensor::FromVector<float>(Shape({2, 2}), {1, 0, 0, 1});
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> grads;
  // Example 0: logits [1000, -1000, 0], label 1 (probability exp(-2000): 0 in float32).
  // Example 1: logits [0, 0, 500], label 2.
  const Tensor y = Tensor::FromVector<int32_t>(Shape({2}), {1, 2});
  auto sparse =
      model.TrainStep(vars, x, y, Loss::SparseCategoricalCrossentropy(), 0.5f, *ws, grads);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_NEAR(sparse->loss_sum, 2000.0, 1e-2);  // logsumexp - logit, as tf.keras computes
  for (const Tensor& g : grads) EXPECT_TRUE(g.Flat().isFinite().all()) << g.DebugString();
  // d/d(kernel[0][1]) = 0.5 * x[0][0] * (softmax - onehot)[1] = 0.5 * (0 - 1).
  EXPECT_NEAR(grads[0].data<float>()[1], -0.5f, 1e-6);
  EXPECT_NEAR(grads[0].data<float>()[0], 0.5f, 1e-6);
  // from_logits=true on a softmax output: Keras' TensorFlow backend still uses the cached
  // logits (with a warning), so the values are the same.
  auto from_logits =
      model.TrainStep(vars, x, y, Loss::SparseCategoricalCrossentropy(true), 0.5f, *ws, grads);
  ASSERT_OK(from_logits);
  EXPECT_EQ(from_logits->loss_sum, sparse->loss_sum);
  const Tensor onehot = Tensor::FromVector<float>(Shape({2, 3}), {0, 1, 0, 0, 0, 1});
  auto categorical =
      model.TrainStep(vars, x, onehot, Loss::CategoricalCrossentropy(), 0.5f, *ws, grads);
  ASSERT_OK(categorical);
  EXPECT_NEAR(categorical->loss_sum, 2000.0, 1e-2);
  for (const Tensor& g : grads) EXPECT_TRUE(g.Flat().isFinite().all());
  auto evaluated = model.Evaluate(vars, x, y, Loss::SparseCategoricalCrossentropy(), *ws);
  ASSERT_OK(evaluated);
  EXPECT_NEAR(evaluated->loss_sum, 2000.0, 1e-2);
  EXPECT_EQ(evaluated->correct, 1);
}

// Jobs refuse from_logits true on a softmax output (a Dense softmax, an Activation softmax,
// or either followed by Dropout): the output is probabilities, not logits.
TEST(LossTest, ModelsRefuseFromLogitsOnASoftmaxOutput) {
  auto model = [](const std::string& last_layers) {
    return *Model::FromKerasJson(R"({"class_name": "Sequential", "config": {"layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 2]}}, )" +
                                 last_layers + "]}}");
  };
  const Model dense = SoftmaxModel();
  EXPECT_EQ(dense.CheckLoss(Loss::SparseCategoricalCrossentropy(true)),
            absl::InvalidArgumentError(
                "loss sparse_categorical_crossentropy has from_logits true, but the model's "
                "output (layer \"out\") is a softmax, so it gives probabilities, not logits: set "
                "from_logits to false, or make the last layer's activation linear"));
  EXPECT_FALSE(dense.CheckLoss(Loss::CategoricalCrossentropy(true)).ok());
  EXPECT_OK(dense.CheckLoss(Loss::SparseCategoricalCrossentropy()));
  EXPECT_OK(dense.CheckLoss(Loss::MeanSquaredError()));
  const Model activation = model(R"({"class_name": "Dense", "config": {"units": 3}},
      {"class_name": "Activation", "config": {"name": "probs", "activation": "softmax"}},
      {"class_name": "Dropout", "config": {"rate": 0.5}})");
  EXPECT_THAT(std::string(activation.CheckLoss(Loss::CategoricalCrossentropy(true)).message()),
              HasSubstr("the model's output (layer \"probs\") is a softmax"));
  const Model logits = model(R"({"class_name": "Dense", "config": {"units": 3}})");
  EXPECT_OK(logits.CheckLoss(Loss::SparseCategoricalCrossentropy(true)));
  EXPECT_OK(logits.CheckLoss(Loss::CategoricalCrossentropy(true)));
}

TEST(LossTest, ValidatesTargets) {
  const Loss sparse = Loss::SparseCategoricalCrossentropy();
  EXPECT_OK(sparse.ValidateTargets(Tensor(DType::kUInt8, Shape({4})), 4, 10));
  EXPECT_OK(sparse.ValidateTargets(Tensor(DType::kInt32, Shape({4, 1})), 4, 10));
  EXPECT_EQ(std::string(sparse.ValidateTargets(Tensor(DType::kInt32, Shape({3})), 4, 10).message()),
            "y is int32[3], but sparse_categorical_crossentropy takes one class id per example: "
            "pass y of shape [4]");
  EXPECT_THAT(
      std::string(
          sparse.ValidateTargets(Tensor::FromVector<int32_t>(Shape({1}), {-1}), 1, 10).message()),
      HasSubstr("y[0] is -1, outside the 10 classes"));
  const Loss categorical = Loss::CategoricalCrossentropy();
  EXPECT_OK(categorical.ValidateTargets(Tensor(DType::kFloat32, Shape({4, 10})), 4, 10));
  EXPECT_EQ(
      std::string(categorical.ValidateTargets(Tensor(DType::kInt64, Shape({4})), 4, 10).message()),
      "y is int64[4], but categorical_crossentropy takes float32 targets of shape [4, 10] "
      "(one-hot rows; for class ids use sparse_categorical_crossentropy): pass one target "
      "row per example");
  EXPECT_THAT(std::string(Loss::MeanSquaredError()
                              .ValidateTargets(Tensor(DType::kFloat32, Shape({4, 3})), 4, 10)
                              .message()),
              HasSubstr("takes float32 targets of shape [4, 10]"));
}

// Keras' AUC: keras.metrics.AUC() on labels [0, 0, 1, 1] and predictions [0, 0.5, 0.3, 0.9]
// is 0.75 (3 of the 4 positive-negative pairs are ordered right); the counts add up over
// batches and survive their trip as numbers.
TEST(AucCountsTest, MeasuresKerasAucAndAddsUp) {
  AucCounts counts;
  EXPECT_TRUE(counts.empty());
  EXPECT_EQ(counts.Auc(), 0);
  counts.Add(0.0f, false);
  counts.Add(0.5f, false);
  AucCounts more;
  more.Add(0.3f, true);
  more.Add(0.9f, true);
  EXPECT_EQ(more.Auc(), 0);  // no negatives: Keras' divide_no_nan
  counts.Merge(more);
  EXPECT_NEAR(counts.Auc(), 0.75, 1e-12);
  const std::vector<double> values = counts.Values();
  ASSERT_EQ(values.size(), 2u * AucCounts::kBuckets);
  EXPECT_NEAR(AucCounts::FromValues(values.data(), static_cast<int64_t>(values.size())).Auc(), 0.75,
              1e-12);
  AucCounts perfect, reversed;
  for (int i = 0; i < 100; ++i) {
    perfect.Add(0.6f + 0.003f * static_cast<float>(i), true);
    perfect.Add(0.4f - 0.003f * static_cast<float>(i), false);
    reversed.Add(0.4f - 0.003f * static_cast<float>(i), true);
    reversed.Add(0.6f + 0.003f * static_cast<float>(i), false);
  }
  EXPECT_NEAR(perfect.Auc(), 1.0, 1e-12);
  EXPECT_NEAR(reversed.Auc(), 0.0, 1e-12);
  // binary_crossentropy counts a one-output model's examples: probabilities as they are,
  // logits through a sigmoid.
  auto loss = Loss::FromKeras("binary_crossentropy");
  ASSERT_TRUE(loss.ok()) << loss.status();
  const Tensor p = Tensor::FromVector<float>({4, 1}, {0.0f, 0.5f, 0.3f, 0.9f});
  const Tensor y = Tensor::FromVector<uint8_t>({4}, {0, 0, 1, 1});
  EXPECT_NEAR(loss->Compute(p.Matrix(), nullptr, y, 1, nullptr).auc.Auc(), 0.75, 1e-12);
}

}  // namespace
}  // namespace stratum
