// Embedding and GlobalAveragePooling1D against hand-computed values: the lookup (ids outside
// the table give zeros), the table's gradient summed per row in order, the mean over steps;
// Keras' RandomUniform default and range; ids taken unscaled from an int InputLayer; and the
// options Stratum refuses, by name.
#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "stratum/device/device.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/testing/status_matchers.h"

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
  // Ids as the model's buffers hold them: id words. 7 and -1: outside the table.
  const float ids[] = {IdWord(2), IdWord(0), IdWord(2), IdWord(7), IdWord(-1)};
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

TEST(EmbeddingTest, FindsIdsAmongTheRowsGiven) {
  const int64_t rows[] = {0, 4, 9};
  const float ids[] = {IdWord(9), IdWord(4),     IdWord(5),           IdWord(-1),
                       IdWord(0), IdWord(kNoId), IdWordOfValue(9.5f), IdWord(12)};
  float positions[8];
  CpuDevice().EmbeddingPositions(ids, 8, rows, 3, positions);
  // 9.5 is row 9, as TensorFlow casts it; 5, 12, -1 and no id are not among the rows.
  std::vector<int32_t> found;
  for (float word : positions) found.push_back(IdOfWord(word));
  EXPECT_THAT(found, ::testing::ElementsAre(2, 1, -1, -1, 0, -1, 2, -1));
  // A value no int32 holds, and NaN, are no id.
  EXPECT_EQ(IdOfWord(IdWordOfValue(NAN)), kNoId);
  EXPECT_EQ(IdOfWord(IdWordOfValue(3e9f)), kNoId);
  EXPECT_EQ(IdOfWord(IdWord(int64_t{1} << 40)), kNoId);
  EXPECT_EQ(IdOfWord(IdWordOfValue(-2.5f)), -2);
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

TEST(EmbeddingTest, AMaskedMeanLeavesPaddingStepsOut) {
  const Device& cpu = CpuDevice();
  const float x[] = {1, 2, 3, 4, 5, 6, /* example 2: all padding */ 7, 7, 7, 7, 7, 7};
  const float ids[] = {IdWord(4), IdWord(0), IdWord(9), /**/ IdWord(0), IdWord(0), IdWord(0)};
  float out[4] = {9, 9, 9, 9};
  cpu.AverageMaskedSteps(x, ids, 2, 3, 2, out);
  // Keras divides 0 by 0 for the second (NaN); Stratum gives zeros.
  EXPECT_THAT(std::vector<float>(out, out + 4), ::testing::ElementsAre(3, 4, 0, 0));
  const float grad_out[] = {4, 6, 5, 5};
  float grad_x[12];
  std::fill(grad_x, grad_x + 12, 1.0f);
  cpu.AverageMaskedStepsGrad(grad_out, ids, 2, 3, 2, grad_x, /*accumulate=*/true);
  EXPECT_THAT(std::vector<float>(grad_x, grad_x + 12),
              ::testing::ElementsAre(3, 4, 1, 1, 3, 4, 1, 1, 1, 1, 1, 1));
  cpu.AverageMaskedStepsGrad(grad_out, ids, 2, 3, 2, grad_x, /*accumulate=*/false);
  EXPECT_THAT(std::vector<float>(grad_x, grad_x + 12),
              ::testing::ElementsAre(2, 3, 0, 0, 2, 3, 0, 0, 0, 0, 0, 0));
}

// With mask_zero, padded sequences train as their unpadded steps alone would: the same
// predictions, loss and gradients as a model given only those ids, and no gradient for the
// padding row. Dense and Dropout between the table and the mean pass the mask on.
TEST(EmbeddingTest, MaskZeroTrainsPaddedSequencesAsTheirStepsAlone) {
  auto make = [](int64_t steps, bool mask_zero) {
    return Model::FromKerasJson(Sequential(
        Input({steps}, "int32"),
        {Embedding(
             {{"name", "emb"}, {"input_dim", 10}, {"output_dim", 3}, {"mask_zero", mask_zero}}),
         {{"class_name", "Dense"}, {"config", {{"name", "per_step"}, {"units", 4}}}},
         {{"class_name", "Dropout"}, {"config", {{"rate", 0.0}}}},
         {{"class_name", "GlobalAveragePooling1D"}, {"config", json::object()}},
         {{"class_name", "Dense"}, {"config", {{"units", 1}, {"activation", "sigmoid"}}}}}));
  };
  auto padded = make(4, true);
  ASSERT_TRUE(padded.ok()) << padded.status();
  auto unpadded = make(2, false);
  ASSERT_TRUE(unpadded.ok()) << unpadded.status();
  EXPECT_TRUE(padded->variables()[0].row_sparse);  // ids still straight from the input
  const std::vector<Tensor> variables = padded->InitialVariables(5);
  auto loss = Loss::FromKeras("binary_crossentropy");
  ASSERT_OK(loss);
  const Tensor y = Tensor::FromVector<int32_t>({2}, {1, 0});
  auto padded_ws = padded->NewWorkspace(1);
  auto unpadded_ws = unpadded->NewWorkspace(1);
  std::vector<Tensor> padded_grads, unpadded_grads;
  auto a =
      padded->TrainStep(variables, Tensor::FromVector<float>({2, 4}, {5, 3, 0, 0, /**/ 0, 7, 0, 2}),
                        y, *loss, 0.5f, *padded_ws, padded_grads);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = unpadded->TrainStep(variables, Tensor::FromVector<float>({2, 2}, {5, 3, /**/ 7, 2}), y,
                               *loss, 0.5f, *unpadded_ws, unpadded_grads);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FLOAT_EQ(a->loss_sum, b->loss_sum);
  ASSERT_EQ(padded_grads.size(), unpadded_grads.size());
  for (size_t v = 0; v < padded_grads.size(); ++v) {
    for (int64_t i = 0; i < padded_grads[v].num_elements(); ++i) {
      EXPECT_FLOAT_EQ(padded_grads[v].data<float>()[i], unpadded_grads[v].data<float>()[i])
          << padded->variables()[v].name << " [" << i << "]";
    }
  }
  for (int k = 0; k < 3; ++k) EXPECT_EQ(padded_grads[0].data<float>()[k], 0.0f);  // row 0
  // A sequence of padding alone averages to zeros: the output is the head's bias, not NaN.
  auto empty =
      padded->Predict(variables, Tensor::FromVector<float>({1, 4}, {0, 0, 0, 0}), *padded_ws);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_FLOAT_EQ(empty->data<float>()[0], 0.5f);  // sigmoid(0): the bias starts at zeros

  // The mask must end at a mean: a model whose output still carries it is refused.
  auto unfinished = Model::FromKerasJson(Sequential(
      Input({4}, "int32"),
      {Embedding({{"name", "emb"}, {"input_dim", 10}, {"output_dim", 1}, {"mask_zero", true}}),
       {{"class_name", "Reshape"}, {"config", {{"target_shape", {4}}}}}}));
  EXPECT_THAT(std::string(unfinished.status().message()),
              HasSubstr("is given the mask of model layer \"emb\" (Embedding)"));
  auto output_masked = Model::FromKerasJson(Sequential(
      Input({4}, "int32"),
      {Embedding({{"name", "emb"}, {"input_dim", 10}, {"output_dim", 1}, {"mask_zero", true}}),
       {{"class_name", "Dense"}, {"config", {{"units", 1}}}}}));
  EXPECT_THAT(std::string(output_masked.status().message()),
              HasSubstr("a model output carries the mask of model layer \"emb\" (Embedding) "
                        "(mask_zero)"));
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

// A step given only the rows its batch reads (what a parameter-server worker pulls) computes
// what the step on the whole table does: the same loss and other gradients, and the table's
// gradient for those rows, bit for bit; every other row's gradient is zero.
TEST(EmbeddingTest, AStepOnTheRowsItReadsMatchesTheStepOnTheWholeTable) {
  auto model = Model::FromKerasJson(Sequential(
      Input({4}, "int32"),
      {Embedding({{"name", "emb"}, {"input_dim", 50}, {"output_dim", 3}}),
       {{"class_name", "GlobalAveragePooling1D"}, {"config", json::object()}},
       {{"class_name", "Dense"}, {"config", {{"units", 2}, {"activation", "softmax"}}}}}));
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(model->variables()[0].row_sparse);
  EXPECT_FALSE(model->variables()[1].row_sparse);
  auto loss = Loss::FromKeras("sparse_categorical_crossentropy");
  ASSERT_OK(loss);
  const std::vector<Tensor> whole = model->InitialVariables(3);
  // 60 and -1 lie outside the table; 7 and 49 appear twice.
  const Tensor x =
      Tensor::FromVector<float>({3, 4}, {7, 3, 60, 49, /**/ 7, 7, -1, 0, /**/ 49, 12, 3, 3});
  const Tensor y = Tensor::FromVector<int32_t>({3}, {0, 1, 1});

  auto rows = model->RowsRead({&x}, 0);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, (std::vector<int64_t>{0, 3, 7, 12, 49}));
  // Two batches' rows together, as a worker's replicas read them.
  const Tensor more = Tensor::FromVector<float>({1, 4}, {1, 1, 1, 2});
  EXPECT_EQ(*model->RowsRead({&x, &more}, 0), (std::vector<int64_t>{0, 1, 2, 3, 7, 12, 49}));
  EXPECT_FALSE(model->RowsRead({&x}, 1).ok());  // the Dense kernel

  auto dense_ws = model->NewWorkspace(1);
  std::vector<Tensor> dense_grads;
  auto dense = model->TrainStep(whole, x, y, *loss, 1.0f / 3, *dense_ws, dense_grads);
  ASSERT_TRUE(dense.ok()) << dense.status();

  std::vector<Tensor> given = whole;
  given[0] = Tensor(DType::kFloat32, Shape({static_cast<int64_t>(rows->size()), 3}));
  for (size_t i = 0; i < rows->size(); ++i) {
    std::copy_n(whole[0].data<float>() + (*rows)[i] * 3, 3, given[0].data<float>() + i * 3);
  }
  auto sparse_ws = model->NewWorkspace(1);
  ASSERT_OK(sparse_ws->SetVariableRows(0, *rows));
  std::vector<Tensor> sparse_grads;
  auto sparse = model->TrainStep(given, x, y, *loss, 1.0f / 3, *sparse_ws, sparse_grads);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_EQ(sparse->loss_sum, dense->loss_sum);
  ASSERT_EQ(sparse_grads[0].shape(), Shape({5, 3}));
  for (int64_t r = 0, i = 0; r < 50; ++r) {
    const bool read = i < 5 && (*rows)[static_cast<size_t>(i)] == r;
    for (int64_t k = 0; k < 3; ++k) {
      const float expected = dense_grads[0].data<float>()[r * 3 + k];
      if (read) {
        EXPECT_EQ(sparse_grads[0].data<float>()[i * 3 + k], expected) << "row " << r;
      } else {
        EXPECT_EQ(expected, 0.0f) << "row " << r;
      }
    }
    if (read) ++i;
  }
  EXPECT_TRUE(sparse_grads[1].BitwiseEqual(dense_grads[1]));
  EXPECT_TRUE(sparse_grads[2].BitwiseEqual(dense_grads[2]));
  // Predictions agree too; the whole table is refused while rows are given, and taken again
  // once they are cleared.
  auto predicted = model->Predict(given, x, *sparse_ws);
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  EXPECT_TRUE(predicted->BitwiseEqual(*model->Predict(whole, x, *dense_ws)));
  EXPECT_THAT(std::string(model->Predict(whole, x, *sparse_ws).status().message()),
              HasSubstr("(the rows the workspace was given)"));
  sparse_ws->ClearVariableRows();
  EXPECT_OK(model->Predict(whole, x, *sparse_ws));

  EXPECT_THAT(std::string(sparse_ws->SetVariableRows(0, {3, 3}).message()),
              HasSubstr("not sorted, unique and within its 50 rows"));
  EXPECT_THAT(std::string(sparse_ws->SetVariableRows(0, {50}).message()),
              HasSubstr("not sorted, unique and within its 50 rows"));
  EXPECT_THAT(std::string(sparse_ws->SetVariableRows(1, {0}).message()),
              HasSubstr("is not row-sparse"));
}

// A table is row-sparse only where its ids come straight from a model input (RowsRead reads
// them there, in that input's columns) and no regularizer needs every row.
TEST(EmbeddingTest, RowSparseTablesReadTheirIdsFromTheirInputsColumns) {
  auto input = [](const char* name, int64_t size) {
    return json{
        {"class_name", "InputLayer"},
        {"name", name},
        {"config", {{"name", name}, {"batch_input_shape", {nullptr, size}}, {"dtype", "int64"}}},
        {"inbound_nodes", json::array()}};
  };
  auto layer = [](const char* class_name, const char* name, json config, json inbound) {
    config["name"] = name;
    json inputs = json::array();
    for (const auto& from : inbound) inputs.push_back({from, 0, 0, json::object()});
    return json{{"class_name", class_name},
                {"name", name},
                {"config", std::move(config)},
                {"inbound_nodes", {inputs}}};
  };
  const json two_inputs = {
      {"class_name", "Functional"},
      {"config",
       {{"name", "two"},
        {"layers",
         json::array({input("a", 2), input("b", 1),
                      layer("Embedding", "ea", {{"input_dim", 10}, {"output_dim", 2}}, {"a"}),
                      layer("Embedding", "eb", {{"input_dim", 20}, {"output_dim", 2}}, {"b"}),
                      layer("Concatenate", "both", {{"axis", 1}}, {"ea", "eb"}),
                      layer("Flatten", "flat", json::object(), {"both"})})},
        {"input_layers", {{"a", 0, 0}, {"b", 0, 0}}},
        {"output_layers", {{"flat", 0, 0}}}}}};
  auto model = Model::FromKerasJson(two_inputs);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(model->variables()[0].row_sparse);
  ASSERT_TRUE(model->variables()[1].row_sparse);
  // Examples of a's two ids then b's one; 11 is outside ea's 10 rows but inside eb's 20.
  const Tensor x = Tensor::FromVector<float>({2, 3}, {4, 1, 11, /**/ 4, 11, 2});
  EXPECT_EQ(*model->RowsRead({&x}, 0), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(*model->RowsRead({&x}, 1), (std::vector<int64_t>{2, 11}));

  auto regularized = Model::FromKerasJson(Sequential(
      Input({2}, "int32"),
      {Embedding({{"input_dim", 10},
                  {"output_dim", 2},
                  {"embeddings_regularizer", {{"class_name", "L2"}, {"config", {{"l2", 0.01}}}}}}),
       {{"class_name", "Flatten"}, {"config", json::object()}}}));
  ASSERT_TRUE(regularized.ok()) << regularized.status();
  EXPECT_FALSE(regularized->variables()[0].row_sparse);
  auto computed = Model::FromKerasJson(
      Sequential(Input({2}), {{{"class_name", "Reshape"}, {"config", {{"target_shape", {2, 1}}}}},
                              Embedding({{"input_dim", 10}, {"output_dim", 2}}),
                              {{"class_name", "Flatten"}, {"config", json::object()}}}));
  ASSERT_TRUE(computed.ok()) << computed.status();
  EXPECT_FALSE(computed->variables()[0].row_sparse);
  EXPECT_THAT(std::string(computed->RowsRead({&x}, 0).status().message()),
              HasSubstr("is not row-sparse"));
}

TEST(EmbeddingTest, RefusesWhatStratumDoesNotImplementByName) {
  auto refusal = [](json config) {
    auto model = Model::FromKerasJson(Sequential(
        Input({3}, "int32"),
        {Embedding(std::move(config)), {{"class_name", "Flatten"}, {"config", json::object()}}}));
    return std::string(model.status().message());
  };
  // The mask reaches only GlobalAveragePooling1D: Flatten (as in Keras) does not take it.
  EXPECT_THAT(
      refusal({{"name", "words"}, {"input_dim", 5}, {"output_dim", 2}, {"mask_zero", true}}),
      HasSubstr("(Flatten) is given the mask of model layer \"words\" (Embedding) "
                "(mask_zero), which Stratum carries only through Dense, Dropout and "
                "Activation to GlobalAveragePooling1D"));
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
  EXPECT_THAT(refusal({{"input_dim", int64_t{3} << 30}, {"output_dim", 2}}),
              HasSubstr("has input_dim 3221225472: set it to a positive integer below 2^31"));
}

// Ids travel as int32 from the data to the lookup: a table of more than 2^24 rows (where
// float32 values skip every other integer, and above 2^25 three in four) reads the rows named.
TEST(EmbeddingTest, IdsBeyond2To24AddressTheirOwnRows) {
  constexpr int64_t kRows = (int64_t{1} << 25) + 8;
  auto model = Model::FromKerasJson(Sequential(
      Input({3}, "int64"),
      {Embedding({{"name", "big"}, {"input_dim", kRows}, {"output_dim", 2}}),
       {{"class_name", "Flatten"}, {"config", json::object()}},
       {{"class_name", "Dense"}, {"config", {{"units", 2}, {"activation", "softmax"}}}}}));
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(model->variables()[0].row_sparse);
  // 2^25 + 1, + 3 and + 5 are no float32: as values they would read rows 2^25 and 2^25 + 4.
  const int32_t top = 1 << 25;
  const Tensor x =
      Tensor::FromVector<int32_t>({2, 3}, {top + 1, top + 3, 16777217, /**/ top + 5, top + 7, 0});
  auto rows = model->RowsRead({&x}, 0);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, (std::vector<int64_t>{0, 16777217, top + 1, top + 3, top + 5, top + 7}));

  // The step on those rows alone (the whole table, 256 MiB, is never made): each id reads
  // the row it names, so each given row gets a gradient.
  std::vector<Tensor> variables;
  for (const VariableSpec& spec : model->variables()) {
    variables.emplace_back(DType::kFloat32,
                           spec.shape.dim(0) == kRows ? Shape({6, 2}) : spec.shape);
    for (int64_t i = 0; i < variables.back().num_elements(); ++i) {
      variables.back().data<float>()[i] = 0.1f * static_cast<float>(i + 1);
    }
  }
  auto ws = model->NewWorkspace(1);
  ASSERT_OK(ws->SetVariableRows(0, *rows));
  auto loss = Loss::FromKeras("sparse_categorical_crossentropy");
  ASSERT_OK(loss);
  const Tensor y = Tensor::FromVector<int32_t>({2}, {0, 1});
  std::vector<Tensor> grads;
  auto step = model->TrainStep(variables, x, y, *loss, 0.5f, *ws, grads);
  ASSERT_TRUE(step.ok()) << step.status();
  // Every given row is read once, by the id that names it.
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_NE(grads[0].data<float>()[i * 2], 0.0f) << "row " << (*rows)[static_cast<size_t>(i)];
  }
  // The same ids as float32 values do not reach their rows: the model takes int32 for them.
  const Tensor floats = Tensor::FromVector<float>(
      {2, 3}, {static_cast<float>(top + 1), static_cast<float>(top + 3), 16777217.0f,
               static_cast<float>(top + 5), static_cast<float>(top + 7), 0});
  EXPECT_NE(*model->RowsRead({&floats}, 0), *rows);

  // A model that takes values besides ids gets them all as float32 values: its tables are
  // held to 2^24 rows, and an id input read as values is refused.
  json functional = json::parse(R"({"class_name": "Functional", "config": {"name": "mixed",
    "layers": [
      {"class_name": "InputLayer", "name": "ids", "config": {"batch_input_shape": [null, 2],
       "dtype": "int32", "name": "ids"}, "inbound_nodes": []},
      {"class_name": "InputLayer", "name": "values", "config": {"batch_input_shape": [null, 3],
       "name": "values"}, "inbound_nodes": []},
      {"class_name": "Embedding", "name": "emb", "config": {"name": "emb", "input_dim": 20000000,
       "output_dim": 2}, "inbound_nodes": [[["ids", 0, 0, {}]]]},
      {"class_name": "Flatten", "name": "flat", "config": {"name": "flat"},
       "inbound_nodes": [[["emb", 0, 0, {}]]]},
      {"class_name": "Concatenate", "name": "cat", "config": {"name": "cat"},
       "inbound_nodes": [[["flat", 0, 0, {}], ["values", 0, 0, {}]]]},
      {"class_name": "Dense", "name": "out", "config": {"name": "out", "units": 1},
       "inbound_nodes": [[["cat", 0, 0, {}]]]}],
    "input_layers": [["ids", 0, 0], ["values", 0, 0]], "output_layers": [["out", 0, 0]]}})");
  EXPECT_THAT(std::string(Model::FromKerasJson(functional).status().message()),
              HasSubstr("has 20000000 rows, but the model takes values besides ids"));
  functional["config"]["layers"][2]["config"]["input_dim"] = 1000;
  EXPECT_OK(Model::FromKerasJson(functional));
  // A float32 input passed on by Flatten takes ids too; values a Dense made do not.
  auto flattened = Model::FromKerasJson(
      Sequential(Input({2, 2}), {{{"class_name", "Flatten"}, {"config", json::object()}},
                                 Embedding({{"input_dim", 5}, {"output_dim", 1}}),
                                 {{"class_name", "Flatten"}, {"config", json::object()}}}));
  ASSERT_TRUE(flattened.ok()) << flattened.status();
  EXPECT_TRUE(flattened->takes_only_ids());
  std::vector<Tensor> table = flattened->InitialVariables(1);
  for (int64_t r = 0; r < 5; ++r) table[0].data<float>()[r] = static_cast<float>(r * 10);
  auto flat_ws = flattened->NewWorkspace(1);
  auto looked_up =
      flattened->Predict(table, Tensor::FromVector<float>({1, 2, 2}, {4, 1, 3.5f, 9}), *flat_ws);
  ASSERT_TRUE(looked_up.ok()) << looked_up.status();
  EXPECT_THAT(std::vector<float>(looked_up->data<float>(), looked_up->data<float>() + 4),
              ::testing::ElementsAre(40, 10, 30, 0));  // 3.5 is cast to 3; 9 is outside
  EXPECT_THAT(
      std::string(Model::FromKerasJson(
                      Sequential(Input({2}), {{{"class_name", "Dense"}, {"config", {{"units", 2}}}},
                                              Embedding({{"input_dim", 5}, {"output_dim", 1}})}))
                      .status()
                      .message()),
      HasSubstr("(Embedding) reads the values of model layer \"dense\" (Dense) as ids"));

  functional["config"]["layers"][4]["inbound_nodes"][0][1][0] = "ids";
  EXPECT_THAT(
      std::string(Model::FromKerasJson(functional).status().message()),
      HasSubstr(
          "model layer \"cat\" (Concatenate) reads the ids of model input \"ids\" as values"));
}

}  // namespace
}  // namespace stratum
