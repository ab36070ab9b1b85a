// Keras' AUC metric (tf.keras.metrics.AUC() with its defaults: the ROC curve, 200
// thresholds, summation "interpolation"), kept as counts that add up over replicas, workers
// and steps: for each prediction, how many of Keras' thresholds it exceeds (0 to 200), for
// the positive and the negative examples apart. Keras' thresholds are 0 - 1e-7, i / 199 for
// i = 1..198, and 1 + 1e-7, compared in float32 (prediction > threshold) as Keras compares
// them, so the counts give Keras' true and false positives at every threshold exactly.
//
// Thread safety: a plain value.
#pragma once

#include <cstdint>
#include <vector>

namespace stratum {

class AucCounts {
 public:
  static constexpr int kThresholds = 200;
  // Buckets per class: a prediction exceeds 0 to kThresholds thresholds.
  static constexpr int kBuckets = kThresholds + 1;

  // Whether any example was counted (a model without one sigmoid output counts none).
  bool empty() const { return positives_.empty(); }
  // One example: its predicted probability and whether its label is positive.
  void Add(float probability, bool positive);
  void Merge(const AucCounts& other);
  // Keras' result: the area under the ROC curve by the trapezoidal rule over the
  // thresholds; 0 with no positives or no negatives (Keras' divide_no_nan).
  double Auc() const;

  // The counts as 2 * kBuckets numbers (positives, then negatives), and back: how they
  // travel between processes and into checkpoints. FromValues of an empty list is empty.
  std::vector<double> Values() const;
  static AucCounts FromValues(const double* values, int64_t size);

 private:
  std::vector<int64_t> positives_;  // kBuckets, or empty
  std::vector<int64_t> negatives_;
};

}  // namespace stratum
