// Embedding and GlobalAveragePooling1D against hand-computed values: the lookup (ids outside
// the table give zeros), the table's gradient summed per row in order, the mean over steps;
// Keras' RandomUniform default and range; ids taken unscaled from an int InputLayer; and the
// options Stratum refuses, by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "stratum/device/device.h"
#include "stratum/model/model.h"

namespace stratum {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json Sequential(json input_layer, std::vector<json> layers) {
  json all = json::array({std::move(input_layer)});
  for (json& layer : layers) all.push_back(std::move(layer));
  return {{"class_name", "Sequential"}, {"config", {{"name", "m"}, {"layers", all}}}};
}

json Input(std::vector<int64_t> shape, const char* dtype = nullptr) {
  json batch = json::array({nullptr});
  for (int64_t d : shape) batch.push_back(d);
  json config = {{"batch_input_shape", batch}};
  if (dtype != nullptr) config["dtype"] = dtype;
  return {{"class_name", "InputLayer"}, {"config", config}};
}

json Embedding(json config) { return {{"class_name", "Embedding"}, {"config", std::move(config)}}; }

TEST(EmbeddingTest, LooksUpRowsAndSumsTheirGradientsPerRow) {
  const Device& cpu = CpuDevice();
  const float table[] = {0, 1, 10, 11, 20, 21};  // 3 rows of 2
  const float ids[] = {2, 0, 2, 7, -1};          // 7 and -1: outside the table
  float out[10];
  cpu.EmbeddingLookup(ids, 5, table, 3, 2, out);
  EXPECT_THAT(std::vector<float>(out, out + 10),
              ::testing::ElementsAre(20, 21, 0, 1, 20, 21, 0, 0, 0, 0));
  const float grad_out[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  float grad_table[6] = {9, 9, 9, 9, 9, 9};
  cpu.EmbeddingGrad(ids, 5, grad_out, 3, 2, grad_table);
  // Row 2 twice (positions 0 and 2), row 0 once, row 1 never: zeros, not what was there.
  EXPECT_THAT(std::vector<float>(grad_table, grad_table + 6),
              ::testing::ElementsAre(3, 4, 0, 0, 6, 8));
}

TEST(EmbeddingTest, AveragesOverStepsAndSharesTheGradient) {
  const Device& cpu = CpuDevice();
  const float x[] = {1, 2, 3, 4, 5, 6, /* example 2 */ 0, 0, 0, 0, 3, 3};  // [2, 3, 2]
  float out[4];
  cpu.AverageSteps(x, 2, 3, 2, out);
  EXPECT_THAT(std::vector<float>(out, out + 4), ::testing::ElementsAre(3, 4, 1, 1));
  const float grad_out[] = {3, 6, 0, 3};
  float grad_x[12];
  std::fill(grad_x, grad_x + 12, 1.0f);
  cpu.AverageStepsGrad(grad_out, 2, 3, 2, grad_x, /*accumulate=*/true);
  EXPECT_THAT(std::vector<float>(grad_x, grad_x + 12),
              ::testing::ElementsAre(2, 3, 2, 3, 2, 3, 1, 2, 1, 2, 1, 2));
}

TEST(EmbeddingTest, BuildsKerasShapesVariablesAndInitialValues) {
  auto model = Model::FromKerasJson(Sequential(
      Input({4}, "int32"), {Embedding({{"name", "emb"}, {"input_dim", 1000}, {"output_dim", 8}}),
                            {{"class_name", "GlobalAveragePooling1D"}, {"config", json::object()}},
                            {{"class_name", "Dense"}, {"config", {{"units", 2}}}}}));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->takes_ids());
  ASSERT_EQ(model->variables()[0].name, "emb/embeddings");
  EXPECT_EQ(model->variables()[0].shape, Shape({1000, 8}));
  // Keras' default: RandomUniform(-0.05, 0.05), spread over the range.
  const Tensor table = model->InitialVariables(1)[0];
  float low = 1, high = -1;
  for (int64_t i = 0; i < table.num_elements(); ++i) {
    low = std::min(low, table.data<float>()[i]);
    high = std::max(high, table.data<float>()[i]);
  }
  EXPECT_GE(low, -0.05f);
  EXPECT_LT(low, -0.049f);
  EXPECT_LT(high, 0.05f);
  EXPECT_GT(high, 0.049f);
  auto ranged = Model::FromKerasJson(
      Sequential(Input({3}, "int64"),
                 {Embedding({{"input_dim", 50},
                             {"output_dim", 4},
                             {"embeddings_initializer",
                              {{"class_name", "RandomUniform"},
                               {"config", {{"minval", 1.0}, {"maxval", 2.0}, {"seed", 7}}}}}}),
                  {{"class_name", "Flatten"}, {"config", json::object()}},
                  {{"class_name", "Dense"}, {"config", {{"units", 2}}}}}));
  ASSERT_TRUE(ranged.ok()) << ranged.status();
  const Tensor values = ranged->InitialVariables(1)[0];
  for (int64_t i = 0; i < values.num_elements(); ++i) {
    ASSERT_GE(values.data<float>()[i], 1.0f);
    ASSERT_LT(values.data<float>()[i], 2.0f);
  }
  // Its own seed: the same values whatever the model's seed.
  EXPECT_EQ(ranged->InitialVariables(2)[0].data<float>()[5], values.data<float>()[5]);
  // A float32 input an Embedding reads takes ids too (Keras casts them, never scales them);
  // one that feeds a Dense takes values.
  auto floats = Model::FromKerasJson(
      Sequential(Input({3}), {Embedding({{"input_dim", 5}, {"output_dim", 2}}),
                              {{"class_name", "Flatten"}, {"config", json::object()}}}));
  ASSERT_TRUE(floats.ok()) << floats.status();
  EXPECT_TRUE(floats->takes_ids());
  auto dense = Model::FromKerasJson(Sequential(
      Input({3}),
      {{{"class_name", "Dense"},
        {"config",
         {{"units", 2},
          {"kernel_initializer",
           {{"class_name", "RandomUniform"}, {"config", {{"minval", 3.0}, {"maxval", 4.0}}}}}}}}}));
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_FALSE(dense->takes_ids());
  // RandomUniform's range holds in every layer, not the Embedding alone.
  const Tensor kernel = dense->InitialVariables(1)[0];
  for (int64_t i = 0; i < kernel.num_elements(); ++i) {
    ASSERT_GE(kernel.data<float>()[i], 3.0f);
    ASSERT_LT(kernel.data<float>()[i], 4.0f);
  }
}

TEST(EmbeddingTest, RefusesWhatStratumDoesNotImplementByName) {
  auto refusal = [](json config) {
    auto model = Model::FromKerasJson(Sequential(
        Input({3}, "int32"),
        {Embedding(std::move(config)), {{"class_name", "Flatten"}, {"config", json::object()}}}));
    return std::string(model.status().message());
  };
  EXPECT_THAT(refusal({{"input_dim", 5}, {"output_dim", 2}, {"mask_zero", true}}),
              HasSubstr("mask_zero to true, which Stratum does not support yet"));
  EXPECT_THAT(refusal({{"output_dim", 2}}), HasSubstr("input_dim missing: set it to a positive"));
  EXPECT_THAT(refusal({{"input_dim", 5}, {"output_dim", 0}}), HasSubstr("output_dim 0"));
  EXPECT_THAT(refusal({{"input_dim", 5}, {"output_dim", 2}, {"embeddings_constraint", "non_neg"}}),
              HasSubstr("embeddings_constraint"));
  EXPECT_THAT(
      refusal({{"input_dim", 5},
               {"output_dim", 2},
               {"embeddings_initializer",
                {{"class_name", "RandomUniform"}, {"config", {{"minval", 1}, {"maxval", 1}}}}}}),
      HasSubstr("minval must be below maxval"));
  EXPECT_THAT(refusal({{"input_dim", 5}, {"output_dim", 2}, {"input_lenght", 3}}),
              HasSubstr("\"input_lenght\", which Keras' layer does not have"));
  auto uint8 = Model::FromKerasJson(
      Sequential(Input({3}, "uint8"), {Embedding({{"input_dim", 5}, {"output_dim", 2}})}));
  EXPECT_THAT(uint8.status().message(), HasSubstr("dtype \"uint8\""));
  EXPECT_THAT(uint8.status().message(), HasSubstr("or int32 / int64 for ids (Embedding)"));
  EXPECT_THAT(refusal({{"input_dim", 20000000}, {"output_dim", 2}}),
              HasSubstr("more rows than Stratum's ids address exactly (2^24 = 16777216)"));
}

}  // namespace
}  // namespace stratum
