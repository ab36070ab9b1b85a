// Eigen's matrix products take their packing buffers from the stack up to this size, and from
// the heap above it (128 KiB by default). The reference model's first Dense layer needs 200
// KiB; 512 KiB keeps a step free of heap allocations for layers up to about 1,000 units while
// staying far below a thread's stack (8 MiB by default). Must precede every Eigen include.
#define EIGEN_STACK_ALLOCATION_LIMIT 524288

#include <algorithm>
#include <vector>

#include <Eigen/Core>

#include "absl/container/flat_hash_map.h"

#include "common/device/onednn.h"
#include "stratum/device/device.h"
#include "stratum/tensor/tensor.h"

namespace stratum {
namespace {

using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;

// c (+)= a * b for any Eigen operands, without an aliasing temporary.
template <typename A, typename B>
void Product(const A& a, const B& b, MatrixMap c, bool accumulate) {
  if (accumulate) {
    c.noalias() += a * b;
  } else {
    c.noalias() = a * b;
  }
}

class Cpu final : public Device {
 public:
  std::string name() const override { return "CPU"; }

  void MatMul(const float* a, bool transpose_a, const float* b, bool transpose_b, int64_t m,
              int64_t n, int64_t k, float* c, bool accumulate) const override {
    const MatrixMap out(c, m, n);
    if (!transpose_a && !transpose_b) {
      Product(ConstMatrixMap(a, m, k), ConstMatrixMap(b, k, n), out, accumulate);
    } else if (transpose_a && !transpose_b) {
      Product(ConstMatrixMap(a, k, m).transpose(), ConstMatrixMap(b, k, n), out, accumulate);
    } else if (!transpose_a && transpose_b) {
      Product(ConstMatrixMap(a, m, k), ConstMatrixMap(b, n, k).transpose(), out, accumulate);
    } else {
      Product(ConstMatrixMap(a, k, m).transpose(), ConstMatrixMap(b, n, k).transpose(), out,
              accumulate);
    }
  }

  void AddBias(float* x, const float* bias, int64_t rows, int64_t width) const override {
    MatrixMap(x, rows, width).rowwise() += ConstRowVectorMap(bias, width);
  }

  void SumRows(const float* x, int64_t rows, int64_t width, float* out,
               bool accumulate) const override {
    const ConstMatrixMap in(x, rows, width);
    if (accumulate) {
      RowVectorMap(out, width) += in.colwise().sum();
    } else {
      RowVectorMap(out, width) = in.colwise().sum();
    }
  }

  void BiasActivation(ActivationKind kind, float* z, const float* bias, float* out, int64_t rows,
                      int64_t width) const override {
    if (bias != nullptr && out == z && kind == ActivationKind::kRelu) {
      // One pass: a convolution's or a Dense layer's epilogue.
      MatrixMap m(z, rows, width);
      m = (m.rowwise() + ConstRowVectorMap(bias, width)).cwiseMax(0.0f);
      return;
    }
    if (bias != nullptr) AddBias(z, bias, rows, width);
    Activation(kind, z, out, rows, width);
  }

  void ActivationGradSumRows(ActivationKind kind, const float* y, float* g, int64_t rows,
                             int64_t width, float* sums) const override {
    ActivationGrad(kind, y, g, rows, width);
    if (sums != nullptr) SumRows(g, rows, width, sums, false);
  }

  void Activation(ActivationKind kind, const float* z, float* out, int64_t rows,
                  int64_t width) const override {
    const ConstMatrixMap in(z, rows, width);
    MatrixMap o(out, rows, width);
    switch (kind) {
      case ActivationKind::kLinear:
        if (out != z) o = in;
        return;
      case ActivationKind::kRelu:
        o.array() = in.array().max(0.0f);
        return;
      case ActivationKind::kSigmoid:
        o.array() = (1.0f + (-in.array()).exp()).inverse();
        return;
      case ActivationKind::kTanh:
        o.array() = in.array().tanh();
        return;
      case ActivationKind::kSoftmax:
        for (int64_t r = 0; r < rows; ++r) {
          const float max = in.row(r).maxCoeff();
          o.row(r).array() = (in.row(r).array() - max).exp();
          o.row(r) /= o.row(r).sum();
        }
        return;
    }
  }

