#include "stratum/data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <stdexcept>

#include "absl/synchronization/notification.h"
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

// All elements of one epoch; fails the test on an error.
std::vector<Element> Collect(const Dataset& dataset) {
  std::vector<Element> out;
  std::unique_ptr<Iterator> it = dataset.MakeIterator();
  while (true) {
    absl::StatusOr<std::optional<Element>> next = it->GetNext();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    out.push_back(std::move(**next));
  }
  return out;
}

// The first int32 value of component 0 of each element.
std::vector<int32_t> Values(const Dataset& dataset) {
  std::vector<int32_t> out;
  for (const Element& e : Collect(dataset)) out.push_back(e[0].data<int32_t>()[0]);
  return out;
}

std::vector<int32_t> Iota(int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(DatasetTest, FromTensorSlicesYieldsRowsSharingTheBuffer) {
  Tensor images = Tensor::FromVector<float>({3, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor labels = Tensor::FromVector<int32_t>({3}, {7, 8, 9});
  std::vector<Element> elements = Collect(Dataset::FromTensorSlices({images, labels}));
  ASSERT_EQ(elements.size(), 3u);
  EXPECT_EQ(elements[1][0].shape(), Shape({2, 2}));
  EXPECT_EQ(elements[1][1].shape(), Shape());
  EXPECT_EQ(elements[1][0].data<float>()[0], 4);
  EXPECT_EQ(elements[2][1].data<int32_t>()[0], 9);
  EXPECT_EQ(elements[1][0].raw_data(), images.data<float>() + 4);
}

TEST(DatasetTest, FromTensorSlicesRefusesDifferentRowCounts) {
  Dataset ds = Dataset::FromTensorSlices({Range(5), Range(4)});
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(ds.status()),
              AllOf(HasSubstr("FromTensorSlices"), HasSubstr("component 1 int32[4] has 4 rows"),
                    HasSubstr("has 5"), HasSubstr("same size along axis 0")));
  // The error travels through later operations, Cardinality and iterators.
  Dataset batched = ds.Shuffle(4, 1).Batch(2);
  EXPECT_EQ(batched.status(), ds.status());
  EXPECT_EQ(batched.Cardinality().status(), ds.status());
  std::unique_ptr<Iterator> it = batched.MakeIterator();
  EXPECT_EQ(it->GetNext().status(), ds.status());
  EXPECT_EQ(it->GetNext().status(), ds.status());
}

TEST(DatasetTest, FromTensorSlicesRefusesScalarsAndEmptyElements) {
  EXPECT_THAT(Message(Dataset::FromTensorSlices({Tensor::Scalar(1)}).status()),
              AllOf(HasSubstr("scalar"), HasSubstr("FromTensors")));
  EXPECT_THAT(Message(Dataset::FromTensorSlices({}).status()), HasSubstr("no components"));
  EXPECT_THAT(Message(Dataset::FromTensorSlices({Tensor()}).status()),
              HasSubstr("component 0 is an empty"));
  EXPECT_THAT(Message(Dataset().status()), HasSubstr("default-constructed"));
}

TEST(DatasetTest, FromTensorsIsOneElement) {
  Dataset ds = Dataset::FromTensors({Range(4), Tensor::Scalar(2)});
  std::vector<Element> elements = Collect(ds);
  ASSERT_EQ(elements.size(), 1u);
  EXPECT_EQ(elements[0][0].shape(), Shape({4}));
  EXPECT_EQ(elements[0][1].data<float>()[0], 2);
  EXPECT_EQ(*ds.Cardinality(), 1);
}

TEST(DatasetTest, MapTransformsAndReportsErrorsWithTheElementIndex) {
  Dataset ds = Dataset::FromTensorSlices({Range(5)}).Map([](Element e) -> absl::StatusOr<Element> {
    const int32_t v = e[0].data<int32_t>()[0];
    if (v == 3) return absl::OutOfRangeError("three is not allowed");
    return Element{Tensor::FromVector<int32_t>({}, {v * 10})};
  });
  std::unique_ptr<Iterator> it = ds.MakeIterator();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::optional<Element>> next = it->GetNext();
    ASSERT_TRUE(next.ok() && next->has_value());
    EXPECT_EQ((**next)[0].data<int32_t>()[0], i * 10);
  }
  absl::StatusOr<std::optional<Element>> error = it->GetNext();
  EXPECT_EQ(error.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(Message(error.status()),
              AllOf(HasSubstr("element 3"), HasSubstr("three is not allowed")));
  // Finished after an error: the same error again, element 4 is never produced.
  EXPECT_EQ(it->GetNext().status(), error.status());
  EXPECT_FALSE(Dataset::FromTensorSlices({Range(2)}).Map(nullptr).status().ok());
}

TEST(DatasetTest, BatchStacksAndKeepsOrDropsTheRemainder) {
  Tensor x = Tensor::FromVector<float>({5, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  Dataset base = Dataset::FromTensorSlices({x, Range(5)});
  std::vector<Element> batches = Collect(base.Batch(2));
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0][0].shape(), Shape({2, 2}));
  EXPECT_EQ(batches[0][1].shape(), Shape({2}));
  EXPECT_EQ(batches[1][0].data<float>()[3], 7);
  EXPECT_EQ(batches[1][1].data<int32_t>()[1], 3);
  EXPECT_EQ(batches[2][0].shape(), Shape({1, 2}));
  EXPECT_EQ(batches[2][0].data<float>()[1], 9);
  EXPECT_EQ(*base.Batch(2).Cardinality(), 3);

  std::vector<Element> dropped = Collect(base.Batch(2, /*drop_remainder=*/true));
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(*base.Batch(2, true).Cardinality(), 2);
  EXPECT_EQ(Collect(base.Batch(8, true)).size(), 0u);
  EXPECT_EQ(Collect(base.Batch(8))[0][0].shape(), Shape({5, 2}));
  // Batch copies: the batch does not alias the source.
  EXPECT_NE(batches[0][0].raw_data(), x.raw_data());
  EXPECT_THAT(Message(base.Batch(0).status()), HasSubstr("batch_size 0 is not positive"));
}

TEST(DatasetTest, BatchRefusesDifferentShapes) {
  Dataset ds = Dataset::FromTensorSlices({Range(4)}).Map([](Element e) -> absl::StatusOr<Element> {
    const int32_t v = e[0].data<int32_t>()[0];
    return Element{Tensor(DType::kFloat32, Shape({v == 2 ? 3 : 2}))};
  });
  std::unique_ptr<Iterator> it = ds.Batch(4).MakeIterator();
  absl::StatusOr<std::optional<Element>> next = it->GetNext();
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(Message(next.status()),
              AllOf(HasSubstr("element 2 of batch 0"), HasSubstr("float32[3]"),
                    HasSubstr("started with float32[2]"), HasSubstr("identical shapes")));
}

// A batch_size far above the data allocates only the rows it gathers.
TEST(DatasetTest, HugeBatchSizeAllocatesOnlyTheRowsItGathers) {
  Tensor images(DType::kUInt8, Shape({60000, 784}));
  images.data<uint8_t>()[59999 * 784] = 7;
  Dataset ds = Dataset::FromTensorSlices({images}).Batch(100000000).Prefetch(2);
  std::vector<Element> batches = Collect(ds);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0][0].shape(), Shape({60000, 784}));
  EXPECT_EQ(batches[0][0].data<uint8_t>()[59999 * 784], 7);
  EXPECT_EQ(*Dataset::FromTensorSlices({images}).Batch(100000000).Cardinality(), 1);
  EXPECT_EQ(*Dataset::FromTensorSlices({images}).Batch(INT64_MAX).Cardinality(), 1);
  EXPECT_EQ(Collect(Dataset::FromTensorSlices({images}).Batch(INT64_MAX)).size(), 1u);
}

