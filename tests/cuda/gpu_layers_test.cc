// The GPU path's convolutional layers against the CPU: CudaDevice's Conv2D (cuDNN), poolings and
// batch-normalization passes against CpuDevice's on random shapes (odd sizes, strides,
// dilation, Keras' asymmetric "same" padding); a CNN with BatchNormalization trained by a
// Replica (in CUDA graphs, the convolutions planned by a discarded capture) against the CPU
// Model step for step, moving statistics included; two mirrored replicas of it staying
// bit-identical; and a Fit of it on one GPU reaching accuracy. cuDNN runs in full float32
// (allow_tf32 false) so that the comparisons can be tight. Every test skips without a GPU.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/cuda/all_reduce.h"
#include "stratum/cuda/cublas_library.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/cuda/cuda_device.h"
#include "stratum/cuda/device.h"
#include "stratum/cuda/replica.h"
#include "stratum/testing/gpu_replica.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/worker/fit.h"
#include "stratum/worker/mirrored_strategy.h"

namespace stratum::cuda {
namespace {

using testing::IdentityOrder;
using testing::InMemoryFitData;
using testing::Labels;
using testing::Rows;

std::vector<float> Random(int64_t n, std::mt19937& rng, float low = -1, float high = 1) {
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = uniform(rng);
  return v;
}

// A CudaDevice on GPU 0 with its own stream, cuBLAS handle and memory.
class GpuFixture {
 public:
  GpuFixture() : allocator_(0) {
    stream_ = *Stream::Create(0);
    cublas_library_ = *Cublas();
    STRATUM_CUBLAS_CHECK(cublas_library_->create(&cublas_));
    STRATUM_CUBLAS_CHECK(cublas_library_->set_stream(cublas_, stream_.get()));
    counters_ = *DeviceBuffer::Allocate(allocator_, sizeof(StepCounters));
    STRATUM_CUDA_CHECK(cudaMemset(counters_.data(), 0, sizeof(StepCounters)));
    device_ = *CudaDevice::Create({.device = 0,
                                   .stream = stream_.get(),
                                   .cublas = cublas_,
                                   .counters = counters_.as<StepCounters>(),
                                   .allocator = &allocator_,
                                   .allow_tf32 = false});
  }
  ~GpuFixture() {
    device_.reset();
    buffers_.clear();
    cublas_library_->destroy(cublas_);
  }

