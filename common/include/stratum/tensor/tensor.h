// Tensor: a dense, row-major, CPU array of one dtype, in a 64-byte aligned buffer.
// Copies of a Tensor share the buffer (cheap; like TensorFlow's tensors, a value handed
// around); Clone() makes an independent one. Reshape and row slices (SliceRows) share the
// buffer too. Eigen views (Matrix(), Flat()) map the buffer without copying.
//
// Thread safety: a Tensor is not synchronized; tensors that share a buffer must not be
// written from two threads at once. Distinct buffers are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stratum {

enum class DType : int { kFloat32 = 1, kInt32 = 2, kInt64 = 3, kUInt8 = 4 };

// "float32", "int32", "int64", "uint8".
const char* DTypeName(DType dtype);
absl::StatusOr<DType> DTypeFromName(absl::string_view name);
size_t DTypeSize(DType dtype);

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType DTypeOf<uint8_t>() {
  return DType::kUInt8;
}

class Shape {
 public:
  Shape() = default;  // a scalar
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return dims_[static_cast<size_t>(i)]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t num_elements() const;
  // The shape with the first dimension replaced.
  Shape WithFirstDim(int64_t first) const;
  // "[64, 784]"
  std::string ToString() const;

  friend bool operator==(const Shape&, const Shape&) = default;

 private:
  std::vector<int64_t> dims_;
};

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// Unaligned: row slices start anywhere in the buffer.
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
template <typename T>
using FlatMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstFlatMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

class Tensor {
 public:
  Tensor() = default;  // an empty float32 scalar-less tensor; valid() is false
  // Zero-filled.
  Tensor(DType dtype, Shape shape);
  template <typename T>
  static Tensor FromVector(Shape shape, const std::vector<T>& values);
  static Tensor Scalar(float value);
  // A tensor over `data` (byte_size() bytes, aligned for `dtype`), which `owner` keeps
  // alive for as long as any copy of the tensor lives: memory a transport received into,
  // handed over without a copy. Not zero-filled.
  static Tensor FromBuffer(DType dtype, Shape shape, std::shared_ptr<void> owner, void* data);

  bool valid() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t num_elements() const { return shape_.num_elements(); }
  size_t byte_size() const { return static_cast<size_t>(num_elements()) * DTypeSize(dtype_); }
  // Rows along axis 0 and the elements per row (1 for a vector).
  int64_t rows() const { return shape_.rank() == 0 ? 1 : shape_.dim(0); }
  int64_t row_size() const;

  // Typed access; the dtype must match (checked in debug builds).
  template <typename T>
  T* data();
  template <typename T>
  const T* data() const;
  void* raw_data() { return raw_; }
  const void* raw_data() const { return raw_; }

  // float32 views: as a rows x row_size matrix, and as a flat array.
  MatrixMap Matrix();
  ConstMatrixMap Matrix() const;
  template <typename T = float>
  FlatMap<T> Flat() {
    return FlatMap<T>(data<T>(), num_elements());
  }
  template <typename T = float>
  ConstFlatMap<T> Flat() const {
    return ConstFlatMap<T>(data<T>(), num_elements());
  }

  // Same buffer, new shape with as many elements.
  absl::StatusOr<Tensor> Reshape(Shape shape) const;
  // Rows [begin, end) of axis 0, sharing the buffer.
  Tensor SliceRows(int64_t begin, int64_t end) const;
  // An independent copy.
  Tensor Clone() const;
  // Copies `other` (same dtype and element count) into this tensor's buffer.
  void CopyFrom(const Tensor& other);
  // Sets every element to zero.
  void SetZero();

  // Whether two tensors have the same dtype, shape and bytes.
  bool BitwiseEqual(const Tensor& other) const;
  // "float32[64, 784]"
  std::string DebugString() const;

 private:
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  std::shared_ptr<void> buffer_;  // owns the aligned allocation
  void* raw_ = nullptr;           // first element (may be inside buffer_ for slices)
};

template <typename T>
T* Tensor::data() {
  return static_cast<T*>(raw_);
}
template <typename T>
const T* Tensor::data() const {
  return static_cast<const T*>(raw_);
}

template <typename T>
Tensor Tensor::FromVector(Shape shape, const std::vector<T>& values) {
  Tensor tensor(DTypeOf<T>(), std::move(shape));
  std::copy(values.begin(),
            values.begin() +
                std::min<int64_t>(tensor.num_elements(), static_cast<int64_t>(values.size())),
            tensor.data<T>());
  return tensor;
}

// Concatenates tensors of the same dtype and row shape along axis 0.
absl::StatusOr<Tensor> ConcatRows(const std::vector<Tensor>& parts);

// Whether every float32 element of `tensor` (of `tensors`) is finite: no NaN, no infinity.
// Tensors of other dtypes are finite by nature.
bool AllFinite(const Tensor& tensor);
bool AllFinite(const std::vector<Tensor>& tensors);

}  // namespace stratum
