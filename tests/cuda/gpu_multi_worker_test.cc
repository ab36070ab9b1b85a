// Workers on GPUs in multi-worker jobs: MultiWorkerMirrored Fit on the GPU path with two
// workers in one process (in-memory collectives) keeping bit-identical variables, over the
// ring and over NCCL (two GPUs; one rank on one GPU; workers sharing a GPU refused); the same
// with two worker processes sharing GPU:0 through stratum-worker, over the ring and over a
// two-rank NCCL group; and a parameter-server job whose workers train on GPU:0. Every test skips,
// with the reason, when no GPU is visible (as in CI, which builds with CUDA but has no GPU).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "nlohmann/json.hpp"
#include "stratum/cuda/device.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/worker/collective/collectives.h"
#include "stratum/worker/collective/transport.h"
#include "stratum/worker/fit.h"
#include "stratum/worker/multi_worker_mirrored_strategy.h"

namespace stratum {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::LocalCluster;
using ::testing::Not;
using testing::StatusIs;
using testing::TempPath;

#define SKIP_WITHOUT_GPU()                                                                  \
  if (cuda::PhysicalGpuCount() == 0) {                                                      \
    GTEST_SKIP() << "no CUDA GPU is visible to this process: the GPU path cannot run here"; \
  }

constexpr char kModel[] = R"({"class_name": "Sequential", "config": {"layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 8]}},
    {"class_name": "Dense", "config": {"name": "hidden", "units": 16, "activation": "relu"}},
    {"class_name": "Dense", "config": {"name": "out", "units": 5, "activation": "softmax"}}]}})";

// uint8 examples whose class is the argmax of a fixed linear map of the features: learnable.
std::pair<Tensor, Tensor> Examples(int64_t n, uint32_t seed) {
  const int inputs = 8, classes = 5;
  std::mt19937 rng(seed);
  Tensor images(DType::kUInt8, {n, inputs}), labels(DType::kUInt8, {n});
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* x = images.data<uint8_t>() + i * inputs;
    for (int j = 0; j < inputs; ++j) x[j] = static_cast<uint8_t>(rng() % 256);
    float best = -1e9f;
    for (int c = 0; c < classes; ++c) {
      float score = 0;
      for (int j = 0; j < inputs; ++j)
        score += (x[j] / 255.0f - 0.5f) * static_cast<float>(((c * inputs + j) * 7919 % 13) - 6);
      if (score > best) {
        best = score;
        labels.data<uint8_t>()[i] = static_cast<uint8_t>(c);
      }
    }
  }
  return {images, labels};
}

// A small learnable job: 4000 training examples, 1000 test examples.
struct SmallJob {
  FitData data;
  Model model = *Model::FromKerasJson(kModel);
  Loss loss = Loss::SparseCategoricalCrossentropy();
  std::unique_ptr<Optimizer> optimizer = *Optimizer::FromKeras(
      nlohmann::json::parse(R"({"class_name": "Adam", "config": {"learning_rate": 0.01}})"));
  FitOptions options;

  explicit SmallJob(int epochs) {
    const auto train = Examples(4000, 21);
    const auto test = Examples(1000, 22);
    data.train = Dataset::FromTensorSlices({train.first, train.second});
    data.test = Dataset::FromTensorSlices({test.first, test.second});
    data.has_test = true;
    data.train_examples = 4000;
    data.test_examples = 1000;
    data.rescale = 1.0 / 255;
    options.epochs = epochs;
    options.batch_size_per_replica = 32;
    options.progress = ProgressStyle::kNone;
  }
};

