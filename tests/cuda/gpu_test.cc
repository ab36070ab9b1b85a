// The GPU path against the CPU Model: kernels (forward, gradients, metrics, every optimizer
// update; Sequential models and functional graphs with several inputs and merge layers), the
// caching allocator, the check macros, mirrored replicas on logical GPUs, and a short Fit. Every
// test that needs a GPU skips, with the reason, when none is visible (as in CI, which builds with
// CUDA but has no GPU).
#include <cstring>
#include <filesystem>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "stratum/checkpoint/checkpoint_reader.h"
#include "stratum/cuda/all_reduce.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/cuda/device.h"
#include "stratum/cuda/nccl_group.h"
#include "stratum/cuda/replica.h"
#include "stratum/testing/functional_json.h"
#include "stratum/testing/gpu_replica.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/devices.h"
#include "stratum/worker/fit.h"
#include "stratum/worker/mirrored_strategy.h"

namespace stratum::cuda {
namespace {

using testing::ExpectClose;
using ::testing::HasSubstr;
using testing::IdentityOrder;
using testing::Labels;
using testing::Rows;

std::string ModelJson(const std::string& hidden_activation, const std::string& output_activation,
                      int inputs = 8, const std::string& extra_layer = "") {
  return R"({"class_name": "Sequential", "config": {"layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, )" +
         std::to_string(inputs) + R"(]}},
    {"class_name": "Dense", "config": {"name": "hidden", "units": 16, "activation": ")" +
         hidden_activation + R"("}},)" + extra_layer + R"(
    {"class_name": "Dense", "config": {"name": "out", "units": 5, "activation": ")" +
         output_activation + R"("}}]}})";
}

struct Data {
  Tensor images;  // uint8 [n, inputs]
  Tensor labels;  // uint8 [n]
};

// uint8 examples whose class is the argmax of a fixed linear map: learnable.
Data MakeData(int64_t n, int inputs, int classes, uint32_t seed) {
  std::mt19937 rng(seed);
  Data data{Tensor(DType::kUInt8, {n, inputs}), Tensor(DType::kUInt8, {n})};
  for (int64_t i = 0; i < n; ++i) {
    float best = -1e9f;
    for (int j = 0; j < inputs; ++j) data.images.data<uint8_t>()[i * inputs + j] = rng() % 256;
    for (int c = 0; c < classes; ++c) {
      float score = 0;
      for (int j = 0; j < inputs; ++j) {
        const float x = data.images.data<uint8_t>()[i * inputs + j] / 255.0f - 0.5f;
        score += x * static_cast<float>(((c * inputs + j) * 7919 % 13) - 6);
      }
      if (score > best) {
        best = score;
        data.labels.data<uint8_t>()[i] = static_cast<uint8_t>(c);
      }
    }
  }
  return data;
}

TEST(CudaCheckTest, NamesTheCallFileLineAndError) {
  const absl::Status status = STRATUM_CUDA_STATUS_(CudaStatus, cudaErrorMemoryAllocation);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("cudaErrorMemoryAllocation failed at "));
  EXPECT_THAT(status.message(), HasSubstr("gpu_test.cc:"));
  EXPECT_THAT(status.message(), HasSubstr("out of memory"));
  const absl::Status blas = STRATUM_CUDA_STATUS_(CublasStatus, CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_THAT(blas.message(), HasSubstr("CUBLAS_STATUS_INVALID_VALUE"));
  const absl::Status nccl = STRATUM_CUDA_STATUS_(NcclStatus, ncclInvalidArgument);
  EXPECT_THAT(nccl.message(), HasSubstr("ncclInvalidArgument failed at"));
  EXPECT_OK(STRATUM_CUDA_STATUS_(CudaStatus, cudaSuccess));
}

