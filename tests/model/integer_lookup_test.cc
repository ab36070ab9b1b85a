// IntegerLookup against Keras' numbering (mask token at 0, then the out-of-vocabulary
// indices, then the vocabulary), its vocabulary from a list or a file, a model that looks
// the indices up in an Embedding, and the options Stratum refuses, by name.
#include <cmath>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json Lookup(json config) {
  return {{"class_name", "IntegerLookup"}, {"config", std::move(config)}};
}

json Sequential(std::vector<json> layers, int64_t width = 4) {
  json all =
      json::array({{{"class_name", "InputLayer"},
                    {"config", {{"batch_input_shape", {nullptr, width}}, {"dtype", "int64"}}}}});
  for (json& layer : layers) all.push_back(std::move(layer));
  return {{"class_name", "Sequential"}, {"config", {{"name", "m"}, {"layers", all}}}};
}

// The indices the model made of one layer `lookup` gives `tokens`.
std::vector<float> Indices(const json& lookup, const std::vector<float>& tokens) {
  auto model = Model::FromKerasJson(Sequential({lookup}, static_cast<int64_t>(tokens.size())));
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto ws = model->NewWorkspace(1);
  auto out = model->Predict(
      {}, Tensor::FromVector<float>({1, static_cast<int64_t>(tokens.size())}, tokens), *ws);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  return std::vector<float>(out->data<float>(), out->data<float>() + out->num_elements());
}

TEST(IntegerLookupTest, NumbersTokensAsKerasDoes) {
  // One OOV index (0) before the vocabulary; 5 is not in it, and 7.5 is cast to 7 (as Keras
  // casts a float input to its integer tokens).
  EXPECT_THAT(Indices(Lookup({{"vocabulary", {12, 7, 30}}}), {12, 7, 30, 5, 7.5f}),
              ::testing::ElementsAre(1, 2, 3, 0, 2));
  // The mask token at 0, then the OOV index, then the vocabulary.
  EXPECT_THAT(Indices(Lookup({{"vocabulary", {12, 7}}, {"mask_token", 0}}), {0, 12, 7, 9}),
              ::testing::ElementsAre(0, 2, 3, 1));
  // Two OOV indices: a token goes to its value modulo 2 (negative ones too).
  EXPECT_THAT(Indices(Lookup({{"vocabulary", {12}}, {"num_oov_indices", 2}}), {12, 4, 5, -3}),
              ::testing::ElementsAre(2, 0, 1, 1));
  // No OOV index: -1, which an Embedding looks up as zeros.
  EXPECT_THAT(Indices(Lookup({{"vocabulary", {12}}, {"num_oov_indices", 0}}), {12, 4}),
              ::testing::ElementsAre(0, -1));
  // The vocabulary from a file, one token a line.
  const std::string path = testing::TempPath("vocabulary.txt");
  std::ofstream(path) << "40\n 41 \n-2\n";
  EXPECT_THAT(Indices(Lookup({{"vocabulary", path}}), {-2, 41, 40, 3}),
              ::testing::ElementsAre(3, 2, 1, 0));
}

// Tokens travel as int32: exact beyond 2^24 in a model of ids; a model that also takes values
// gets them as float32 values, so its vocabulary is held to 2^24. A model whose output is
// the indices predicts them, and no loss trains on it.
TEST(IntegerLookupTest, TokensBeyond2To24AreExactInAModelOfIds) {
  auto exact =
      Model::FromKerasJson(Sequential({Lookup({{"vocabulary", {16777217, 16777216}}})}, 3));
  ASSERT_TRUE(exact.ok()) << exact.status();
  auto exact_ws = exact->NewWorkspace(1);
  auto indices =
      exact->Predict({}, Tensor::FromVector<int32_t>({1, 3}, {16777216, 16777217, 3}), *exact_ws);
  ASSERT_TRUE(indices.ok()) << indices.status();
  EXPECT_THAT(std::vector<float>(indices->data<float>(), indices->data<float>() + 3),
              ::testing::ElementsAre(2, 1, 0));
  auto mixed = Model::FromKerasJson(json::parse(R"({"class_name": "Functional", "config": {
    "name": "mixed", "layers": [
      {"class_name": "InputLayer", "name": "tokens", "config": {"batch_input_shape": [null, 1],
       "dtype": "int64", "name": "tokens"}, "inbound_nodes": []},
      {"class_name": "InputLayer", "name": "values", "config": {"batch_input_shape": [null, 1],
       "name": "values"}, "inbound_nodes": []},
      {"class_name": "IntegerLookup", "name": "lookup", "config": {"name": "lookup",
       "vocabulary": [16777217]}, "inbound_nodes": [[["tokens", 0, 0, {}]]]},
      {"class_name": "Embedding", "name": "emb", "config": {"name": "emb", "input_dim": 2,
       "output_dim": 1}, "inbound_nodes": [[["lookup", 0, 0, {}]]]},
      {"class_name": "Flatten", "name": "flat", "config": {"name": "flat"},
       "inbound_nodes": [[["emb", 0, 0, {}]]]},
      {"class_name": "Concatenate", "name": "cat", "config": {"name": "cat"},
       "inbound_nodes": [[["flat", 0, 0, {}], ["values", 0, 0, {}]]]}],
    "input_layers": [["tokens", 0, 0], ["values", 0, 0]], "output_layers": [["cat", 0, 0]]}})"));
  EXPECT_THAT(std::string(mixed.status().message()),
              HasSubstr("has the token 16777217, but the model takes values besides ids"));
  auto lookup_only = Model::FromKerasJson(Sequential({Lookup({{"vocabulary", {12}}})}, 1));
  ASSERT_TRUE(lookup_only.ok()) << lookup_only.status();
  auto ws = lookup_only->NewWorkspace(1);
  std::vector<Tensor> grads;
  EXPECT_THAT(std::string(lookup_only
                              ->TrainStep({}, Tensor::FromVector<int32_t>({1, 1}, {12}),
                                          Tensor::FromVector<float>({1, 1}, {1}),
                                          Loss::MeanSquaredError(), 1.0f, *ws, grads)
                              .status()
                              .message()),
              HasSubstr("outputs ids (an IntegerLookup's indices), which no loss trains on"));
}