  void ActivationGrad(ActivationKind kind, const float* y, float* g, int64_t rows,
                      int64_t width) const override {
    const ConstMatrixMap out(y, rows, width);
    MatrixMap grad(g, rows, width);
    switch (kind) {
      case ActivationKind::kLinear:
        return;
      case ActivationKind::kRelu:
        grad.array() = (out.array() > 0.0f).select(grad.array(), 0.0f);
        return;
      case ActivationKind::kSigmoid:
        grad.array() *= out.array() * (1.0f - out.array());
        return;
      case ActivationKind::kTanh:
        grad.array() *= 1.0f - out.array().square();
        return;
      case ActivationKind::kSoftmax:
        for (int64_t r = 0; r < rows; ++r) {
          const float dot = (grad.row(r).array() * out.row(r).array()).sum();
          grad.row(r).array() = out.row(r).array() * (grad.row(r).array() - dot);
        }
        return;
    }
  }

  void Copy(const float* x, float* out, int64_t n, bool accumulate) const override {
    if (accumulate) {
      FlatMap<float>(out, n) += ConstFlatMap<float>(x, n);
    } else if (out != x) {
      FlatMap<float>(out, n) = ConstFlatMap<float>(x, n);
    }
  }

  void Multiply(const float* x, const float* y, float* out, int64_t n,
                bool accumulate) const override {
    if (accumulate) {
      FlatMap<float>(out, n) += ConstFlatMap<float>(x, n) * ConstFlatMap<float>(y, n);
    } else {
      FlatMap<float>(out, n) = ConstFlatMap<float>(x, n) * ConstFlatMap<float>(y, n);
    }
  }

  void Scale(float alpha, const float* x, float* out, int64_t n, bool accumulate) const override {
    if (accumulate) {
      FlatMap<float>(out, n) += alpha * ConstFlatMap<float>(x, n);
    } else {
      FlatMap<float>(out, n) = alpha * ConstFlatMap<float>(x, n);
    }
  }

  void Sum(const float* const* inputs, int count, float* out, int64_t n) const override {
    FlatMap<float> o(out, n);
    if (count == 1) {
      if (out != inputs[0]) o = ConstFlatMap<float>(inputs[0], n);
      return;
    }
    o = ConstFlatMap<float>(inputs[0], n) + ConstFlatMap<float>(inputs[1], n);
    for (int i = 2; i < count; ++i) o += ConstFlatMap<float>(inputs[i], n);
  }

  void Zero(float* out, int64_t n) const override { FlatMap<float>(out, n).setZero(); }

  void CopyBlocks(const float* x, int64_t x_stride, float* out, int64_t out_stride, int64_t rows,
                  int64_t width, bool accumulate) const override {
    for (int64_t r = 0; r < rows; ++r)
      Copy(x + r * x_stride, out + r * out_stride, width, accumulate);
  }

  void Conv2D(const Window2D& w, int64_t batch, const float* x, const float* kernel,
              const float* bias, float* out) const override {
    onednn::Conv2DForward(w, batch, x, kernel, bias, out);
  }

  void Conv2DBackwardData(const Window2D& w, int64_t batch, const float* grad_out,
                          const float* kernel, float* grad_x) const override {
    onednn::Conv2DBackwardData(w, batch, grad_out, kernel, grad_x);
  }

  void Conv2DBackwardWeights(const Window2D& w, int64_t batch, const float* x,
                             const float* grad_out, float* grad_kernel,
                             float* grad_bias) const override {
    onednn::Conv2DBackwardWeights(w, batch, x, grad_out, grad_kernel, grad_bias);
  }

  void MaxPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const override {
    onednn::Pool2DForward(w, batch, /*max=*/true, x, out);
  }

  void MaxPool2DBackward(const Window2D& w, int64_t batch, const float* x, const float* /*out*/,
                         const float* grad_out, float* grad_x, bool accumulate) const override {
    PoolBackward(w, batch, true, x, grad_out, grad_x, accumulate);
  }

  void AvgPool2D(const Window2D& w, int64_t batch, const float* x, float* out) const override {
    onednn::Pool2DForward(w, batch, /*max=*/false, x, out);
  }

  void AvgPool2DBackward(const Window2D& w, int64_t batch, const float* grad_out, float* grad_x,
                         bool accumulate) const override {
    PoolBackward(w, batch, false, nullptr, grad_out, grad_x, accumulate);
  }

  void SumSquaredDeviations(const float* x, const float* mean, int64_t rows, int64_t width,
                            float* out) const override {
    const ConstRowVectorMap m(mean, width);
    RowVectorMap sum(out, width);
    sum.setZero();
    for (int64_t r = 0; r < rows; ++r) {
      sum.array() += (ConstRowVectorMap(x + r * width, width) - m).array().square();
    }
  }

