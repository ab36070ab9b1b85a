#include "stratum/data/input_context.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "idx_writer.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::stratum::testing::TempDir;
using ::stratum::testing::UbyteIdx;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::stratum::testing::Message;
using ::stratum::testing::Range;

// Every value of component `c` of every element, flattened, for int32 or uint8 data.
std::vector<int> Values(const Dataset& dataset, size_t c = 0) {
  std::vector<int> out;
  std::unique_ptr<Iterator> it = dataset.MakeIterator();
  while (true) {
    absl::StatusOr<std::optional<Element>> next = it->GetNext();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    const Tensor& t = (**next)[c];
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      out.push_back(t.dtype() == DType::kInt32 ? t.data<int32_t>()[i] : t.data<uint8_t>()[i]);
    }
  }
  return out;
}

TEST(InputContextTest, PerReplicaBatchSize) {
  InputContext context{.num_input_pipelines = 2, .input_pipeline_id = 1, .num_replicas_in_sync = 4};
  EXPECT_EQ(*context.GetPerReplicaBatchSize(128), 32);
  absl::StatusOr<int64_t> bad = context.GetPerReplicaBatchSize(130);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(bad.status()),
            "global batch size 130 does not divide evenly over 4 replicas in sync: use a "
            "multiple of 4, e.g. 128");
  EXPECT_THAT(Message(context.GetPerReplicaBatchSize(3).status()), HasSubstr("e.g. 4"));
  EXPECT_FALSE(context.GetPerReplicaBatchSize(0).ok());
  EXPECT_EQ(*InputContext{}.GetPerReplicaBatchSize(64), 64);
}

TEST(InputContextTest, PolicyNames) {
  EXPECT_EQ(*AutoShardPolicyFromName("OFF"), AutoShardPolicy::kOff);
  EXPECT_EQ(*AutoShardPolicyFromName("AUTO"), AutoShardPolicy::kAuto);
  EXPECT_EQ(*AutoShardPolicyFromName("FILE"), AutoShardPolicy::kFile);
  EXPECT_EQ(*AutoShardPolicyFromName("data"), AutoShardPolicy::kData);
  absl::StatusOr<AutoShardPolicy> bad = AutoShardPolicyFromName("HINT");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(Message(bad.status()),
            "unknown auto-shard policy \"HINT\": use OFF, AUTO, FILE or DATA");
  EXPECT_STREQ(AutoShardPolicyName(AutoShardPolicy::kFile), "FILE");
}

