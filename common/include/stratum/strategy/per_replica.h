// PerReplica<T>: one value per replica of a strategy, as tf.distribute's PerReplica.
// A plain value type.
#pragma once

#include <utility>
#include <vector>

namespace stratum {

template <typename T>
class PerReplica {
 public:
  PerReplica() = default;
  explicit PerReplica(std::vector<T> values) : values_(std::move(values)) {}

  int size() const { return static_cast<int>(values_.size()); }
  T& operator[](int replica) { return values_[static_cast<size_t>(replica)]; }
  const T& operator[](int replica) const { return values_[static_cast<size_t>(replica)]; }
  const std::vector<T>& values() const { return values_; }
  std::vector<T>& values() { return values_; }

 private:
  std::vector<T> values_;
};

}  // namespace stratum