// A batch that would exceed the cap is an error naming the batch size, not bad_alloc.
TEST(DatasetTest, BatchOverTheSizeCapIsAnError) {
  Tensor big(DType::kUInt8, Shape({int64_t{1} << 28}));  // 256 MiB, shared by every element
  Dataset ds = Dataset::FromTensors({big}).Repeat().Batch(40).Prefetch(1);
  std::unique_ptr<Iterator> it = ds.MakeIterator();
  absl::StatusOr<std::optional<Element>> next = it->GetNext();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(next.status()),
              AllOf(HasSubstr("batch_size 40"), HasSubstr("8 GiB"), HasSubstr("at most 32")));
}

TEST(DatasetTest, ShuffleIsAPermutationReproducibleFromTheSeed) {
  Dataset source = Dataset::FromTensorSlices({Range(100)});
  std::vector<int32_t> a = Values(source.Shuffle(100, 42));
  std::vector<int32_t> b = Values(source.Shuffle(100, 42));
  std::vector<int32_t> c = Values(source.Shuffle(100, 43));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, Iota(100));
  std::vector<int32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, Iota(100));
  // A buffer of 1 keeps the order.
  EXPECT_EQ(Values(source.Shuffle(1, 42)), Iota(100));
}

TEST(DatasetTest, ShuffleDrawsOnlyFromItsBuffer) {
  // With a buffer of b, output i is one of the input elements 0 .. i + b - 1.
  std::vector<int32_t> order = Values(Dataset::FromTensorSlices({Range(200)}).Shuffle(5, 7));
  ASSERT_EQ(order.size(), 200u);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_LT(order[i], static_cast<int32_t>(i + 5));
}

