// ShardedVariables against two parameter-server services in this process over real gRPC
// (InProcessPs): an embedding table split by rows over both, read and updated by the rows a
// step selects, beside a variable that travels whole.
#include "stratum/ps/sharded_variables.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "stratum/model/initial_fill.h"
#include "stratum/model/model.h"
#include "stratum/ps/placement.h"
#include "stratum/testing/in_process_ps.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using testing::InProcessPs;

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.5}})");

class ShardedVariablesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::unique_ptr<PsClient>> clients;
    for (int task = 0; task < 2; ++task) {
      absl::StatusOr<std::unique_ptr<InProcessPs>> ps = InProcessPs::Start();
      ASSERT_TRUE(ps.ok()) << ps.status();
      clients.push_back(std::make_unique<PsClient>(absl::StrCat("ps:", task), (*ps)->address(),
                                                   PsClientOptions{.timeout = absl::Seconds(5)}));
      servers_.push_back(*std::move(ps));
    }
    // The table's rows 0..3 on ps:0 and 4..9 on ps:1; the bias whole on ps:1.
    std::vector<ShardSpec> shards = {
        {.name = "emb/part_0",
         .variable = "emb",
         .num_shards = 2,
         .first_row = 0,
         .shape = Shape({4, 2}),
         .ps_task = 0},
        {.name = "emb/part_1",
         .variable = "emb",
         .shard_index = 1,
         .num_shards = 2,
         .first_row = 4,
         .shape = Shape({6, 2}),
         .ps_task = 1},
        {.name = "bias", .variable = "bias", .shape = Shape({3}), .ps_task = 1}};
    variables_ = std::make_unique<ShardedVariables>(std::vector<std::string>{"emb", "bias"},
                                                    std::vector<Shape>{Shape({10, 2}), Shape({3})},
                                                    std::move(shards), std::move(clients));
    std::vector<float> table;
    for (int i = 0; i < 20; ++i) table.push_back(static_cast<float>(i));
    initial_ = {Tensor::FromVector<float>({10, 2}, table),
                Tensor::FromVector<float>({3}, {1, 2, 3})};
    ASSERT_OK(variables_->Create(initial_, std::vector<nlohmann::json>{kSgd, kSgd}));
  }

  std::vector<std::unique_ptr<InProcessPs>> servers_;
  std::unique_ptr<ShardedVariables> variables_;
  std::vector<Tensor> initial_;
};

TEST_F(ShardedVariablesTest, PullsAndPushesOnlyTheRowsAStepSelects) {
  const std::vector<int64_t> rows = {1, 4, 8};  // across the shard boundary
  auto pulled = variables_->Pull({&rows, nullptr});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE((*pulled)[0].BitwiseEqual(Tensor::FromVector<float>({3, 2}, {2, 3, 8, 9, 16, 17})));
  EXPECT_TRUE((*pulled)[1].BitwiseEqual(initial_[1]));

  // Row gradients for the three rows and a whole one for the bias; the next step's rows come
  // back with the bias, after the update.
  const std::vector<int64_t> next = {0, 8, 9};
  std::vector<Tensor> back;
  ASSERT_TRUE(variables_
                  ->Push({Tensor::FromVector<float>({3, 2}, {2, 2, 4, 4, 6, 6}),
                          Tensor::FromVector<float>({3}, {2, 0, 2})},
                         &back, {&rows, nullptr}, {&next, nullptr})
                  .ok());
  EXPECT_TRUE(back[0].BitwiseEqual(Tensor::FromVector<float>({3, 2}, {0, 1, 13, 14, 18, 19})));
  EXPECT_TRUE(back[1].BitwiseEqual(Tensor::FromVector<float>({3}, {0, 2, 2})));

  // Rows 1, 4 and 8 moved by -0.5 * gradient; no other row did.
  auto whole = variables_->Pull();
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<float> expected;
  for (int i = 0; i < 20; ++i) expected.push_back(static_cast<float>(i));
  expected[2] -= 1, expected[3] -= 1, expected[8] -= 2, expected[9] -= 2, expected[16] -= 3,
      expected[17] -= 3;
  EXPECT_TRUE((*whole)[0].BitwiseEqual(Tensor::FromVector<float>({10, 2}, expected)));

  // A step that reads rows of one shard alone, and one that reads none.
  const std::vector<int64_t> one = {5}, none = {};
  auto some = variables_->Pull({&one, nullptr});
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_TRUE((*some)[0].BitwiseEqual(Tensor::FromVector<float>({1, 2}, {10, 11})));
  auto empty = variables_->Pull({&none, nullptr});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)[0].shape(), Shape({0, 2}));
}