  const CudaDevice& device() const { return *device_; }
  CudaDevice& mutable_device() { return *device_; }
  cudaStream_t stream() const { return stream_.get(); }
  // A device copy of `values` (or n uninitialized floats), alive as long as the fixture.
  float* Upload(const std::vector<float>& values) {
    float* p = New(static_cast<int64_t>(values.size()));
    STRATUM_CUDA_CHECK(
        cudaMemcpy(p, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice));
    return p;
  }
  float* New(int64_t n) {
    buffers_.push_back(
        *DeviceBuffer::Allocate(allocator_, static_cast<size_t>(std::max<int64_t>(n, 1)) * 4));
    return buffers_.back().as<float>();
  }
  // Waits for the stream, checks the device's status, and copies n floats back.
  std::vector<float> Download(const float* p, int64_t n) {
    EXPECT_OK(stream_.Synchronize());
    const absl::Status status = device_->TakeStatus();
    EXPECT_TRUE(status.ok()) << status;
    std::vector<float> v(static_cast<size_t>(n));
    STRATUM_CUDA_CHECK(cudaMemcpy(v.data(), p, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  CachingAllocator allocator_;
  Stream stream_;
  const CublasLibrary* cublas_library_ = nullptr;
  cublasContext* cublas_ = nullptr;
  DeviceBuffer counters_;
  std::vector<DeviceBuffer> buffers_;
  std::unique_ptr<CudaDevice> device_;
};

// |gpu - cpu| <= tolerance * (1 + |cpu|) elementwise.
void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu,
                const std::string& what, float tolerance) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_NEAR(gpu[i], cpu[i], tolerance * (1 + std::abs(cpu[i])))
        << what << ": element " << i << " of " << cpu.size();
  }
}

struct WindowCase {
  int64_t batch, h, w, in_c, out_c;
  std::array<int64_t, 2> kernel, strides, dilation;
  bool same;
};

std::string Name(const WindowCase& c) {
  return absl::StrCat(c.batch, "x", c.h, "x", c.w, "x", c.in_c, " -> ", c.out_c, ", kernel ",
                      c.kernel[0], "x", c.kernel[1], ", strides ", c.strides[0], "x", c.strides[1],
                      ", dilation ", c.dilation[0], ", ", c.same ? "same" : "valid");
}

// Keras' output size and padding ("same": the extra row or column at the bottom or right).
Window2D WindowOf(const WindowCase& c) {
  Window2D w;
  w.in_h = c.h;
  w.in_w = c.w;
  w.in_c = c.in_c;
  w.out_c = c.out_c;
  w.kernel_h = c.kernel[0];
  w.kernel_w = c.kernel[1];
  w.stride_h = c.strides[0];
  w.stride_w = c.strides[1];
  w.dilation_h = c.dilation[0];
  w.dilation_w = c.dilation[1];
  auto axis = [&](int64_t in, int64_t k, int64_t s, int64_t d, int64_t* out, int64_t* before,
                  int64_t* after) {
    const int64_t span = (k - 1) * d + 1;
    *out = c.same ? (in + s - 1) / s : (in - span) / s + 1;
    const int64_t total = c.same ? std::max<int64_t>((*out - 1) * s + span - in, 0) : 0;
    *before = total / 2;
    *after = total - *before;
  };
  axis(c.h, w.kernel_h, w.stride_h, w.dilation_h, &w.out_h, &w.pad_top, &w.pad_bottom);
  axis(c.w, w.kernel_w, w.stride_w, w.dilation_w, &w.out_w, &w.pad_left, &w.pad_right);
  return w;
}

TEST(CudaDeviceTest, ConvolutionsMatchTheCpuOnRandomShapes) {
  SKIP_WITHOUT_GPU();
  const std::vector<WindowCase> cases = {
      {3, 9, 7, 3, 5, {3, 3}, {1, 1}, {1, 1}, false},
      {2, 8, 8, 4, 6, {3, 3}, {2, 2}, {1, 1}, true},  // one more row and column at the end
      {2, 11, 10, 2, 3, {5, 3}, {2, 3}, {1, 1}, true},
      {1, 12, 12, 3, 4, {3, 3}, {1, 1}, {2, 2}, true},
      {2, 6, 5, 3, 7, {4, 2}, {1, 1}, {1, 1}, true},  // even kernel: asymmetric
      {2, 7, 7, 16, 8, {1, 1}, {2, 2}, {1, 1}, false},
      {4, 28, 28, 1, 32, {3, 3}, {1, 1}, {1, 1}, false},  // the tutorial's first layer
  };
  std::mt19937 rng(5);
  for (const WindowCase& c : cases) {
    SCOPED_TRACE(Name(c));
    const Window2D w = WindowOf(c);
    const int64_t in = c.batch * w.in_h * w.in_w * w.in_c;
    const int64_t out = c.batch * w.out_h * w.out_w * w.out_c;
    const int64_t weights = w.kernel_h * w.kernel_w * w.in_c * w.out_c;
    const std::vector<float> x = Random(in, rng), kernel = Random(weights, rng),
                             bias = Random(w.out_c, rng), grad_out = Random(out, rng);
    std::vector<float> cpu_out(out), cpu_grad_x(in), cpu_grad_kernel(weights),
        cpu_grad_bias(w.out_c);
    const Device& cpu = CpuDevice();
    cpu.Conv2D(w, c.batch, x.data(), kernel.data(), bias.data(), cpu_out.data());
    cpu.Conv2DBackwardData(w, c.batch, grad_out.data(), kernel.data(), cpu_grad_x.data());
    cpu.Conv2DBackwardWeights(w, c.batch, x.data(), grad_out.data(), cpu_grad_kernel.data(),
                              cpu_grad_bias.data());

    GpuFixture gpu;
    float *gx = gpu.Upload(x), *gk = gpu.Upload(kernel), *gb = gpu.Upload(bias),
          *gg = gpu.Upload(grad_out);
    float *g_out = gpu.New(out), *g_grad_x = gpu.New(in), *g_grad_kernel = gpu.New(weights),
          *g_grad_bias = gpu.New(w.out_c);
    gpu.device().Conv2D(w, c.batch, gx, gk, gb, g_out);
    gpu.device().Conv2DBackwardData(w, c.batch, gg, gk, g_grad_x);
    gpu.device().Conv2DBackwardWeights(w, c.batch, gx, gg, g_grad_kernel, g_grad_bias);
    // float32 sums in another order: sums of up to a few thousand products.
    ExpectNear(gpu.Download(g_out, out), cpu_out, "output", 1e-4f);
    ExpectNear(gpu.Download(g_grad_x, in), cpu_grad_x, "input gradient", 1e-4f);
    ExpectNear(gpu.Download(g_grad_kernel, weights), cpu_grad_kernel, "kernel gradient", 5e-4f);
    ExpectNear(gpu.Download(g_grad_bias, w.out_c), cpu_grad_bias, "bias gradient", 5e-4f);
  }
}

TEST(CudaDeviceTest, PoolingsMatchTheCpuOnRandomShapes) {
  SKIP_WITHOUT_GPU();
  const std::vector<WindowCase> cases = {
      {2, 8, 8, 3, 3, {2, 2}, {2, 2}, {1, 1}, false},
      {2, 7, 7, 4, 4, {2, 2}, {2, 2}, {1, 1}, true},  // padding at the end only
      {1, 9, 6, 2, 2, {3, 3}, {1, 1}, {1, 1}, true},  // overlapping windows, padding both sides
      {3, 5, 5, 5, 5, {3, 2}, {2, 1}, {1, 1}, false},
      {2, 7, 7, 8, 8, {7, 7}, {1, 1}, {1, 1}, false},  // global
  };
  std::mt19937 rng(6);
  for (const WindowCase& c : cases) {
    SCOPED_TRACE(Name(c));
    const Window2D w = WindowOf(c);
    const int64_t in = c.batch * w.in_h * w.in_w * w.in_c;
    const int64_t out = c.batch * w.out_h * w.out_w * w.out_c;
    // Distinct values: the maximum of each window is unique.
    const std::vector<float> x = Random(in, rng), grad_out = Random(out, rng),
                             earlier = Random(in, rng);
    GpuFixture gpu;
    float *gx = gpu.Upload(x), *gg = gpu.Upload(grad_out);
    for (bool max : {true, false}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(absl::StrCat(max ? "max" : "average", accumulate ? ", accumulating" : ""));
        std::vector<float> cpu_out(out), cpu_grad = earlier;
        const Device& cpu = CpuDevice();
        float* g_out = gpu.New(out);
        float* g_grad = gpu.Upload(earlier);
        if (max) {
          cpu.MaxPool2D(w, c.batch, x.data(), cpu_out.data());
          cpu.MaxPool2DBackward(w, c.batch, x.data(), cpu_out.data(), grad_out.data(),
                                cpu_grad.data(), accumulate);
          gpu.device().MaxPool2D(w, c.batch, gx, g_out);
          gpu.device().MaxPool2DBackward(w, c.batch, gx, g_out, gg, g_grad, accumulate);
        } else {
          cpu.AvgPool2D(w, c.batch, x.data(), cpu_out.data());
          cpu.AvgPool2DBackward(w, c.batch, grad_out.data(), cpu_grad.data(), accumulate);
          gpu.device().AvgPool2D(w, c.batch, gx, g_out);
          gpu.device().AvgPool2DBackward(w, c.batch, gg, g_grad, accumulate);
        }
        ExpectNear(gpu.Download(g_out, out), cpu_out, "output", 1e-6f);
        ExpectNear(gpu.Download(g_grad, in), cpu_grad, "input gradient", 1e-6f);
      }
    }
  }
}

TEST(CudaDeviceTest, BatchNormalizationPassesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  // Few rows (one pass for SumRows), many (two passes), and a width past one 32-column tile.
  for (const auto& [rows, width] :
       std::vector<std::pair<int64_t, int64_t>>{{37, 7}, {5000, 7}, {9000, 70}, {1, 3}}) {
    SCOPED_TRACE(absl::StrCat(rows, " rows of ", width));
    const int64_t n = rows * width;
    const std::vector<float> x = Random(n, rng, -2, 3), dy = Random(n, rng),
                             gamma = Random(width, rng, 0.5, 1.5), beta = Random(width, rng),
                             earlier = Random(n, rng);
    const Device& cpu = CpuDevice();
    GpuFixture gpu;
    float *gx = gpu.Upload(x), *gdy = gpu.Upload(dy), *ggamma = gpu.Upload(gamma),
          *gbeta = gpu.Upload(beta);

    std::vector<float> mean(width), variance(width), previous = Random(width, rng);
    std::vector<float> summed = previous;
    cpu.SumRows(x.data(), rows, width, mean.data(), false);
    cpu.SumRows(x.data(), rows, width, summed.data(), true);
    float* g_mean = gpu.New(width);
    float* g_summed = gpu.Upload(previous);
    gpu.device().SumRows(gx, rows, width, g_mean, false);
    gpu.device().SumRows(gx, rows, width, g_summed, true);
    ExpectNear(gpu.Download(g_mean, width), mean, "sums", 1e-5f * std::sqrt(rows));
    ExpectNear(gpu.Download(g_summed, width), summed, "sums added", 1e-5f * std::sqrt(rows));
    for (float& m : mean) m /= static_cast<float>(rows);
    g_mean = gpu.Upload(mean);
    cpu.SumSquaredDeviations(x.data(), mean.data(), rows, width, variance.data());
    float* g_variance = gpu.New(width);
    gpu.device().SumSquaredDeviations(gx, g_mean, rows, width, g_variance);
    ExpectNear(gpu.Download(g_variance, width), variance, "squared deviations",
               1e-5f * std::sqrt(rows));
    for (float& v : variance) v /= static_cast<float>(rows);
    g_variance = gpu.Upload(variance);

    for (bool affine : {true, false}) {
      SCOPED_TRACE(affine ? "gamma and beta" : "no gamma or beta");
      const float* cg = affine ? gamma.data() : nullptr;
      const float* cb = affine ? beta.data() : nullptr;
      float* dg = affine ? ggamma : nullptr;
      float* db = affine ? gbeta : nullptr;
      std::vector<float> y(n);
      cpu.BatchNorm(x.data(), rows, width, mean.data(), variance.data(), 1e-3f, cg, cb, y.data());
      float* g_y = gpu.New(n);
      gpu.device().BatchNorm(gx, rows, width, g_mean, g_variance, 1e-3f, dg, db, g_y);
      ExpectNear(gpu.Download(g_y, n), y, "normalized", 1e-5f);

      std::vector<float> sums(2 * width), grad_gamma(width), grad_beta(width);
      cpu.BatchNormGradSums(dy.data(), x.data(), rows, width, mean.data(), variance.data(), 1e-3f,
                            sums.data(), grad_gamma.data(), grad_beta.data());
      float *g_sums = gpu.New(2 * width), *g_grad_gamma = gpu.New(width),
            *g_grad_beta = gpu.New(width);
      gpu.device().BatchNormGradSums(gdy, gx, rows, width, g_mean, g_variance, 1e-3f, g_sums,
                                     g_grad_gamma, g_grad_beta);
      const float sum_tolerance = 1e-5f * std::sqrt(static_cast<float>(rows)) * 4;
      ExpectNear(gpu.Download(g_sums, 2 * width), sums, "gradient sums", sum_tolerance);
      ExpectNear(gpu.Download(g_grad_gamma, width), grad_gamma, "gamma gradient", sum_tolerance);
      ExpectNear(gpu.Download(g_grad_beta, width), grad_beta, "beta gradient", sum_tolerance);

      // Training (the batch statistics' dependence) and inference, overwriting and adding.
      g_sums = gpu.Upload(sums);
      for (bool training : {true, false}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(absl::StrCat(training ? "training" : "inference",
                                    accumulate ? ", accumulating" : ""));
          std::vector<float> dx = earlier;
          cpu.BatchNormBackward(dy.data(), x.data(), rows, width, mean.data(), variance.data(),
                                1e-3f, cg, training ? sums.data() : nullptr, rows, dx.data(),
                                accumulate);
          float* g_dx = gpu.Upload(earlier);
          gpu.device().BatchNormBackward(gdy, gx, rows, width, g_mean, g_variance, 1e-3f, dg,
                                         training ? g_sums : nullptr, rows, g_dx, accumulate);
          ExpectNear(gpu.Download(g_dx, n), dx, "input gradient", 1e-4f);
        }
      }
    }
  }
}