TEST(DatasetTest, ShuffleReshufflesEachEpochDeterministically) {
  Dataset ds = Dataset::FromTensorSlices({Range(50)}).Shuffle(50, 9);
  std::vector<int32_t> epoch0 = Values(ds);
  std::vector<int32_t> epoch1 = Values(ds);
  EXPECT_NE(epoch0, epoch1);
  // A pipeline built again from the same seed goes through the same epochs.
  Dataset again = Dataset::FromTensorSlices({Range(50)}).Shuffle(50, 9);
  EXPECT_EQ(Values(again), epoch0);
  EXPECT_EQ(Values(again), epoch1);
  // Without reshuffling every epoch has the first epoch's order.
  Dataset fixed = Dataset::FromTensorSlices({Range(50)}).Shuffle(50, 9, false);
  EXPECT_EQ(Values(fixed), epoch0);
  EXPECT_EQ(Values(fixed), epoch0);
  // Repeat after Shuffle reshuffles each repetition.
  std::vector<int32_t> repeated =
      Values(Dataset::FromTensorSlices({Range(50)}).Shuffle(50, 9).Repeat(2));
  ASSERT_EQ(repeated.size(), 100u);
  EXPECT_EQ(std::vector<int32_t>(repeated.begin(), repeated.begin() + 50), epoch0);
  EXPECT_EQ(std::vector<int32_t>(repeated.begin() + 50, repeated.end()), epoch1);
  EXPECT_FALSE(ds.Shuffle(0, 1).status().ok());
}

TEST(DatasetTest, RepeatCountsAndForever) {
  Dataset ds = Dataset::FromTensorSlices({Range(3)});
  EXPECT_THAT(Values(ds.Repeat(2)), ElementsAre(0, 1, 2, 0, 1, 2));
  EXPECT_TRUE(Values(ds.Repeat(0)).empty());
  EXPECT_THAT(Values(ds.Repeat().Take(7)), ElementsAre(0, 1, 2, 0, 1, 2, 0));
  EXPECT_EQ(*ds.Repeat(4).Cardinality(), 12);
  EXPECT_EQ(*ds.Repeat().Cardinality(), kInfiniteCardinality);
  EXPECT_EQ(*ds.Repeat().Take(7).Cardinality(), 7);
  // Forever over nothing ends instead of spinning.
  EXPECT_TRUE(Values(ds.Take(0).Repeat()).empty());
  EXPECT_FALSE(ds.Repeat(-2).status().ok());
}

TEST(DatasetTest, ShardKeepsEveryNthElementFromIndex) {
  Dataset ds = Dataset::FromTensorSlices({Range(10)});
  EXPECT_THAT(Values(ds.Shard(3, 0)), ElementsAre(0, 3, 6, 9));
  EXPECT_THAT(Values(ds.Shard(3, 1)), ElementsAre(1, 4, 7));
  EXPECT_THAT(Values(ds.Shard(3, 2)), ElementsAre(2, 5, 8));
  EXPECT_EQ(*ds.Shard(3, 0).Cardinality(), 4);
  EXPECT_EQ(*ds.Shard(3, 2).Cardinality(), 3);
  EXPECT_TRUE(Values(ds.Take(1).Shard(2, 1)).empty());
  Dataset bad = ds.Shard(2, 2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(bad.status()),
            "Dataset.Shard: index 2 is out of range for num_shards 2: use an index in 0..1");
  EXPECT_THAT(Message(ds.Shard(0, 0).status()), HasSubstr("num_shards 0 is not positive"));
  EXPECT_FALSE(ds.Shard(2, -1).status().ok());
}

