#include "stratum/data/lookup.h"

#include <farmhash.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/model/keras_config.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using keras::Dump;
using keras::Find;
using json = nlohmann::json;

// A token of either kind, as read from the config or a vocabulary file.
struct Token {
  std::string text;
  int64_t integer = 0;
  bool operator==(const Token& other) const {
    return text == other.text && integer == other.integer;
  }
};

const char* ClassName(TokenLookup::Kind kind) {
  return kind == TokenLookup::Kind::kString ? "StringLookup" : "IntegerLookup";
}

absl::StatusOr<Token> ConfigToken(TokenLookup::Kind kind, const std::string& where,
                                  const json& value, const std::string& what,
                                  const TokenLookup::Options& options) {
  if (kind == TokenLookup::Kind::kString) {
    if (!value.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has ", what, " ", Dump(value),
                                                     ", which is not a string: StringLookup "
                                                     "takes string tokens"));
    }
    return Token{value.get<std::string>(), 0};
  }
  if (!value.is_number_integer() ||
      std::abs(value.get<int64_t>()) > options.max_abs_integer_token) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has ", what, " ", Dump(value), ", which is not an integer token",
        options.max_abs_integer_token < (int64_t{1} << 62)
            ? absl::StrCat(" within +-", options.max_abs_integer_token,
                           " (a model's tokens travel as int32): use such integers, or hash "
                           "larger ones into that range")
            : ": use integers"));
  }
  return Token{"", value.get<int64_t>()};
}

// The vocabulary: the config's list, or the file it names (one token a line), and whether it
// came from a file (Keras looks for the special tokens only in a list).
absl::StatusOr<std::pair<std::vector<Token>, bool>> Vocabulary(
    TokenLookup::Kind kind, const std::string& where, const json& config,
    const TokenLookup::Options& options) {
  const json* vocabulary = Find(config, "vocabulary");
  if (vocabulary == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        " has no vocabulary, and Stratum does not adapt() one: give \"vocabulary\" as a list of "
        "tokens or the path of a file with one token a line"));
  }
  std::vector<Token> tokens;
  if (vocabulary->is_array()) {
    for (const json& token : *vocabulary) {
      STRATUM_ASSIGN_OR_RETURN(Token value,
                               ConfigToken(kind, where, token, "vocabulary token", options));
      tokens.push_back(std::move(value));
    }
    return std::make_pair(std::move(tokens), false);
  }
  if (!vocabulary->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has vocabulary ", Dump(*vocabulary),
                                                   ": give a list of tokens or a file path"));
  }
  std::string path = vocabulary->get<std::string>();
  if (!path.empty() && path[0] != '/' && !options.base_dir.empty()) {
    path = absl::StrCat(options.base_dir, "/", path);
  }
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(absl::StrCat(where, "'s vocabulary file ", path,
                                            " cannot be read: check the path (one token a line)"));
  }
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (kind == TokenLookup::Kind::kString) {
      tokens.push_back(Token{line, 0});
      continue;
    }
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    int64_t value = 0;
    if (!absl::SimpleAtoi(text, &value) || std::abs(value) > options.max_abs_integer_token) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "'s vocabulary file ", path, " has \"", text, "\" on line ", number,
                       ", which is not an integer token",
                       options.max_abs_integer_token < (int64_t{1} << 62)
                           ? absl::StrCat(" within +-", options.max_abs_integer_token)
                           : std::string(),
                       ": one integer a line"));
    }
    tokens.push_back(Token{"", value});
  }
  return std::make_pair(std::move(tokens), true);
}

std::string Describe(TokenLookup::Kind kind, const Token& token) {
  return kind == TokenLookup::Kind::kString ? absl::StrCat("\"", token.text, "\"")
                                            : absl::StrCat(token.integer);
}

}  // namespace

const char* TokenLookup::class_name() const { return ClassName(kind_); }

absl::StatusOr<std::shared_ptr<const TokenLookup>> TokenLookup::FromKerasLayer(
    const json& layer, const std::string& where, const Options& options) {
  const std::optional<std::string> class_name = keras::FindString(layer, "class_name");
  const json* config = Find(layer, "config");
  if (!class_name || (*class_name != "StringLookup" && *class_name != "IntegerLookup") ||
      config == nullptr || !config->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " is ", Dump(layer),
        ": give a Keras StringLookup or IntegerLookup layer as model.to_json() writes it, e.g. "
        "{\"class_name\": \"StringLookup\", \"config\": {\"vocabulary\": [\"a\", \"b\"]}}"));
  }
  return FromConfig(*class_name == "StringLookup" ? Kind::kString : Kind::kInteger, *config,
                    absl::StrCat(where, " (", *class_name, ")"), options);
}

