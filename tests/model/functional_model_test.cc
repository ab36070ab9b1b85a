// The Keras functional API: graphs of layers from to_json() in the tf.keras 2 and Keras 3
// forms (several named inputs, merge layers, a residual Add), the same results as the
// Sequential model a linear graph is, the merge layers' values, and the refusals that name
// what is wrong in a graph.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/model/model.h"
#include "stratum/testing/functional_json.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using nlohmann::json;
using testing::Call;
using testing::Graph;
using ::testing::HasSubstr;
using testing::Keras2Functional;
using testing::Keras3Functional;
using testing::Layer;

Model MustBuild(const json& spec) {
  auto model = Model::FromKerasJson(spec);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

std::string Refusal(const json& spec) {
  auto model = Model::FromKerasJson(spec);
  EXPECT_FALSE(model.ok()) << spec.dump();
  return model.ok() ? "" : std::string(model.status().message());
}

Tensor RandomX(int64_t batch, int64_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor x(DType::kFloat32, Shape({batch, width}));
  for (int64_t i = 0; i < x.num_elements(); ++i) x.data<float>()[i] = normal(rng);
  return x;
}

Tensor Labels(int64_t batch, int classes) {
  Tensor y(DType::kInt32, Shape({batch}));
  for (int64_t i = 0; i < batch; ++i) y.data<int32_t>()[i] = static_cast<int32_t>(i % classes);
  return y;
}

TEST(FunctionalModelTest, BuildsTheTwoInputResidualModelFromBothForms) {
  const Graph graph = testing::TwoInputResidualGraph(8, 10);
  for (const json& spec : {Keras2Functional(graph), Keras3Functional(graph)}) {
    const Model model = MustBuild(spec);
    EXPECT_EQ(model.input_names(), (std::vector<std::string>{"top", "bottom"}));
    EXPECT_EQ(model.input_shape(), Shape({784}));
    EXPECT_EQ(model.output_size(), 10);
    EXPECT_EQ(model.num_outputs(), 1);
    std::vector<std::string> names;
    for (const VariableSpec& spec : model.variables()) names.push_back(spec.name);
    EXPECT_EQ(names,
              (std::vector<std::string>{"top_dense/kernel", "top_dense/bias", "bottom_dense/kernel",
                                        "bottom_dense/bias", "mix/kernel", "mix/bias",
                                        "classes/kernel", "classes/bias"}));
    EXPECT_EQ(model.num_parameters(), 2 * (392 * 8 + 8) + (8 * 8 + 8) + (8 * 10 + 10));
    const std::string summary = model.Summary();
    EXPECT_THAT(summary, HasSubstr("Connected to"));
    EXPECT_THAT(summary, HasSubstr(" top (InputLayer)"));
    EXPECT_THAT(summary, HasSubstr("['mix[0][0]', 'top_dense[0][0]', 'bottom_dense[0][0]']"));
    // Every layer's math is the Device interface's, which the CUDA device implements.
    EXPECT_OK(model.CheckRunsOnGpu());
  }
}

TEST(FunctionalModelTest, BothFormsComputeTheSameValues) {
  const Graph graph = testing::TwoInputResidualGraph(8, 10);
  const Model keras2 = MustBuild(Keras2Functional(graph));
  const Model keras3 = MustBuild(Keras3Functional(graph));
  const std::vector<Tensor> vars = keras2.InitialVariables(3);
  const Tensor x = RandomX(5, 784, 1);
  auto ws2 = keras2.NewWorkspace(0);
  auto ws3 = keras3.NewWorkspace(0);
  auto a = keras2.Predict(vars, x, *ws2);
  auto b = keras3.Predict(vars, x, *ws3);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_TRUE(a->BitwiseEqual(*b));
}

// The inputs are the example's values split in order: feeding the bottom half zeros changes
// only what flows from "bottom".
TEST(FunctionalModelTest, SeveralInputsTakeTheExampleSplitInOrder) {
  const Graph graph{.inputs = {{"a", {2}}, {"b", {3}}},
                    .calls = {{Layer("Concatenate", "joined"), {"b", "a"}}},
                    .outputs = {"joined"}};
  const Model model = MustBuild(Keras2Functional(graph));
  EXPECT_EQ(model.input_shape(), Shape({5}));
  auto ws = model.NewWorkspace(0);
  const Tensor x = Tensor::FromVector<float>(Shape({2, 5}), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  auto out = model.Predict({}, x, *ws);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(
      out->BitwiseEqual(Tensor::FromVector<float>(Shape({2, 5}), {3, 4, 5, 1, 2, 8, 9, 10, 6, 7})));
}

TEST(FunctionalModelTest, MergeLayersComputeKerasValues) {
  const Graph graph{
      .inputs = {{"a", {3}}, {"b", {3}}},
      .calls = {{Layer("Add", "sum"), {"a", "b"}},
                {Layer("Average", "mean"), {"a", "b"}},
                {Layer("Multiply", "product"), {"a", "b"}},
                {Layer("Concatenate", "all", {{"axis", -1}}), {"sum", "mean", "product"}}},
      .outputs = {"all"}};
  const Model model = MustBuild(Keras2Functional(graph));
  auto ws = model.NewWorkspace(0);
  const Tensor x = Tensor::FromVector<float>(Shape({1, 6}), {1, 2, 3, 4, 5, 6});
  auto out = model.Predict({}, x, *ws);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->BitwiseEqual(
      Tensor::FromVector<float>(Shape({1, 9}), {5, 7, 9, 2.5f, 3.5f, 4.5f, 4, 10, 18})));
}

TEST(FunctionalModelTest, ConcatenateJoinsAlongAnInnerAxis) {
  const Graph graph{.inputs = {{"a", {2, 1}}, {"b", {2, 2}}},
                    .calls = {{Layer("Concatenate", "joined", {{"axis", 2}}), {"a", "b"}},
                              {Layer("Flatten", "flat"), {"joined"}}},
                    .outputs = {"flat"}};
  const Model model = MustBuild(Keras2Functional(graph));
  auto ws = model.NewWorkspace(0);
  // a = [[1], [2]], b = [[3, 4], [5, 6]] -> [[1, 3, 4], [2, 5, 6]].
  const Tensor x = Tensor::FromVector<float>(Shape({1, 6}), {1, 2, 3, 4, 5, 6});
  auto out = model.Predict({}, x, *ws);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->BitwiseEqual(Tensor::FromVector<float>(Shape({1, 6}), {1, 3, 4, 2, 5, 6})));
}