TEST(DatasetTest, TakeLimits) {
  Dataset ds = Dataset::FromTensorSlices({Range(5)});
  EXPECT_THAT(Values(ds.Take(2)), ElementsAre(0, 1));
  EXPECT_TRUE(Values(ds.Take(0)).empty());
  EXPECT_EQ(Values(ds.Take(-1)).size(), 5u);
  EXPECT_EQ(Values(ds.Take(50)).size(), 5u);
  EXPECT_EQ(*ds.Take(50).Cardinality(), 5);
  EXPECT_FALSE(ds.Take(-3).status().ok());
}

TEST(DatasetTest, EachIteratorIsItsOwnEpoch) {
  Dataset ds = Dataset::FromTensorSlices({Range(4)});
  std::unique_ptr<Iterator> a = ds.MakeIterator();
  std::unique_ptr<Iterator> b = ds.MakeIterator();
  EXPECT_EQ((**a->GetNext())[0].data<int32_t>()[0], 0);
  EXPECT_EQ((**a->GetNext())[0].data<int32_t>()[0], 1);
  EXPECT_EQ((**b->GetNext())[0].data<int32_t>()[0], 0);
  // After the end, GetNext keeps returning nullopt.
  std::unique_ptr<Iterator> c = ds.Take(1).MakeIterator();
  EXPECT_TRUE(c->GetNext()->has_value());
  EXPECT_FALSE(c->GetNext()->has_value());
  EXPECT_FALSE(c->GetNext()->has_value());
}

TEST(DatasetTest, PrefetchKeepsOrderAndDeliversErrorsInOrder) {
  Dataset ds = Dataset::FromTensorSlices({Range(100)});
  EXPECT_EQ(Values(ds.Prefetch(3)), Iota(100));
  EXPECT_EQ(Values(ds.Prefetch(kAutotune).Batch(10).Prefetch(1)).size(), 10u);

  Dataset failing = ds.Map([](Element e) -> absl::StatusOr<Element> {
                        if (e[0].data<int32_t>()[0] == 5) return absl::DataLossError("bad row 5");
                        return e;
                      }).Prefetch(8);
  std::unique_ptr<Iterator> it = failing.MakeIterator();
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<std::optional<Element>> next = it->GetNext();
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ((**next)[0].data<int32_t>()[0], i);
  }
  EXPECT_EQ(it->GetNext().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(it->GetNext().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(ds.Prefetch(0).status().ok());
}

// An exception thrown upstream of Prefetch reaches the consumer as INTERNAL instead of
// terminating the process from the background thread.
TEST(DatasetTest, PrefetchDeliversUpstreamExceptionsAsInternal) {
  Dataset ds = Dataset::FromTensorSlices({Range(10)})
                   .Map([](Element e) -> absl::StatusOr<Element> {
                     if (e[0].data<int32_t>()[0] == 3) throw std::runtime_error("boom at 3");
                     return e;
                   })
                   .Prefetch(2);
  std::unique_ptr<Iterator> it = ds.MakeIterator();
  for (int i = 0; i < 3; ++i) ASSERT_OK(it->GetNext());
  absl::StatusOr<std::optional<Element>> next = it->GetNext();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Message(next.status()), AllOf(HasSubstr("Prefetch"), HasSubstr("boom at 3")));
  EXPECT_EQ(it->GetNext().status().code(), absl::StatusCode::kInternal);
}