TEST(CachingAllocatorTest, ReusesFreedBlocksOfTheSizeClass) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator(0);
  EXPECT_EQ(CachingAllocator::RoundUp(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundUp(3u << 20), 4u << 20);
  void* first = nullptr;
  {
    DeviceBuffer buffer = *DeviceBuffer::Allocate(allocator, 1000);
    first = buffer.data();
  }
  DeviceBuffer again = *DeviceBuffer::Allocate(allocator, 900);  // the same 1024-byte class
  EXPECT_EQ(again.data(), first);
  const AllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.driver_allocations, 1);
  EXPECT_EQ(stats.cache_hits, 1);
  EXPECT_EQ(stats.bytes_in_use, 1024);
  DeviceBuffer other = *DeviceBuffer::Allocate(allocator, 5000);
  EXPECT_NE(other.data(), first);
  EXPECT_EQ(allocator.stats().driver_allocations, 2);
}

struct Case {
  std::string name;
  std::string model;
  Loss loss;
  int inputs = 8;
};

std::vector<Case> Cases() {
  return {
      {"relu_softmax_fused", ModelJson("relu", "softmax"), Loss::SparseCategoricalCrossentropy()},
      {"tanh_logits", ModelJson("tanh", "linear"), Loss::SparseCategoricalCrossentropy(true)},
      {"sigmoid_probabilities", ModelJson("sigmoid", "sigmoid"),
       Loss::SparseCategoricalCrossentropy()},
      {"odd_width_softmax_layer",
       ModelJson("relu", "linear", 6,
                 R"({"class_name": "Dense", "config": {"name": "mid", "units": 7,
                     "activation": "softmax"}},)") +
           "",
       Loss::SparseCategoricalCrossentropy(true), 6},
      // A graph: two inputs split from each example, a gate, a residual sum and a join.
      {"functional_merges_softmax_fused",
       testing::Keras2Functional(
           {.inputs = {{"a", {3}}, {"b", {5}}},
            .calls =
                {{testing::Layer("Dense", "h", {{"units", 16}, {"activation", "relu"}}), {"a"}},
                 {testing::Layer("Dense", "g", {{"units", 16}, {"activation", "tanh"}}), {"b"}},
                 {testing::Layer("Multiply", "gate"), {"h", "g"}},
                 {testing::Layer("Add", "residual"), {"gate", "h", "g"}},
                 {testing::Layer("Average", "mean"), {"residual", "h"}},
                 {testing::Layer("Concatenate", "joined"), {"mean", "g"}},
                 {testing::Layer("Dense", "out", {{"units", 5}, {"activation", "softmax"}}),
                  {"joined"}}},
            .outputs = {"out"}})
           .dump(),
       Loss::SparseCategoricalCrossentropy()},
      {"functional_activation_softmax_layer",
       testing::Keras3Functional(
           {.inputs = {{"x", {8}}},
            .calls = {{testing::Layer("Dense", "h", {{"units", 16}, {"activation", "sigmoid"}}),
                       {"x"}},
                      {testing::Layer("Dense", "z", {{"units", 5}}), {"h"}},
                      {testing::Layer("Activation", "p", {{"activation", "softmax"}}), {"z"}}},
            .outputs = {"p"}})
           .dump(),
       Loss::SparseCategoricalCrossentropy()},
  };
}