// A Sequential model and the Functional model of the same chain are one graph: the same
// variables give the same step, bit for bit.
TEST(FunctionalModelTest, ALinearGraphTrainsAsTheSequentialModelDoes) {
  const json sequential = {
      {"class_name", "Sequential"},
      {"config",
       {{"name", "chain"},
        {"layers",
         {{{"class_name", "InputLayer"}, {"config", {{"batch_input_shape", {nullptr, 12}}}}},
          Layer("Dense", "hidden", {{"units", 16}, {"activation", "relu"}}),
          Layer("Dropout", "drop", {{"rate", 0.2}}),
          Layer("Dense", "out", {{"units", 4}, {"activation", "softmax"}})}}}}};
  const Graph graph{
      .inputs = {{"x", {12}}},
      .calls = {{Layer("Dense", "hidden", {{"units", 16}, {"activation", "relu"}}), {"x"}},
                {Layer("Dropout", "drop", {{"rate", 0.2}}), {"hidden"}},
                {Layer("Dense", "out", {{"units", 4}, {"activation", "softmax"}}), {"drop"}}},
      .outputs = {"out"}};
  const Model a = MustBuild(sequential);
  const Model b = MustBuild(Keras3Functional(graph));
  const std::vector<Tensor> vars = a.InitialVariables(7);
  const Tensor x = RandomX(6, 12, 2);
  const Tensor y = Labels(6, 4);
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto ws_a = a.NewWorkspace(9);
  auto ws_b = b.NewWorkspace(9);
  std::vector<Tensor> ga, gb;
  auto sa = a.TrainStep(vars, x, y, loss, 1.0f / 6, *ws_a, ga);
  auto sb = b.TrainStep(vars, x, y, loss, 1.0f / 6, *ws_b, gb);
  ASSERT_OK(sa);
  ASSERT_OK(sb);
  EXPECT_EQ(sa->loss_sum, sb->loss_sum);
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(ga[i].BitwiseEqual(gb[i])) << i;
}

TEST(FunctionalModelTest, TrainingReducesTheLossOfTheResidualModel) {
  const Model model = MustBuild(Keras2Functional(testing::TwoInputResidualGraph(16, 4)));
  std::vector<Tensor> vars = model.InitialVariables(1);
  const Tensor x = RandomX(32, 784, 5);
  const Tensor y = Labels(32, 4);
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> grads;
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto stats = model.TrainStep(vars, x, y, loss, 1.0f / 32, *ws, grads);
    ASSERT_TRUE(stats.ok()) << stats.status();
    (step == 0 ? first : last) = stats->loss_sum / 32;
    for (size_t v = 0; v < vars.size(); ++v) vars[v].Flat() -= 0.1f * grads[v].Flat();
  }
  EXPECT_LT(last, 0.5 * first);
}

TEST(FunctionalModelTest, SeveralOutputsPredictSideBySideButDoNotTrain) {
  const Graph graph{.inputs = {{"x", {3}}},
                    .calls = {{Layer("Dense", "a", {{"units", 2}}), {"x"}},
                              {Layer("Dense", "b", {{"units", 1}}), {"x"}}},
                    .outputs = {"a", "b"}};
  const Model model = MustBuild(Keras2Functional(graph));
  EXPECT_EQ(model.num_outputs(), 2);
  EXPECT_EQ(model.output_size(), 3);
  const std::vector<Tensor> vars = model.InitialVariables(1);
  auto ws = model.NewWorkspace(0);
  const Tensor x = RandomX(2, 3, 1);
  auto out = model.Predict(vars, x, *ws);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->shape(), Shape({2, 3}));
  // Column 2 is b's output: x . b/kernel (b's bias starts at zero).
  const float* k = vars[2].data<float>();
  const float* row = x.data<float>();
  EXPECT_FLOAT_EQ(out->data<float>()[2], row[0] * k[0] + row[1] * k[1] + row[2] * k[2]);
  std::vector<Tensor> grads;
  auto step =
      model.TrainStep(vars, x, RandomX(2, 3, 2), Loss::MeanSquaredError(), 1.0f, *ws, grads);
  EXPECT_THAT(step.status().message(), HasSubstr("has 2 outputs"));
  EXPECT_THAT(model.CheckLoss(Loss::MeanSquaredError()).message(), HasSubstr("has 2 outputs"));
}

