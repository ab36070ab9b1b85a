#include "stratum/model/auc.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace stratum {
namespace {

// Keras' thresholds, as float32.
const std::array<float, AucCounts::kThresholds>& Thresholds() {
  static const std::array<float, AucCounts::kThresholds> thresholds = [] {
    std::array<float, AucCounts::kThresholds> t{};
    constexpr double kEpsilon = 1e-7;
    t[0] = static_cast<float>(0.0 - kEpsilon);
    for (int i = 1; i < AucCounts::kThresholds - 1; ++i) {
      t[i] = static_cast<float>(i * 1.0 / (AucCounts::kThresholds - 1));
    }
    t[AucCounts::kThresholds - 1] = static_cast<float>(1.0 + kEpsilon);
    return t;
  }();
  return thresholds;
}

}  // namespace

void AucCounts::Add(float probability, bool positive) {
  if (positives_.empty()) {
    positives_.assign(kBuckets, 0);
    negatives_.assign(kBuckets, 0);
  }
  // The thresholds a prediction exceeds; NaN exceeds none, as in Keras' comparison.
  const auto& t = Thresholds();
  const auto exceeded =
      std::isnan(probability) ? 0 : std::lower_bound(t.begin(), t.end(), probability) - t.begin();
  (positive ? positives_ : negatives_)[static_cast<size_t>(exceeded)] += 1;
}

void AucCounts::Merge(const AucCounts& other) {
  if (other.empty()) return;
  if (empty()) {
    *this = other;
    return;
  }
  for (int b = 0; b < kBuckets; ++b) {
    positives_[static_cast<size_t>(b)] += other.positives_[static_cast<size_t>(b)];
    negatives_[static_cast<size_t>(b)] += other.negatives_[static_cast<size_t>(b)];
  }
}

double AucCounts::Auc() const {
  if (empty()) return 0;
  // tp[i], fp[i]: the examples whose prediction exceeds threshold i, i.e. falls in a bucket
  // above i.
  std::array<double, kThresholds> tp{}, fp{};
  double above_positive = 0, above_negative = 0;
  for (int i = kThresholds - 1; i >= 0; --i) {
    above_positive += static_cast<double>(positives_[static_cast<size_t>(i + 1)]);
    above_negative += static_cast<double>(negatives_[static_cast<size_t>(i + 1)]);
    tp[static_cast<size_t>(i)] = above_positive;
    fp[static_cast<size_t>(i)] = above_negative;
  }
  double all_positive = above_positive + static_cast<double>(positives_[0]);
  double all_negative = above_negative + static_cast<double>(negatives_[0]);
  if (all_positive == 0 || all_negative == 0) return 0;
  double area = 0;
  for (int i = 0; i + 1 < kThresholds; ++i) {
    const double recall = tp[static_cast<size_t>(i)] / all_positive;
    const double next_recall = tp[static_cast<size_t>(i + 1)] / all_positive;
    const double fp_rate = fp[static_cast<size_t>(i)] / all_negative;
    const double next_fp_rate = fp[static_cast<size_t>(i + 1)] / all_negative;
    area += (fp_rate - next_fp_rate) * (recall + next_recall) / 2;
  }
  return area;
}

std::vector<double> AucCounts::Values() const {
  if (empty()) return {};
  std::vector<double> values(positives_.begin(), positives_.end());
  values.insert(values.end(), negatives_.begin(), negatives_.end());
  return values;
}

AucCounts AucCounts::FromValues(const double* values, int64_t size) {
  AucCounts counts;
  if (size != 2 * kBuckets) return counts;
  counts.positives_.resize(kBuckets);
  counts.negatives_.resize(kBuckets);
  for (int b = 0; b < kBuckets; ++b) {
    counts.positives_[static_cast<size_t>(b)] = std::llround(values[b]);
    counts.negatives_[static_cast<size_t>(b)] = std::llround(values[kBuckets + b]);
  }
  return counts;
}

}  // namespace stratum
