// A user's own parameter-server programs, as the PS tutorial's custom loop: the example
// worker program (examples/ps_custom_loop_worker.cc, its step function and per-worker
// dataset registered) serves real stratum-ps tasks' variables; a coordinator, the example
// program or one in this process (ParameterServerCluster), schedules the functions by name.
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "examples/ps_custom_loop.h"
#include "stratum/coordinator/parameter_server_cluster.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using testing::LocalClusterOptions;

constexpr char kBuilt[] = "built per-worker dataset \"train\"";

// A PS cluster whose workers run the example worker program; the chief is planned (its
// address is in every TF_CONFIG) but left to the test.
std::unique_ptr<LocalCluster> StartCluster(int workers) {
  LocalClusterOptions options{.num_workers = workers, .num_ps = 2, .chief = true};
  options.not_started = {{"chief", 0}};
  options.forward_output = false;
  for (int w = 0; w < workers; ++w) {
    // In place of stratum-worker, with its arguments.
    options.wrapper_by_task.push_back(
        {{"worker", w},
         {"/bin/sh", "-c",
          absl::StrCat("exec ", STRATUM_BIN_DIR, "/ps_custom_loop_worker \"$@\"")}});
  }
  auto cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

int CountOf(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

TEST(UserClosuresTest, TheExampleProgramsTrainFashionMnist) {
  std::unique_ptr<LocalCluster> cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/ps_custom_loop_coordinator", "--epochs=2",
                  "--steps_per_epoch=300"};
  options.env = {{"TF_CONFIG", cluster->TfConfig({"chief", 0})}};
  options.forward_fd = -1;
  options.capture_output = true;
  auto coordinator = Subprocess::Spawn(std::move(options));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto exit = (*coordinator)->Wait(absl::Seconds(90));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << (*coordinator)->output();
  const std::string output = (*coordinator)->output();
  ASSERT_TRUE(exit->success()) << output;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(output, match, std::regex("epoch 2: .*test accuracy ([0-9.]+)")))
      << output;
  // Asynchronous updates make the figure noisy (0.78 to 0.84 after 600 steps): well above
  // chance (0.1) is what this checks.
  EXPECT_GT(std::stod(match[1]), 0.75) << output;
  EXPECT_THAT(output, HasSubstr("final loss"));
  // Each worker built its dataset once, whatever the closures it ran.
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(CountOf(cluster->Output({"worker", w}), kBuilt), 1) << cluster->Output({"worker", w});
  }
}

// The coordinator side in this process.
std::unique_ptr<ParameterServerCluster> Connect(const LocalCluster& cluster) {
  ParameterServerClusterOptions options;
  options.cluster_timeout = absl::Seconds(30);
  options.worker_recovery_timeout = absl::Seconds(30);
  auto connected = ParameterServerCluster::Create(cluster.spec(), ps_custom_loop::kJob, options);
  EXPECT_TRUE(connected.ok()) << connected.status();
  return connected.ok() ? *std::move(connected) : nullptr;
}

