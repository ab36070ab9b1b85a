#include "stratum/data/example.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "proto/example.pb.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::stratum::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::vector<FeatureSpec> Specs(const json& j) {
  absl::StatusOr<std::vector<FeatureSpec>> specs = ParseFeatureSpecs(j, "data.train.features");
  EXPECT_TRUE(specs.ok()) << specs.status();
  return specs.ok() ? *specs : std::vector<FeatureSpec>{};
}

std::string Refusal(const json& j) {
  absl::StatusOr<std::vector<FeatureSpec>> specs = ParseFeatureSpecs(j, "data.train.features");
  return specs.ok() ? "accepted" : std::string(specs.status().message());
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.num_elements());
}

// An Example built with protobuf's generated classes, as TensorFlow builds one.
std::string MakeExample() {
  tensorflow::Example example;
  auto& f = *example.mutable_features()->mutable_feature();
  f["image"].mutable_bytes_list()->add_value(std::string("\x01\x02\x03\xff\x00\x07", 6));
  for (float v : {0.5f, -1.25f, 3.0f, 4.0f}) f["dense"].mutable_float_list()->add_value(v);
  f["label"].mutable_int64_list()->add_value(-7);
  for (int64_t v : {int64_t{3}, int64_t{1}, int64_t{1} << 40})
    f["ids"].mutable_int64_list()->add_value(v);
  f["unused"].mutable_float_list()->add_value(1);
  return example.SerializeAsString();
}

TEST(ExampleTest, ParsesWhatProtobufWritesIntoTheSpecsTensors) {
  const ExampleParser parser(Specs({
      {"image",
       {{"type", "FixedLenFeature"},
        {"dtype", "string"},
        {"decode_raw", "uint8"},
        {"shape", {2, 3}}}},
      {"dense", {{"type", "FixedLenFeature"}, {"dtype", "float32"}, {"shape", {2, 2}}}},
      {"label", {{"type", "FixedLenFeature"}, {"dtype", "int64"}, {"shape", json::array()}}},
      {"ids", {{"type", "VarLenFeature"}, {"dtype", "int64"}, {"pad_to", 5}}},
      {"missing",
       {{"type", "FixedLenFeature"}, {"dtype", "float32"}, {"shape", {3}}, {"default_value", 2.5}}},
  }));
  Element out;
  ASSERT_OK(parser.Parse(MakeExample(), out));
  ASSERT_EQ(out.size(), 5u);  // key order: dense, ids, image, label, missing
  EXPECT_EQ(out[0].shape(), Shape({2, 2}));
  EXPECT_THAT(Values<float>(out[0]), ElementsAre(0.5f, -1.25f, 3.0f, 4.0f));
  EXPECT_EQ(out[1].shape(), Shape({5}));
  EXPECT_THAT(Values<int64_t>(out[1]), ElementsAre(3, 1, int64_t{1} << 40, 0, 0));
  EXPECT_EQ(out[2].dtype(), DType::kUInt8);
  EXPECT_EQ(out[2].shape(), Shape({2, 3}));
  EXPECT_THAT(Values<uint8_t>(out[2]), ElementsAre(1, 2, 3, 255, 0, 7));
  EXPECT_EQ(out[3].shape(), Shape({}));
  EXPECT_THAT(Values<int64_t>(out[3]), ElementsAre(-7));
  EXPECT_THAT(Values<float>(out[4]), ElementsAre(2.5f, 2.5f, 2.5f));
}

TEST(ExampleTest, ReadsUnpackedListsAndTheLastOfRepeatedKeysAsProtobufDoes) {
  // Example{features{feature{key "x" value{float_list{value 1.5 value 2.5}}}}}, the floats
  // unpacked (tag 0x0d, fixed32 each), then "x" again as an int64_list that the float spec
  // is not; then "y" as an unpacked int64 (tag 0x08).
  // A length-delimited field of one byte's tag and one byte's length.
  auto field = [](char tag, const std::string& bytes) {
    std::string out;
    out.push_back(tag);
    out.push_back(static_cast<char>(bytes.size()));
    out.append(bytes);
    return out;
  };
  auto entry = [&](const std::string& key, const std::string& feature) {
    return field('\x0a', field('\x0a', key).append(field('\x12', feature)));
  };
  const std::string floats("\x12\x0a\x0d\x00\x00\xc0\x3f\x0d\x00\x00\x20\x40", 12);
  const std::string ints("\x1a\x02\x08\x05", 4);
  std::string features = entry("x", ints) + entry("x", floats) + entry("y", ints);
  const std::string record = field('\x0a', features);
  const ExampleParser parser(Specs({{"x", {{"dtype", "float32"}, {"shape", {2}}}},
                                    {"y", {{"dtype", "int64"}, {"shape", json::array()}}}}));
  Element out;
  ASSERT_OK(parser.Parse(record, out));
  EXPECT_THAT(Values<float>(out[0]), ElementsAre(1.5f, 2.5f));
  EXPECT_THAT(Values<int64_t>(out[1]), ElementsAre(5));
}