TEST(CudaDeviceTest, EmbeddingOpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  struct Case {
    int64_t rows, width, count;
  };
  for (const Case& c : std::vector<Case>{
           {5, 3, 37}, {1000, 64, 5000}, {70000, 200, 300}, {3, 1, 1}, {256, 4, 200000}}) {
    SCOPED_TRACE(absl::StrCat(c.count, " ids into ", c.rows, " rows of ", c.width));
    // Id words with repeats, and some outside the table (negative, too large, no id).
    std::vector<float> ids(static_cast<size_t>(c.count));
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint32_t r = rng();
      // The last case: most ids name row 0 (as background pixels do).
      if (c.count == 200000 && r % 4 != 0) {
        ids[i] = IdWord(0);
        continue;
      }
      ids[i] = IdWord(r % 17 == 0   ? -1
                      : r % 19 == 0 ? c.rows + r % 3
                      : r % 23 == 0 ? kNoId
                                    : r % std::min<int64_t>(c.rows, 50));
    }
    const std::vector<float> table = Random(c.rows * c.width, rng),
                             grad_out = Random(c.count * c.width, rng);
    const Device& cpu = CpuDevice();
    std::vector<float> out(c.count * c.width), grad_table(c.rows * c.width);
    cpu.EmbeddingLookup(ids.data(), c.count, table.data(), c.rows, c.width, out.data());
    cpu.EmbeddingGrad(ids.data(), c.count, grad_out.data(), c.rows, c.width, grad_table.data());
    GpuFixture gpu;
    float *g_ids = gpu.Upload(ids), *g_table = gpu.Upload(table),
          *g_grad_out = gpu.Upload(grad_out);
    float *g_out = gpu.New(c.count * c.width), *g_grad_table = gpu.New(c.rows * c.width);
    gpu.device().EmbeddingLookup(g_ids, c.count, g_table, c.rows, c.width, g_out);
    // The gradient first inside a capture: it only asks for scratch (a plan); then outside.
    cudaGraph_t graph = nullptr;
    STRATUM_CUDA_CHECK(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeThreadLocal));
    gpu.device().EmbeddingGrad(g_ids, c.count, g_grad_out, c.rows, c.width, g_grad_table);
    STRATUM_CUDA_CHECK(cudaStreamEndCapture(gpu.stream(), &graph));
    cudaGraphDestroy(graph);
    EXPECT_TRUE(gpu.device().has_pending());
    ASSERT_OK(gpu.mutable_device().PreparePending());
    EXPECT_FALSE(gpu.device().has_pending());
    // Captured again, now with its scratch, and replayed.
    STRATUM_CUDA_CHECK(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeThreadLocal));
    gpu.device().EmbeddingGrad(g_ids, c.count, g_grad_out, c.rows, c.width, g_grad_table);
    STRATUM_CUDA_CHECK(cudaStreamEndCapture(gpu.stream(), &graph));
    EXPECT_FALSE(gpu.device().has_pending());
    cudaGraphExec_t exec = nullptr;
    STRATUM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    STRATUM_CUDA_CHECK(cudaGraphLaunch(exec, gpu.stream()));
    // The lookup copies; the gradient sums each row's gradients in another order.
    EXPECT_EQ(gpu.Download(g_out, c.count * c.width), out);
    // The CPU's sequential sums are themselves off by about sqrt(ids) roundings.
    ExpectNear(gpu.Download(g_grad_table, c.rows * c.width), grad_table, "table gradient",
               2e-6f * std::sqrt(static_cast<float>(c.count)));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    // The ids' positions among some rows of the table (a parameter-server worker's pull):
    // every other row of the first 50, as int64 on the device (float pairs upload them).
    std::vector<int64_t> given;
    for (int64_t r = 0; r < std::min<int64_t>(c.rows, 50); r += 2) given.push_back(r);
    std::vector<float> positions(c.count), given_floats(given.size() * 2);
    std::memcpy(given_floats.data(), given.data(), given.size() * sizeof(int64_t));
    cpu.EmbeddingPositions(ids.data(), c.count, given.data(), static_cast<int64_t>(given.size()),
                           positions.data());
    float* g_positions = gpu.New(c.count);
    gpu.device().EmbeddingPositions(g_ids, c.count,
                                    reinterpret_cast<const int64_t*>(gpu.Upload(given_floats)),
                                    static_cast<int64_t>(given.size()), g_positions);
    // Id words (-1's is a NaN as a float): compared as the ids they hold.
    auto as_ids = [](const std::vector<float>& words) {
      std::vector<int32_t> out;
      for (float word : words) out.push_back(IdOfWord(word));
      return out;
    };
    EXPECT_EQ(as_ids(gpu.Download(g_positions, c.count)), as_ids(positions));

    const int64_t steps = 7, batch = std::max<int64_t>(c.count / steps, 1);
    std::vector<float> mean(batch * c.width), grad_steps = Random(batch * steps * c.width, rng);
    const std::vector<float> earlier = grad_steps;
    cpu.AverageSteps(grad_out.data(), batch, std::min(steps, c.count), c.width, mean.data());
    cpu.AverageStepsGrad(mean.data(), batch, std::min(steps, c.count), c.width, grad_steps.data(),
                         true);
    float* g_mean = gpu.New(batch * c.width);
    float* g_steps = gpu.Upload(earlier);
    gpu.device().AverageSteps(g_grad_out, batch, std::min(steps, c.count), c.width, g_mean);
    gpu.device().AverageStepsGrad(g_mean, batch, std::min(steps, c.count), c.width, g_steps, true);
    ExpectNear(gpu.Download(g_mean, batch * c.width), mean, "mean over steps", 1e-6f);
    ExpectNear(gpu.Download(g_steps, batch * steps * c.width), grad_steps, "steps' gradient",
               1e-6f);
  }
}

