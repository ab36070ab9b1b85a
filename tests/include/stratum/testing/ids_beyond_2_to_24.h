// A job whose classes only exact ids tell apart: each example is 4 ids 2^25 + 4k + c, for the
// example's class c in [0, 4) and k drawn from [0, 64), read by an Embedding of 2^25 + 256
// rows. As float32 values, 2^25 + 4k + 1, + 2 and + 3 fall on 2^25 + 4k or 2^25 + 4k + 4, the
// rows of other classes, and accuracy could not pass about 0.5; as int32 ids it reaches 1.
// The integration tests of the strategies that take tables by rows train it.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "stratum/data/convert.h"
#include "stratum/data/dataset.h"
#include "stratum/testing/local_cluster.h"

namespace stratum::testing {

// Writes `n` such examples as int64 features "ids" and "label" of a TFRecord file; its path.
inline std::string WriteIdsBeyond2To24(const std::string& name, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids, labels;
  for (int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<int64_t>(rng() % 4);
    for (int s = 0; s < 4; ++s) {
      ids.push_back((int64_t{1} << 25) + 4 * static_cast<int64_t>(rng() % 64) + c);
    }
    labels.push_back(c);
  }
  ConvertOptions options;
  options.out_prefix = TempPath(name);
  options.input_key = "ids";
  auto files =
      WriteTFRecordShards(Dataset::FromTensorSlices({Tensor::FromVector<int64_t>({n, 4}, ids),
                                                     Tensor::FromVector<int64_t>({n}, labels)}),
                          n, options);
  EXPECT_TRUE(files.ok()) << files.status();
  return files.ok() ? files->front() : "";
}

// The job on 2,000 training and 500 test examples (4 epochs of batch 50, SGD) under
// `strategy`.
inline nlohmann::json IdsBeyond2To24Job(nlohmann::json strategy) {
  const nlohmann::json features = {
      {"ids", {{"type", "FixedLenFeature"}, {"dtype", "int64"}, {"shape", {4}}}},
      {"label",
       {{"type", "FixedLenFeature"}, {"dtype", "int64"}, {"shape", nlohmann::json::array()}}}};
  auto source = [&](const std::string& file) {
    return nlohmann::json{
        {"format", "tfrecord"}, {"files", {file}}, {"features", features}, {"label_key", "label"}};
  };
  const nlohmann::json layers = {
      {{"class_name", "InputLayer"},
       {"config", {{"batch_input_shape", {nullptr, 4}}, {"dtype", "int64"}}}},
      {{"class_name", "Embedding"},
       {"config", {{"name", "table"}, {"input_dim", (int64_t{1} << 25) + 256}, {"output_dim", 2}}}},
      {{"class_name", "GlobalAveragePooling1D"}, {"config", nlohmann::json::object()}},
      {{"class_name", "Dense"}, {"config", {{"units", 4}}}}};
  return {
      {"strategy", std::move(strategy)},
      {"model",
       {{"class_name", "Sequential"}, {"config", {{"name", "big_ids"}, {"layers", layers}}}}},
      {"compile",
       {{"optimizer", {{"class_name", "SGD"}, {"config", {{"learning_rate", 2.0}}}}},
        {"loss",
         {{"class_name", "SparseCategoricalCrossentropy"}, {"config", {{"from_logits", true}}}}},
        {"metrics", {"accuracy"}}}},
      {"data",
       {{"train", source(WriteIdsBeyond2To24("big_ids_train", 2000, 1))},
        {"test", source(WriteIdsBeyond2To24("big_ids_test", 500, 2))}}},
      {"fit", {{"epochs", 4}, {"batch_size_per_replica", 50}, {"seed", 1}}}};
}

}  // namespace stratum::testing
