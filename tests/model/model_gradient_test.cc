// Finite-difference checks of Model::TrainStep's gradients, for every layer, activation and
// loss combination Stratum supports, and for functional graphs: several inputs, merge
// layers, and tensors that feed several layers (whose gradients add up).
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/testing/functional_json.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using nlohmann::json;

struct GradientCase {
  std::string label;
  std::vector<int64_t> input_shape;
  json layers;
  json loss;
  json functional = nullptr;  // a whole Functional model, instead of Sequential `layers`
  int64_t ids = 0;            // > 0: the inputs are ids in [0, ids), repeated (Embedding)
};

json Dense(int units, const char* activation, bool use_bias = true) {
  return {{"class_name", "Dense"},
          {"config", {{"units", units}, {"activation", activation}, {"use_bias", use_bias}}}};
}
json Act(const char* activation) {
  return {{"class_name", "Activation"}, {"config", {{"activation", activation}}}};
}
json Dropout(double rate) { return {{"class_name", "Dropout"}, {"config", {{"rate", rate}}}}; }
json Flatten() { return {{"class_name", "Flatten"}, {"config", json::object()}}; }
json Conv(json config) { return {{"class_name", "Conv2D"}, {"config", std::move(config)}}; }
json MaxPool(json config) {
  return {{"class_name", "MaxPooling2D"}, {"config", std::move(config)}};
}
json BatchNorm(json config = json::object()) {
  return {{"class_name", "BatchNormalization"}, {"config", std::move(config)}};
}
json Reshape(std::vector<int64_t> shape) {
  return {{"class_name", "Reshape"}, {"config", {{"target_shape", shape}}}};
}