// Fits `job` on MultiWorkerMirrored workers in this process, one thread each, over
// in-memory collectives and one in-memory rendezvous: worker w on devices[w], for
// epochs[w] epochs (job.options.epochs when empty), stopped by stops[w] (none when empty).
std::vector<absl::StatusOr<FitSummary>> FitWorkers(
    const SmallJob& job, const std::vector<std::vector<std::string>>& devices,
    CommunicationImplementation implementation, absl::Duration timeout,
    const std::vector<int>& epochs = {}, const std::vector<const absl::Notification*>& stops = {}) {
  const int workers = static_cast<int>(devices.size());
  auto group = InProcessTransportGroup::Create(workers);
  std::shared_ptr<Rendezvous> rendezvous = NewInMemoryRendezvous();
  std::vector<absl::StatusOr<FitSummary>> summaries(devices.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      CommunicationOptions communication;
      communication.implementation = implementation;
      communication.timeout = timeout;
      auto collectives = Collectives::Create(group->TakeTransport(w), communication);
      if (!collectives.ok()) {
        summaries[w] = collectives.status();
        return;
      }
      MirroredOptions local;
      local.devices = devices[w];
      auto strategy =
          MultiWorkerMirroredStrategy::Create(local, *std::move(collectives), rendezvous.get());
      if (!strategy.ok()) {
        summaries[w] = strategy.status();
        return;
      }
      FitOptions options = job.options;
      if (!epochs.empty()) options.epochs = epochs[w];
      if (!stops.empty()) options.stop = stops[w];
      summaries[w] = Fit(**strategy, job.model, job.loss, *job.optimizer, job.data, options);
      // Gone: its transport looks closed to the others, as a process that exited.
      group->Close(w);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return summaries;
}

void ExpectBitIdenticalVariables(const FitSummary& first, const FitSummary& second) {
  ASSERT_EQ(second.variables.size(), first.variables.size());
  for (size_t v = 0; v < first.variables.size(); ++v) {
    ASSERT_EQ(first.variables[v].byte_size(), second.variables[v].byte_size());
    EXPECT_EQ(std::memcmp(first.variables[v].data<float>(), second.variables[v].data<float>(),
                          first.variables[v].byte_size()),
              0)
        << "variable " << v << " differs between the workers";
  }
}

TEST(GpuMultiWorkerFitTest, TwoWorkersKeepBitIdenticalVariablesAndAgree) {
  SKIP_WITHOUT_GPU();
  const SmallJob job(6);
  const auto summaries = FitWorkers(job, {{"GPU:0"}, {"GPU:0"}}, CommunicationImplementation::kRing,
                                    absl::Seconds(60));
  for (const auto& summary : summaries) ASSERT_TRUE(summary.ok()) << summary.status();
  const FitSummary& first = *summaries[0];
  EXPECT_EQ(first.num_workers, 2);
  EXPECT_EQ(first.num_replicas_in_sync, 2);
  // Each worker trains its half (2000 examples) in full batches of 32: 62 steps per epoch.
  EXPECT_EQ(first.steps, 6 * 62);
  EXPECT_GT(first.test_accuracy, 0.85);
  const FitSummary& second = *summaries[1];
  EXPECT_EQ(second.steps, first.steps);
  EXPECT_EQ(second.test_accuracy, first.test_accuracy);
  EXPECT_EQ(second.test_loss, first.test_loss);
  ExpectBitIdenticalVariables(first, second);
}

// Preemption on the GPU path with several workers: a stop on worker 1 alone ends both
// after the same step (their stop vote), with the state there saved by the chief; the job
// run again resumes at that step, and its workers end with bit-identical variables.
TEST(GpuMultiWorkerFitTest, AStopOnOneWorkerStopsBothAtOneStepAndTheRunAgainResumesThere) {
  SKIP_WITHOUT_GPU();
  SmallJob job(2);
  const auto whole = FitWorkers(job, {{"GPU:0"}, {"GPU:0"}}, CommunicationImplementation::kRing,
                                absl::Seconds(60));
  ASSERT_TRUE(whole[0].ok()) << whole[0].status();
  job.options.checkpoint_dir = TempPath("gpu_mwms_stop");
  std::filesystem::remove_all(job.options.checkpoint_dir);
  absl::Notification stop;
  stop.Notify();
  const auto stopped = FitWorkers(job, {{"GPU:0"}, {"GPU:0"}}, CommunicationImplementation::kRing,
                                  absl::Seconds(60), {}, {nullptr, &stop});
  for (const auto& summary : stopped) {
    ASSERT_TRUE(IsStoppedEarly(summary.status())) << summary.status();
    EXPECT_THAT(summary.status().message(), HasSubstr("training stopped after step 1 (epoch 1, "
                                                      "step 1 of 62)"));
  }
  EXPECT_THAT(stopped[0].status().message(), HasSubstr("because another worker was stopped"));
  EXPECT_THAT(stopped[1].status().message(), HasSubstr("this process was stopped by a signal"));

  const auto resumed = FitWorkers(job, {{"GPU:0"}, {"GPU:0"}}, CommunicationImplementation::kRing,
                                  absl::Seconds(60));
  for (const auto& summary : resumed) {
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->resumed_from_step, 1);
    EXPECT_EQ(summary->steps, whole[0]->steps);
  }
  EXPECT_NEAR(resumed[0]->test_accuracy, whole[0]->test_accuracy, 0.005);
  ExpectBitIdenticalVariables(*resumed[0], *resumed[1]);
  std::filesystem::remove_all(job.options.checkpoint_dir);
}

