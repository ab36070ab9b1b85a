#include "stratum/ps/placement.h"
#include "stratum/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum {
namespace {

using ::testing::HasSubstr;
using Kind = PartitionerSpec::Kind;

TEST(PartitionerTest, FixedShardsIsCappedByRows) {
  PartitionerSpec fixed{.kind = Kind::kFixedShards, .num_shards = 4};
  EXPECT_EQ(NumShards(fixed, {10, 3}), 4);
  EXPECT_EQ(NumShards(fixed, {3, 3}), 3);
  EXPECT_EQ(NumShards(fixed, {}), 1);
}

TEST(PartitionerTest, MinSizeFollowsTensorFlow) {
  // 1000 x 128 float32 = 512,000 bytes; 256 KiB slices -> ceil(1.95) = 2, capped by max_shards.
  PartitionerSpec min_size{.kind = Kind::kMinSize, .min_shard_bytes = 262144, .max_shards = 4};
  EXPECT_EQ(NumShards(min_size, {1000, 128}), 2);
  min_size.max_shards = 1;  // TF's default
  EXPECT_EQ(NumShards(min_size, {1000, 128}), 1);
  min_size.max_shards = 100;
  min_size.min_shard_bytes = 100;               // 3,584 bytes want 36 shards
  EXPECT_EQ(NumShards(min_size, {7, 128}), 7);  // never more shards than rows
}

TEST(PartitionerTest, MaxSizeFollowsTensorFlow) {
  // 100 rows of 40 bytes; 250 bytes per shard -> 6 rows per shard -> 17 shards.
  PartitionerSpec max_size{.kind = Kind::kMaxSize, .max_shard_bytes = 250};
  EXPECT_EQ(NumShards(max_size, {100, 10}), 17);
  max_size.max_shards = 5;
  EXPECT_EQ(NumShards(max_size, {100, 10}), 5);
  max_size.max_shards = 0;
  max_size.max_shard_bytes = 1;  // at least one row per shard
  EXPECT_EQ(NumShards(max_size, {100, 10}), 100);
}

TEST(PartitionerTest, RowsSplitLikeDivAndShardsAreNamedPartI) {
  auto shards = ShardVariable("emb", {10, 2}, {.kind = Kind::kFixedShards, .num_shards = 3});
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards[0].name, "emb/part_0");
  EXPECT_EQ(shards[2].name, "emb/part_2");
  EXPECT_EQ(shards[0].shape, Shape({4, 2}));
  EXPECT_EQ(shards[1].shape, Shape({3, 2}));
  EXPECT_EQ(shards[2].first_row, 7);
  EXPECT_EQ(shards[0].bytes, 32);
  auto whole = ShardVariable("bias", {10}, {});
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].name, "bias");
}

TEST(PartitionerTest, ParsesTheJobsPartitionerAndRefusesNonsense) {
  auto spec = PartitionerFromJson(
      nlohmann::json::parse(R"({"type": "min_size", "min_shard_bytes": 1024, "max_shards": 4})"));
  ASSERT_OK(spec);
  EXPECT_EQ(spec->kind, Kind::kMinSize);
  EXPECT_EQ(spec->max_shards, 4);
  EXPECT_EQ(PartitionerFromJson(nullptr)->kind, Kind::kNone);
  EXPECT_THAT(
      std::string(
          PartitionerFromJson(nlohmann::json::parse(R"({"type": "hash"})")).status().message()),
      HasSubstr("type is \"hash\""));
  EXPECT_THAT(std::string(PartitionerFromJson(
                              nlohmann::json::parse(R"({"type": "fixed_shards", "num_shards": 0})"))
                              .status()
                              .message()),
              HasSubstr("num_shards is 0"));
  EXPECT_FALSE(
      PartitionerFromJson(nlohmann::json::parse(R"({"type": "fixed_shards", "shards": 2})")).ok());
  // max_size's max_shards 0 (as the docs write it), null or left out: no limit, as
  // TensorFlow's max_shards=None; a negative count is refused.
  for (const char* text : {R"({"type": "max_size", "max_shard_bytes": 64, "max_shards": 0})",
                           R"({"type": "max_size", "max_shard_bytes": 64, "max_shards": null})",
                           R"({"type": "max_size", "max_shard_bytes": 64})"}) {
    auto unlimited = PartitionerFromJson(nlohmann::json::parse(text));
    ASSERT_OK(unlimited);
    EXPECT_EQ(unlimited->max_shards, 0) << text;
  }
  EXPECT_FALSE(
      PartitionerFromJson(
          nlohmann::json::parse(R"({"type": "max_size", "max_shard_bytes": 64, "max_shards": -1})"))
          .ok());
}

TEST(PlacementTest, RoundRobinIsTensorFlowsOrder) {
  std::vector<ShardSpec> shards(5);
  ASSERT_OK(PlaceShards(shards, 2, PlacementPolicy::kRoundRobin));
  EXPECT_EQ(shards[0].ps_task, 0);
  EXPECT_EQ(shards[1].ps_task, 1);
  EXPECT_EQ(shards[4].ps_task, 0);
}

TEST(PlacementTest, BalancedBytesEvensOutWhatRoundRobinDoesNot) {
  // The reference model: kernel 401,408 B, bias 512 B, kernel 5,120 B, bias 40 B.
  std::vector<ShardSpec> shards;
  for (const auto& [name, shape] :
       std::vector<std::pair<std::string, Shape>>{{"dense/kernel", {784, 128}},
                                                  {"dense/bias", {128}},
                                                  {"dense_1/kernel", {128, 10}},
                                                  {"dense_1/bias", {10}}}) {
    for (ShardSpec& shard :
         ShardVariable(name, shape, {.kind = Kind::kFixedShards, .num_shards = 2})) {
      shards.push_back(shard);
    }
  }
  auto load = [&](const std::vector<ShardSpec>& placed) {
    std::vector<int64_t> bytes(2, 0);
    for (const ShardSpec& s : placed) bytes[s.ps_task] += s.bytes;
    return bytes;
  };
  std::vector<ShardSpec> round_robin = shards, balanced = shards;
  ASSERT_OK(PlaceShards(round_robin, 2, PlacementPolicy::kRoundRobin));
  ASSERT_OK(PlaceShards(balanced, 2, PlacementPolicy::kBalancedBytes));
  const auto rr = load(round_robin), bb = load(balanced);
  EXPECT_LE(std::abs(bb[0] - bb[1]), std::abs(rr[0] - rr[1]));
  EXPECT_LE(std::abs(bb[0] - bb[1]), 2560);  // within the largest small shard
  EXPECT_FALSE(PlaceShards(shards, 0, PlacementPolicy::kBalancedBytes).ok());
}

}  // namespace
}  // namespace stratum
