#include "stratum/tensor/tensor.h"

#include <sys/resource.h>

#include <cmath>

#include "stratum/tensor/gather_rows.h"
#include "stratum/tensor/tensor_proto.h"
#include "stratum/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum {
namespace {

TEST(TensorTest, ZeroFilledAlignedAndShaped) {
  Tensor t(DType::kFloat32, {3, 4});
  EXPECT_EQ(t.num_elements(), 12);
  EXPECT_EQ(t.byte_size(), 48u);
  EXPECT_EQ(t.rows(), 3);
  EXPECT_EQ(t.row_size(), 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
  EXPECT_EQ(t.DebugString(), "float32[3, 4]");
}

TEST(TensorTest, CopiesShareAndCloneDoesNot) {
  Tensor a = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4});
  Tensor shared = a;
  Tensor clone = a.Clone();
  a.data<float>()[0] = 9;
  EXPECT_EQ(shared.data<float>()[0], 9);
  EXPECT_EQ(clone.data<float>()[0], 1);
}

TEST(TensorTest, SliceRowsAndReshapeShareTheBuffer) {
  Tensor a = Tensor::FromVector<int32_t>({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor middle = a.SliceRows(1, 3);
  EXPECT_EQ(middle.shape(), Shape({2, 2}));
  EXPECT_EQ(middle.data<int32_t>()[0], 3);
  auto flat = a.Reshape({6});
  ASSERT_OK(flat);
  EXPECT_EQ(flat->data<int32_t>()[5], 6);
  EXPECT_FALSE(a.Reshape({4}).ok());
}

TEST(TensorTest, MatrixViewMapsRowMajor) {
  Tensor a = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(a.Matrix()(1, 0), 4);
  a.Matrix()(0, 2) = 7;
  EXPECT_EQ(a.data<float>()[2], 7);
}

TEST(TensorTest, AllFiniteFindsNaNAndInfinityAnywhere) {
  std::vector<Tensor> tensors = {Tensor::FromVector<float>(Shape({2}), {1, -2}),
                                 Tensor::FromVector<float>(Shape({3}), {0, 3e38f, -1e-38f}),
                                 Tensor::FromVector<int32_t>(Shape({1}), {7})};
  EXPECT_TRUE(AllFinite(tensors));
  EXPECT_TRUE(AllFinite(std::vector<Tensor>{}));
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    tensors[1].data<float>()[2] = bad;
    EXPECT_FALSE(AllFinite(tensors)) << bad;
  }
}

TEST(TensorTest, ConcatRowsAndEquality) {
  Tensor a = Tensor::FromVector<uint8_t>({1, 2}, {1, 2});
  Tensor b = Tensor::FromVector<uint8_t>({2, 2}, {3, 4, 5, 6});
  auto c = ConcatRows({a, b});
  ASSERT_OK(c);
  EXPECT_TRUE(c->BitwiseEqual(Tensor::FromVector<uint8_t>({3, 2}, {1, 2, 3, 4, 5, 6})));
  EXPECT_FALSE(ConcatRows({a, Tensor(DType::kFloat32, {1, 2})}).ok());
}

TEST(TensorTest, DTypeNames) {
  EXPECT_EQ(*DTypeFromName("int64"), DType::kInt64);
  EXPECT_EQ(DTypeSize(DType::kUInt8), 1u);
  EXPECT_THAT(std::string(DTypeFromName("float16").status().message()),
              ::testing::HasSubstr("dtype \"float16\" is not supported"));
}

TEST(TensorProtoTest, RoundTripsEveryDtype) {
  for (const Tensor& tensor :
       {Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6}),
        Tensor::FromVector<int32_t>({2}, {-1, 7}), Tensor::FromVector<int64_t>({1, 1}, {1LL << 40}),
        Tensor::FromVector<uint8_t>({3}, {0, 128, 255}), Tensor(DType::kFloat32, {0, 4}),
        Tensor::Scalar(2.5f)}) {
    proto::TensorProto message;
    TensorToProto(tensor, &message);
    auto back = TensorFromProto(message);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(back->BitwiseEqual(tensor)) << tensor.DebugString();
  }
}

TEST(TensorProtoTest, RefusesMalformedMessages) {
  proto::TensorProto message;
  TensorToProto(Tensor::FromVector<float>({2}, {1, 2}), &message);
  message.set_content("abc");
  EXPECT_THAT(std::string(TensorFromProto(message).status().message()),
              ::testing::HasSubstr("tensor float32[2] needs 8 bytes but carries 3"));
  message.set_dtype(static_cast<proto::DataType>(42));
  EXPECT_THAT(std::string(TensorFromProto(message).status().message()),
              ::testing::HasSubstr("dtype 42"));
  message.set_dtype(proto::DT_FLOAT);
  message.set_dims(0, -2);
  EXPECT_THAT(std::string(TensorFromProto(message).status().message()),
              ::testing::HasSubstr("dimension -2"));
}

// A 16-byte message declaring 2^29 floats and carrying none is refused before 2 GiB is
// allocated and zero-filled (the peak RSS stays where it was).
TEST(TensorProtoTest, ASizeIsCheckedBeforeMemoryIsCommitted) {
  proto::TensorProto message;
  message.set_dtype(proto::DT_FLOAT);
  message.add_dims(int64_t{1} << 29);
  struct rusage before {};
  getrusage(RUSAGE_SELF, &before);
  EXPECT_THAT(std::string(TensorFromProto(message).status().message()),
              ::testing::HasSubstr("tensor float32[536870912] needs 2147483648 bytes but "
                                   "carries 0"));
  struct rusage after {};
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 64 * 1024);  // KiB
}

TEST(TensorTest, GatherRowsCopiesTheRowsNamedInTheirOrder) {
  // More rows than the prefetch runs ahead, in no order, with repeats; and a table of int32
  // rows of 3 (12 bytes, not a multiple of a cache line).
  Tensor table(DType::kFloat32, {40, 5});
  for (int64_t i = 0; i < table.num_elements(); ++i) table.data<float>()[i] = static_cast<float>(i);
  const std::vector<int64_t> rows = {39, 0, 7, 7, 21, 3, 38, 12, 5, 0, 19, 33, 2};
  Tensor out(DType::kFloat32, {static_cast<int64_t>(rows.size()), 5});
  GatherRows(table, rows.data(), rows.size(), out.raw_data());
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t k = 0; k < 5; ++k) {
      EXPECT_EQ(out.data<float>()[i * 5 + static_cast<size_t>(k)],
                static_cast<float>(rows[i] * 5 + k));
    }
  }
  Tensor ids(DType::kInt32, {20, 3});
  for (int64_t i = 0; i < ids.num_elements(); ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(i);
  const std::vector<int64_t> picked = {19, 1, 10, 1, 0, 18, 4, 9, 11, 2};
  Tensor picked_out(DType::kInt32, {static_cast<int64_t>(picked.size()), 3});
  GatherRows(ids, picked.data(), picked.size(), picked_out.raw_data());
  for (size_t i = 0; i < picked.size(); ++i) {
    EXPECT_EQ(picked_out.data<int32_t>()[i * 3 + 2], static_cast<int32_t>(picked[i] * 3 + 2));
  }
}

}  // namespace
}  // namespace stratum