// uint8 8x8 images whose class (of 5) is the quadrant-and-channel pattern of their brightest
// pixels: learnable by a small CNN.
struct ImageData {
  Tensor images;  // uint8 [n, 64]
  Tensor labels;  // uint8 [n]
};

ImageData MakeImages(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  ImageData data{Tensor(DType::kUInt8, {n, 64}), Tensor(DType::kUInt8, {n})};
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng() % 5);
    data.labels.data<uint8_t>()[i] = static_cast<uint8_t>(label);
    for (int p = 0; p < 64; ++p) {
      const int row = p / 8, col = p % 8;
      // Class 0..3: a bright quadrant; class 4: a bright centre.
      const bool bright =
          label < 4 ? (row / 4) * 2 + col / 4 == label : row >= 2 && row < 6 && col >= 2 && col < 6;
      data.images.data<uint8_t>()[i * 64 + p] =
          static_cast<uint8_t>(rng() % 96 + (bright ? 128 : 0));
    }
  }
  return data;
}

// Reshape -> Conv2D same relu -> BatchNormalization -> MaxPooling2D -> Conv2D strided (its
// asymmetric same padding) -> BatchNormalization without gamma -> AveragePooling2D (padding at
// the end) -> Flatten -> Dense softmax.
std::string CnnJson() {
  return R"({"class_name": "Sequential", "config": {"layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 64]}},
    {"class_name": "Reshape", "config": {"name": "image", "target_shape": [8, 8, 1]}},
    {"class_name": "Conv2D", "config": {"name": "c1", "filters": 6, "kernel_size": 3,
      "padding": "same", "activation": "relu"}},
    {"class_name": "BatchNormalization", "config": {"name": "bn1", "momentum": 0.9}},
    {"class_name": "MaxPooling2D", "config": {"name": "p1", "pool_size": 2}},
    {"class_name": "Conv2D", "config": {"name": "c2", "filters": 8, "kernel_size": 3,
      "strides": 2, "padding": "same", "activation": "tanh"}},
    {"class_name": "BatchNormalization", "config": {"name": "bn2", "scale": false}},
    {"class_name": "AveragePooling2D", "config": {"name": "p2", "pool_size": 2, "strides": 1,
      "padding": "same"}},
    {"class_name": "Flatten", "config": {"name": "flat"}},
    {"class_name": "Dense", "config": {"name": "out", "units": 5, "activation": "softmax"}}]}})";
}