// Communication NCCL on one GPU: a group of one rank, which sums nothing but takes every
// step through the NCCL path (formation, all-reduce, the bounded waits, closing).
TEST(GpuMultiWorkerFitTest, OneWorkerOverNcclTrainsAsTheSingleGpuPath) {
  SKIP_WITHOUT_GPU();
  const SmallJob job(3);
  const auto nccl =
      FitWorkers(job, {{"GPU:0"}}, CommunicationImplementation::kNccl, absl::Seconds(60));
  const auto ring =
      FitWorkers(job, {{"GPU:0"}}, CommunicationImplementation::kRing, absl::Seconds(60));
  ASSERT_TRUE(nccl[0].ok()) << nccl[0].status();
  ASSERT_TRUE(ring[0].ok()) << ring[0].status();
  EXPECT_EQ(nccl[0]->steps, ring[0]->steps);
  EXPECT_GT(nccl[0]->test_accuracy, 0.85);
  EXPECT_NEAR(nccl[0]->test_accuracy, ring[0]->test_accuracy, 0.01);
  ASSERT_EQ(nccl[0]->variables.size(), ring[0]->variables.size());
  for (size_t v = 0; v < ring[0]->variables.size(); ++v) {
    const Tensor& a = nccl[0]->variables[v];
    const Tensor& b = ring[0]->variables[v];
    ASSERT_EQ(a.num_elements(), b.num_elements());
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-3)
          << "variable " << v << "[" << i << "]";
    }
  }
}

// NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); the group's formation names
// the workers that share it, at once, instead of failing deep inside NCCL or hanging.
TEST(GpuMultiWorkerFitTest, NcclWorkersSharingAGpuAreRefusedByName) {
  SKIP_WITHOUT_GPU();
  const SmallJob job(1);
  const absl::Time start = absl::Now();
  const auto summaries = FitWorkers(job, {{"GPU:0"}, {"GPU:0"}}, CommunicationImplementation::kNccl,
                                    absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  for (const auto& summary : summaries) {
    EXPECT_THAT(summary.status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("rank 0 (replica 0) and rank 1 (replica 0)"),
                               HasSubstr("RING or AUTO"))));
  }
}

#define SKIP_WITHOUT_TWO_GPUS()                                                            \
  if (cuda::PhysicalGpuCount() < 2) {                                                      \
    GTEST_SKIP() << "NCCL across workers needs a GPU per rank, and this process sees "     \
                 << cuda::PhysicalGpuCount() << " GPU(s) (NCCL refuses two ranks on one)"; \
  }

