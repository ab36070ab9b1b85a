// TextVectorizer against Keras' TextVectorization as its docstrings and code define it
// (standardize, split, ngrams, the lookup's numbering, padding), and text-line files as
// tf.data.TextLineDataset reads them (blank lines, '\r\n', a last line without '\n', GZIP),
// each line labelled by its file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "idx_writer.h"
#include "stratum/data/text_lines.h"
#include "stratum/data/text_vectorization.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::stratum::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::shared_ptr<const TextVectorizer> Make(json config,
                                           const std::string& class_name = "TextVectorization") {
  auto made = TextVectorizer::FromKerasLayer({{"class_name", class_name}, {"config", config}},
                                             "preprocess.line", {});
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *made : nullptr;
}

std::string Refusal(json config) {
  auto made = TextVectorizer::FromKerasLayer(
      {{"class_name", "TextVectorization"}, {"config", config}}, "preprocess.line", {});
  return made.ok() ? "built" : std::string(made.status().message());
}

std::vector<float> Ids(const TextVectorizer& vectorizer, const std::string& text, int64_t length) {
  std::vector<float> out(static_cast<size_t>(length), -1.0f);
  vectorizer.Vectorize(text, length, out.data());
  return out;
}

TEST(TextVectorizerTest, NumbersTextAsKerasDocumentsIt) {
  // The docstring's vocabulary example: get_vocabulary() is ['', '[UNK]', 'earth', 'wind',
  // 'and', 'fire'], so "earth wind and also fire" is [2, 3, 4, 1] at max_len 4.
  auto layer = Make({{"max_tokens", 5000},
                     {"output_mode", "int"},
                     {"output_sequence_length", 4},
                     {"vocabulary", {"earth", "wind", "and", "fire"}}});
  EXPECT_EQ(layer->lookup().vocabulary_size(), 6);
  EXPECT_THAT(Ids(*layer, "earth wind and also fire", 4), ElementsAre(2, 3, 4, 1));
  EXPECT_THAT(Ids(*layer, "fire and earth michigan", 4), ElementsAre(5, 4, 2, 1));
  // The adapt() example's vocabulary (by count, ties high to low): baz bar foo boom bada.
  layer = Make({{"output_sequence_length", 4},
                {"vocabulary", {"", "[UNK]", "baz", "bar", "foo", "boom", "bada"}}});
  EXPECT_THAT(Ids(*layer, "foo qux bar", 4), ElementsAre(4, 1, 3, 0));
  EXPECT_THAT(Ids(*layer, "qux baz", 4), ElementsAre(1, 2, 0, 0));
}

TEST(TextVectorizerTest, StandardizesAndSplitsAsKerasDoes) {
  auto layer = Make({{"vocabulary", {"a"}}});
  // Lower-cased (ASCII only), the 32 ASCII punctuation characters removed, whitespace runs.
  EXPECT_THAT(layer->Tokens("  Hello, World!\tIt's  ÉTÉ-time.\n"),
              ElementsAre("hello", "world", "its", "ÉtÉtime"));
  EXPECT_THAT(layer->Tokens("a+b=c [x] {y} <z> ~`|\\^_@#$%&*()\"'/:;?"),
              ElementsAre("abc", "x", "y", "z"));
  EXPECT_THAT(layer->Tokens(""), ElementsAre());
  EXPECT_THAT(Make({{"vocabulary", {"a"}}, {"standardize", "lower"}})->Tokens("Hi, There"),
              ElementsAre("hi,", "there"));
  EXPECT_THAT(Make({{"vocabulary", {"a"}}, {"standardize", "strip_punctuation"}})->Tokens("Hi, X"),
              ElementsAre("Hi", "X"));
  EXPECT_THAT(
      Make({{"vocabulary", {"a"}}, {"standardize", nullptr}, {"split", nullptr}})->Tokens("Hi, X"),
      ElementsAre("Hi, X"));
  // Characters: UTF-8 code points, an invalid byte as U+FFFD.
  EXPECT_THAT(Make({{"vocabulary", {"a"}}, {"split", "character"}})->Tokens("Aé b\xff"),
              ElementsAre("a", "é", " ", "b", "\xEF\xBF\xBD"));
}

TEST(TextVectorizerTest, MakesNgramsWidthByWidth) {
  // tf.strings.ngrams(["a", "b", "c"], (1, 2)): the unigrams, then the bigrams.
  EXPECT_THAT(Make({{"vocabulary", {"a"}}, {"ngrams", 2}})->Tokens("a b c"),
              ElementsAre("a", "b", "c", "a b", "b c"));
  EXPECT_THAT(Make({{"vocabulary", {"a"}}, {"ngrams", {3}}})->Tokens("a b c d"),
              ElementsAre("a b c", "b c d"));
  auto layer = Make({{"vocabulary", {"a b", "b"}}, {"ngrams", 2}});
  EXPECT_THAT(Ids(*layer, "A b", 5), ElementsAre(1, 3, 2, 0, 0));
}