// EarlyStopping's restore_best_weights on a PS job: whole variables go back, each PS its
// shards, and come back as they were given.
TEST_F(ShardedVariablesTest, AssignPutsWholeVariablesBackShardByShard) {
  std::vector<float> table;
  for (int i = 0; i < 20; ++i) table.push_back(static_cast<float>(100 - i));
  const std::vector<Tensor> values = {Tensor::FromVector<float>({10, 2}, table),
                                      Tensor::FromVector<float>({3}, {7, 8, 9})};
  ASSERT_OK(variables_->Assign(values));
  auto whole = variables_->Pull();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE((*whole)[0].BitwiseEqual(values[0]));
  EXPECT_TRUE((*whole)[1].BitwiseEqual(values[1]));
  EXPECT_FALSE(variables_->Assign({values[0]}).ok());  // one value for two variables
}

// A selection that is not sorted, unique and within the table is refused before anything
// travels (its rows would otherwise find no shard, or the wrong place).
TEST_F(ShardedVariablesTest, ASelectionOutOfOrderOrOutsideTheTableIsRefused) {
  const std::vector<int64_t> unsorted = {4, 1}, outside = {3, 10};
  EXPECT_THAT(std::string(variables_->Pull({&unsorted, nullptr}).status().message()),
              ::testing::HasSubstr("are not sorted, unique and within its 10 rows"));
  EXPECT_THAT(std::string(variables_
                              ->Push({Tensor::FromVector<float>({2, 2}, {1, 1, 1, 1}),
                                      Tensor::FromVector<float>({3}, {0, 0, 0})},
                                     nullptr, {&outside, nullptr})
                              .message()),
              ::testing::HasSubstr("(row 10 at position 1)"));
}

// The PS refuses rows outside a shard, naming it, before it changes anything.
TEST_F(ShardedVariablesTest, RowsOutsideAShardAreRefusedByTheParameterServer) {
  PsClient& ps1 = variables_->client(1);
  const absl::Status pull = ps1.Pull({}, {{"emb/part_1", {6}}}).status();
  EXPECT_THAT(std::string(pull.message()),
              ::testing::HasSubstr("row 6 of variable \"emb/part_1\" is out of range"));
  std::vector<Tensor> back;
  const absl::Status push =
      ps1.Push({{"emb/part_1", Tensor::FromVector<float>({1, 2}, {1, 1}), std::vector<int64_t>{0}}},
               &back, {{"emb/part_1", {0, 9}}});
  EXPECT_THAT(std::string(push.message()), ::testing::HasSubstr("row 9 of variable"));
  auto whole = variables_->Pull();
  ASSERT_OK(whole);
  EXPECT_TRUE((*whole)[0].BitwiseEqual(initial_[0]));
}

// A model's variables made by their PSs from fills (only the fills travel) equal, bit for
// bit, what Model::InitialVariables builds whole: a RandomUniform table split by rows over
// two PSs, a glorot_uniform kernel and a zero bias; a shard that would not fit the PS is
// refused by name.
TEST_F(ShardedVariablesTest, ShardsMadeByTheirPsFromFillsEqualTheVariablesBuiltWhole) {
  const absl::StatusOr<Model> model = Model::FromKerasJson(nlohmann::json::parse(R"({
      "class_name": "Sequential", "config": {"layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 3], "dtype": "int64"}},
        {"class_name": "Embedding", "config": {"name": "emb", "input_dim": 1001,
                                                "output_dim": 7}},
        {"class_name": "Flatten", "config": {}},
        {"class_name": "Dense", "config": {"name": "out", "units": 5}}]}})"));
  ASSERT_OK(model.status());
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<ShardSpec> shards;
  for (const VariableSpec& variable : model->variables()) {
    names.push_back(variable.name);
    shapes.push_back(variable.shape);
    std::vector<ShardSpec> split =
        ShardVariable(variable.name, variable.shape,
                      {.kind = PartitionerSpec::Kind::kFixedShards, .num_shards = 3});
    for (ShardSpec& shard : split) {
      shard.ps_task = shard.shard_index % 2;
      shards.push_back(std::move(shard));
    }
  }
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int task = 0; task < 2; ++task) {
    clients.push_back(std::make_unique<PsClient>(absl::StrCat("ps:", task),
                                                 servers_[task]->address(),
                                                 PsClientOptions{.timeout = absl::Seconds(5)}));
  }
  ShardedVariables filled(names, shapes, shards, std::move(clients));
  const std::vector<nlohmann::json> rules(names.size(), kSgd);
  ASSERT_OK(filled.Create(model->InitialFills(7), rules));
  const absl::StatusOr<std::vector<Tensor>> pulled = filled.Pull();
  ASSERT_OK(pulled.status());
  const std::vector<Tensor> whole = model->InitialVariables(7);
  ASSERT_EQ(pulled->size(), whole.size());
  for (size_t v = 0; v < whole.size(); ++v) {
    EXPECT_TRUE((*pulled)[v].BitwiseEqual(whole[v])) << names[v];
  }
  EXPECT_NE(whole[0].data<float>()[0], 0.0f);  // drawn, not zeros

  // A shard of 2^38 floats (1 TiB): refused before anything is allocated.
  std::vector<std::unique_ptr<PsClient>> one;
  one.push_back(std::make_unique<PsClient>("ps:0", servers_[0]->address(),
                                           PsClientOptions{.timeout = absl::Seconds(5)}));
  ShardedVariables huge(
      {"huge"}, {Shape({int64_t{1} << 32, 64})},
      {{.name = "huge", .variable = "huge", .shape = Shape({int64_t{1} << 32, 64})}},
      std::move(one));
  const absl::Status refused =
      huge.Create(std::vector<InitialFill>{{.kind = InitialFill::Kind::kOnes}}, {kSgd});
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("this parameter server may still allocate: give the job more "
                                   "ps tasks"));
}

