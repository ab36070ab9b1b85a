// A synthetic click-through data set whose best reachable AUC is known (issue 31's "Scale"
// workload): each example has `fields` categorical fields of Zipf(1.1)-distributed ids
// (1..ids_per_field), each (field, id) hashed into one table of `rows` rows; the label is
// drawn from a planted logistic model, sigmoid(bias + sum over the fields of the weight of
// the example's (field, id)), the weights N(0, weight_sd) fixed by a hash of (field, id). The
// AUC of the planted probabilities on the test examples is the best any model can reach
// there; it is printed with the files. Written as TFRecord shards of tf.train.Example:
// "ids" (int64 [fields], the table rows) and "label" (int64 0/1), so that a job reads them
// with an Embedding of `rows` rows (examples/ctr.json).
//
//   build/bin/ctr_data --out examples/data/ctr [--rows 8388608] [--train 1000000]
//                      [--test 100000] [--shards 4] [--seed 1]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "proto/example.pb.h"
#include "stratum/data/tfrecord.h"
#include "stratum/model/auc.h"
#include "stratum/util/flags.h"
#include "stratum/util/status_macros.h"

ABSL_FLAG(std::string, out, "", "The folder the shards go into");
ABSL_FLAG(int64_t, rows, int64_t{1} << 23, "Rows of the table the (field, id) pairs hash into");
ABSL_FLAG(int, fields, 26, "Categorical fields per example");
ABSL_FLAG(int64_t, ids_per_field, int64_t{1} << 22, "Ids of each field (Zipf over 1..this)");
ABSL_FLAG(double, zipf, 1.1, "The Zipf exponent of the ids");
ABSL_FLAG(double, weight_sd, 0.25, "Standard deviation of the planted weights");
ABSL_FLAG(double, bias, -1.0, "The planted model's bias (sets the share of positives)");
ABSL_FLAG(int64_t, train, 1000000, "Training examples");
ABSL_FLAG(int64_t, test, 100000, "Test examples");
ABSL_FLAG(int, shards, 4, "Training shards");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the ids and labels (the planted weights are fixed)");

namespace stratum {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Zipf(s) over 1..n by inverting its CDF, tabulated once.
class Zipf {
 public:
  Zipf(int64_t n, double s) : cdf_(static_cast<size_t>(n)) {
    double sum = 0;
    for (int64_t k = 1; k <= n; ++k) cdf_[static_cast<size_t>(k - 1)] = sum += std::pow(k, -s);
    for (double& c : cdf_) c /= sum;
  }
  int64_t operator()(std::mt19937_64& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return (std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin()) + 1;
  }

 private:
  std::vector<double> cdf_;
};

// The planted weight of (field, id): N(0, sd) from a hash, the same in every run.
double Weight(int field, int64_t id, double sd) {
  const uint64_t h =
      Mix(Mix(static_cast<uint64_t>(field) * 0x100000001b3ULL) ^ static_cast<uint64_t>(id));
  const double u1 = (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = (static_cast<double>(Mix(h) >> 11) + 0.5) / 9007199254740992.0;
  return sd * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
}

// The AUC of `scores` for `labels`: the share of positive-negative pairs ordered right, ties
// half (Mann-Whitney).
double ExactAuc(const std::vector<double>& scores, const std::vector<int>& labels) {
  std::vector<size_t> order(scores.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double negatives_below = 0, pairs_right = 0, positives = 0, negatives = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    double tie_positives = 0, tie_negatives = 0;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) {
      (labels[order[j]] != 0 ? tie_positives : tie_negatives) += 1;
      ++j;
    }
    pairs_right += tie_positives * (negatives_below + tie_negatives / 2);
    negatives_below += tie_negatives;
    positives += tie_positives;
    negatives += tie_negatives;
    i = j;
  }
  return positives > 0 && negatives > 0 ? pairs_right / (positives * negatives) : 0;
}

struct Written {
  int64_t positives = 0;
  std::vector<double> probabilities;
  std::vector<int> labels;
};

absl::Status WriteShard(const std::string& path, int64_t count, const Zipf& zipf,
                        std::mt19937_64& rng, Written& written) {
  STRATUM_ASSIGN_OR_RETURN(auto writer, TFRecordWriter::Open(path, Compression::kNone));
  const int fields = absl::GetFlag(FLAGS_fields);
  const auto rows = static_cast<uint64_t>(absl::GetFlag(FLAGS_rows));
  const double sd = absl::GetFlag(FLAGS_weight_sd);
  tensorflow::Example example;
  auto& features = *example.mutable_features()->mutable_feature();
  for (int64_t e = 0; e < count; ++e) {
    auto& ids = *features["ids"].mutable_int64_list();
    ids.Clear();
    double logit = absl::GetFlag(FLAGS_bias);
    for (int f = 0; f < fields; ++f) {
      const int64_t id = zipf(rng);
      logit += Weight(f, id, sd);
      ids.add_value(static_cast<int64_t>(
          Mix((static_cast<uint64_t>(f) << 40) ^ static_cast<uint64_t>(id)) % rows));
    }
    const double p = 1 / (1 + std::exp(-logit));
    const int label = std::uniform_real_distribution<double>(0, 1)(rng) < p ? 1 : 0;
    auto& labels = *features["label"].mutable_int64_list();
    labels.Clear();
    labels.add_value(label);
    written.positives += label;
    written.probabilities.push_back(p);
    written.labels.push_back(label);
    STRATUM_RETURN_IF_ERROR(writer->Write(example.SerializeAsString()));
  }
  return writer->Close();
}

int Main() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "ctr_data: give --out, the folder to write into\n");
    return 2;
  }
  std::filesystem::create_directories(out);
  const Zipf zipf(absl::GetFlag(FLAGS_ids_per_field), absl::GetFlag(FLAGS_zipf));
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const int shards = absl::GetFlag(FLAGS_shards);
  const int64_t train = absl::GetFlag(FLAGS_train);
  Written training, test;
  for (int s = 0; s < shards; ++s) {
    const std::string path = absl::StrFormat("%s/train-%05d-of-%05d.tfrecord", out, s, shards);
    const int64_t count = train * (s + 1) / shards - train * s / shards;
    if (absl::Status status = WriteShard(path, count, zipf, rng, training); !status.ok()) {
      std::fprintf(stderr, "ctr_data: %s\n", std::string(status.message()).c_str());
      return 1;
    }
  }
  if (absl::Status status =
          WriteShard(out + "/test.tfrecord", absl::GetFlag(FLAGS_test), zipf, rng, test);
      !status.ok()) {
    std::fprintf(stderr, "ctr_data: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  AucCounts keras;
  for (size_t i = 0; i < test.labels.size(); ++i) {
    keras.Add(static_cast<float>(test.probabilities[i]), test.labels[i] != 0);
  }
  const nlohmann::json summary = {{"out", out},
                                  {"rows", absl::GetFlag(FLAGS_rows)},
                                  {"fields", absl::GetFlag(FLAGS_fields)},
                                  {"train", train},
                                  {"test", absl::GetFlag(FLAGS_test)},
                                  {"train_positive_rate", static_cast<double>(training.positives) /
                                                              std::max<int64_t>(train, 1)},
                                  {"best_test_auc", ExactAuc(test.probabilities, test.labels)},
                                  {"best_test_auc_keras", keras.Auc()}};
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv,
                            "ctr_data: a synthetic click-through data set with a planted "
                            "logistic model, as TFRecord shards");
  return stratum::Main();
}