TEST(InputContextTest, DataShardsAtTheSourceSoBatchesStayFull) {
  Dataset ds = Dataset::FromTensorSlices({Range(20)}).Shuffle(20, 3).Batch(5);
  std::vector<int> all;
  for (int worker = 0; worker < 2; ++worker) {
    absl::StatusOr<Dataset> shard = AutoShard(ds, AutoShardPolicy::kData, 2, worker);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->DebugString(), absl::StrCat("FromTensorSlices(20) -> Shard(2, ", worker,
                                                 ") -> Shuffle(20, seed 3) -> Batch(5)"));
    EXPECT_EQ(*shard->Cardinality(), 2);  // two full batches of 5, not 2 + 2 partial ones
    std::vector<int> values = Values(*shard);
    ASSERT_EQ(values.size(), 10u);
    for (int v : values) EXPECT_EQ(v % 2, worker) << "worker " << worker << " got " << v;
    all.insert(all.end(), values.begin(), values.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int> expected(20);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(all, expected);
  // The original pipeline is unchanged.
  EXPECT_EQ(ds.DebugString(), "FromTensorSlices(20) -> Shuffle(20, seed 3) -> Batch(5)");
}

TEST(InputContextTest, OffAndOneWorkerLeaveTheDatasetAlone) {
  Dataset ds = Dataset::FromTensorSlices({Range(6)}).Batch(2);
  EXPECT_EQ(AutoShard(ds, AutoShardPolicy::kOff, 3, 2)->DebugString(), ds.DebugString());
  EXPECT_EQ(AutoShard(ds, AutoShardPolicy::kData, 1, 0)->DebugString(), ds.DebugString());
  EXPECT_EQ(Values(*AutoShard(ds, AutoShardPolicy::kOff, 3, 2)).size(), 6u);
}

TEST(InputContextTest, FileAndAutoOnInMemoryData) {
  Dataset ds = Dataset::FromTensorSlices({Range(8)}).Batch(2);
  absl::StatusOr<Dataset> file = AutoShard(ds, AutoShardPolicy::kFile, 2, 0);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(Message(file.status()), AllOf(HasSubstr("reads no files"),
                                            HasSubstr("FromTensorSlices(8)"), HasSubstr("DATA")));
  absl::StatusOr<Dataset> automatic = AutoShard(ds, AutoShardPolicy::kAuto, 2, 1);
  ASSERT_OK(automatic);
  EXPECT_THAT(Values(*automatic), ElementsAre(1, 3, 5, 7));
}

TEST(InputContextTest, FileShardsSplitTheFilesOverWorkers) {
  TempDir dir;
  std::vector<std::pair<std::string, std::string>> pairs;
  for (int f = 0; f < 3; ++f) {
    pairs.emplace_back(
        dir.Write(absl::StrCat("img", f), UbyteIdx({2, 1}, {static_cast<uint8_t>(f), 0})),
        dir.Write(absl::StrCat("lbl", f),
                  UbyteIdx({2}, {static_cast<uint8_t>(10 * f), static_cast<uint8_t>(10 * f + 1)})));
  }
  Dataset ds = Dataset::FromIdxFiles(pairs).Shuffle(1, 1).Batch(1);

  absl::StatusOr<Dataset> w0 = AutoShard(ds, AutoShardPolicy::kFile, 2, 0);
  absl::StatusOr<Dataset> w1 = AutoShard(ds, AutoShardPolicy::kFile, 2, 1);
  ASSERT_OK(w0);
  ASSERT_OK(w1);
  EXPECT_THAT(w0->source_files(),
              ElementsAre(pairs[0].first, pairs[0].second, pairs[2].first, pairs[2].second));
  EXPECT_THAT(w1->source_files(), ElementsAre(pairs[1].first, pairs[1].second));
  EXPECT_THAT(Values(*w0, 1), ElementsAre(0, 1, 20, 21));
  EXPECT_THAT(Values(*w1, 1), ElementsAre(10, 11));
  EXPECT_EQ(w1->DebugString(), "FromIdxFiles(1 file pairs) -> Shuffle(1, seed 1) -> Batch(1)");

  // AUTO picks FILE with enough files, DATA with too few.
  EXPECT_EQ(AutoShard(ds, AutoShardPolicy::kAuto, 3, 2)->source_files(),
            std::vector<std::string>({pairs[2].first, pairs[2].second}));
  absl::StatusOr<Dataset> data = AutoShard(ds, AutoShardPolicy::kAuto, 4, 1);
  ASSERT_OK(data);
  EXPECT_THAT(data->DebugString(), HasSubstr("FromIdxFiles(3 file pairs) -> Shard(4, 1)"));
  EXPECT_THAT(Values(*data, 1), ElementsAre(1, 21));  // elements 1 and 5 of 6

  absl::StatusOr<Dataset> too_few = AutoShard(ds, AutoShardPolicy::kFile, 4, 0);
  ASSERT_FALSE(too_few.ok());
  EXPECT_THAT(Message(too_few.status()),
              AllOf(HasSubstr("reads 3 file units"), HasSubstr("4 workers"), HasSubstr("DATA")));
}

TEST(InputContextTest, AutoShardValidatesWorkers) {
  Dataset ds = Dataset::FromTensorSlices({Range(4)});
  EXPECT_EQ(Message(AutoShard(ds, AutoShardPolicy::kData, 2, 2).status()),
            "AutoShard: worker_index 2 is out of range for 2 workers: use 0..1");
  EXPECT_FALSE(AutoShard(ds, AutoShardPolicy::kData, 0, 0).ok());
  EXPECT_FALSE(AutoShard(ds.Shard(2, 5), AutoShardPolicy::kOff, 1, 0).ok());
}

TEST(InputContextTest, SplitBatchSharesTheBuffer) {
  Tensor x = Tensor::FromVector<float>({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor y = Tensor::FromVector<int32_t>({4}, {10, 11, 12, 13});
  absl::StatusOr<std::vector<Element>> parts = SplitBatch({x, y}, 2);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[1][0].shape(), Shape({2, 2}));
  EXPECT_EQ((*parts)[1][0].data<float>()[0], 4);
  EXPECT_EQ((*parts)[1][1].data<int32_t>()[1], 13);
  EXPECT_EQ((*parts)[1][0].raw_data(), x.data<float>() + 4);

  absl::StatusOr<std::vector<Element>> uneven = SplitBatch({Range(10)}, 4);
  ASSERT_FALSE(uneven.ok());
  EXPECT_THAT(Message(uneven.status()), AllOf(HasSubstr("component 0 int32[10] has 10 rows"),
                                              HasSubstr("4 replicas"), HasSubstr("multiple of 4")));
  EXPECT_THAT(Message(SplitBatch({Tensor::Scalar(1)}, 2).status()), HasSubstr("no batch axis"));
  EXPECT_FALSE(SplitBatch({x}, 0).ok());
}

}  // namespace
}  // namespace stratum