TEST(ExampleTest, AValueThatDoesNotFitItsSpecIsRefusedNamingTheFeature) {
  const std::string record = MakeExample();
  auto parse = [&](const json& spec) {
    Element out;
    return ExampleParser(Specs(spec)).Parse(record, out);
  };
  EXPECT_THAT(parse({{"label", {{"dtype", "float32"}, {"shape", json::array()}}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("feature \"label\" is an int64_list, but its spec's dtype is "
                                 "float32: fix the spec's dtype")));
  EXPECT_THAT(parse({{"dense", {{"dtype", "float32"}, {"shape", {3}}}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("feature \"dense\" has 4 values, but its FixedLenFeature shape "
                                 "[3] takes 3")));
  EXPECT_THAT(parse({{"ids", {{"type", "VarLenFeature"}, {"dtype", "int64"}, {"pad_to", 2}}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has 3 values, more than its pad_to 2: raise pad_to")));
  EXPECT_THAT(parse({{"image", {{"dtype", "string"}, {"decode_raw", "uint8"}, {"shape", {7}}}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("feature \"image\" holds 6 bytes, but decode_raw uint8 into "
                                 "shape [7] takes 7")));
  EXPECT_THAT(parse({{"nope", {{"dtype", "int64"}, {"shape", json::array()}}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("feature \"nope\" is missing from the example and its spec has "
                                 "no default_value")));
  Element out;
  EXPECT_THAT(ExampleParser(Specs({{"label", {{"dtype", "int64"}}}}))
                  .Parse(record.substr(0, record.size() - 3), out),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a well-formed")));
}

TEST(ExampleTest, SpecsAreCheckedWithTheFix) {
  EXPECT_THAT(Refusal({{"x", {{"type", "SparseFeature"}, {"dtype", "int64"}}}}),
              HasSubstr("data.train.features.x: type \"SparseFeature\" is not one Stratum "
                        "parses: use FixedLenFeature or VarLenFeature"));
  EXPECT_THAT(Refusal({{"x", {{"dtype", "string"}, {"default_value", "a"}}}}),
              HasSubstr("a string feature has no default_value"));
  EXPECT_THAT(Refusal({{"x", {{"type", "VarLenFeature"}, {"dtype", "int64"}}}}),
              HasSubstr("a VarLenFeature needs pad_to"));
  EXPECT_THAT(Refusal({{"x", {{"dtype", "int64"}, {"shpe", {1}}}}}),
              HasSubstr("unknown key \"shpe\""));
  EXPECT_THAT(Refusal({{"x", {{"dtype", "float64"}}}}), HasSubstr("dtype \"float64\""));
  EXPECT_THAT(Refusal({{"x", {{"dtype", "int64"}, {"shape", {2}}, {"default_value", {1, 2, 3}}}}}),
              HasSubstr("default_value has 3 values, but shape [2] takes 1 (broadcast) or 2"));
  EXPECT_THAT(Refusal(json::array()), HasSubstr("must be an object of feature specs"));
  // Sizes whose product would overflow are refused, not wrapped around.
  EXPECT_THAT(Refusal({{"x", {{"dtype", "float32"}, {"shape", {2147483648, 2147483648, 3}}}}}),
              HasSubstr("values per example: give the shape of one example"));
  EXPECT_THAT(Refusal({{"x", {{"dtype", "float32"}, {"default_value", 1e300}}}}),
              HasSubstr("beyond float32's range"));
}

// A string feature without decode_raw holds tokens, which a lookup makes int64 ids (the
// job's preprocess); without one, parsing says what to give.
TEST(ExampleTest, TokensBecomeIdsThroughTheirLookup) {
  tensorflow::Example example;
  auto& f = *example.mutable_features()->mutable_feature();
  for (const char* token : {"hulk", "avenger", "thanos"})
    f["words"].mutable_bytes_list()->add_value(token);
  f["label"].mutable_bytes_list()->add_value("no");
  f["ids"].mutable_int64_list()->add_value(36);
  const std::string record = example.SerializeAsString();

  std::vector<FeatureSpec> specs = Specs({
      {"words", {{"type", "VarLenFeature"}, {"dtype", "string"}, {"pad_to", 4}}},
      {"label", {{"dtype", "string"}, {"shape", json::array()}}},
      {"ids", {{"dtype", "int64"}, {"shape", {1}}}},
  });
  // Keys in order: ids, label, words.
  ASSERT_EQ(specs[2].key, "words");
  EXPECT_TRUE(specs[2].tokens);
  EXPECT_EQ(specs[2].output_dtype(), DType::kInt64);
  Element out;
  EXPECT_THAT(ExampleParser(specs).Parse(record, out),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("feature \"label\" holds string tokens, but no StringLookup")));
  auto lookup = [](const std::string& class_name, json config) {
    return *TokenLookup::FromKerasLayer({{"class_name", class_name}, {"config", config}}, "x", {});
  };
  specs[0].lookup = lookup("IntegerLookup", {{"vocabulary", {12, 36}}});
  specs[1].lookup = lookup("StringLookup", {{"vocabulary", {"yes", "no"}}, {"num_oov_indices", 0}});
  specs[2].lookup = lookup("StringLookup", {{"vocabulary", {"avenger", "hulk"}}});
  out.clear();
  ASSERT_OK(ExampleParser(specs).Parse(record, out));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_THAT(Values<int64_t>(out[0]), ElementsAre(2));
  EXPECT_THAT(Values<int64_t>(out[1]), ElementsAre(1));
  // Padded with zeros to pad_to, as padded_batch pads the ids.
  EXPECT_THAT(Values<int64_t>(out[2]), ElementsAre(2, 1, 0, 0));
}

}  // namespace
}  // namespace stratum