TEST(ReplicaTest, GradientsAndMetricsMatchTheCpuModel) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    Model model = *Model::FromKerasJson(c.model);
    auto optimizer = *Optimizer::FromKeras("adam");
    const int64_t n = 48;
    const float scale = 1.0f / 255;
    Data data = MakeData(n, c.inputs, 5, 7);
    CachingAllocator allocator(0);
    auto device_data = *UploadDataset(allocator, data.images, data.labels, 5);
    DeviceBuffer order = IdentityOrder(allocator, n);
    ReplicaOptions options;
    options.max_batch = n;
    auto replica = *Replica::Create(model, c.loss, *optimizer, allocator, options);
    const std::vector<Tensor> variables = model.InitialVariables(3);
    ASSERT_OK(replica->SetState(variables, {}, 0));
    StepInput input{device_data.get(), order.as<int32_t>(), n, 0, static_cast<int>(n), scale};
    ASSERT_OK(replica->EnqueueTrainStep(input, 1.0f / n, false));
    std::vector<Tensor> gpu_grads;
    ASSERT_OK(replica->GetGradients(&gpu_grads));
    const StepStats gpu_stats = *replica->TakeMetrics(false);

    auto ws = model.NewWorkspace(1);
    std::vector<Tensor> cpu_grads;
    const StepStats cpu_stats =
        *model.TrainStep(variables, Rows(data.images, 0, n, scale), Labels(data.labels, 0, n),
                         c.loss, 1.0f / n, *ws, cpu_grads);
    ExpectClose(gpu_grads, cpu_grads, "gradients");
    EXPECT_NEAR(gpu_stats.loss_sum, cpu_stats.loss_sum, 1e-4 * std::abs(cpu_stats.loss_sum));
    EXPECT_EQ(gpu_stats.correct, cpu_stats.correct);
    EXPECT_EQ(gpu_stats.examples, n);

    // Evaluation in batches of 20 (a partial last one) against Model::Evaluate.
    for (int64_t first = 0; first < n; first += 20) {
      ASSERT_TRUE(replica
                      ->EnqueueEvaluate(*device_data, first,
                                        static_cast<int>(std::min<int64_t>(20, n - first)), scale)
                      .ok());
    }
    const StepStats gpu_eval = *replica->TakeMetrics(true);
    const StepStats cpu_eval = *model.Evaluate(variables, Rows(data.images, 0, n, scale),
                                               Labels(data.labels, 0, n), c.loss, *ws);
    EXPECT_NEAR(gpu_eval.loss_sum, cpu_eval.loss_sum, 1e-4 * std::abs(cpu_eval.loss_sum));
    EXPECT_EQ(gpu_eval.correct, cpu_eval.correct);
    EXPECT_EQ(gpu_eval.examples, n);
  }
}

TEST(ReplicaTest, EveryOptimizerUpdateMatchesKeras) {
  SKIP_WITHOUT_GPU();
  const char* kOptimizers[] = {
      R"({"class_name": "SGD", "config": {"learning_rate": 0.1}})",
      R"({"class_name": "SGD", "config": {"learning_rate": 0.1, "momentum": 0.9}})",
      R"({"class_name": "SGD", "config": {"learning_rate": 0.1, "momentum": 0.9, "nesterov": true}})",
      R"({"class_name": "Adam", "config": {"learning_rate": 0.01}})",
      R"({"class_name": "Adagrad", "config": {"learning_rate": 0.1}})",
      R"({"class_name": "RMSprop", "config": {"learning_rate": 0.01}})",
      R"({"class_name": "RMSprop", "config": {"learning_rate": 0.01, "momentum": 0.5}})",
      R"({"class_name": "RMSprop", "config": {"learning_rate": 0.01, "centered": true}})",
      R"({"class_name": "RMSprop", "config": {"learning_rate": 0.01, "momentum": 0.5,
          "centered": true}})",
  };
  Model model = *Model::FromKerasJson(ModelJson("relu", "softmax"));
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  const int64_t n = 32, batch = 16;
  const float scale = 1.0f / 255;
  Data data = MakeData(n, 8, 5, 11);
  for (const char* spec : kOptimizers) {
    SCOPED_TRACE(spec);
    auto optimizer = *Optimizer::FromKeras(nlohmann::json::parse(spec));
    CachingAllocator allocator(0);
    auto device_data = *UploadDataset(allocator, data.images, data.labels, 5);
    DeviceBuffer order = IdentityOrder(allocator, n);
    ReplicaOptions options;
    options.max_batch = batch;
    auto replica = *Replica::Create(model, loss, *optimizer, allocator, options);
    std::vector<Tensor> cpu_vars = model.InitialVariables(5);
    ASSERT_OK(replica->SetState(cpu_vars, {}, 0));
    std::vector<std::vector<Tensor>> cpu_slots;
    std::vector<Tensor> grads;
    auto ws = model.NewWorkspace(1);
    // Three steps through the CUDA graph path (steps 0 and 1 of the order, then 0 again).
    for (int64_t step = 0; step < 3; ++step) {
      if (step == 2) {
        ASSERT_OK(replica->ResetStep(0));
      }
      StepInput input{
          device_data.get(), order.as<int32_t>(), batch, 0, static_cast<int>(batch), scale};
      ASSERT_OK(replica->EnqueueTrainStep(input, 1.0f / batch, true));
      const int64_t first = (step % 2) * batch;
      ASSERT_TRUE(model
                      .TrainStep(cpu_vars, Rows(data.images, first, batch, scale),
                                 Labels(data.labels, first, batch), loss, 1.0f / batch, *ws, grads)
                      .ok());
      optimizer->Apply(cpu_vars, grads, cpu_slots, step);
    }
    std::vector<Tensor> gpu_vars;
    std::vector<std::vector<Tensor>> gpu_slots;
    ASSERT_OK(replica->GetState(&gpu_vars, &gpu_slots));
    ExpectClose(gpu_vars, cpu_vars, "variables", 1e-4f);
    ASSERT_EQ(gpu_slots.size(), cpu_slots.size());
    for (size_t v = 0; v < cpu_slots.size(); ++v) {
      ExpectClose(gpu_slots[v], cpu_slots[v], "slots", 1e-3f);
    }
  }
}