TEST(GpuMultiWorkerFitTest, TwoWorkersOverNcclKeepBitIdenticalVariables) {
  SKIP_WITHOUT_TWO_GPUS();
  const SmallJob job(6);
  const auto summaries = FitWorkers(job, {{"GPU:0"}, {"GPU:1"}}, CommunicationImplementation::kNccl,
                                    absl::Seconds(60));
  for (const auto& summary : summaries) ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summaries[0]->steps, 6 * 62);
  EXPECT_GT(summaries[0]->test_accuracy, 0.85);
  EXPECT_EQ(summaries[1]->test_accuracy, summaries[0]->test_accuracy);
  ExpectBitIdenticalVariables(*summaries[0], *summaries[1]);
}

// A worker that leaves after one epoch of two: the other's next NCCL all-reduce has no
// partner. It fails within the timeout naming the job's workers, instead of hanging.
TEST(GpuMultiWorkerFitTest, AWorkerThatLeavesFailsTheNcclStepWithinTheTimeout) {
  SKIP_WITHOUT_TWO_GPUS();
  const SmallJob job(2);
  const absl::Time start = absl::Now();
  // The timeout also bounds forming the group (1-3 s on H100s): not too short.
  const auto summaries = FitWorkers(job, {{"GPU:0"}, {"GPU:1"}}, CommunicationImplementation::kNccl,
                                    absl::Seconds(15), {2, 1});
  EXPECT_LT(absl::Now() - start, absl::Seconds(90));
  EXPECT_TRUE(summaries[1].ok()) << summaries[1].status();
  ASSERT_FALSE(summaries[0].ok());
  // NCCL may notice the peer's exit itself (UNAVAILABLE) or not at all (the deadline).
  EXPECT_THAT(summaries[0].status().code(),
              ::testing::AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kUnavailable))
      << summaries[0].status();
  EXPECT_THAT(summaries[0].status().message(), HasSubstr("NCCL all-reduce"));
}

// An example job with every local replica on GPU:0.
std::string GpuJob(const std::string& example, const std::string& name, int epochs,
                   int steps_per_epoch) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/" + example);
  nlohmann::json job = nlohmann::json::parse(file);
  job["fit"]["epochs"] = epochs;
  job["fit"]["steps_per_epoch"] = steps_per_epoch;
  job["strategy"]["devices"] = {"GPU:0"};
  job.erase("checkpoint");
  const std::string path = TempPath(name + ".json");
  std::ofstream(path) << job.dump();
  return path;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
}

// Both workers of a 2-epoch MWMS example job on GPU:0 ended well, with the summary at
// `summary`, and report the same test figures (they hold the same variables).
void ExpectTwoWorkersTrainedTwoEpochsAlike(LocalCluster& cluster, const std::string& summary) {
  for (int w = 0; w < 2; ++w) {
    auto exit = cluster.WaitForExit({"worker", w}, absl::Seconds(240));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_TRUE(exit->success()) << cluster.Output({"worker", w});
    EXPECT_THAT(cluster.Output({"worker", w}), Not(HasSubstr("training on the CPU")));
  }
  const nlohmann::json result = ReadJson(summary);
  ASSERT_TRUE(result.is_object()) << "no summary at " << summary;
  EXPECT_EQ(result["num_workers"], 2);
  EXPECT_EQ(result["num_replicas_in_sync"], 2);
  // Two epochs: each worker trains its half of the data in full batches of 64.
  EXPECT_EQ(result["steps"], 2 * (60000 / 2 / 64));
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.8);
  const absl::Status agree =
      cluster.OutputsAgree({{"worker", 0}, {"worker", 1}}, testing::kTestFigures);
  EXPECT_TRUE(agree.ok()) << agree;
}