// Step for step against the CPU Model: the first step's gradients (the moving statistics'
// changes among them), then four SGD updates with momentum through CUDA graphs (the moving
// statistics moving with them; SGD keeps rounding differences as small as they are, where
// Adam would magnify those of gradients near zero), then evaluation in inference mode.
TEST(ReplicaCnnTest, TrainsStepForStepAsTheCpuModel) {
  SKIP_WITHOUT_GPU();
  const Model model = *Model::FromKerasJson(CnnJson());
  ASSERT_TRUE(model.CheckRunsOnGpu().ok()) << model.CheckRunsOnGpu();
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras(nlohmann::json::parse(
      R"({"class_name": "SGD", "config": {"learning_rate": 0.1, "momentum": 0.9}})"));
  const int64_t n = 64, batch = 32;
  const float scale = 1.0f / 255;
  ImageData data = MakeImages(n, 3);
  CachingAllocator allocator(0);
  auto device_data = *UploadDataset(allocator, data.images, data.labels, 5);
  DeviceBuffer order = IdentityOrder(allocator, n);
  ReplicaOptions options;
  options.max_batch = batch;
  options.allow_tf32 = false;
  auto replica = *Replica::Create(model, loss, *optimizer, allocator, options);
  std::vector<Tensor> cpu_vars = model.InitialVariables(4);
  ASSERT_OK(replica->SetState(cpu_vars, {}, 0));
  auto ws = model.NewWorkspace(1);

  StepInput first{device_data.get(), order.as<int32_t>(), batch, 0, static_cast<int>(batch), scale};
  ASSERT_OK(replica->EnqueueTrainStep(first, 1.0f / batch, false));
  std::vector<Tensor> gpu_grads, cpu_grads;
  ASSERT_OK(replica->GetGradients(&gpu_grads));
  ASSERT_TRUE(model
                  .TrainStep(cpu_vars, Rows(data.images, 0, batch, scale),
                             Labels(data.labels, 0, batch), loss, 1.0f / batch, *ws, cpu_grads)
                  .ok());
  testing::ExpectClose(gpu_grads, cpu_grads, "first step's gradients", 1e-3f, &model);

  // Steps 1..4 (batches 1, 0, 1, 0 of the order) with updates, from the same start.
  ASSERT_OK(replica->SetState(cpu_vars, {}, 0));
  std::vector<std::vector<Tensor>> cpu_slots;
  for (int64_t step = 1; step <= 4; ++step) {
    ASSERT_OK(replica->ResetStep(step % 2));
    StepInput input{
        device_data.get(), order.as<int32_t>(), batch, 0, static_cast<int>(batch), scale};
    ASSERT_OK(replica->EnqueueTrainStep(input, 1.0f / batch, true));
    const int64_t rows_first = (step % 2) * batch;
    ASSERT_TRUE(model
                    .TrainStep(cpu_vars, Rows(data.images, rows_first, batch, scale),
                               Labels(data.labels, rows_first, batch), loss, 1.0f / batch, *ws,
                               cpu_grads)
                    .ok());
    optimizer->Apply(cpu_vars, cpu_grads, cpu_slots, step - 1, model.variables());
  }
  std::vector<Tensor> gpu_vars;
  std::vector<std::vector<Tensor>> gpu_slots;
  ASSERT_OK(replica->GetState(&gpu_vars, &gpu_slots));
  testing::ExpectClose(gpu_vars, cpu_vars, "variables after 4 SGD steps", 1e-3f, &model);
  ASSERT_EQ(gpu_slots.size(), cpu_slots.size());
  for (size_t v = 0; v < cpu_slots.size(); ++v) {
    EXPECT_EQ(gpu_slots[v].size(), cpu_slots[v].size()) << model.variables()[v].name;
  }
  // The moving statistics moved (from zeros and ones).
  bool moved = false;
  for (size_t v = 0; v < gpu_vars.size(); ++v) {
    if (model.variables()[v].trainable) continue;
    for (int64_t i = 0; i < gpu_vars[v].num_elements(); ++i) {
      const float start = model.variables()[v].name.find("variance") != std::string::npos ? 1 : 0;
      moved |= std::abs(gpu_vars[v].data<float>()[i] - start) > 1e-4f;
    }
  }
  EXPECT_TRUE(moved);

  // Evaluation (moving statistics) of a partial batch, eagerly (no graph).
  ASSERT_OK(replica->SetState(cpu_vars, {}, 4));
  ASSERT_OK(replica->EnqueueEvaluate(*device_data, 0, 20, scale));
  const StepStats gpu_eval = *replica->TakeMetrics(true);
  const StepStats cpu_eval = *model.Evaluate(cpu_vars, Rows(data.images, 0, 20, scale),
                                             Labels(data.labels, 0, 20), loss, *ws);
  EXPECT_NEAR(gpu_eval.loss_sum, cpu_eval.loss_sum, 1e-3 * std::abs(cpu_eval.loss_sum));
  EXPECT_EQ(gpu_eval.correct, cpu_eval.correct);
}

