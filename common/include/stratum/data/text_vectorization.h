// TextVectorizer: Keras' TextVectorization layer (output_mode "int"), a text to the indices
// an Embedding looks up, as Keras computes them:
//   standardize  "lower_and_strip_punctuation" (the default), "lower", "strip_punctuation"
//                or null. Lowering is ASCII's (tf.strings.lower), stripping removes the 32
//                ASCII punctuation characters (Keras' regex), bytes of UTF-8 text kept.
//   split        "whitespace" (the default: runs of ASCII whitespace, none kept empty),
//                "character" (UTF-8 code points, an invalid byte as U+FFFD) or null.
//   ngrams       null, n (widths 1..n) or a list of widths: for each width in turn, every
//                window of that many tokens joined by " ", as tf.strings.ngrams.
//   lookup       StringLookup(mask_token="", oov "[UNK]" at 1), the vocabulary from the
//                config's list or file (get_vocabulary()'s "" and "[UNK]" first are taken
//                as those), max_tokens checked.
//   output_sequence_length  ids truncated or padded with 0 to it.
// A StringLookup layer in its place takes the whole text as one token (Keras' split None).
//
// Custom standardize/split functions, adapt(), and the other output modes are refused by
// name: a job file holds what to_json() writes, and Stratum's inputs take ids.
//
// Thread safety: immutable after creation.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "stratum/data/lookup.h"

namespace stratum {

class TextVectorizer {
 public:
  enum class Standardize { kNone, kLower, kStripPunctuation, kLowerAndStripPunctuation };
  enum class Split { kNone, kWhitespace, kCharacter };

  // {"class_name": "TextVectorization" or "StringLookup", "config": {...}} as to_json()
  // writes it; `where` names it in errors. A vocabulary file's relative path is taken from
  // options.base_dir.
  static absl::StatusOr<std::shared_ptr<const TextVectorizer>> FromKerasLayer(
      const nlohmann::json& layer, const std::string& where, const TokenLookup::Options& options);

  // The tokens the lookup numbers: standardized, split and made n-grams.
  std::vector<std::string> Tokens(absl::string_view text) const;
  // The text's ids into out[0, length): the first `length` tokens' ids, then 0s, as float32
  // values (exact below 2^24; MakeBatches gives a model of ids them as int32).
  void Vectorize(absl::string_view text, int64_t length, float* out) const;

  // The config's output_sequence_length; 1 for a StringLookup; nullopt when not set (the
  // model's input length then decides, as Keras pads to the longest text of a batch).
  std::optional<int64_t> output_sequence_length() const { return output_sequence_length_; }
  const TokenLookup& lookup() const { return *lookup_; }
  // "TextVectorization", "StringLookup"
  const std::string& class_name() const { return class_name_; }

 private:
  TextVectorizer() = default;

  std::string class_name_;
  Standardize standardize_ = Standardize::kLowerAndStripPunctuation;
  Split split_ = Split::kWhitespace;
  std::vector<int> ngram_widths_;  // empty: the tokens as split
  std::optional<int64_t> output_sequence_length_;
  std::shared_ptr<const TokenLookup> lookup_;
};

}  // namespace stratum
