#include "stratum/data/text_vectorization.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/keras_config.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using keras::Dump;
using keras::Find;
using json = nlohmann::json;

// The member `key`, null included (Keras writes standardize=None and split=None as null,
// which differ from their defaults); nullptr when absent.
const json* Member(const json& config, const char* key) {
  const auto it = config.find(key);
  return it == config.end() ? nullptr : &*it;
}

absl::StatusOr<TextVectorizer::Standardize> ParseStandardize(const std::string& where,
                                                             const json& config) {
  using S = TextVectorizer::Standardize;
  const json* value = Member(config, "standardize");
  if (value == nullptr) return S::kLowerAndStripPunctuation;
  if (value->is_null()) return S::kNone;
  if (*value == "lower_and_strip_punctuation") return S::kLowerAndStripPunctuation;
  if (*value == "lower") return S::kLower;
  if (*value == "strip_punctuation") return S::kStripPunctuation;
  return absl::InvalidArgumentError(absl::StrCat(
      where, " has standardize ", Dump(*value),
      ": Stratum applies Keras' own: \"lower_and_strip_punctuation\", \"lower\", "
      "\"strip_punctuation\" or null (a custom function is Python: apply it when writing "
      "the data, and set null)"));
}

absl::StatusOr<TextVectorizer::Split> ParseSplit(const std::string& where, const json& config) {
  using S = TextVectorizer::Split;
  const json* value = Member(config, "split");
  if (value == nullptr) return S::kWhitespace;
  if (value->is_null()) return S::kNone;
  if (*value == "whitespace") return S::kWhitespace;
  if (*value == "character") return S::kCharacter;
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has split ", Dump(*value),
                   ": Stratum applies Keras' own: \"whitespace\", \"character\" or null (a "
                   "custom function is Python: split the text when writing the data)"));
}

// ngrams n: widths 1..n; a list: those widths.
absl::StatusOr<std::vector<int>> ParseNgrams(const std::string& where, const json& config) {
  const json* value = Find(config, "ngrams");
  if (value == nullptr || value->is_null()) return std::vector<int>{};
  auto refuse = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ngrams ", Dump(*value),
                     ": give null, an integer n from 1 to 16 (widths 1..n) or a list of such "
                     "widths"));
  };
  auto width = [](const json& w) {
    return w.is_number_integer() && w.get<int64_t>() >= 1 && w.get<int64_t>() <= 16;
  };
  std::vector<int> widths;
  if (value->is_number_integer()) {
    if (!width(*value)) return refuse();
    for (int n = 1; n <= value->get<int>(); ++n) widths.push_back(n);
    return widths;
  }
  if (!value->is_array() || value->empty()) return refuse();
  for (const json& w : *value) {
    if (!width(w)) return refuse();
    widths.push_back(w.get<int>());
  }
  return widths;
}