TEST(DatasetTest, PrefetchStopsPromptlyWhenDestroyedEarly) {
  Dataset forever = Dataset::FromTensorSlices({Range(10)}).Repeat().Prefetch(4);
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 20; ++round) {
    std::unique_ptr<Iterator> it = forever.MakeIterator();
    for (int i = 0; i < round; ++i) ASSERT_TRUE(it->GetNext()->has_value());
  }  // destroyed with a full queue, a running producer, or never started
  // A slow upstream: the producer is inside the upstream call when the iterator goes. The
  // call for row 1 lasts until then, so the producer is provably in it.
  absl::Notification inside;  // the producer is in the upstream call for row 1
  absl::Notification going;   // the iterator is about to be destroyed
  std::atomic<int> calls_after_going{0};
  Dataset slow = Dataset::FromTensorSlices({Range(1000)})
                     .Map([&](Element e) -> absl::StatusOr<Element> {
                       if (going.HasBeenNotified()) {
                         ++calls_after_going;
                       } else if (e[0].data<int32_t>()[0] == 1) {
                         inside.Notify();
                         going.WaitForNotificationWithTimeout(absl::Seconds(10));
                       }
                       return e;
                     })
                     .Prefetch(2);
  {
    std::unique_ptr<Iterator> it = slow.MakeIterator();
    ASSERT_TRUE(it->GetNext()->has_value());
    EXPECT_TRUE(inside.WaitForNotificationWithTimeout(absl::Seconds(10)));
    going.Notify();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // The producer stopped, at most after filling the buffer, not after the 998 rows left.
  EXPECT_LE(calls_after_going, 2);
}

TEST(DatasetTest, CardinalityAndDebugString) {
  Dataset ds = Dataset::FromTensorSlices({Range(60)}).Shuffle(10, 1).Batch(8).Prefetch(2);
  EXPECT_EQ(*ds.Cardinality(), 8);
  EXPECT_EQ(ds.DebugString(),
            "FromTensorSlices(60) -> Shuffle(10, seed 1) -> Batch(8) -> Prefetch(2)");
  EXPECT_FALSE(ds.reads_files());
  EXPECT_TRUE(ds.source_files().empty());
}

TEST(DatasetTest, FromIdxFilesReadsPairsLazily) {
  TempDir dir;
  const std::pair<std::string, std::string> first = {
      dir.WriteGz("a-images.gz", UbyteIdx({2, 2, 2}, {1, 1, 1, 1, 2, 2, 2, 2})),
      dir.Write("a-labels", UbyteIdx({2}, {10, 20}))};
  const std::pair<std::string, std::string> second = {
      dir.Write("b-images", UbyteIdx({3, 2, 2}, std::vector<uint8_t>(12, 3))),
      dir.WriteGz("b-labels.gz", UbyteIdx({3}, {30, 40, 50}))};
  Dataset ds = Dataset::FromIdxFiles({first, second});
  EXPECT_TRUE(ds.reads_files());
  EXPECT_THAT(ds.source_files(),
              ElementsAre(first.first, first.second, second.first, second.second));
  EXPECT_EQ(*ds.Cardinality(), kUnknownCardinality);
  std::vector<Element> elements = Collect(ds);
  ASSERT_EQ(elements.size(), 5u);
  EXPECT_EQ(elements[0][0].shape(), Shape({2, 2}));
  EXPECT_EQ(elements[0][1].shape(), Shape());
  std::vector<int> labels;
  for (const Element& e : elements) labels.push_back(e[1].data<uint8_t>()[0]);
  EXPECT_THAT(labels, ElementsAre(10, 20, 30, 40, 50));
  EXPECT_EQ(elements[1][0].data<uint8_t>()[3], 2);
  EXPECT_EQ(Collect(ds.Batch(5))[0][0].shape(), Shape({5, 2, 2}));

  // A missing file surfaces when the iterator reaches it, after the first pair's rows.
  Dataset missing = Dataset::FromIdxFiles({first, {dir.path() + "/nope", second.second}});
  std::unique_ptr<Iterator> it = missing.MakeIterator();
  EXPECT_TRUE(it->GetNext()->has_value());
  EXPECT_TRUE(it->GetNext()->has_value());
  EXPECT_EQ(it->GetNext().status().code(), absl::StatusCode::kNotFound);

  std::unique_ptr<Iterator> mismatched =
      Dataset::FromIdxFiles({{first.first, second.second}}).MakeIterator();
  absl::StatusOr<std::optional<Element>> next = mismatched->GetNext();
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(Message(next.status()), AllOf(HasSubstr(first.first), HasSubstr(second.second),
                                            HasSubstr("[2, 2, 2]"), HasSubstr("[3]")));
  EXPECT_FALSE(Dataset::FromIdxFiles({}).status().ok());
}

}  // namespace
}  // namespace stratum
