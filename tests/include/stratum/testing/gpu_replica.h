// What the GPU tests share (CUDA builds only): the skip without a GPU, the host copies of a
// step's rows a CPU Model trains on, an identity example order on the device, the comparison
// of the GPU's tensors with the CPU's, and a FitData of tensors in memory.
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "stratum/cuda/cuda_check.h"
#include "stratum/cuda/device.h"
#include "stratum/data/dataset.h"
#include "stratum/model/model.h"
#include "stratum/tensor/tensor.h"
#include "stratum/training/fit_options.h"

#define SKIP_WITHOUT_GPU()                                                                  \
  if (::stratum::cuda::PhysicalGpuCount() == 0) {                                           \
    GTEST_SKIP() << "no CUDA GPU is visible to this process: the GPU path cannot run here"; \
  }

namespace stratum::testing {

// Rows [first, first + rows) of uint8 examples as float32, times `scale`.
inline Tensor Rows(const Tensor& images, int64_t first, int64_t rows, float scale) {
  Tensor x(DType::kFloat32, {rows, images.row_size()});
  for (int64_t i = 0; i < rows * images.row_size(); ++i) {
    x.data<float>()[i] =
        static_cast<float>(images.data<uint8_t>()[first * images.row_size() + i]) * scale;
  }
  return x;
}

// Labels [first, first + rows) of uint8 labels.
inline Tensor Labels(const Tensor& labels, int64_t first, int64_t rows) {
  Tensor y(DType::kUInt8, {rows});
  std::memcpy(y.data<uint8_t>(), labels.data<uint8_t>() + first, static_cast<size_t>(rows));
  return y;
}

// The order [0, n) on the allocator's device.
inline cuda::DeviceBuffer IdentityOrder(cuda::CachingAllocator& allocator, int64_t n) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  cuda::DeviceBuffer buffer = *cuda::DeviceBuffer::Allocate(allocator, static_cast<size_t>(n) * 4);
  STRATUM_CUDA_CHECK(
      cudaMemcpy(buffer.data(), order.data(), order.size() * 4, cudaMemcpyHostToDevice));
  return buffer;
}

// |gpu - cpu| <= tolerance * (1 + |cpu|) for every element of every tensor; a failure names
// the variable when `model` is given.
inline void ExpectClose(const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu,
                        const std::string& what, float tolerance = 2e-4f,
                        const Model* model = nullptr) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t v = 0; v < cpu.size(); ++v) {
    ASSERT_EQ(gpu[v].num_elements(), cpu[v].num_elements()) << what;
    const std::string name =
        model != nullptr ? model->variables()[v].name : "tensor " + std::to_string(v);
    for (int64_t i = 0; i < cpu[v].num_elements(); ++i) {
      const float expected = cpu[v].data<float>()[i];
      ASSERT_NEAR(gpu[v].data<float>()[i], expected, tolerance * (1 + std::abs(expected)))
          << what << ": " << name << " element " << i;
    }
  }
}

// Training and test sets of uint8 examples and labels in memory.
inline FitData InMemoryFitData(const Tensor& train_images, const Tensor& train_labels,
                               const Tensor& test_images, const Tensor& test_labels,
                               double rescale) {
  FitData data;
  data.train = Dataset::FromTensorSlices({train_images, train_labels});
  data.test = Dataset::FromTensorSlices({test_images, test_labels});
  data.has_test = true;
  data.train_examples = train_images.rows();
  data.test_examples = test_images.rows();
  data.rescale = rescale;
  return data;
}

}  // namespace stratum::testing