// Appends the UTF-8 code points of `text`, an invalid byte as U+FFFD (tf.strings.unicode_split's
// errors="replace").
void SplitCharacters(absl::string_view text, std::vector<std::string>& out) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t length = lead < 0x80           ? 1
                    : (lead >> 5) == 0x6  ? 2
                    : (lead >> 4) == 0xE  ? 3
                    : (lead >> 3) == 0x1E ? 4
                                          : 0;
    bool valid = length > 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      valid = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    }
    if (!valid) {
      out.emplace_back("\xEF\xBF\xBD");
      ++i;
      continue;
    }
    out.emplace_back(text.substr(i, length));
    i += length;
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TextVectorizer>> TextVectorizer::FromKerasLayer(
    const json& layer, const std::string& where, const TokenLookup::Options& options) {
  const std::optional<std::string> class_name = keras::FindString(layer, "class_name");
  const json* config = Find(layer, "config");
  if (!class_name || (*class_name != "TextVectorization" && *class_name != "StringLookup") ||
      config == nullptr || !config->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is ", Dump(layer),
        ": give a Keras TextVectorization (or StringLookup) layer as model.to_json() writes "
        "it, e.g. {\"class_name\": \"TextVectorization\", \"config\": {\"vocabulary\": "
        "\"vocab.txt\", \"output_sequence_length\": 64}}"));
  }
  std::shared_ptr<TextVectorizer> out(new TextVectorizer());
  out->class_name_ = *class_name;
  const std::string named = absl::StrCat(where, " (", *class_name, ")");
  if (*class_name == "StringLookup") {
    out->standardize_ = Standardize::kNone;
    out->split_ = Split::kNone;
    out->output_sequence_length_ = 1;
    STRATUM_ASSIGN_OR_RETURN(
        out->lookup_, TokenLookup::FromConfig(TokenLookup::Kind::kString, *config, named, options));
    return std::shared_ptr<const TextVectorizer>(std::move(out));
  }
  STRATUM_RETURN_IF_ERROR(
      keras::RefuseUnknown(named, *config,
                           {"max_tokens", "standardize", "split", "ngrams", "output_mode",
                            "output_sequence_length", "pad_to_max_tokens", "sparse", "ragged",
                            "vocabulary", "idf_weights", "encoding", "vocabulary_size"}));
  if (const json* mode = Find(*config, "output_mode"); mode != nullptr && *mode != "int") {
    return absl::InvalidArgumentError(absl::StrCat(
        named, " has output_mode ", Dump(*mode),
        ", which Stratum does not support: use \"int\" (indices an Embedding looks up)"));
  }
  for (const char* key : {"sparse", "ragged"}) {
    STRATUM_ASSIGN_OR_RETURN(const bool set, keras::ParseBool(named, *config, key, false));
    if (set) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, " sets ", key,
                       " to true, but a model's input takes a dense row of ids: remove it (and "
                       "set output_sequence_length)"));
    }
  }
  STRATUM_ASSIGN_OR_RETURN(out->standardize_, ParseStandardize(named, *config));
  STRATUM_ASSIGN_OR_RETURN(out->split_, ParseSplit(named, *config));
  STRATUM_ASSIGN_OR_RETURN(out->ngram_widths_, ParseNgrams(named, *config));
  if (const json* length = Find(*config, "output_sequence_length");
      length != nullptr && !length->is_null()) {
    if (!length->is_number_integer() || length->get<int64_t>() < 1 ||
        length->get<int64_t>() > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, " has output_sequence_length ", Dump(*length),
                       ": give the ids per text, from 1 to 2^20, or null"));
    }
    out->output_sequence_length_ = length->get<int64_t>();
  }
  // Its lookup: Keras' StringLookup(mask_token="") with the layer's vocabulary.
  json lookup = {{"mask_token", ""}};
  for (const char* key : {"vocabulary", "max_tokens", "idf_weights", "encoding"}) {
    if (const json* value = Find(*config, key)) lookup[key] = *value;
  }
  if (lookup.contains("vocabulary") && lookup["vocabulary"].is_null()) lookup.erase("vocabulary");
  STRATUM_ASSIGN_OR_RETURN(
      out->lookup_, TokenLookup::FromConfig(TokenLookup::Kind::kString, lookup, named, options));
  return std::shared_ptr<const TextVectorizer>(std::move(out));
}

std::vector<std::string> TextVectorizer::Tokens(absl::string_view text) const {
  std::string standard(text);
  if (standardize_ == Standardize::kLower ||
      standardize_ == Standardize::kLowerAndStripPunctuation) {
    absl::AsciiStrToLower(&standard);
  }
  if (standardize_ == Standardize::kStripPunctuation ||
      standardize_ == Standardize::kLowerAndStripPunctuation) {
    standard.erase(std::remove_if(standard.begin(), standard.end(),
                                  [](char c) { return absl::ascii_ispunct(c); }),
                   standard.end());
  }
  std::vector<std::string> tokens;
  switch (split_) {
    case Split::kNone:
      tokens.push_back(std::move(standard));
      break;
    case Split::kCharacter:
      SplitCharacters(standard, tokens);
      break;
    case Split::kWhitespace:
      for (size_t i = 0; i < standard.size();) {
        while (i < standard.size() && absl::ascii_isspace(standard[i])) ++i;
        const size_t start = i;
        while (i < standard.size() && !absl::ascii_isspace(standard[i])) ++i;
        if (i > start) tokens.push_back(standard.substr(start, i - start));
      }
      break;
  }
  if (ngram_widths_.empty()) return tokens;
  std::vector<std::string> grams;
  for (int width : ngram_widths_) {
    const auto w = static_cast<size_t>(width);
    for (size_t start = 0; start + w <= tokens.size(); ++start) {
      grams.push_back(absl::StrJoin(tokens.begin() + start, tokens.begin() + start + w, " "));
    }
  }
  return grams;
}

void TextVectorizer::Vectorize(absl::string_view text, int64_t length, float* out) const {
  const std::vector<std::string> tokens = Tokens(text);
  const auto used = std::min<int64_t>(length, static_cast<int64_t>(tokens.size()));
  for (int64_t i = 0; i < used; ++i) out[i] = static_cast<float>(lookup_->Index(tokens[i]));
  std::fill(out + used, out + length, 0.0f);
}

}  // namespace stratum