TEST(GpuMultiWorkerJobTest, TwoWorkerProcessesOnOneGpuTrainInLockStepAndAgree) {
  SKIP_WITHOUT_GPU();
  const std::string summary = TempPath("gpu_mwms_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .args_by_type = {{"worker",
                         {"--job=" + GpuJob("fashion_mnist_mwms.json", "gpu_mwms", 2, 0),
                          "--summary_json=" + summary, "--cluster_timeout=60s"}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ExpectTwoWorkersTrainedTwoEpochsAlike(**cluster, summary);
}

// The MWMS example on GPU:0, its all-reduce over NCCL.
std::string NcclGpuJob(const std::string& name, int epochs) {
  const std::string path = GpuJob("fashion_mnist_mwms.json", name, epochs, 0);
  nlohmann::json job = ReadJson(path);
  job["strategy"]["communication"]["implementation"] = "NCCL";
  job["strategy"]["communication"]["timeout_seconds"] = 20;
  std::ofstream(path) << job.dump();
  return path;
}

// Two worker processes on GPU:0 that NCCL takes for two hosts: each has its own NCCL_HOSTID,
// so NCCL forms a real two-rank group and joins the ranks over its socket transport (on
// the loopback interface), as it joins workers on two machines. Without the ids NCCL
// refuses two ranks on one GPU, and so does Stratum (NcclWorkersSharingAGpuAreRefusedByName).
testing::LocalClusterOptions NcclWorkersAsTwoHosts(const std::string& job,
                                                   const std::string& summary) {
  testing::LocalClusterOptions options{
      .num_workers = 2,
      .args_by_type = {{"worker",
                        {"--job=" + job, "--summary_json=" + summary, "--cluster_timeout=60s"}}},
      .forward_output = false};
  for (int w = 0; w < 2; ++w) {
    options.env_by_task.push_back(
        {TaskKey{"worker", w},
         {{"NCCL_HOSTID", absl::StrCat("stratum-test-host-", w)}, {"NCCL_SOCKET_IFNAME", "lo"}}});
  }
  return options;
}

TEST(GpuMultiWorkerJobTest, TwoWorkerProcessesOverATwoRankNcclGroupTrainInLockStepAndAgree) {
  SKIP_WITHOUT_GPU();
  const std::string summary = TempPath("gpu_nccl_summary.json");
  auto cluster = LocalCluster::Start(NcclWorkersAsTwoHosts(NcclGpuJob("gpu_nccl", 2), summary));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ExpectTwoWorkersTrainedTwoEpochsAlike(**cluster, summary);
}

// A worker killed mid-training: the survivor's NCCL all-reduce has no partner, and it exits
// with an error naming the dead worker instead of hanging.
TEST(GpuMultiWorkerJobTest, AKilledNcclPeerEndsTheSurvivorWithAnErrorThatNamesIt) {
  SKIP_WITHOUT_GPU();
  auto cluster = LocalCluster::Start(
      NcclWorkersAsTwoHosts(NcclGpuJob("gpu_nccl_kill", 50), TempPath("gpu_nccl_kill.json")));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitForOutput({"worker", 0}, "Epoch 2/50", absl::Seconds(120)))
      << (*cluster)->Output({"worker", 0});
  ASSERT_OK((*cluster)->Kill({"worker", 1}));
  const absl::Time killed = absl::Now();
  auto exit = (*cluster)->WaitForExit({"worker", 0}, absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(60));
  EXPECT_FALSE(exit->success());
  const std::string output = (*cluster)->Output({"worker", 0});
  const size_t error = output.rfind("stratum-worker: ");
  ASSERT_NE(error, std::string::npos) << output;
  EXPECT_THAT(output.substr(error), HasSubstr("worker:1")) << output;
}