TEST(IntegerLookupTest, FeedsAnEmbeddingThatTrainsOnTheCpu) {
  auto model = Model::FromKerasJson(Sequential(
      {Lookup({{"vocabulary", {3, 1, 4, 15, 9}}}),
       {{"class_name", "Embedding"}, {"config", {{"input_dim", 6}, {"output_dim", 2}}}},
       {{"class_name", "Flatten"}, {"config", json::object()}},
       {{"class_name", "Dense"}, {"config", {{"units", 2}, {"activation", "softmax"}}}}}));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->takes_ids());
  // The table's ids are computed in the model, so the table travels whole.
  EXPECT_FALSE(model->variables()[0].row_sparse);
  EXPECT_THAT(std::string(model->CheckRunsOnGpu().message()),
              HasSubstr("(IntegerLookup) has no CUDA kernel yet"));
  auto loss = Loss::FromKeras("sparse_categorical_crossentropy");
  ASSERT_OK(loss);
  auto ws = model->NewWorkspace(1);
  std::vector<Tensor> variables = model->InitialVariables(1), gradients;
  const Tensor x = Tensor::FromVector<float>({2, 4}, {3, 1, 4, 15, 9, 2, 6, 5});
  const Tensor y = Tensor::FromVector<int32_t>({2}, {0, 1});
  auto stats = model->TrainStep(variables, x, y, *loss, 0.5f, *ws, gradients);
  ASSERT_TRUE(stats.ok()) << stats.status();
  // Rows 1..5 (the vocabulary) and 0 (2, 6 and 5 are out of it) have gradients.
  const float* table = gradients[0].data<float>();
  for (int row = 0; row < 6; ++row) {
    EXPECT_NE(std::abs(table[row * 2]) + std::abs(table[row * 2 + 1]), 0.0f) << "row " << row;
  }
}

TEST(IntegerLookupTest, RefusesWhatStratumDoesNotImplementByName) {
  auto refusal = [](json config) {
    auto model = Model::FromKerasJson(Sequential({Lookup(std::move(config))}));
    return model.ok() ? std::string("built") : std::string(model.status().message());
  };
  EXPECT_THAT(refusal(json::object()),
              HasSubstr("has no vocabulary, and Stratum does not adapt()"));
  EXPECT_THAT(refusal({{"vocabulary", {1, 2, 1}}}), HasSubstr("has token 1 twice"));
  EXPECT_THAT(refusal({{"vocabulary", {1}}, {"output_mode", "one_hot"}}),
              HasSubstr("output_mode \"one_hot\", which Stratum does not support"));
  EXPECT_THAT(refusal({{"vocabulary", {1}}, {"invert", true}}), HasSubstr("sets invert to true"));
  EXPECT_THAT(refusal({{"vocabulary", {1.5}}}), HasSubstr("which is not an integer token"));
  EXPECT_THAT(refusal({{"vocabulary", "/nonexistent/vocabulary.txt"}}),
              HasSubstr("cannot be read: check the path"));
  EXPECT_THAT(refusal({{"vocabulary", {1, 2, 3}}, {"max_tokens", 2}}),
              HasSubstr("has max_tokens 2 but 4 indices"));
}

}  // namespace
}  // namespace stratum