// Two replicas on one GPU (logical GPUs) with each copy-based all-reduce: the variables stay
// bit-identical, and equal one replica's training on the whole batch within rounding.
TEST(MirroredReplicasTest, LogicalGpusKeepBitIdenticalVariables) {
  SKIP_WITHOUT_GPU();
  Model model = *Model::FromKerasJson(ModelJson("relu", "softmax"));
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras("adam");
  const int64_t n = 64, batch = 32;
  Data data = MakeData(n, 8, 5, 13);
  for (const char* op_name : {"HierarchicalCopyAllReduce", "ReductionToOneDevice"}) {
    SCOPED_TRACE(op_name);
    CachingAllocator allocator(0);
    auto device_data = *UploadDataset(allocator, data.images, data.labels, 5);
    DeviceBuffer order = IdentityOrder(allocator, n);
    ReplicaOptions options;
    options.max_batch = batch;
    std::vector<std::unique_ptr<Replica>> replicas;
    const std::vector<Tensor> initial = model.InitialVariables(9);
    for (int r = 0; r < 3; ++r) {  // two mirrored, one on the whole batch
      options.max_batch = r == 2 ? batch : batch / 2;
      replicas.push_back(*Replica::Create(model, loss, *optimizer, allocator, options));
      ASSERT_OK(replicas.back()->SetState(initial, {}, 0));
    }
    auto all_reduce =
        *MakeDeviceAllReduce(op_name, 1, {0, 0}, {&allocator}, replicas[0]->flat_size());
    for (int step = 0; step < 2; ++step) {
      for (int r = 0; r < 2; ++r) {
        StepInput input{device_data.get(), order.as<int32_t>(),         batch,
                        r * batch / 2,     static_cast<int>(batch / 2), 1.0f / 255};
        ASSERT_TRUE(
            replicas[static_cast<size_t>(r)]->EnqueueTrainStep(input, 1.0f / batch, false).ok());
      }
      std::vector<ReplicaBuffer> buffers = {{replicas[0]->gradients(), &replicas[0]->stream()},
                                            {replicas[1]->gradients(), &replicas[1]->stream()}};
      ASSERT_OK(all_reduce->AllReduce(buffers, replicas[0]->flat_size()));
      ASSERT_OK(replicas[0]->EnqueueUpdate());
      ASSERT_OK(replicas[1]->EnqueueUpdate());
      StepInput whole{device_data.get(),       order.as<int32_t>(), batch, 0,
                      static_cast<int>(batch), 1.0f / 255};
      ASSERT_OK(replicas[2]->EnqueueTrainStep(whole, 1.0f / batch, true));
    }
    std::vector<Tensor> a, b, single;
    ASSERT_OK(replicas[0]->GetState(&a, nullptr));
    ASSERT_OK(replicas[1]->GetState(&b, nullptr));
    ASSERT_OK(replicas[2]->GetState(&single, nullptr));
    for (size_t v = 0; v < a.size(); ++v) {
      EXPECT_EQ(std::memcmp(a[v].data<float>(), b[v].data<float>(),
                            static_cast<size_t>(a[v].num_elements()) * sizeof(float)),
                0)
          << "variable " << v << " differs between the mirrored replicas";
    }
    ExpectClose(a, single, "mirrored vs one replica", 1e-4f);
  }
}

