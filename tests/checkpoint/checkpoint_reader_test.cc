// ReadLatestCheckpoint on a PS job's checkpoint whose manifest places shards: whole
// variables put back together, and a manifest that places them anywhere but exactly
// tiling their variable (a damaged or forged one) refused as DATA_LOSS, never a write
// past the variable or an allocation the files' bytes do not justify.
#include "stratum/checkpoint/checkpoint_reader.h"

#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

class CheckpointReaderTest : public ::testing::Test {
 protected:
  // Writes ckpt-000000000007 with one PS file holding `tensors` and a manifest placing
  // `shards` ({variable, shard, first_row}), and points the folder's pointer at it.
  void Write(const std::vector<std::pair<std::string, Tensor>>& tensors,
             const nlohmann::json& shards) {
    const std::string folder = dir_ + "/ckpt-000000000007";
    std::filesystem::create_directories(folder);
    TensorFile file;
    file.tensors = tensors;
    absl::StatusOr<WrittenFile> written = WriteSafetensors(folder + "/ps-0.safetensors", file);
    ASSERT_OK(written.status());
    const nlohmann::json manifest = {
        {"step", 7},
        {"format", "stratum-checkpoint-1"},
        {"files", {{{"file", "ps-0.safetensors"}, {"crc32", written->crc32}}}},
        {"shards", shards}};
    ASSERT_OK(WriteFileAtomically(folder + "/manifest.json", manifest.dump()));
    ASSERT_OK(
        WriteFileAtomically(dir_ + "/checkpoint", R"({"latest": "ckpt-000000000007", "step": 7})"));
  }

  absl::Status Read() { return ReadLatestCheckpoint(dir_).status(); }

  const std::string dir_ = ::testing::TempDir() + "/checkpoint_reader_test";
};

Tensor Rows(int64_t rows, float first) {
  std::vector<float> values;
  for (int64_t i = 0; i < rows * 2; ++i) values.push_back(first + static_cast<float>(i));
  return Tensor::FromVector<float>({rows, 2}, values);
}

TEST_F(CheckpointReaderTest, JoinsShardsIntoWholeVariables) {
  Write({{"w/part_0", Rows(2, 0)},
         {"w/part_1", Rows(1, 4)},
         {"b", Tensor::FromVector<float>({}, {3})}},
        {{{"variable", "w"}, {"shard", "w/part_0"}, {"first_row", 0}},
         {{"variable", "w"}, {"shard", "w/part_1"}, {"first_row", 2}},
         {{"variable", "b"}, {"shard", "b"}, {"first_row", 0}}});
  absl::StatusOr<CheckpointVariables> read = ReadLatestCheckpoint(dir_);
  ASSERT_OK(read.status());
  EXPECT_EQ(read->step, 7);
  EXPECT_TRUE(read->variables.at("w").BitwiseEqual(Rows(3, 0)));
  EXPECT_TRUE(read->variables.at("b").BitwiseEqual(Tensor::FromVector<float>({}, {3})));
}

TEST_F(CheckpointReaderTest, RefusesAShardThatIsNotFloat32) {
  Write({{"w", Tensor::FromVector<int64_t>({2, 2}, {1, 2, 3, 4})}},
        {{{"variable", "w"}, {"shard", "w"}, {"first_row", 0}}});
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("int64")));
  Write({{"b", Tensor::FromVector<int64_t>({}, {7})}},
        {{{"variable", "b"}, {"shard", "b"}, {"first_row", 0}}});
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("int64")));
}

TEST_F(CheckpointReaderTest, RefusesShardsThatDoNotTileTheirVariable) {
  // Far beyond the rows the files hold (once an overflow, then a huge allocation).
  Write({{"w", Rows(2, 0)}},
        {{{"variable", "w"}, {"shard", "w"}, {"first_row", int64_t{1} << 62}}});
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rows")));
  // A gap (rows 2 and 3 would read as zeros) and an overlap.
  Write({{"w/part_0", Rows(2, 0)}, {"w/part_1", Rows(1, 4)}},
        {{{"variable", "w"}, {"shard", "w/part_0"}, {"first_row", 0}},
         {{"variable", "w"}, {"shard", "w/part_1"}, {"first_row", 4}}});
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rows")));
  Write({{"w/part_0", Rows(2, 0)}, {"w/part_1", Rows(2, 4)}},
        {{{"variable", "w"}, {"shard", "w/part_0"}, {"first_row", 0}},
         {{"variable", "w"}, {"shard", "w/part_1"}, {"first_row", 1}}});
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rows")));
}

}  // namespace
}  // namespace stratum
