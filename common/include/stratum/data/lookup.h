// TokenLookup: Keras' StringLookup and IntegerLookup (output_mode "int"), tokens to the
// indices an Embedding looks up, numbered as Keras numbers them: the mask token (when
// mask_token is set) at 0, then num_oov_indices indices for tokens outside the vocabulary,
// then the vocabulary in its order. A token outside the vocabulary goes to one of the
// out-of-vocabulary indices: a string by tf.strings.to_hash_bucket_fast (FarmHash's
// Fingerprint64 modulo num_oov_indices), an integer by floormod. With num_oov_indices 0 it
// gives -1, which an Embedding looks up as zeros (Keras fails the step).
//
// The vocabulary is the config's list or a file of one token a line (the whole line, a
// trailing '\r' dropped); Stratum does not adapt() one. A list that begins with the special
// tokens (the mask token, then the OOV token once per OOV index), as get_vocabulary()
// returns it, has them taken as such, as Keras' set_vocabulary does.
//
// Where it runs: the IntegerLookup layer of a model uses it, and a job's data sources apply
// either layer to a feature before batching ("preprocess" in the job file), as the
// ParameterServerStrategy tutorial's dataset.map applies its StringLookup layers: Stratum's
// tensors hold numbers, so strings become ids while the data is read.
//
// Thread safety: immutable after creation.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace stratum {

class TokenLookup {
 public:
  enum class Kind { kString, kInteger };

  struct Options {
    // A vocabulary file's relative path is taken from here (the job file's folder).
    std::string base_dir;
    // Integer tokens (vocabulary and mask_token) must lie within +-this: the IntegerLookup
    // layer's tokens travel as int32 id words (stratum/device/device.h).
    int64_t max_abs_integer_token = std::numeric_limits<int64_t>::max();
  };

  // A Keras layer as model.to_json() writes it: {"class_name": "StringLookup" or
  // "IntegerLookup", "config": {...}}. `where` names it in errors.
  static absl::StatusOr<std::shared_ptr<const TokenLookup>> FromKerasLayer(
      const nlohmann::json& layer, const std::string& where, const Options& options);
  // The layer's config alone.
  static absl::StatusOr<std::shared_ptr<const TokenLookup>> FromConfig(Kind kind,
                                                                       const nlohmann::json& config,
                                                                       const std::string& where,
                                                                       const Options& options);

  Kind kind() const { return kind_; }
  // "StringLookup", "IntegerLookup"
  const char* class_name() const;
  // The index of a token (of a lookup of that kind).
  int64_t Index(absl::string_view token) const;
  int64_t Index(int64_t token) const;
  // Where a value that is no token at all goes (an IntegerLookup layer given a fraction or
  // NaN): the first out-of-vocabulary index, or -1 without one.
  int64_t NonTokenIndex() const { return num_oov_ > 0 ? first_oov_ : -1; }
  // The largest magnitude of an integer lookup's tokens (vocabulary and mask token); 0 for a
  // string lookup.
  int64_t LargestIntegerToken() const;
  // Keras' vocabulary_size(): the mask, out-of-vocabulary and vocabulary indices in all.
  int64_t vocabulary_size() const { return first_token_ + tokens_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };

  explicit TokenLookup(Kind kind) : kind_(kind) {}
  int64_t OutOfVocabulary(uint64_t bucket_source) const;

  Kind kind_;
  int64_t num_oov_ = 1;
  int64_t first_oov_ = 0;    // 1 with a mask token, else 0
  int64_t first_token_ = 1;  // first_oov_ + num_oov_
  int64_t tokens_ = 0;
  std::optional<std::string> string_mask_;
  std::optional<int64_t> integer_mask_;
  std::unordered_map<std::string, int64_t, Hash, std::equal_to<>> strings_;
  std::unordered_map<int64_t, int64_t> integers_;
};

}  // namespace stratum
