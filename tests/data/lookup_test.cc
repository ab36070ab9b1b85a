// TokenLookup against Keras' own documented numbers: StringLookup's and IntegerLookup's
// docstring examples, and tf.strings.to_hash_bucket_fast's, which out-of-vocabulary strings
// are bucketed by.
#include "stratum/data/lookup.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "idx_writer.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::shared_ptr<const TokenLookup> Make(const std::string& class_name, json config,
                                        TokenLookup::Options options = {}) {
  auto lookup = TokenLookup::FromKerasLayer({{"class_name", class_name}, {"config", config}},
                                            "preprocess.x", options);
  EXPECT_TRUE(lookup.ok()) << lookup.status();
  return lookup.ok() ? *lookup : nullptr;
}

std::vector<int64_t> Indices(const TokenLookup& lookup, const std::vector<std::string>& tokens) {
  std::vector<int64_t> out;
  for (const std::string& token : tokens) out.push_back(lookup.Index(token));
  return out;
}

std::string Refusal(const std::string& class_name, json config) {
  auto lookup = TokenLookup::FromKerasLayer({{"class_name", class_name}, {"config", config}},
                                            "preprocess.x", {});
  return lookup.ok() ? "built" : std::string(lookup.status().message());
}

const std::vector<std::string> kVocab = {"a", "b", "c", "d"};

TEST(TokenLookupTest, NumbersStringsAsKerasDocumentsIt) {
  // StringLookup(vocabulary=vocab)([["a", "c", "d"], ["d", "z", "b"]]) -> [[1, 3, 4], [4, 0, 2]]
  auto lookup = Make("StringLookup", {{"vocabulary", kVocab}});
  EXPECT_THAT(Indices(*lookup, {"a", "c", "d", "d", "z", "b"}), ElementsAre(1, 3, 4, 4, 0, 2));
  EXPECT_EQ(lookup->vocabulary_size(), 5);
  // num_oov_indices=2: [["a", "c", "d"], ["m", "z", "b"]] -> [[2, 4, 5], [0, 1, 3]]
  lookup = Make("StringLookup", {{"vocabulary", kVocab}, {"num_oov_indices", 2}});
  EXPECT_THAT(Indices(*lookup, {"a", "c", "d", "m", "z", "b"}), ElementsAre(2, 4, 5, 0, 1, 3));
  // mask_token="": [["a", "c", "d", ""], ["d", "z", "b", ""]] -> [[2, 4, 5, 0], [5, 1, 3, 0]]
  lookup = Make("StringLookup", {{"vocabulary", kVocab}, {"mask_token", ""}});
  EXPECT_THAT(Indices(*lookup, {"a", "c", "d", "", "d", "z", "b", ""}),
              ElementsAre(2, 4, 5, 0, 5, 1, 3, 0));
  // The tutorial's labels: num_oov_indices=0, so "yes" is 0 and "no" 1; an unknown label -1.
  lookup = Make("StringLookup", {{"vocabulary", {"yes", "no"}}, {"num_oov_indices", 0}});
  EXPECT_THAT(Indices(*lookup, {"yes", "no", "maybe"}), ElementsAre(0, 1, -1));
}

TEST(TokenLookupTest, BucketsUnknownStringsAsToHashBucketFast) {
  // tf.strings.to_hash_bucket_fast(["Hello", "TensorFlow", "2.x"], 3) -> [0, 2, 2]
  auto lookup = Make("StringLookup", {{"vocabulary", {"x"}}, {"num_oov_indices", 3}});
  EXPECT_THAT(Indices(*lookup, {"Hello", "TensorFlow", "2.x", "x"}), ElementsAre(0, 2, 2, 3));
}