TEST(MirroredReplicasTest, NcclRefusesReplicasThatShareAGpu) {
  SKIP_WITHOUT_GPU();
  CachingAllocator allocator(0);
  auto op = MakeDeviceAllReduce("NcclAllReduce", 1, {0, 0}, {&allocator}, 100);
  EXPECT_EQ(op.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(op.status().message(), HasSubstr("HierarchicalCopyAllReduce"));
}

// Rank 0 of a two-rank NCCL group whose rank 1 never joins (it runs on one GPU).
NcclGroupOptions LonelyRank(absl::Duration timeout) {
  NcclGroupOptions options;
  options.unique_id = *NewNcclUniqueId();
  options.num_ranks = 2;
  options.devices = {0};
  options.timeout = timeout;
  options.participants = "worker:0, worker:1";
  return options;
}

TEST(NcclGroupTest, APeerThatNeverJoinsEndsFormingTheGroupAtTheTimeout) {
  SKIP_WITHOUT_GPU();
  const absl::Time start = absl::Now();
  auto group = NcclGroup::Create(LonelyRank(absl::Seconds(3)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  ASSERT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded) << group.status();
  EXPECT_THAT(group.status().message(), HasSubstr("forming the NCCL group of 2 ranks"));
  EXPECT_THAT(group.status().message(), HasSubstr("worker:0, worker:1"));
}

// A peer the coordination service reports gone (no heartbeats) ends the wait in about the
// check interval, not at the collective timeout.
TEST(NcclGroupTest, TheAbortCheckEndsFormingTheGroupLongBeforeTheTimeout) {
  SKIP_WITHOUT_GPU();
  NcclGroupOptions options = LonelyRank(absl::Minutes(5));
  const absl::Time start = absl::Now();
  options.abort_check = [start] {
    return absl::Now() - start < absl::Seconds(1)
               ? absl::OkStatus()
               : absl::UnavailableError("worker:1 sent no heartbeat for 11s");
  };
  auto group = NcclGroup::Create(options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  ASSERT_EQ(group.status().code(), absl::StatusCode::kUnavailable) << group.status();
  EXPECT_THAT(group.status().message(), HasSubstr("gave up on forming the NCCL group"));
  EXPECT_THAT(group.status().message(), HasSubstr("worker:1 sent no heartbeat"));
}

FitData SyntheticFitData(int64_t n, int inputs) {
  Data train = MakeData(n, inputs, 5, 21);
  Data test = MakeData(n / 4, inputs, 5, 22);
  return testing::InMemoryFitData(train.images, train.labels, test.images, test.labels, 1.0 / 255);
}

TEST(GpuFitTest, OneGpuAndTwoLogicalGpusReachAccuracy) {
  SKIP_WITHOUT_GPU();
  Model model = *Model::FromKerasJson(ModelJson("relu", "softmax"));
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto optimizer = *Optimizer::FromKeras(
      nlohmann::json::parse(R"({"class_name": "Adam", "config": {"learning_rate": 0.01}})"));
  const FitData data = SyntheticFitData(4000, 8);
  FitOptions options;
  options.epochs = 8;
  options.batch_size_per_replica = 32;
  options.progress = ProgressStyle::kNone;

  auto one = *OneDeviceStrategy::Create("GPU:0");
  absl::StatusOr<FitSummary> single = Fit(*one, model, loss, *optimizer, data, options);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_GT(single->test_accuracy, 0.85);
  EXPECT_EQ(single->steps, 8 * 125);

  ASSERT_TRUE(SetLogicalGpusPerGpu(2));
  MirroredOptions mirrored_options;
  mirrored_options.devices = {"GPU:0", "GPU:1"};
  absl::StatusOr<std::unique_ptr<MirroredStrategy>> mirrored =
      MirroredStrategy::Create(mirrored_options);
  ASSERT_TRUE(mirrored.ok()) << mirrored.status();
  EXPECT_EQ((*mirrored)->cross_device_ops().name(), "HierarchicalCopyAllReduce");
  options.batch_size_per_replica = 16;
  absl::StatusOr<FitSummary> two = Fit(**mirrored, model, loss, *optimizer, data, options);
  SetLogicalGpusPerGpu(1);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->num_replicas_in_sync, 2);
  EXPECT_GT(two->test_accuracy, 0.85);
  mirrored_options.cross_device_ops = "NcclAllReduce";
  ASSERT_TRUE(SetLogicalGpusPerGpu(2));
  EXPECT_EQ(MirroredStrategy::Create(mirrored_options).status().code(),
            absl::StatusCode::kInvalidArgument);
  SetLogicalGpusPerGpu(1);
}

// Two epochs of 20 steps (1000 examples, batch 50) with Adam on GPU:0.
struct ShortGpuFit {
  Model model = *Model::FromKerasJson(ModelJson("relu", "softmax"));
  Loss loss = Loss::SparseCategoricalCrossentropy();
  std::unique_ptr<Optimizer> optimizer = *Optimizer::FromKeras("adam");
  FitData data = SyntheticFitData(1000, 8);
  std::unique_ptr<OneDeviceStrategy> one = *OneDeviceStrategy::Create("GPU:0");
  FitOptions options;

  ShortGpuFit() {
    options.epochs = 2;
    options.batch_size_per_replica = 50;
    options.progress = ProgressStyle::kNone;
  }
  absl::StatusOr<FitSummary> Run() { return Fit(*one, model, loss, *optimizer, data, options); }
};

TEST(GpuFitTest, BacksUpAndResumesFromACheckpoint) {
  SKIP_WITHOUT_GPU();
  ShortGpuFit fit;
  FitOptions& options = fit.options;
  options.checkpoint_dir = ::testing::TempDir() + "/gpu_fit_checkpoint";
  options.checkpoint_every_steps = 7;
  std::filesystem::remove_all(options.checkpoint_dir);
  absl::StatusOr<FitSummary> first = fit.Run();
  ASSERT_TRUE(first.ok()) << first.status();
  options.epochs = 3;
  absl::StatusOr<FitSummary> resumed = fit.Run();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from_step, 40);
  EXPECT_EQ(resumed->steps, 60);
  ASSERT_EQ(resumed->history.size(), 3u);
  EXPECT_EQ(resumed->history[2].steps, 20);
  std::filesystem::remove_all(options.checkpoint_dir);
}

// Preemption on the GPU path: a stop (a SIGTERM in the binaries) ends training after the
// step it is seen at, with the state there saved; the run again resumes at that step and
// ends as the uninterrupted run does.
TEST(GpuFitTest, AStopSavesTheStepAndTheRunAgainEndsAsTheUninterruptedOne) {
  SKIP_WITHOUT_GPU();
  ShortGpuFit fit;
  FitOptions& options = fit.options;
  absl::StatusOr<FitSummary> whole = fit.Run();
  ASSERT_TRUE(whole.ok()) << whole.status();

  options.checkpoint_dir = ::testing::TempDir() + "/gpu_fit_stop";
  std::filesystem::remove_all(options.checkpoint_dir);
  absl::Notification stop;
  stop.Notify();
  options.stop = &stop;
  absl::StatusOr<FitSummary> stopped = fit.Run();
  ASSERT_TRUE(IsStoppedEarly(stopped.status())) << stopped.status();
  EXPECT_THAT(stopped.status().message(),
              HasSubstr("training stopped after step 1 (epoch 1, step 1 of 20): this process was "
                        "stopped by a signal; the state at step 1 is saved in"));
  auto saved = ReadLatestCheckpoint(options.checkpoint_dir);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->step, 1);

  options.stop = nullptr;
  absl::StatusOr<FitSummary> resumed = fit.Run();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from_step, 1);
  EXPECT_EQ(resumed->steps, whole->steps);
  EXPECT_NEAR(resumed->test_accuracy, whole->test_accuracy, 0.005);
  ASSERT_EQ(resumed->variables.size(), whole->variables.size());
  for (size_t v = 0; v < whole->variables.size(); ++v) {
    const Tensor& a = resumed->variables[v];
    const Tensor& b = whole->variables[v];
    ASSERT_EQ(a.num_elements(), b.num_elements());
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-4)
          << "variable " << v << "[" << i << "]";
    }
  }
  std::filesystem::remove_all(options.checkpoint_dir);
}

}  // namespace
}  // namespace stratum::cuda