  void BatchNorm(const float* x, int64_t rows, int64_t width, const float* mean,
                 const float* variance, float epsilon, const float* gamma, const float* beta,
                 float* y) const override {
    // y = x * scale + shift, per channel.
    thread_local Eigen::RowVectorXf scale, shift;
    scale = (ConstRowVectorMap(variance, width).array() + epsilon).rsqrt();
    if (gamma != nullptr) scale.array() *= ConstRowVectorMap(gamma, width).array();
    shift = -ConstRowVectorMap(mean, width).cwiseProduct(scale);
    if (beta != nullptr) shift += ConstRowVectorMap(beta, width);
    for (int64_t r = 0; r < rows; ++r) {
      RowVectorMap(y + r * width, width) =
          ConstRowVectorMap(x + r * width, width).cwiseProduct(scale) + shift;
    }
  }

  void BatchNormGradSums(const float* dy, const float* x, int64_t rows, int64_t width,
                         const float* mean, const float* variance, float epsilon, float* sums,
                         float* grad_gamma, float* grad_beta) const override {
    const ConstRowVectorMap m(mean, width);
    RowVectorMap dy_sum(sums, width), dy_dev_sum(sums + width, width);
    dy_sum.setZero();
    dy_dev_sum.setZero();
    for (int64_t r = 0; r < rows; ++r) {
      const ConstRowVectorMap g(dy + r * width, width);
      dy_sum += g;
      dy_dev_sum.array() += g.array() * (ConstRowVectorMap(x + r * width, width) - m).array();
    }
    if (grad_gamma != nullptr) {
      RowVectorMap(grad_gamma, width) =
          dy_dev_sum.array() * (ConstRowVectorMap(variance, width).array() + epsilon).rsqrt();
    }
    if (grad_beta != nullptr) RowVectorMap(grad_beta, width) = dy_sum;
  }

  void BatchNormBackward(const float* dy, const float* x, int64_t rows, int64_t width,
                         const float* mean, const float* variance, float epsilon,
                         const float* gamma, const float* sums, int64_t count, float* dx,
                         bool accumulate) const override {
    // dx = k * dy (inference); in training dx = k * (dy - mean(dy) - (x - mean) * inv_std^2 *
    // mean(dy * (x - mean))), where k = gamma * inv_std: dx = k * dy + a * x + b per channel.
    thread_local Eigen::RowVectorXf inv_std, k, a, b;
    inv_std = (ConstRowVectorMap(variance, width).array() + epsilon).rsqrt();
    k = inv_std;
    if (gamma != nullptr) k.array() *= ConstRowVectorMap(gamma, width).array();
    a.setZero(width);
    b.setZero(width);
    if (sums != nullptr) {
      const float per_row = 1.0f / static_cast<float>(count);
      a = -k.array() * inv_std.array().square() * ConstRowVectorMap(sums + width, width).array() *
          per_row;
      b = -k.array() * ConstRowVectorMap(sums, width).array() * per_row -
          a.array() * ConstRowVectorMap(mean, width).array();
    }
    for (int64_t r = 0; r < rows; ++r) {
      RowVectorMap out(dx + r * width, width);
      const ConstRowVectorMap g(dy + r * width, width), in(x + r * width, width);
      if (accumulate) {
        out += g.cwiseProduct(k) + in.cwiseProduct(a) + b;
      } else {
        out = g.cwiseProduct(k) + in.cwiseProduct(a) + b;
      }
    }
  }

  void EmbeddingLookup(const float* ids, int64_t count, const float* table, int64_t rows,
                       int64_t width, float* out) const override {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t id = EmbeddingRow(ids[i], rows);
      RowVectorMap row(out + i * width, width);
      if (id < 0) {
        row.setZero();
      } else {
        row = ConstRowVectorMap(table + id * width, width);
      }
    }
  }

  void EmbeddingGrad(const float* ids, int64_t count, const float* grad_out, int64_t rows,
                     int64_t width, float* grad_table) const override {
    FlatMap<float>(grad_table, rows * width).setZero();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t id = EmbeddingRow(ids[i], rows);
      if (id >= 0) {
        RowVectorMap(grad_table + id * width, width) +=
            ConstRowVectorMap(grad_out + i * width, width);
      }
    }
  }