TEST(FunctionalModelTest, RefusesBrokenGraphsNamingTheLayer) {
  auto with = [](std::vector<Call> calls, std::vector<std::string> outputs) {
    return Keras2Functional(
        Graph{.inputs = {{"x", {4}}}, .calls = std::move(calls), .outputs = std::move(outputs)});
  };
  const json dense = Layer("Dense", "d", {{"units", 2}});
  EXPECT_THAT(Refusal(with({{dense, {"nowhere"}}}, {"d"})),
              HasSubstr("model layer \"d\" (Dense) takes the output of \"nowhere\", which the "
                        "model does not have"));
  EXPECT_THAT(Refusal(with({{Layer("Dense", "a", {{"units", 4}}), {"b"}},
                            {Layer("Dense", "b", {{"units", 4}}), {"a"}}},
                           {"b"})),
              HasSubstr("a cycle"));
  EXPECT_THAT(
      Refusal(with({{dense, {"x"}}, {Layer("Dense", "unused", {{"units", 2}}), {"x"}}}, {"d"})),
      HasSubstr("model layer \"unused\" (Dense) leads to none of the model's outputs"));
  EXPECT_THAT(Refusal(with({{dense, {"x"}}}, {"missing"})),
              HasSubstr("model output_layers names \"missing\""));
  EXPECT_THAT(Refusal(with({{Layer("Add", "add"), {"x"}}}, {"add"})),
              HasSubstr("model layer \"add\" (Add) takes 1 input: a merge layer takes a list of "
                        "two or more tensors"));
  EXPECT_THAT(Refusal(with({{dense, {"x"}}, {Layer("Add", "add"), {"x", "d"}}}, {"add"})),
              HasSubstr("model layer \"add\" (Add) takes inputs of shapes (None, 4) and (None, "
                        "2): its inputs must have one shape"));
  EXPECT_THAT(Refusal(with({{dense, {"x"}}, {Layer("Concatenate", "c", {{"axis", 0}}), {"x", "d"}}},
                           {"c"})),
              HasSubstr("has axis 0, which its inputs of shape (None, 4) do not have (axis 0 is "
                        "the batch)"));
  EXPECT_THAT(Refusal(with({{Layer("Conv3D", "conv"), {"x"}}}, {"conv"})),
              HasSubstr("model layer \"conv\" has class \"Conv3D\", which Stratum does not "
                        "support: use InputLayer, Activation, Add"));

  json shared = with({{dense, {"x"}}}, {"d"});
  shared["config"]["layers"][1]["inbound_nodes"].push_back(
      shared["config"]["layers"][1]["inbound_nodes"][0]);
  EXPECT_THAT(Refusal(shared), HasSubstr("model layer \"d\" (Dense) is called 2 times (a shared "
                                         "layer), which Stratum does not support"));
  json called_with_kwargs = with({{dense, {"x"}}}, {"d"});
  called_with_kwargs["config"]["layers"][1]["inbound_nodes"][0][0][3] = {{"training", true}};
  EXPECT_THAT(Refusal(called_with_kwargs), HasSubstr("calls \"x\" with training=true"));
  json second_output = with({{dense, {"x"}}}, {"d"});
  second_output["config"]["output_layers"][0][2] = 1;
  EXPECT_THAT(Refusal(second_output), HasSubstr("have one output"));
  json not_an_input = with({{dense, {"x"}}}, {"d"});
  not_an_input["config"]["input_layers"][0][0] = "d";
  EXPECT_THAT(Refusal(not_an_input),
              HasSubstr("model input_layers names \"d\", which is not an InputLayer"));
  EXPECT_THAT(Refusal(json{{"class_name", "Functional"}, {"config", {{"layers", json::array()}}}}),
              HasSubstr("model config has no layers"));
  EXPECT_THAT(Refusal(json{{"class_name", "MyModel"}, {"config", json::object()}}),
              HasSubstr("model has class \"MyModel\", which Stratum does not support: build the "
                        "model as keras.Sequential([...]) or with the functional API"));
  // Malformed references are refusals, never exceptions.
  for (const json& ref : {json(7), json::array({1, 0, 0}), json::array({"x"}), json("x")}) {
    json broken = with({{dense, {"x"}}}, {"d"});
    broken["config"]["layers"][1]["inbound_nodes"][0][0] = ref;
    EXPECT_EQ(Model::FromKerasJson(broken).status().code(), absl::StatusCode::kInvalidArgument)
        << ref.dump();
  }
}

}  // namespace
}  // namespace stratum
