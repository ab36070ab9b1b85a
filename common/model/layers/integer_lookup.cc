// IntegerLookup: integer tokens to vocabulary indices, as Keras' IntegerLookup with
// output_mode "int" numbers them: the mask token (when mask_token is set) at index 0, then
// num_oov_indices indices for tokens outside the vocabulary (a token goes to the one its
// value modulo num_oov_indices names), then the vocabulary in its order. The vocabulary is
// the layer's config (a list) or a file of one token a line; Stratum does not adapt() one.
// With num_oov_indices 0 a token outside the vocabulary gives -1, which an Embedding looks
// up as zeros (Keras fails the step).
//
// The indices are ids: an Embedding after the layer looks them up. Tokens reach the layer
// as the model's float values, exact up to 2^24. The layer has no gradient and no CUDA
// kernel (a model with it trains on the CPU, saying so).
#include <cmath>
#include <fstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

using keras::Dump;
using keras::Find;

class IntegerLookup final : public Layer {
 public:
  IntegerLookup(std::unordered_map<int64_t, int64_t> index, int64_t num_oov,
                std::optional<int64_t> mask_token)
      : index_(std::move(index)), num_oov_(num_oov), mask_token_(mask_token) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& /*where*/) override {
    per_example_ = inputs[0].num_elements();
    LayerBuild build;
    build.output = inputs[0];
    return build;
  }

  bool RunsOnGpu() const override { return false; }

  void Forward(const LayerForward& args) const override {
    const int64_t first_oov = mask_token_.has_value() ? 1 : 0;
    const int64_t count = args.batch * per_example_;
    for (int64_t i = 0; i < count; ++i) {
      const float value = args.inputs[0][i];
      const auto token = static_cast<int64_t>(value);
      int64_t out;
      if (mask_token_.has_value() && token == *mask_token_) {
        out = 0;
      } else if (const auto found = index_.find(token);
                 found != index_.end() && static_cast<float>(token) == value) {
        out = found->second;
      } else {
        // Keras' floormod for integer tokens; NaN and fractions are out of the vocabulary.
        const int64_t bucket =
            num_oov_ > 1 && std::isfinite(value) ? ((token % num_oov_) + num_oov_) % num_oov_ : 0;
        out = num_oov_ > 0 ? first_oov + bucket : -1;
      }
      args.output[i] = static_cast<float>(out);
    }
  }

  void Backward(const LayerBackward& args) const override {
    // Tokens have no gradient; a layer before this one (rare) gets zeros.
    if (args.grad_inputs[0] != nullptr && !args.accumulate[0]) {
      args.device->Zero(args.grad_inputs[0], args.batch * per_example_);
    }
  }

 private:
  const std::unordered_map<int64_t, int64_t> index_;  // token -> its index
  const int64_t num_oov_;
  const std::optional<int64_t> mask_token_;
  int64_t per_example_ = 0;
};

// An integer token of the config (exact as a float: at most 2^24 in size).
absl::StatusOr<int64_t> Token(const std::string& where, const nlohmann::json& value,
                              const std::string& what) {
  if (!value.is_number_integer() || std::abs(value.get<int64_t>()) > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has ", what, " ", Dump(value),
        ", which is not an integer token within 2^24 (tokens travel as float32): use such "
        "integers, or hash larger ones into that range"));
  }
  return value.get<int64_t>();
}

// The vocabulary: the config's list, or the file it names (one token a line).
absl::StatusOr<std::vector<int64_t>> Vocabulary(const std::string& where,
                                                const nlohmann::json& config) {
  const nlohmann::json* vocabulary = Find(config, "vocabulary");
  if (vocabulary == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        " has no vocabulary, and Stratum does not adapt() one: give \"vocabulary\" as a list of "
        "tokens or the path of a file with one token a line"));
  }
  std::vector<int64_t> tokens;
  if (vocabulary->is_array()) {
    for (const nlohmann::json& token : *vocabulary) {
      STRATUM_ASSIGN_OR_RETURN(const int64_t value, Token(where, token, "vocabulary token"));
      tokens.push_back(value);
    }
    return tokens;
  }
  if (!vocabulary->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has vocabulary ", Dump(*vocabulary),
                                                   ": give a list of tokens or a file path"));
  }
  const std::string path = vocabulary->get<std::string>();
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(absl::StrCat(where, "'s vocabulary file ", path,
                                            " cannot be read: check the path (one token a line)"));
  }
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    const absl::string_view token = absl::StripAsciiWhitespace(line);
    int64_t value = 0;
    if (!absl::SimpleAtoi(token, &value) || std::abs(value) > (int64_t{1} << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "'s vocabulary file ", path, " has \"", token, "\" on line ", number,
                       ", which is not an integer token within 2^24: one integer a line"));
    }
    tokens.push_back(value);
  }
  return tokens;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeIntegerLookup(const nlohmann::json& config,
                                                         const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(
      where, config,
      {"max_tokens", "num_oov_indices", "mask_token", "oov_token", "vocabulary", "vocabulary_dtype",
       "idf_weights", "invert", "output_mode", "sparse", "pad_to_max_tokens", "vocabulary_size"}));
  STRATUM_RETURN_IF_ERROR(keras::RefuseSet(where, config, {"idf_weights"}));
  for (const char* key : {"invert", "sparse", "pad_to_max_tokens"}) {
    STRATUM_ASSIGN_OR_RETURN(const bool set, keras::ParseBool(where, config, key, false));
    if (set) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " sets ", key, " to true, which Stratum does not support: remove it"));
    }
  }
  if (const nlohmann::json* mode = Find(config, "output_mode"); mode != nullptr && *mode != "int") {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has output_mode ", Dump(*mode),
        ", which Stratum does not support: use \"int\" (indices an Embedding looks up)"));
  }
  int64_t num_oov = 1;
  if (const nlohmann::json* value = Find(config, "num_oov_indices")) {
    if (!value->is_number_integer() || value->get<int64_t>() < 0 || value->get<int64_t>() > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has num_oov_indices ", Dump(*value),
                                                     ": use an integer from 0 to 1024"));
    }
    num_oov = value->get<int64_t>();
  }
  std::optional<int64_t> mask_token;
  if (const nlohmann::json* value = Find(config, "mask_token")) {
    STRATUM_ASSIGN_OR_RETURN(mask_token, Token(where, *value, "mask_token"));
  }
  STRATUM_ASSIGN_OR_RETURN(const std::vector<int64_t> vocabulary, Vocabulary(where, config));
  const int64_t first = (mask_token.has_value() ? 1 : 0) + num_oov;
  std::unordered_map<int64_t, int64_t> index;
  for (size_t i = 0; i < vocabulary.size(); ++i) {
    const int64_t token = vocabulary[i];
    if ((mask_token.has_value() && token == *mask_token) ||
        !index.emplace(token, first + static_cast<int64_t>(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "'s vocabulary has token ", token,
                       " twice (or as the mask_token): Keras "
                       "refuses repeated tokens too; keep each once"));
    }
  }
  if (const nlohmann::json* max_tokens = Find(config, "max_tokens");
      max_tokens != nullptr && max_tokens->is_number_integer() &&
      first + static_cast<int64_t>(vocabulary.size()) > max_tokens->get<int64_t>()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has max_tokens ", Dump(*max_tokens), " but ",
                     first + static_cast<int64_t>(vocabulary.size()),
                     " indices (mask, out-of-vocabulary and the vocabulary): raise max_tokens"));
  }
  return std::make_unique<IntegerLookup>(std::move(index), num_oov, mask_token);
}

}  // namespace stratum::layers