  void EmbeddingPositions(const float* ids, int64_t count, const int64_t* rows, int64_t num_rows,
                          float* positions) const override {
    const int64_t end = num_rows > 0 ? rows[num_rows - 1] + 1 : 0;
    // A binary search per id is a chain of mispredicted branches (over a quarter of a PS
    // worker's step on the CTR model); a hash of the rows costs an insert a row, then one
    // probe an id: 4.5x faster for a batch's ids among its own rows. Among far more rows
    // (an evaluation's given rows of a whole data set), the search stays cheaper.
    if (4 * count < num_rows) {
      for (int64_t i = 0; i < count; ++i) {
        const int64_t id = EmbeddingRow(ids[i], end);
        const int64_t* at = std::lower_bound(rows, rows + num_rows, id);
        positions[i] = IdWord(id >= 0 && at != rows + num_rows && *at == id ? at - rows : -1);
      }
      return;
    }
    absl::flat_hash_map<int64_t, int64_t> position_of;
    position_of.reserve(static_cast<size_t>(num_rows));
    for (int64_t p = 0; p < num_rows; ++p) position_of.emplace(rows[p], p);
    for (int64_t i = 0; i < count; ++i) {
      const auto found = position_of.find(EmbeddingRow(ids[i], end));
      positions[i] = IdWord(found != position_of.end() ? found->second : -1);
    }
  }

  void AverageSteps(const float* x, int64_t batch, int64_t steps, int64_t width,
                    float* out) const override {
    const float scale = 1.0f / static_cast<float>(steps);
    for (int64_t b = 0; b < batch; ++b) {
      RowVectorMap mean(out + b * width, width);
      mean.setZero();
      for (int64_t s = 0; s < steps; ++s) {
        mean += ConstRowVectorMap(x + (b * steps + s) * width, width);
      }
      mean *= scale;
    }
  }

  void AverageStepsGrad(const float* grad_out, int64_t batch, int64_t steps, int64_t width,
                        float* grad_x, bool accumulate) const override {
    const float scale = 1.0f / static_cast<float>(steps);
    for (int64_t b = 0; b < batch; ++b) {
      const ConstRowVectorMap g(grad_out + b * width, width);
      for (int64_t s = 0; s < steps; ++s) {
        RowVectorMap out(grad_x + (b * steps + s) * width, width);
        if (accumulate) {
          out += g * scale;
        } else {
          out = g * scale;
        }
      }
    }
  }

  void AverageMaskedSteps(const float* x, const float* step_ids, int64_t batch, int64_t steps,
                          int64_t width, float* out) const override {
    for (int64_t b = 0; b < batch; ++b) {
      RowVectorMap mean(out + b * width, width);
      mean.setZero();
      int64_t count = 0;
      for (int64_t s = 0; s < steps; ++s) {
        if (IdOfWord(step_ids[b * steps + s]) == 0) continue;
        mean += ConstRowVectorMap(x + (b * steps + s) * width, width);
        ++count;
      }
      if (count > 0) mean *= 1.0f / static_cast<float>(count);
    }
  }

  void AverageMaskedStepsGrad(const float* grad_out, const float* step_ids, int64_t batch,
                              int64_t steps, int64_t width, float* grad_x,
                              bool accumulate) const override {
    for (int64_t b = 0; b < batch; ++b) {
      const float* ids = step_ids + b * steps;
      const int64_t count =
          std::count_if(ids, ids + steps, [](float id) { return IdOfWord(id) != 0; });
      const float scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
      const ConstRowVectorMap g(grad_out + b * width, width);
      for (int64_t s = 0; s < steps; ++s) {
        RowVectorMap out(grad_x + (b * steps + s) * width, width);
        const float step_scale = IdOfWord(ids[s]) != 0 ? scale : 0.0f;
        if (accumulate) {
          out += g * step_scale;
        } else {
          out = g * step_scale;
        }
      }
    }
  }

  void Dropout(RandomStream& rng, float rate, const float* x, float* out, float* mask,
               int64_t n) const override {
    const float keep_scale = 1.0f / (1.0f - rate);
    for (int64_t j = 0; j < n; ++j) mask[j] = Uniform01(rng) >= rate ? keep_scale : 0.0f;
    Multiply(x, mask, out, n, false);
  }

 private:
  // oneDNN overwrites grad_x: a gradient that adds to another goes through a buffer.
  void PoolBackward(const Window2D& w, int64_t batch, bool max, const float* x,
                    const float* grad_out, float* grad_x, bool accumulate) const {
    if (!accumulate) {
      onednn::Pool2DBackward(w, batch, max, x, grad_out, grad_x);
      return;
    }
    const int64_t n = batch * w.in_h * w.in_w * w.in_c;
    thread_local std::vector<float> added;
    added.resize(static_cast<size_t>(n));
    onednn::Pool2DBackward(w, batch, max, x, grad_out, added.data());
    Copy(added.data(), grad_x, n, true);
  }
};

}  // namespace

const Device& CpuDevice() {
  static const Cpu* const kCpu = new Cpu();
  return *kCpu;
}

}  // namespace stratum