// Two replicas of `model` (the CNN's) on logical GPUs of one GPU, each stepping on its half of
// 32 images and summing its gradients with the other's (Adam, `steps` steps from the same
// variables): their variables, the moving statistics among them, stay bit-identical, and
// moved from where they started.
void ExpectMirroredReplicasAgree(const Model& model, ReplicaOptions options, int steps) {
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras("adam");
  const int64_t n = 64, batch = 32;
  ImageData data = MakeImages(n, 8);
  CachingAllocator allocator(0);
  auto device_data = *UploadDataset(allocator, data.images, data.labels, 5);
  DeviceBuffer order = IdentityOrder(allocator, n);
  options.max_batch = batch / 2;
  options.replica_share = 0.5f;
  std::vector<std::unique_ptr<Replica>> replicas;
  const std::vector<Tensor> initial = model.InitialVariables(9);
  for (int r = 0; r < 2; ++r) {
    options.seed = 1 + r;
    replicas.push_back(*Replica::Create(model, loss, *optimizer, allocator, options));
    ASSERT_OK(replicas.back()->SetState(initial, {}, 0));
  }
  auto all_reduce = *MakeDeviceAllReduce("HierarchicalCopyAllReduce", 1, {0, 0}, {&allocator},
                                         replicas[0]->flat_size());
  for (int step = 0; step < steps; ++step) {
    for (int r = 0; r < 2; ++r) {
      ASSERT_OK(replicas[static_cast<size_t>(r)]->ResetStep(step % 2));
      const StepInput input{device_data.get(), order.as<int32_t>(),         batch,
                            r * batch / 2,     static_cast<int>(batch / 2), 1.0f / 255};
      ASSERT_OK(replicas[static_cast<size_t>(r)]->EnqueueTrainStep(input, 1.0f / batch, false));
    }
    std::vector<ReplicaBuffer> buffers = {{replicas[0]->gradients(), &replicas[0]->stream()},
                                          {replicas[1]->gradients(), &replicas[1]->stream()}};
    ASSERT_OK(all_reduce->AllReduce(buffers, replicas[0]->flat_size()));
    ASSERT_OK(replicas[0]->EnqueueUpdate());
    ASSERT_OK(replicas[1]->EnqueueUpdate());
  }
  EXPECT_EQ(*replicas[0]->LossScale(), *replicas[1]->LossScale());
  std::vector<Tensor> a, b;
  ASSERT_OK(replicas[0]->GetState(&a, nullptr));
  ASSERT_OK(replicas[1]->GetState(&b, nullptr));
  for (size_t v = 0; v < a.size(); ++v) {
    const auto bytes = static_cast<size_t>(a[v].num_elements()) * sizeof(float);
    EXPECT_EQ(std::memcmp(a[v].data<float>(), b[v].data<float>(), bytes), 0)
        << model.variables()[v].name << " differs between the mirrored replicas";
    EXPECT_NE(std::memcmp(a[v].data<float>(), initial[v].data<float>(), bytes), 0)
        << model.variables()[v].name << " never trained";
  }
}

TEST(ReplicaCnnTest, MirroredReplicasKeepBitIdenticalVariables) {
  SKIP_WITHOUT_GPU();
  ExpectMirroredReplicasAgree(*Model::FromKerasJson(CnnJson()), ReplicaOptions(), 2);
}

// uint8 ids: 8 per example, 5 drawn from the 40 ids of the example's class (of 5), 3 from
// anywhere in [0, 256): a bag of ids an embedding model learns.
ImageData MakeIds(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  ImageData data{Tensor(DType::kUInt8, {n, 8}), Tensor(DType::kUInt8, {n})};
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng() % 5);
    data.labels.data<uint8_t>()[i] = static_cast<uint8_t>(label);
    for (int p = 0; p < 8; ++p) {
      data.images.data<uint8_t>()[i * 8 + p] =
          static_cast<uint8_t>(p % 3 == 2 ? rng() % 256 : label * 40 + rng() % 40);
    }
  }
  return data;
}

// Ids -> Embedding -> GlobalAveragePooling1D -> Dense softmax, and a second lookup of the same
// ids flattened beside it (one table read twice: its gradients add).
std::string EmbeddingJson() {
  return R"({"class_name": "Functional", "config": {"name": "bag",
    "layers": [
      {"class_name": "InputLayer", "name": "ids",
       "config": {"batch_input_shape": [null, 8], "dtype": "int32", "name": "ids"},
       "inbound_nodes": []},
      {"class_name": "Embedding", "name": "table",
       "config": {"name": "table", "input_dim": 256, "output_dim": 12},
       "inbound_nodes": [[["ids", 0, 0, {}]]]},
      {"class_name": "GlobalAveragePooling1D", "name": "mean", "config": {"name": "mean"},
       "inbound_nodes": [[["table", 0, 0, {}]]]},
      {"class_name": "Flatten", "name": "flat", "config": {"name": "flat"},
       "inbound_nodes": [[["table", 0, 0, {}]]]},
      {"class_name": "Concatenate", "name": "both", "config": {"name": "both"},
       "inbound_nodes": [[["mean", 0, 0, {}], ["flat", 0, 0, {}]]]},
      {"class_name": "Dense", "name": "out",
       "config": {"name": "out", "units": 5, "activation": "softmax"},
       "inbound_nodes": [[["both", 0, 0, {}]]]}],
    "input_layers": [["ids", 0, 0]], "output_layers": [["out", 0, 0]]}})";
}

// The embedding model step for step against the CPU Model (ids unscaled, rescale 1).
TEST(ReplicaEmbeddingTest, TrainsStepForStepAsTheCpuModel) {
  SKIP_WITHOUT_GPU();
  const Model model = *Model::FromKerasJson(EmbeddingJson());
  ASSERT_TRUE(model.takes_ids());
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras(nlohmann::json::parse(
      R"({"class_name": "SGD", "config": {"learning_rate": 0.5, "momentum": 0.9}})"));
  const int64_t n = 96, batch = 48;
  ImageData data = MakeIds(n, 12);
  CachingAllocator allocator(0);
  auto device_data = *UploadDataset(allocator, data.images, data.labels, 5);
  DeviceBuffer order = IdentityOrder(allocator, n);
  ReplicaOptions options;
  options.max_batch = batch;
  auto replica = *Replica::Create(model, loss, *optimizer, allocator, options);
  std::vector<Tensor> cpu_vars = model.InitialVariables(6);
  ASSERT_OK(replica->SetState(cpu_vars, {}, 0));
  auto ws = model.NewWorkspace(1);
  std::vector<std::vector<Tensor>> cpu_slots;
  std::vector<Tensor> cpu_grads, gpu_grads;
  for (int64_t step = 0; step < 4; ++step) {
    ASSERT_OK(replica->ResetStep(step % 2));
    StepInput input{
        device_data.get(), order.as<int32_t>(), batch, 0, static_cast<int>(batch), 1.0f};
    ASSERT_OK(replica->EnqueueTrainStep(input, 1.0f / batch, true));
    const int64_t first = (step % 2) * batch;
    ASSERT_TRUE(model
                    .TrainStep(cpu_vars, Rows(data.images, first, batch, 1.0f),
                               Labels(data.labels, first, batch), loss, 1.0f / batch, *ws,
                               cpu_grads)
                    .ok());
    if (step == 0) {
      ASSERT_OK(replica->GetGradients(&gpu_grads));
      testing::ExpectClose(gpu_grads, cpu_grads, "first step's gradients", 1e-4f, &model);
    }
    optimizer->Apply(cpu_vars, cpu_grads, cpu_slots, step, model.variables());
  }
  std::vector<Tensor> gpu_vars;
  ASSERT_OK(replica->GetState(&gpu_vars, nullptr));
  testing::ExpectClose(gpu_vars, cpu_vars, "variables after 4 SGD steps", 1e-4f, &model);
}