Model Build(const GradientCase& c) {
  if (!c.functional.is_null()) {
    auto model = Model::FromKerasJson(c.functional);
    EXPECT_TRUE(model.ok()) << model.status();
    return *std::move(model);
  }
  json input_shape = json::array({nullptr});
  for (int64_t dim : c.input_shape) input_shape.push_back(dim);
  json layers = json::array(
      {{{"class_name", "InputLayer"}, {"config", {{"batch_input_shape", input_shape}}}}});
  for (const json& layer : c.layers) layers.push_back(layer);
  auto model = Model::FromKerasJson(
      json{{"class_name", "Sequential"}, {"config", {{"name", "m"}, {"layers", layers}}}});
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

class GradientTest : public ::testing::TestWithParam<GradientCase> {};

TEST_P(GradientTest, MatchesFiniteDifferences) {
  const GradientCase& c = GetParam();
  const Model model = Build(c);
  auto loss_or = Loss::FromKeras(c.loss);
  ASSERT_TRUE(loss_or.ok()) << loss_or.status();
  const Loss loss = *loss_or;
  constexpr int64_t kBatch = 4;
  const int64_t classes = model.output_size();

  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int64_t> x_dims = {kBatch};
  for (int64_t dim : c.input_shape) x_dims.push_back(dim);
  Tensor x(DType::kFloat32, Shape(x_dims));
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    x.data<float>()[i] = c.ids > 0 ? static_cast<float>((i * 7 + i / 3) % c.ids) : normal(rng);
  }
  Tensor y;
  if (loss.sparse_targets()) {
    y = Tensor(DType::kInt64, Shape({kBatch}));
    for (int64_t i = 0; i < kBatch; ++i) y.data<int64_t>()[i] = (i * 2 + 1) % classes;
  } else {
    y = Tensor(DType::kFloat32, Shape({kBatch, classes}));
    for (int64_t i = 0; i < kBatch; ++i) {
      for (int64_t k = 0; k < classes; ++k) {
        y.data<float>()[i * classes + k] =
            loss.is_crossentropy() ? (k == i % classes ? 1.0f : 0.0f) : 0.3f * normal(rng);
      }
    }
  }
  std::vector<Tensor> vars = model.InitialVariables(11);
  // Non-zero biases (and BatchNormalization's beta), gammas and moving statistics other
  // than 1, so that every path is exercised.
  for (size_t v = 0; v < vars.size(); ++v) {
    const std::string& name = model.variables()[v].name;
    const bool shift = name.find("bias") != std::string::npos ||
                       name.find("beta") != std::string::npos ||
                       name.find("moving_mean") != std::string::npos;
    const bool scale = name.find("gamma") != std::string::npos ||
                       name.find("moving_variance") != std::string::npos;
    for (int64_t i = 0; (shift || scale) && i < vars[v].num_elements(); ++i) {
      vars[v].data<float>()[i] = shift ? 0.1f * normal(rng) : 1.0f + 0.3f * std::abs(normal(rng));
    }
  }
  const float scale = 1.0f / 8;  // as if the global batch had 8 examples
  // The same workspace seed gives the same dropout masks on every call.
  auto objective = [&](const std::vector<Tensor>& at) {
    auto ws = model.NewWorkspace(5);
    std::vector<Tensor> unused;
    auto stats = model.TrainStep(at, x, y, loss, scale, *ws, unused);
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats->loss_sum * scale;
  };
  auto ws = model.NewWorkspace(5);
  std::vector<Tensor> grads;
  ASSERT_OK(model.TrainStep(vars, x, y, loss, scale, *ws, grads));

  constexpr float kStep = 2e-3f;
  int checked = 0;
  for (size_t v = 0; v < vars.size(); ++v) {
    // A non-trainable variable's slot holds its step, not a gradient (batch_normalization_test).
    if (!model.variables()[v].trainable) continue;
    for (int64_t i = 0; i < vars[v].num_elements(); ++i) {
      std::vector<Tensor> plus, minus;
      for (const Tensor& t : vars) {
        plus.push_back(t.Clone());
        minus.push_back(t.Clone());
      }
      plus[v].data<float>()[i] += kStep;
      minus[v].data<float>()[i] -= kStep;
      const double numeric = (objective(plus) - objective(minus)) / (2.0 * kStep);
      const double analytic = grads[v].data<float>()[i];
      EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << c.label << ": " << model.variables()[v].name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, model.num_parameters() - model.num_non_trainable_parameters());
}

INSTANTIATE_TEST_SUITE_P(
    AllLayers, GradientTest,
    ::testing::Values(
        GradientCase{"ReluSoftmaxSparse",
                     {6},
                     {Dense(5, "relu"), Dense(3, "softmax")},
                     "sparse_categorical_crossentropy"},
        GradientCase{"TanhSoftmaxCategorical",
                     {6},
                     {Dense(5, "tanh"), Dense(3, "softmax")},
                     "categorical_crossentropy"},
        GradientCase{
            "SigmoidLogitsSparse",
            {6},
            {Dense(5, "sigmoid"), Dense(3, "linear")},
            {{"class_name", "SparseCategoricalCrossentropy"}, {"config", {{"from_logits", true}}}}},
        GradientCase{
            "LinearLogitsCategorical",
            {6},
            {Dense(5, "linear"), Dense(3, "linear")},
            {{"class_name", "CategoricalCrossentropy"}, {"config", {{"from_logits", true}}}}},
        GradientCase{"ActivationSoftmaxFused",
                     {6},
                     {Dense(5, "linear"), Dense(3, "linear"), Act("softmax")},
                     "sparse_categorical_crossentropy"},
        GradientCase{"DropoutHidden",
                     {6},
                     {Dense(5, "relu"), Dropout(0.3), Dense(3, "softmax")},
                     "sparse_categorical_crossentropy"},
        GradientCase{"SigmoidMse", {6}, {Dense(5, "relu"), Dense(3, "sigmoid")}, "mse"},
        GradientCase{"SigmoidBinaryCrossentropy",
                     {6},
                     {Dense(5, "relu"), Dense(3, "sigmoid")},
                     "binary_crossentropy"},
        GradientCase{"LogitsBinaryCrossentropy",
                     {6},
                     {Dense(5, "tanh"), Dense(1, "linear")},
                     {{"class_name", "BinaryCrossentropy"}, {"config", {{"from_logits", true}}}}},
        GradientCase{"SigmoidProbabilitiesSparse",
                     {6},
                     {Dense(5, "tanh"), Dense(3, "sigmoid")},
                     "sparse_categorical_crossentropy"},
        GradientCase{"SigmoidProbabilitiesCategorical",
                     {6},
                     {Dense(3, "sigmoid")},
                     "categorical_crossentropy"},
        GradientCase{"SoftmaxThenDropoutCategorical",
                     {6},
                     {Dense(5, "relu"), Dense(3, "softmax"), Dropout(0.5)},
                     "categorical_crossentropy"},
        GradientCase{"HiddenSoftmaxNoBiasMse",
                     {6},
                     {Dense(4, "softmax"), Dense(3, "linear", false)},
                     "mean_squared_error"},
        GradientCase{
            "ActivationLayers",
            {6},
            {Dense(5, "linear"), Act("relu"), Act("tanh"), Dense(3, "linear"), Act("sigmoid")},
            "mse"},
        GradientCase{"DenseOnRank2InputThenFlatten",
                     {2, 3},
                     {Dense(4, "tanh"), Flatten(), Dense(3, "softmax")},
                     "sparse_categorical_crossentropy"},
        GradientCase{
            "DropoutFirst",
            {2, 3},
            {Flatten(), Dropout(0.25), Dense(4, "relu"), Dense(3, "softmax")},
            {{"class_name", "SparseCategoricalCrossentropy"}, {"config", {{"from_logits", true}}}}},
        GradientCase{"Conv2DValidTanhThenDense",
                     {5, 5, 2},
                     {Conv({{"filters", 3}, {"kernel_size", 3}, {"activation", "tanh"}}), Flatten(),
                      Dense(3, "softmax")},
                     "sparse_categorical_crossentropy"},
        GradientCase{
            "Conv2DSameStridesThenDilated",
            {6, 6, 1},
            {Conv({{"filters", 2},
                   {"kernel_size", {3, 2}},
                   {"strides", 2},
                   {"padding", "same"},
                   {"activation", "tanh"}}),
             Conv({{"filters", 2}, {"kernel_size", 2}, {"dilation_rate", 2}, {"use_bias", false}}),
             Flatten(), Dense(3, "softmax")},
            "sparse_categorical_crossentropy"},
        GradientCase{"MaxPoolingValidAndSame",
                     {5, 5, 2},
                     {Conv({{"filters", 2}, {"kernel_size", 2}, {"activation", "sigmoid"}}),
                      MaxPool({{"pool_size", 2}}),
                      MaxPool({{"pool_size", 2}, {"strides", 1}, {"padding", "same"}}), Flatten(),
                      Dense(3, "softmax")},
                     "sparse_categorical_crossentropy"},
        GradientCase{
            "EmbeddingAveragedOverSteps",
            {6},
            {json{{"class_name", "Embedding"}, {"config", {{"input_dim", 5}, {"output_dim", 3}}}},
             json{{"class_name", "GlobalAveragePooling1D"}, {"config", json::object()}},
             Dense(3, "softmax")},
            "sparse_categorical_crossentropy",
            nullptr,
            5},
        GradientCase{
            "EmbeddingFlattenedWithAnUnusedRow",
            {2, 3},
            {json{{"class_name", "Embedding"}, {"config", {{"input_dim", 7}, {"output_dim", 2}}}},
             Flatten(), Dense(3, "tanh"), Dense(2, "linear")},
            "mse",
            nullptr,
            6},
        GradientCase{"EmbeddingReadTwiceFunctional",
                     {5},
                     json::array(),
                     "sparse_categorical_crossentropy",
                     json::parse(R"({"class_name": "Functional", "config": {"name": "bag",
                       "layers": [
                         {"class_name": "InputLayer", "name": "ids",
                          "config": {"batch_input_shape": [null, 5], "dtype": "int64",
                                     "name": "ids"}, "inbound_nodes": []},
                         {"class_name": "Embedding", "name": "table",
                          "config": {"name": "table", "input_dim": 9, "output_dim": 3},
                          "inbound_nodes": [[["ids", 0, 0, {}]]]},
                         {"class_name": "GlobalAveragePooling1D", "name": "mean",
                          "config": {"name": "mean"}, "inbound_nodes": [[["table", 0, 0, {}]]]},
                         {"class_name": "Flatten", "name": "flat", "config": {"name": "flat"},
                          "inbound_nodes": [[["table", 0, 0, {}]]]},
                         {"class_name": "Concatenate", "name": "both",
                          "config": {"name": "both"},
                          "inbound_nodes": [[["mean", 0, 0, {}], ["flat", 0, 0, {}]]]},
                         {"class_name": "Dense", "name": "out",
                          "config": {"name": "out", "units": 4, "activation": "softmax"},
                          "inbound_nodes": [[["both", 0, 0, {}]]]}],
                       "input_layers": [["ids", 0, 0]],
                       "output_layers": [["out", 0, 0]]}})"),
                     9},
        GradientCase{"AveragePoolingAndGlobalPools",
                     {5, 5, 2},
                     {Conv({{"filters", 3}, {"kernel_size", 2}, {"activation", "tanh"}}),
                      json{{"class_name", "AveragePooling2D"},
                           {"config", {{"pool_size", 3}, {"strides", 2}, {"padding", "same"}}}},
                      json{{"class_name", "GlobalMaxPooling2D"}, {"config", {{"keepdims", true}}}},
                      json{{"class_name", "GlobalAveragePooling2D"}, {"config", json::object()}},
                      Dense(3, "softmax")},
                     "sparse_categorical_crossentropy"},
        GradientCase{
            "ZeroPaddingAsymmetricThenConv",
            {3, 4, 2},
            {json{{"class_name", "ZeroPadding2D"}, {"config", {{"padding", {{1, 0}, {2, 1}}}}}},
             Conv({{"filters", 2}, {"kernel_size", 3}, {"strides", 2}}), Flatten(),
             Dense(3, "softmax")},
            "sparse_categorical_crossentropy"},
        GradientCase{"ReshapeThenConv2D",
                     {12},
                     {Reshape({3, 4, 1}), Conv({{"filters", 2}, {"kernel_size", 2}}), Flatten(),
                      Dense(3, "linear")},
                     "mse"},
        GradientCase{"BatchNormAfterConvAndDense",
                     {4, 4, 2},
                     {Conv({{"filters", 2}, {"kernel_size", 2}}), BatchNorm({{"momentum", 0.9}}),
                      Act("relu"), Flatten(), Dense(4, "linear"), BatchNorm(), Dense(3, "softmax")},
                     "sparse_categorical_crossentropy"},
        GradientCase{
            "BatchNormWithoutCenterOrScaleAndFrozen",
            {5},
            {Dense(4, "tanh"), BatchNorm({{"center", false}, {"scale", false}}), Dense(4, "linear"),
             BatchNorm({{"trainable", false}, {"epsilon", 0.1}}), Dense(3, "softmax")},
            "categorical_crossentropy"},
        GradientCase{"FunctionalResidualBlockWithBatchNorm",
                     {4, 4, 2},
                     nullptr,
                     "sparse_categorical_crossentropy",
                     testing::Keras3Functional(
                         {.inputs = {{"image", {4, 4, 2}}},
                          .calls = {{testing::Layer("Conv2D", "conv",
                                                    {{"filters", 2},
                                                     {"kernel_size", 3},
                                                     {"padding", "same"},
                                                     {"use_bias", false}}),
                                     {"image"}},
                                    {testing::Layer("BatchNormalization", "bn"), {"conv"}},
                                    {testing::Layer("Add", "residual"), {"bn", "image"}},
                                    {testing::Layer("ReLU", "relu"), {"residual"}},
                                    {testing::Layer("GlobalAveragePooling2D", "pool"), {"relu"}},
                                    {testing::Layer("Dense", "out", {{"units", 3}}), {"pool"}}},
                          .outputs = {"out"}})},
        GradientCase{"FunctionalTwoInputsResidualAdd",
                     {784},
                     nullptr,
                     "sparse_categorical_crossentropy",
                     testing::Keras2Functional(testing::TwoInputResidualGraph(3, 3))},
        GradientCase{
            "FunctionalMergesAndFanOut",
            {6},
            nullptr,
            "categorical_crossentropy",
            testing::Keras3Functional(
                {.inputs = {{"a", {2}}, {"b", {4}}},
                 .calls =
                     {{testing::Layer("Dense", "h", {{"units", 4}, {"activation", "tanh"}}), {"a"}},
                      {testing::Layer("Dense", "g", {{"units", 4}, {"activation", "sigmoid"}}),
                       {"b"}},
                      {testing::Layer("Multiply", "gate"), {"h", "g", "b"}},
                      {testing::Layer("Average", "mean"), {"h", "gate"}},
                      {testing::Layer("Add", "twice"), {"mean", "mean"}},
                      {testing::Layer("Concatenate", "joined"), {"twice", "h"}},
                      {testing::Layer("Dense", "out", {{"units", 3}, {"activation", "softmax"}}),
                       {"joined"}}},
                 .outputs = {"out"}})},
        GradientCase{
            "FunctionalSoftmaxReadTwice",
            {4},
            nullptr,
            "mse",
            testing::Keras2Functional(
                {.inputs = {{"x", {4}}},
                 .calls = {{testing::Layer("Dense", "p", {{"units", 3}, {"activation", "softmax"}}),
                            {"x"}},
                           {testing::Layer("Dense", "q", {{"units", 3}}), {"p"}},
                           {testing::Layer("Add", "out"), {"p", "q"}}},
                 .outputs = {"out"}})}),
    [](const ::testing::TestParamInfo<GradientCase>& info) { return info.param.label; });

}  // namespace
}  // namespace stratum