TEST(TokenLookupTest, NumbersIntegersAsKerasDocumentsIt) {
  // IntegerLookup(vocabulary=[12, 36, 1138, 42])([[12, 1138, 42], [42, 1000, 36]])
  //   -> [[1, 3, 4], [4, 0, 2]]; with num_oov_indices=2, 1000 goes to 1000 % 2 = 0.
  const std::vector<int64_t> vocab = {12, 36, 1138, 42};
  auto lookup = Make("IntegerLookup", {{"vocabulary", vocab}});
  std::vector<int64_t> out;
  for (int64_t token : {12, 1138, 42, 42, 1000, 36}) out.push_back(lookup->Index(token));
  EXPECT_THAT(out, ElementsAre(1, 3, 4, 4, 0, 2));
  lookup = Make("IntegerLookup", {{"vocabulary", vocab}, {"num_oov_indices", 2}});
  EXPECT_EQ(lookup->Index(1000), 0);
  EXPECT_EQ(lookup->Index(-3), 1);  // floormod: never negative
  EXPECT_EQ(lookup->Index(12), 2);
}

TEST(TokenLookupTest, TakesTheSpecialTokensAtTheStartOfAVocabularyAsKerasDoes) {
  // get_vocabulary() returns ["", "[UNK]", "a", ...]; set_vocabulary takes it back as is.
  auto lookup = Make("StringLookup", {{"vocabulary", {"", "[UNK]", "a", "b"}}, {"mask_token", ""}});
  EXPECT_THAT(Indices(*lookup, {"", "zz", "a", "b"}), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(lookup->vocabulary_size(), 4);
  // Elsewhere the mask token is refused, as Keras refuses it.
  EXPECT_THAT(Refusal("StringLookup", {{"vocabulary", {"a", ""}}, {"mask_token", ""}}),
              HasSubstr("has token \"\" (the mask_token) after its special tokens"));
}

TEST(TokenLookupTest, ReadsAVocabularyFileRelativeToItsFolder) {
  stratum::testing::TempDir dir;
  dir.Write("vocab.txt", "avenger\r\nironman\nbatman\n");
  TokenLookup::Options options;
  options.base_dir = dir.path();
  auto lookup = Make("StringLookup", {{"vocabulary", "vocab.txt"}}, options);
  EXPECT_THAT(Indices(*lookup, {"avenger", "ironman", "batman", "hulk"}), ElementsAre(1, 2, 3, 0));
  EXPECT_THAT(Refusal("StringLookup", {{"vocabulary", "/nonexistent/vocab.txt"}}),
              HasSubstr("vocabulary file /nonexistent/vocab.txt cannot be read"));
}

TEST(TokenLookupTest, RefusesWhatStratumDoesNotImplementByName) {
  EXPECT_THAT(Refusal("StringLookup", json::object()),
              HasSubstr("has no vocabulary, and Stratum does not adapt() one"));
  EXPECT_THAT(Refusal("StringLookup", {{"vocabulary", {"a", "b", "a"}}}),
              HasSubstr("has token \"a\" twice"));
  EXPECT_THAT(Refusal("StringLookup", {{"vocabulary", {1, 2}}}),
              HasSubstr("which is not a string: StringLookup takes string tokens"));
  EXPECT_THAT(Refusal("StringLookup", {{"vocabulary", {"a"}}, {"output_mode", "multi_hot"}}),
              HasSubstr("output_mode \"multi_hot\", which Stratum does not support"));
  EXPECT_THAT(Refusal("StringLookup", {{"vocabulary", {"a"}}, {"invert", true}}),
              HasSubstr("sets invert to true"));
  EXPECT_THAT(Refusal("StringLookup", {{"vocabulary", {"a"}}, {"encoding", "latin-1"}}),
              HasSubstr("has encoding \"latin-1\""));
  EXPECT_THAT(Refusal("StringLookup", {{"vocabulary", {"a", "b"}}, {"max_tokens", 2}}),
              HasSubstr("has max_tokens 2 but 3 indices"));
  EXPECT_THAT(Refusal("TextVectorization", {{"vocabulary", {"a"}}}),
              HasSubstr("give a Keras StringLookup or IntegerLookup layer"));
}

}  // namespace
}  // namespace stratum
