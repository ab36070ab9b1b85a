// The input pipeline's throughput: 60,000 examples of 784 bytes through
// FromTensorSlices -> Shuffle(10000) -> Batch(64) -> Map(normalise to float32), the shape
// of the reference job's pipeline, one line per epoch. Goal: 300,000 examples/s, so that
// the input never holds a training step of one CPU replica up (about 160,000 examples/s).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>

#include "bench/bench_util.h"
#include "stratum/data/dataset.h"

int main() {
  using stratum::DType;
  using stratum::Element;
  using stratum::Tensor;
  constexpr int64_t kRows = 60000;
  Tensor images(DType::kUInt8, stratum::Shape({kRows, 784}));
  for (int64_t i = 0; i < images.num_elements(); ++i) {
    images.data<uint8_t>()[i] = static_cast<uint8_t>(i * 31);
  }
  Tensor labels(DType::kUInt8, stratum::Shape({kRows}));
  const stratum::Dataset dataset = stratum::Dataset::FromTensorSlices({images, labels})
                                       .Shuffle(10000, 1)
                                       .Batch(64)
                                       .Map([](Element batch) -> absl::StatusOr<Element> {
                                         Tensor x(DType::kFloat32, batch[0].shape());
                                         x.Flat<float>() =
                                             batch[0].Flat<uint8_t>().cast<float>() * (1.0f / 255);
                                         return Element{std::move(x), std::move(batch[1])};
                                       });
  for (int epoch = 1; epoch <= 3; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    int64_t examples = 0;
    std::unique_ptr<stratum::Iterator> it = dataset.MakeIterator();
    while (true) {
      absl::StatusOr<std::optional<Element>> next = it->GetNext();
      if (!next.ok()) {
        std::fprintf(stderr, "input_pipeline_bench: %s\n", next.status().ToString().c_str());
        return 1;
      }
      if (!next->has_value()) break;
      examples += (**next)[0].rows();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stratum::bench::PrintFigure(
        "input_pipeline_examples_per_sec_epoch" + std::to_string(epoch), examples / seconds,
        "examples/s", 300000, "at_least",
        "60000 x 784 uint8, Shuffle(10000), Batch(64), Map(to float32 / 255), one thread");
  }
  return 0;
}