TEST(TextVectorizerTest, PadsAndTruncatesToTheLength) {
  auto layer = Make({{"vocabulary", {"x", "y"}}});
  EXPECT_FALSE(layer->output_sequence_length().has_value());
  EXPECT_THAT(Ids(*layer, "x y x y", 3), ElementsAre(2, 3, 2));
  EXPECT_THAT(Ids(*layer, "y", 3), ElementsAre(3, 0, 0));
  // A StringLookup takes the whole line as its one token.
  auto whole = Make({{"vocabulary", {"spam", "ham"}}, {"num_oov_indices", 0}}, "StringLookup");
  EXPECT_EQ(whole->output_sequence_length(), 1);
  EXPECT_THAT(Ids(*whole, "ham", 1), ElementsAre(1));
}

TEST(TextVectorizerTest, RefusesWhatItCannotApplyNamingTheFix) {
  EXPECT_THAT(Refusal({{"vocabulary", {"a"}}, {"output_mode", "multi_hot"}}),
              HasSubstr("use \"int\""));
  EXPECT_THAT(Refusal({{"vocabulary", {"a"}}, {"standardize", {{"class_name", "MyFn"}}}}),
              HasSubstr("a custom function is Python"));
  EXPECT_THAT(Refusal({{"vocabulary", {"a"}}, {"split", "comma"}}), HasSubstr("has split"));
  EXPECT_THAT(Refusal({{"vocabulary", {"a"}}, {"ngrams", 0}}), HasSubstr("has ngrams 0"));
  EXPECT_THAT(Refusal({{"vocabulary", {"a"}}, {"ragged", true}}), HasSubstr("sets ragged"));
  EXPECT_THAT(Refusal({{"vocabulary", {"a"}}, {"output_sequence_length", -2}}),
              HasSubstr("output_sequence_length -2"));
  EXPECT_THAT(Refusal(json::object()), HasSubstr("Stratum does not adapt() one"));
  EXPECT_THAT(Refusal({{"vocabulary", {"a", "b", "c"}}, {"max_tokens", 4}}),
              HasSubstr("raise max_tokens"));
  EXPECT_THAT(Refusal({{"vocabulary", {"a"}}, {"vocab", 3}}), HasSubstr("config key \"vocab\""));
}

std::vector<Element> ReadAll(const RecordFormat& format, const std::string& path) {
  std::vector<Element> out;
  auto reader = format.Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return out;
  while (true) {
    auto next = (*reader)->Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) return out;
    out.push_back(**next);
  }
}

TEST(TextLinesTest, ReadsEveryLineAsTextLineDatasetDoesLabelledByItsFile) {
  TempDir dir;
  // A blank line is an element; '\r\n' ends a line as '\n' does; the last line has no '\n'.
  const std::string text = "the cat\r\n\nA dog, a CAT.\nbird";
  const std::string plain = dir.Write("a.txt", text);
  const std::string packed = dir.WriteGz("b.txt.gz", text + "\n");
  TextLineOptions options;
  options.vectorizer = Make({{"vocabulary", {"the", "cat", "dog", "a"}}});
  options.length = 3;
  options.labels = {{plain, 0}, {packed, 1}};
  EXPECT_EQ(*CountTextLines(plain, Compression::kNone), 4);
  EXPECT_EQ(*CountTextLines(packed, Compression::kGzip), 4);
  auto check = [](const std::vector<Element>& lines, int64_t label) {
    ASSERT_EQ(lines.size(), 4u);
    const std::vector<std::vector<float>> ids = {{2, 3, 0}, {0, 0, 0}, {5, 4, 5}, {1, 0, 0}};
    for (size_t i = 0; i < lines.size(); ++i) {
      const float* x = lines[i][0].data<float>();
      EXPECT_EQ(std::vector<float>(x, x + lines[i][0].num_elements()), ids[i]) << "line " << i;
      EXPECT_EQ(lines[i][1].dtype(), DType::kInt64);
      EXPECT_EQ(*lines[i][1].data<int64_t>(), label);
    }
  };
  check(ReadAll(*TextLines(options), plain), 0);
  TextLineOptions gzip = options;
  gzip.compression = Compression::kGzip;
  check(ReadAll(*TextLines(gzip), packed), 1);
  EXPECT_EQ(*CountTextLines(dir.Write("empty.txt", ""), Compression::kNone), 0);
  EXPECT_EQ(*CountTextLines(dir.Write("one.txt", "\n"), Compression::kNone), 1);
  auto unlabelled = TextLines(options)->Open(dir.Write("c.txt", "x\n"));
  EXPECT_THAT(unlabelled.status().message(), HasSubstr("c.txt has no label"));
}

}  // namespace
}  // namespace stratum
