#include "ps/data_wire.h"
#include "stratum/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum::data_wire {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TensorRef Ref(std::string name, Shape shape, Location location = Location::kInline,
              uint64_t offset = 0) {
  TensorRef ref;
  ref.name = std::move(name);
  ref.shape = std::move(shape);
  ref.location = location;
  ref.offset = offset;
  return ref;
}

TEST(DataWireTest, RequestAndResponseMetaRoundTrip) {
  RequestMeta request;
  request.tensors = {Ref("dense/kernel", {784, 128}), Ref("b", {10}, Location::kShared, 128)};
  request.tensors[1].dtype = DType::kInt64;
  absl::StatusOr<RequestMeta> parsed = ParseRequestMeta(EncodeRequestMeta(request), Limits());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[0].name, "dense/kernel");
  EXPECT_EQ(parsed->tensors[0].shape, Shape({784, 128}));
  EXPECT_EQ(parsed->tensors[0].byte_size(), 784u * 128 * 4);
  EXPECT_EQ(parsed->tensors[1].dtype, DType::kInt64);
  EXPECT_EQ(parsed->tensors[1].location, Location::kShared);
  EXPECT_EQ(parsed->tensors[1].offset, 128u);

  ResponseMeta response;
  response.message = "fine";
  response.updates = {3, 4};
  response.values = {Ref("", {2, 2}), Ref("", {5})};
  response.shared_bytes_wanted = 4096;
  absl::StatusOr<ResponseMeta> back = ParseResponseMeta(EncodeResponseMeta(response), Limits());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->message, "fine");
  EXPECT_EQ(back->updates, (std::vector<int64_t>{3, 4}));
  ASSERT_EQ(back->values.size(), 2u);
  EXPECT_EQ(back->values[1].shape, Shape({5}));
  EXPECT_EQ(back->shared_bytes_wanted, 4096u);
}

TEST(DataWireTest, MalformedMetaIsRefusedByName) {
  const std::string good = EncodeRequestMeta({{Ref("w", {2, 2})}});
  auto refused = [](const std::string& bytes, const std::string& text, Limits limits = {}) {
    absl::StatusOr<RequestMeta> parsed = ParseRequestMeta(bytes, limits);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
    EXPECT_THAT(Message(parsed.status()), HasSubstr(text));
  };
  refused(good.substr(0, good.size() - 3), "ends inside");
  refused(good + "xx", "runs on for 2 bytes");
  refused(good, "has rank 2, over the limit of 1", {.max_rank = 1});
  refused(good, "frame has 1 tensors, over the limit of 0", {.max_tensors = 0});
  refused(EncodeRequestMeta({{Ref(std::string(100, 'n'), {1})}}), "a name of 100 bytes",
          {.max_name_bytes = 10});

  std::string bad_dtype = good;
  const uint32_t nine = 9;
  std::memcpy(bad_dtype.data() + 4 + 4 + 1, &nine, sizeof(nine));  // count, name length, "w"
  refused(bad_dtype, "has dtype 9");
  refused(EncodeRequestMeta({{Ref("w", {-2})}}), "dimension -2, which is negative");
  refused(EncodeRequestMeta({{Ref("w", {int64_t{1} << 30, int64_t{1} << 30})}}), "too large");
  refused(EncodeRequestMeta({{Ref("w", {1}, static_cast<Location>(7))}}), "has location 7");
}

TEST(DataWireTest, HeadersAreChecked) {
  FrameHeader header;
  header.magic = kRequestMagic;
  header.op_or_code = static_cast<uint32_t>(Op::kPush);
  EXPECT_OK(CheckHeader(header, kRequestMagic, Limits()));

  FrameHeader http = header;
  std::memcpy(&http.magic, "GET ", 4);
  absl::Status status = CheckHeader(http, kRequestMagic, Limits());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), HasSubstr("does not speak Stratum's data path"));

  FrameHeader op = header;
  op.op_or_code = 42;
  EXPECT_THAT(Message(CheckHeader(op, kRequestMagic, Limits())), HasSubstr("op 42"));

  FrameHeader big = header;
  big.inline_bytes = 300ull << 20;
  status = CheckHeader(big, kRequestMagic, Limits());
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(status), HasSubstr("over the limit of 268435456"));
}

TEST(DataWireTest, PlacementMustAddUpAndStayInsideTheSegment) {
  const Limits limits;
  EXPECT_OK(CheckPlacement({Ref("a", {4}), Ref("b", {2})}, 24, 0, limits));
  EXPECT_THAT(Message(CheckPlacement({Ref("a", {4})}, 20, 0, limits)),
              HasSubstr("carries 20 inline bytes but its tensors need 16"));
  EXPECT_THAT(Message(CheckPlacement({Ref("a", {4}, Location::kShared)}, 0, 0, limits)),
              HasSubstr("the connection has none"));
  EXPECT_OK(CheckPlacement({Ref("a", {4}, Location::kShared, 64)}, 0, 80, limits));
  EXPECT_THAT(Message(CheckPlacement({Ref("a", {4}, Location::kShared, 72)}, 0, 80, limits)),
              HasSubstr("does not lie aligned inside the shared segment of 80 bytes"));
  EXPECT_THAT(Message(CheckPlacement({Ref("a", {4}, Location::kShared, 2)}, 0, 80, limits)),
              HasSubstr("does not lie aligned"));
  EXPECT_THAT(
      Message(CheckPlacement({Ref("a", {4}, Location::kShared, ~uint64_t{0} - 3)}, 0, 80, limits)),
      HasSubstr("does not lie aligned"));
  const absl::Status big = CheckPlacement({Ref("a", {4}), Ref("b", {4})}, 32, 0, {.max_bytes = 20});
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace stratum::data_wire