// Three epochs of `train` (batch 50, Adam 0.01) on GPU:0 through Fit, tested on `test`.
absl::StatusOr<FitSummary> FitOnGpu(const std::string& model_json, const ImageData& train,
                                    const ImageData& test, double rescale) {
  const Model model = *Model::FromKerasJson(model_json);
  auto optimizer = *Optimizer::FromKeras(
      nlohmann::json::parse(R"({"class_name": "Adam", "config": {"learning_rate": 0.01}})"));
  const FitData data =
      InMemoryFitData(train.images, train.labels, test.images, test.labels, rescale);
  FitOptions options;
  options.epochs = 3;
  options.batch_size_per_replica = 50;
  options.progress = ProgressStyle::kNone;
  auto one = *OneDeviceStrategy::Create("GPU:0");
  return Fit(*one, model, Loss::SparseCategoricalCrossentropy(), *optimizer, data, options);
}

// Fit on GPU:0 trains the embedding model on the GPU path (not the CPU fallback) to accuracy.
TEST(GpuEmbeddingFitTest, TrainsOnTheGpuToAccuracy) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<FitSummary> summary =
      FitOnGpu(EmbeddingJson(), MakeIds(4000, 31), MakeIds(1000, 32), 1);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->on_gpus);
  EXPECT_GT(summary->test_accuracy, 0.95);
}

// Fit on GPU:0 trains the CNN on the GPU path to accuracy.
TEST(GpuCnnFitTest, TrainsOnTheGpuToAccuracy) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<FitSummary> summary =
      FitOnGpu(CnnJson(), MakeImages(4000, 21), MakeImages(1000, 22), 1.0 / 255);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->on_gpus);
  EXPECT_GT(summary->test_accuracy, 0.9);
}

// ---- Mixed precision (Keras' mixed_bfloat16 / mixed_float16 policies) ----

// `model_json` with every layer's dtype set to `policy` (the InputLayer's stays float32 or
// int32, as Keras writes it), in Keras 3's DTypePolicy form.
std::string WithPolicy(const std::string& model_json, const std::string& policy) {
  nlohmann::json model = nlohmann::json::parse(model_json);
  for (nlohmann::json& layer : model["config"]["layers"]) {
    if (layer["class_name"] == "InputLayer") continue;
    layer["config"]["dtype"] = {
        {"module", "keras"}, {"class_name", "DTypePolicy"}, {"config", {{"name", policy}}}};
  }
  return model.dump();
}

// ||gpu - cpu|| / ||cpu|| per tensor (the relative error of a whole gradient or variable).
std::vector<double> RelativeErrors(const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu) {
  std::vector<double> errors;
  for (size_t v = 0; v < cpu.size(); ++v) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < cpu[v].num_elements(); ++i) {
      const double d = gpu[v].data<float>()[i] - cpu[v].data<float>()[i];
      diff += d * d;
      norm += static_cast<double>(cpu[v].data<float>()[i]) * cpu[v].data<float>()[i];
    }
    errors.push_back(norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff));
  }
  return errors;
}

struct MixedCase {
  const char* policy;
  // Of a first step's gradients against the CPU's float32: the embedding model's, and the
  // CNN's, whose max poolings may pick another maximum among values rounded alike, and whose
  // batch normalizations subtract nearly equal sums.
  double most_error;
  double most_error_cnn;
};

// The first step's gradients of the CNN (BatchNormalization among its layers) and of the
// embedding model in half precision: near the CPU's float32 ones (within the precision's
// rounding), yet not equal to the GPU's own float32 ones (the layers did compute in half).
TEST(MixedPrecisionTest, FirstStepGradientsAreTheCpusWithinHalfPrecision) {
  SKIP_WITHOUT_GPU();
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras("sgd");
  const int64_t batch = 32;
  CachingAllocator allocator(0);
  for (const MixedCase& c :
       {MixedCase{"mixed_bfloat16", 0.03, 0.1}, MixedCase{"mixed_float16", 0.005, 0.1}}) {
    for (const bool cnn : {true, false}) {
      SCOPED_TRACE(std::string(c.policy) + (cnn ? " CNN" : " embedding model"));
      const Model mixed =
          *Model::FromKerasJson(WithPolicy(cnn ? CnnJson() : EmbeddingJson(), c.policy));
      const Model full = *Model::FromKerasJson(cnn ? CnnJson() : EmbeddingJson());
      EXPECT_EQ(DtypePolicyName(mixed.dtype_policy()), std::string(c.policy));
      const ImageData data = cnn ? MakeImages(batch, 41) : MakeIds(batch, 42);
      const float scale = cnn ? 1.0f / 255 : 1.0f;
      auto device_data = *UploadDataset(allocator, data.images, data.labels, 5);
      DeviceBuffer order = IdentityOrder(allocator, batch);
      ReplicaOptions options;
      options.max_batch = batch;
      options.allow_tf32 = false;
      const std::vector<Tensor> variables = full.InitialVariables(5);
      const StepInput input{
          device_data.get(), order.as<int32_t>(), batch, 0, static_cast<int>(batch), scale};
      std::vector<Tensor> half_grads, float_grads, cpu_grads;
      auto half = *Replica::Create(mixed, loss, *optimizer, allocator, options);
      EXPECT_EQ(half->compute(), ComputeTypeOf(mixed.dtype_policy()));
      ASSERT_OK(half->SetState(variables, {}, 0));
      ASSERT_OK(half->EnqueueTrainStep(input, 1.0f / batch, false));
      ASSERT_OK(half->GetGradients(&half_grads));
      // mixed_float16's gradients stay scaled until the update unscales them (the moving
      // statistics' changes are not the loss's).
      const float loss_scale = *half->LossScale();
      for (size_t v = 0; v < half_grads.size(); ++v) {
        if (!mixed.variables()[v].trainable) continue;
        Tensor& g = half_grads[v];
        for (int64_t i = 0; i < g.num_elements(); ++i) g.data<float>()[i] /= loss_scale;
      }
      auto single = *Replica::Create(full, loss, *optimizer, allocator, options);
      ASSERT_OK(single->SetState(variables, {}, 0));
      ASSERT_OK(single->EnqueueTrainStep(input, 1.0f / batch, false));
      ASSERT_OK(single->GetGradients(&float_grads));
      auto ws = full.NewWorkspace(1);
      ASSERT_OK(full.TrainStep(variables, Rows(data.images, 0, batch, scale),
                               Labels(data.labels, 0, batch), loss, 1.0f / batch, *ws, cpu_grads)
                    .status());
      const std::vector<double> to_cpu = RelativeErrors(half_grads, cpu_grads);
      const std::vector<double> to_float = RelativeErrors(half_grads, float_grads);
      double largest = 0;
      for (size_t v = 0; v < to_cpu.size(); ++v) {
        EXPECT_LT(to_cpu[v], cnn ? c.most_error_cnn : c.most_error) << full.variables()[v].name;
        largest = std::max(largest, to_float[v]);
      }
      EXPECT_GT(largest, 1e-5) << "the half-precision step equals the float32 one";
    }
  }
}