// A table larger than one message carries (three 96 MiB shards on one PS, 288 MiB, over
// gRPC's 256 MiB) is created and pulled whole in several requests, and comes back as it
// went.
TEST(ShardedVariablesLargeTest, ATableLargerThanARequestTravelsInSeveralAndComesBackWhole) {
  absl::StatusOr<std::unique_ptr<InProcessPs>> ps = InProcessPs::Start();
  ASSERT_TRUE(ps.ok()) << ps.status();
  const int64_t rows = 3 * (24 << 20) / 4, width = 4;  // 3 x 96 MiB
  std::vector<ShardSpec> shards;
  for (int i = 0; i < 3; ++i) {
    shards.push_back({.name = absl::StrCat("big/part_", i),
                      .variable = "big",
                      .shard_index = i,
                      .num_shards = 3,
                      .first_row = i * rows / 3,
                      .shape = Shape({rows / 3, width}),
                      .ps_task = 0});
  }
  std::vector<std::unique_ptr<PsClient>> clients;
  clients.push_back(std::make_unique<PsClient>("ps:0", (*ps)->address(),
                                               PsClientOptions{.timeout = absl::Seconds(30)}));
  ShardedVariables variables({"big"}, {Shape({rows, width})}, std::move(shards),
                             std::move(clients));
  Tensor initial(DType::kFloat32, Shape({rows, width}));
  for (int64_t i = 0; i < initial.num_elements(); ++i) {
    initial.data<float>()[i] = static_cast<float>(i % 1000);
  }
  ASSERT_OK(variables.Create({initial}, std::vector<nlohmann::json>{kSgd}));
  auto pulled = variables.Pull();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE((*pulled)[0].BitwiseEqual(initial));
}

// One shard larger than a message (288 MiB, as the tutorial's partitioner makes of a large
// table on few parameter servers): pulled whole, read by a selection of rows larger than a
// request, and assigned whole, each in pieces of rows that fit a message.
TEST(ShardedVariablesLargeTest, AShardLargerThanAMessageTravelsInPiecesOfRows) {
  absl::StatusOr<std::unique_ptr<InProcessPs>> ps = InProcessPs::Start();
  ASSERT_TRUE(ps.ok()) << ps.status();
  const int64_t rows = 9 << 20, width = 8;  // 288 MiB
  const Shape shape({rows, width});
  std::vector<std::unique_ptr<PsClient>> clients;
  clients.push_back(std::make_unique<PsClient>("ps:0", (*ps)->address(),
                                               PsClientOptions{.timeout = absl::Seconds(60)}));
  ShardedVariables variables({"table"}, {shape},
                             {{.name = "table", .variable = "table", .shape = shape}},
                             std::move(clients));
  const InitialFill fill = {
      .kind = InitialFill::Kind::kUniform, .low = -1, .span = 2, .stream_seed = 5, .counter = true};
  ASSERT_OK(variables.Create(std::vector<InitialFill>{fill}, {kSgd}));
  Tensor expected(DType::kFloat32, shape);
  FillInitialValues(fill, 0, expected.num_elements(), expected.data<float>());

  absl::StatusOr<std::vector<Tensor>> whole = variables.Pull();
  ASSERT_OK(whole.status());
  EXPECT_TRUE((*whole)[0].BitwiseEqual(expected));

  std::vector<int64_t> odd;  // 144 MiB of rows
  for (int64_t row = 1; row < rows; row += 2) odd.push_back(row);
  absl::StatusOr<std::vector<Tensor>> selected = variables.Pull({&odd});
  ASSERT_OK(selected.status());
  ASSERT_EQ((*selected)[0].shape(), Shape({rows / 2, width}));
  bool same = true;
  for (size_t i = 0; i < odd.size() && same; ++i) {
    same = std::equal(expected.data<float>() + odd[i] * width,
                      expected.data<float>() + (odd[i] + 1) * width,
                      (*selected)[0].data<float>() + static_cast<int64_t>(i) * width);
  }
  EXPECT_TRUE(same);

  for (int64_t i = 0; i < expected.num_elements(); ++i) {
    expected.data<float>()[i] = static_cast<float>(i % 1001);
  }
  ASSERT_OK(variables.Assign({expected}));
  whole = variables.Pull();
  ASSERT_OK(whole.status());
  EXPECT_TRUE((*whole)[0].BitwiseEqual(expected));
}

}  // namespace
}  // namespace stratum