TEST(GpuMultiWorkerJobTest, ParameterServerWorkersTrainOnTheGpu) {
  SKIP_WITHOUT_GPU();
  const std::string summary = TempPath("gpu_ps_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 1,
       .chief = true,
       .args_by_type = {{"chief",
                         {"--job=" + GpuJob("fashion_mnist_ps.json", "gpu_ps", 2, 100),
                          "--summary_json=" + summary}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(120));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_TRUE(exit->success()) << (*cluster)->Output({"chief", 0});
  const nlohmann::json result = ReadJson(summary);
  ASSERT_TRUE(result.is_object()) << "no summary at " << summary;
  EXPECT_EQ(result["steps"], 200);
  // 200 asynchronous steps of 64 examples: as the CPU workers (seen 0.71 to 0.80 there).
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.6);
  for (int w = 0; w < 2; ++w) {
    EXPECT_THAT((*cluster)->Output({"worker", w}),
                HasSubstr("the local replicas train on the GPU (GPU:0)"));
  }
}

// The ResNet example's model (convolutions, BatchNormalization and its moving statistics)
// and loss (from logits) in the job of example `strategy_example`, on GPU:0.
std::string ResNetGpuJob(const std::string& strategy_example, const std::string& name, int epochs,
                         int steps_per_epoch) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_resnet.json");
  const nlohmann::json resnet = nlohmann::json::parse(file);
  const std::string path = GpuJob(strategy_example, name, epochs, steps_per_epoch);
  nlohmann::json job = ReadJson(path);
  job["model"] = resnet["model"];
  job["compile"] = resnet["compile"];
  std::ofstream(path) << job.dump();
  return path;
}

TEST(GpuMultiWorkerJobTest, TwoWorkerProcessesTrainTheResNetOnOneGpuInLockStepAndAgree) {
  SKIP_WITHOUT_GPU();
  const std::string summary = TempPath("gpu_mwms_resnet_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .args_by_type = {{"worker",
                         {"--job=" +
                              ResNetGpuJob("fashion_mnist_mwms.json", "gpu_mwms_resnet", 1, 150),
                          "--summary_json=" + summary, "--cluster_timeout=60s"}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (int w = 0; w < 2; ++w) {
    auto exit = (*cluster)->WaitForExit({"worker", w}, absl::Seconds(240));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_TRUE(exit->success()) << (*cluster)->Output({"worker", w});
    EXPECT_THAT((*cluster)->Output({"worker", w}), Not(HasSubstr("training on the CPU")));
  }
  const nlohmann::json result = ReadJson(summary);
  ASSERT_TRUE(result.is_object()) << "no summary at " << summary;
  EXPECT_EQ(result["steps"], 150);
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.5);
  // The same test figures: the same variables, the moving statistics among them.
  const absl::Status agree =
      (*cluster)->OutputsAgree({{"worker", 0}, {"worker", 1}}, testing::kTestFigures);
  EXPECT_TRUE(agree.ok()) << agree;
}

// Parameter servers hold the ResNet's moving statistics too: the GPU workers push their
// changes as gradients, which the PSs apply as they are.
TEST(GpuMultiWorkerJobTest, ParameterServerWorkersTrainTheResNetOnTheGpu) {
  SKIP_WITHOUT_GPU();
  const std::string summary = TempPath("gpu_ps_resnet_summary.json");
  auto cluster = LocalCluster::Start(
      {.num_workers = 2,
       .num_ps = 1,
       .chief = true,
       .args_by_type = {{"chief",
                         {"--job=" + ResNetGpuJob("fashion_mnist_ps.json", "gpu_ps_resnet", 2, 100),
                          "--summary_json=" + summary}}},
       .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto exit = (*cluster)->WaitForExit({"chief", 0}, absl::Seconds(180));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_TRUE(exit->success()) << (*cluster)->Output({"chief", 0});
  const nlohmann::json result = ReadJson(summary);
  ASSERT_TRUE(result.is_object()) << "no summary at " << summary;
  EXPECT_EQ(result["steps"], 200);
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.5);
  for (int w = 0; w < 2; ++w) {
    EXPECT_THAT((*cluster)->Output({"worker", w}),
                HasSubstr("the local replicas train on the GPU (GPU:0)"));
  }
}

}  // namespace
}  // namespace stratum