TEST(UserClosuresTest, ClosuresAreRefusedByNameAndTheirErrorsReachTheProgram) {
  std::unique_ptr<LocalCluster> cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<ParameterServerCluster> ps = Connect(*cluster);
  ASSERT_NE(ps, nullptr);
  ClusterCoordinator& coordinator = ps->coordinator();
  const PerWorkerValues train = coordinator.CreatePerWorkerDataset("train");

  const auto raised = [&](std::string function, std::vector<ClosureArg> args) {
    auto value = coordinator.Schedule(std::move(function), std::move(args));
    EXPECT_TRUE(value.ok()) << value.status();
    absl::Status joined = coordinator.Join(absl::Seconds(30));
    // The RemoteValue says it too.
    if (value.ok()) {
      EXPECT_EQ((*value)->Fetch().status().code(), joined.code());
    }
    return joined;
  };
  absl::Status unknown = raised("no_such_fn", {train});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  EXPECT_THAT(unknown.message(),
              HasSubstr("function \"no_such_fn\" is not registered on this worker (it has "
                        "train_step_fn, and the built-in train_step)"));
  absl::Status tensor = raised("train_step_fn", {Tensor::Scalar(1.0f)});
  EXPECT_EQ(tensor.code(), absl::StatusCode::kInvalidArgument) << tensor;
  EXPECT_THAT(tensor.message(),
              HasSubstr("function \"train_step_fn\" wants a per-worker dataset "
                        "(CreatePerWorkerDataset's values) as argument 0, and it is a tensor"));
  absl::Status missing = raised("train_step_fn", {});
  EXPECT_THAT(missing.message(), HasSubstr("and the closure has 0 argument(s)")) << missing;
  absl::Status dataset = raised("train_step_fn", {coordinator.CreatePerWorkerDataset("tset")});
  EXPECT_EQ(dataset.code(), absl::StatusCode::kNotFound) << dataset;
  EXPECT_THAT(dataset.message(),
              HasSubstr("dataset function \"tset\" is not registered on this worker (it has "
                        "train)"));
  absl::Status builtin = raised("train_step", {Tensor::Scalar(1.0f)});
  EXPECT_EQ(builtin.code(), absl::StatusCode::kInvalidArgument) << builtin;
  EXPECT_THAT(builtin.message(), HasSubstr("train_step trains on the job's data.train, and this "
                                           "job has none"));

  // After the errors, closures run: each returns [mean loss, correct, examples].
  std::vector<std::shared_ptr<RemoteValue>> values;
  for (int i = 0; i < 20; ++i) values.push_back(*coordinator.Schedule("train_step_fn", {train}));
  ASSERT_OK(coordinator.Join(absl::Seconds(60)));
  for (const std::shared_ptr<RemoteValue>& value : values) {
    auto outputs = value->Fetch();
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    ASSERT_EQ(outputs->size(), 3u);
    EXPECT_GT(*(*outputs)[0].data<float>(), 0.0f);
    EXPECT_EQ(*(*outputs)[2].data<float>(), ps_custom_loop::kBatchPerReplica);
  }
  EXPECT_EQ(CountOf(cluster->Output({"worker", 0}), kBuilt), 1) << cluster->Output({"worker", 0});
  // The variables moved on the parameter servers.
  auto variables = ps->ReadVariables();
  ASSERT_TRUE(variables.ok()) << variables.status();
  EXPECT_EQ(variables->size(), ps->model().variables().size());
}

TEST(UserClosuresTest, AWorkerThatRestartsBuildsItsDatasetAgainAndNoClosureIsLost) {
  std::unique_ptr<LocalCluster> cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<ParameterServerCluster> ps = Connect(*cluster);
  ASSERT_NE(ps, nullptr);
  ClusterCoordinator& coordinator = ps->coordinator();
  const PerWorkerValues train = coordinator.CreatePerWorkerDataset("train");
  std::vector<std::shared_ptr<RemoteValue>> values;
  const auto schedule = [&](int closures) {
    for (int i = 0; i < closures; ++i) {
      auto value = coordinator.Schedule("train_step_fn", {train});
      ASSERT_TRUE(value.ok()) << value.status();
      values.push_back(*std::move(value));
    }
  };
  schedule(50);
  ASSERT_TRUE(cluster->WaitForOutput({"worker", 0}, kBuilt, absl::Seconds(30)));
  ASSERT_OK(cluster->Kill({"worker", 0}));
  schedule(50);  // run on worker:1 meanwhile
  ASSERT_OK(cluster->Restart({"worker", 0}));
  // Until the restarted worker has run some: it is set up anew and builds its dataset again.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (cluster->Output({"worker", 0}).find(kBuilt) == std::string::npos &&
         absl::Now() < deadline) {
    schedule(10);
    ASSERT_OK(coordinator.Join(absl::Seconds(60)));
  }
  ASSERT_OK(coordinator.Join(absl::Seconds(60)));
  EXPECT_EQ(CountOf(cluster->Output({"worker", 0}), kBuilt), 1) << cluster->Output({"worker", 0});
  EXPECT_EQ(CountOf(cluster->Output({"worker", 1}), kBuilt), 1) << cluster->Output({"worker", 1});
  for (const std::shared_ptr<RemoteValue>& value : values) {
    auto outputs = value->Fetch(absl::Seconds(1));
    ASSERT_TRUE(outputs.ok()) << outputs.status();  // at least once: none lost
  }
}

}  // namespace
}  // namespace stratum