// mixed_float16's dynamic loss scaling as Keras 3's LossScaleOptimizer: a scale that makes the
// float16 gradients overflow skips the update (variables and slots unchanged, the optimizer's
// iterations not advanced) and halves, until the steps are finite; then it doubles after
// `loss_scale_growth_steps` finite updates, and the model trains.
TEST(MixedPrecisionTest, Float16LossScaleSkipsOverflowsHalvesAndGrows) {
  SKIP_WITHOUT_GPU();
  const Model model = *Model::FromKerasJson(WithPolicy(CnnJson(), "mixed_float16"));
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras("adam");
  const int64_t n = 64, batch = 32;
  CachingAllocator allocator(0);
  const ImageData data = MakeImages(n, 43);
  auto device_data = *UploadDataset(allocator, data.images, data.labels, 5);
  DeviceBuffer order = IdentityOrder(allocator, n);
  ReplicaOptions options;
  options.max_batch = batch;
  options.initial_loss_scale = 0x1p40f;  // float16 holds up to 65504: the first steps overflow
  options.loss_scale_growth_steps = 3;
  auto replica = *Replica::Create(model, loss, *optimizer, allocator, options);
  ASSERT_TRUE(replica->scales_loss());
  const std::vector<Tensor> initial = model.InitialVariables(2);
  ASSERT_OK(replica->SetState(initial, {}, 0));
  const StepInput input{device_data.get(),       order.as<int32_t>(), batch, 0,
                        static_cast<int>(batch), 1.0f / 255};
  ASSERT_OK(replica->ResetStep(0));
  ASSERT_OK(replica->EnqueueTrainStep(input, 1.0f / batch, true));
  EXPECT_EQ(*replica->LossScale(), 0x1p39f);
  std::vector<Tensor> after;
  std::vector<std::vector<Tensor>> slots;
  ASSERT_OK(replica->GetState(&after, &slots));
  for (size_t v = 0; v < initial.size(); ++v) {
    EXPECT_EQ(std::memcmp(after[v].data<float>(), initial[v].data<float>(),
                          static_cast<size_t>(initial[v].num_elements()) * sizeof(float)),
              0)
        << model.variables()[v].name << " changed in a skipped step";
  }
  // Halving once a step: from 2^39 down to a finite scale, then doubling after every 3 finite
  // steps in a row (and halving again when that overflows).
  float scale = 0x1p39f;
  int finite_steps = 0, in_a_row = 0;
  for (int step = 1; step < 60; ++step) {
    ASSERT_OK(replica->ResetStep(step % 2));
    ASSERT_OK(replica->EnqueueTrainStep(input, 1.0f / batch, true));
    const float now = *replica->LossScale();
    if (now < scale) {
      EXPECT_EQ(now, scale / 2) << "step " << step;
      in_a_row = 0;
    } else {
      ++finite_steps;
      in_a_row = (in_a_row + 1) % 3;
      EXPECT_EQ(now, in_a_row == 0 ? scale * 2 : scale) << "step " << step;
    }
    scale = now;
  }
  EXPECT_GE(finite_steps, 20);
  EXPECT_LE(scale, 0x1p30f);
  ASSERT_OK(replica->GetState(&after, &slots));
  // Adam's iterations counted only the finite updates: the step after them sees that count.
  bool moved = false;
  for (size_t v = 0; v < initial.size(); ++v) {
    for (int64_t i = 0; i < initial[v].num_elements(); ++i) {
      moved |= after[v].data<float>()[i] != initial[v].data<float>()[i];
      ASSERT_TRUE(std::isfinite(after[v].data<float>()[i])) << model.variables()[v].name;
    }
  }
  EXPECT_TRUE(moved);
}

// Mirrored replicas in bfloat16 and float16 (loss scaling decided after the all-reduce, alike
// on both) keep bit-identical float32 variables.
TEST(MixedPrecisionTest, MirroredReplicasKeepBitIdenticalVariables) {
  SKIP_WITHOUT_GPU();
  for (const char* policy : {"mixed_bfloat16", "mixed_float16"}) {
    SCOPED_TRACE(policy);
    ReplicaOptions options;
    options.initial_loss_scale = 0x1p20f;  // overflows first, so a skip is shared too
    ExpectMirroredReplicasAgree(*Model::FromKerasJson(WithPolicy(CnnJson(), policy)), options, 12);
  }
}

// Fit trains the CNN and the embedding model in both mixed policies on the GPU to accuracy.
TEST(MixedPrecisionTest, FitTrainsInHalfPrecisionToAccuracy) {
  SKIP_WITHOUT_GPU();
  for (const char* policy : {"mixed_bfloat16", "mixed_float16"}) {
    SCOPED_TRACE(policy);
    absl::StatusOr<FitSummary> cnn = FitOnGpu(WithPolicy(CnnJson(), policy), MakeImages(4000, 21),
                                              MakeImages(1000, 22), 1.0 / 255);
    ASSERT_OK(cnn.status());
    EXPECT_TRUE(cnn->on_gpus);
    EXPECT_GT(cnn->test_accuracy, 0.9);
    absl::StatusOr<FitSummary> bag =
        FitOnGpu(WithPolicy(EmbeddingJson(), policy), MakeIds(4000, 31), MakeIds(1000, 32), 1);
    ASSERT_OK(bag.status());
    EXPECT_TRUE(bag->on_gpus);
    EXPECT_GT(bag->test_accuracy, 0.95);
  }
}

}  // namespace
}  // namespace stratum::cuda