absl::StatusOr<std::shared_ptr<const TokenLookup>> TokenLookup::FromConfig(Kind kind,
                                                                           const json& config,
                                                                           const std::string& where,
                                                                           const Options& options) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(
      where, config,
      {"max_tokens", "num_oov_indices", "mask_token", "oov_token", "vocabulary", "vocabulary_dtype",
       "idf_weights", "invert", "output_mode", "sparse", "pad_to_max_tokens", "vocabulary_size",
       "encoding"}));
  STRATUM_RETURN_IF_ERROR(keras::RefuseSet(where, config, {"idf_weights"}));
  for (const char* key : {"invert", "sparse", "pad_to_max_tokens"}) {
    STRATUM_ASSIGN_OR_RETURN(const bool set, keras::ParseBool(where, config, key, false));
    if (set) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " sets ", key, " to true, which Stratum does not support: remove it"));
    }
  }
  if (const json* mode = Find(config, "output_mode"); mode != nullptr && *mode != "int") {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has output_mode ", Dump(*mode),
        ", which Stratum does not support: use \"int\" (indices an Embedding looks up)"));
  }
  if (const json* encoding = Find(config, "encoding");
      encoding != nullptr && *encoding != "utf-8" && *encoding != "utf8") {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has encoding ", Dump(*encoding),
        ": Stratum compares tokens as the bytes they are, as Keras does for \"utf-8\"; use it"));
  }
  std::shared_ptr<TokenLookup> lookup(new TokenLookup(kind));
  if (const json* value = Find(config, "num_oov_indices")) {
    if (!value->is_number_integer() || value->get<int64_t>() < 0 || value->get<int64_t>() > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has num_oov_indices ", Dump(*value),
                                                     ": use an integer from 0 to 1024"));
    }
    lookup->num_oov_ = value->get<int64_t>();
  }
  std::optional<Token> mask;
  if (const json* value = Find(config, "mask_token")) {
    STRATUM_ASSIGN_OR_RETURN(mask, ConfigToken(kind, where, *value, "mask_token", options));
    if (kind == Kind::kString) {
      lookup->string_mask_ = mask->text;
    } else {
      lookup->integer_mask_ = mask->integer;
    }
  }
  // Keras' defaults: "[UNK]" and -1.
  Token oov = kind == Kind::kString ? Token{"[UNK]", 0} : Token{"", -1};
  if (const json* value = Find(config, "oov_token")) {
    STRATUM_ASSIGN_OR_RETURN(oov, ConfigToken(kind, where, *value, "oov_token", options));
  }
  lookup->first_oov_ = mask ? 1 : 0;
  lookup->first_token_ = lookup->first_oov_ + lookup->num_oov_;

  STRATUM_ASSIGN_OR_RETURN(auto read, Vocabulary(kind, where, config, options));
  std::vector<Token>& vocabulary = read.first;
  size_t skip = 0;
  if (!read.second) {
    std::vector<Token> special;
    if (mask) special.push_back(*mask);
    for (int64_t i = 0; i < lookup->num_oov_; ++i) special.push_back(oov);
    if (!special.empty() && vocabulary.size() >= special.size() &&
        std::equal(special.begin(), special.end(), vocabulary.begin())) {
      skip = special.size();
    }
  }
  for (size_t i = skip; i < vocabulary.size(); ++i) {
    const Token& token = vocabulary[i];
    const int64_t index = lookup->first_token_ + static_cast<int64_t>(i - skip);
    const bool is_mask = mask && token == *mask;
    const bool added = !is_mask && (kind == Kind::kString
                                        ? lookup->strings_.emplace(token.text, index).second
                                        : lookup->integers_.emplace(token.integer, index).second);
    if (!added) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "'s vocabulary has token ", Describe(kind, token),
                       is_mask ? " (the mask_token) after its special tokens: Keras refuses it "
                                 "there too; keep the mask token out of the vocabulary, or first"
                               : " twice: Keras refuses repeated tokens too; keep each once"));
    }
  }
  lookup->tokens_ = static_cast<int64_t>(vocabulary.size() - skip);
  if (const json* max_tokens = Find(config, "max_tokens");
      max_tokens != nullptr && max_tokens->is_number_integer() &&
      lookup->vocabulary_size() > max_tokens->get<int64_t>()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has max_tokens ", Dump(*max_tokens), " but ", lookup->vocabulary_size(),
        " indices (mask, out-of-vocabulary and the vocabulary): raise max_tokens"));
  }
  return std::shared_ptr<const TokenLookup>(std::move(lookup));
}

int64_t TokenLookup::OutOfVocabulary(uint64_t bucket_source) const {
  if (num_oov_ == 0) return -1;
  return first_oov_ + static_cast<int64_t>(bucket_source % static_cast<uint64_t>(num_oov_));
}

int64_t TokenLookup::Index(absl::string_view token) const {
  if (string_mask_ && token == *string_mask_) return 0;
  if (const auto found = strings_.find(std::string_view(token.data(), token.size()));
      found != strings_.end()) {
    return found->second;
  }
  // tf.strings.to_hash_bucket_fast: Fingerprint64 modulo the buckets.
  return OutOfVocabulary(num_oov_ > 1 ? util::Fingerprint64(token.data(), token.size()) : 0);
}

int64_t TokenLookup::LargestIntegerToken() const {
  int64_t largest = integer_mask_ ? std::abs(*integer_mask_) : 0;
  for (const auto& [token, index] : integers_) largest = std::max(largest, std::abs(token));
  return largest;
}

int64_t TokenLookup::Index(int64_t token) const {
  if (integer_mask_ && token == *integer_mask_) return 0;
  if (const auto found = integers_.find(token); found != integers_.end()) return found->second;
  if (num_oov_ <= 1) return OutOfVocabulary(0);
  // Keras' floormod: never negative.
  return first_oov_ + ((token % num_oov_) + num_oov_) % num_oov_;
}

}  // namespace stratum
