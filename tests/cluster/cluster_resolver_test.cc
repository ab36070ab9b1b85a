#include "stratum/cluster/cluster_resolver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/devices.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kCluster[] =
    R"("cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]})";

std::string Config(const std::string& task, const std::string& extra = "") {
  return absl::StrCat("{", kCluster, ", \"task\": ", task, extra, "}");
}

std::string ErrorOf(const std::string& tf_config, const TaskOverrides& overrides = {}) {
  auto resolver = TFConfigClusterResolver::Create(tf_config, overrides);
  EXPECT_FALSE(resolver.ok()) << tf_config;
  if (resolver.ok()) return "";
  EXPECT_EQ(resolver.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(resolver.status().message());
}

TEST(TFConfigClusterResolverTest, ResolvesClusterAndTask) {
  auto resolver = TFConfigClusterResolver::Create(Config(R"({"type": "worker", "index": 1})"));
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->task_type(), "worker");
  EXPECT_EQ(resolver->task_id(), 1);
  EXPECT_EQ(resolver->cluster_spec().num_tasks("worker"), 2);
  EXPECT_EQ(resolver->master(), "w1:2222");
  EXPECT_FALSE(resolver->is_chief());
  EXPECT_EQ(*resolver->id_in_cluster(), 2);
  EXPECT_EQ(*resolver->worker_count(), 3);
}

TEST(TFConfigClusterResolverTest, MasterUsesRpcLayer) {
  auto resolver = TFConfigClusterResolver::Create(
      Config(R"({"type": "chief", "index": 0})", R"(, "rpc_layer": "grpc")"));
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->master(), "grpc://c:2222");
  EXPECT_EQ(*resolver->master("ps", 0), "grpc://p0:2222");
  EXPECT_EQ(resolver->master("ps", 4).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(resolver->is_chief());
}

TEST(TFConfigClusterResolverTest, EmptyTfConfigMeansLocal) {
  auto resolver = TFConfigClusterResolver::Create("");
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_TRUE(resolver->cluster_spec().empty());
  EXPECT_FALSE(resolver->has_task());
  EXPECT_EQ(resolver->master(), "");
}

TEST(TFConfigClusterResolverTest, ADeeplyNestedTfConfigIsRefusedNotACrash) {
  auto resolver = TFConfigClusterResolver::Create(R"({"cluster": )" + std::string(60000, '[') +
                                                  std::string(60000, ']') + "}");
  EXPECT_EQ(resolver.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(resolver.status().message()),
              HasSubstr("TF_CONFIG nests arrays and objects 60001 levels deep"));
}

TEST(TFConfigClusterResolverTest, AcceptsAndIgnoresEnvironment) {
  auto resolver = TFConfigClusterResolver::Create(
      Config(R"({"type": "ps", "index": 0})", R"(, "environment": "cloud")"));
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->environment(), "cloud");
  EXPECT_EQ(resolver->task_type(), "ps");
  auto refused = TFConfigClusterResolver::Create(
      Config(R"({"type": "ps", "index": 0})", R"(, "environment": 5)"));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("TF_CONFIG environment is 5, not a string: write it as \"cloud\" "
                        "(Kubeflow's value) or leave it out"));
}

TEST(TFConfigClusterResolverTest, AcceptsKubeflowSparseWorkers) {
  auto resolver = TFConfigClusterResolver::Create(
      R"({"cluster": {"worker": {"1": "tfjob-worker-1.ns.svc:2222"}}, "task": {"type": "worker", "index": 1}, "environment": "cloud"})");
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->master(), "tfjob-worker-1.ns.svc:2222");
}

// Kubeflow's training operator (pkg/controller.v1/tensorflow/tensorflow.go) writes
// TF_CONFIG with Go's encoding/json: the TFConfig struct (cluster, task, environment
// "cloud"; the cluster's keys sorted), or, for a TFJob with enableDynamicWorker, the
// SparseTFConfig struct under the key "sparseCluster": a worker gets itself and every ps,
// a ps only itself (a one-element list, whatever its index), the chief nothing.
constexpr char kKubeflowCluster[] =
    R"({"chief":["stratum-chief-0.ml.svc:2222"],"ps":["stratum-ps-0.ml.svc:2222","stratum-ps-1.ml.svc:2222"],"worker":["stratum-worker-0.ml.svc:2222","stratum-worker-1.ml.svc:2222"]})";

TEST(KubeflowTfConfigTest, AcceptsTheOperatorsDenseForm) {
  for (const auto& [type, index] :
       std::vector<std::pair<std::string, int>>{{"chief", 0}, {"ps", 1}, {"worker", 0}}) {
    const std::string tf_config =
        absl::StrCat(R"({"cluster":)", kKubeflowCluster, R"(,"task":{"type":")", type,
                     R"(","index":)", index, R"(},"environment":"cloud"})");
    auto resolver = TFConfigClusterResolver::Create(tf_config);
    ASSERT_TRUE(resolver.ok()) << resolver.status();
    EXPECT_EQ(resolver->task(), (TaskKey{type, index}));
    EXPECT_EQ(resolver->environment(), "cloud");
    EXPECT_EQ(resolver->cluster_spec().num_tasks("worker"), 2);
    EXPECT_EQ(*resolver->cluster_spec().TaskAddress("ps", 1), "stratum-ps-1.ml.svc:2222");
  }
}

TEST(KubeflowTfConfigTest, AcceptsTheOperatorsSparseFormForAWorker) {
  auto resolver = TFConfigClusterResolver::Create(
      R"({"sparseCluster":{"worker":{"1":"stratum-worker-1.ml.svc:2222"},"ps":["stratum-ps-0.ml.svc:2222","stratum-ps-1.ml.svc:2222"]},"task":{"type":"worker","index":1}})");
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->task(), (TaskKey{"worker", 1}));
  EXPECT_EQ(resolver->master(), "stratum-worker-1.ml.svc:2222");
  EXPECT_EQ(resolver->cluster_spec().task_indices("worker"), std::vector<int>{1});
  EXPECT_EQ(resolver->cluster_spec().num_tasks("ps"), 2);
}

TEST(KubeflowTfConfigTest, AcceptsTheOperatorsSparseFormForAPs) {
  auto resolver = TFConfigClusterResolver::Create(
      R"({"sparseCluster":{"worker":{},"ps":["stratum-ps-1.ml.svc:2222"]},"task":{"type":"ps","index":1}})");
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->task(), (TaskKey{"ps", 1}));
  EXPECT_EQ(resolver->master(), "stratum-ps-1.ml.svc:2222");
  EXPECT_FALSE(resolver->cluster_spec().HasJob("worker"));
  auto first = TFConfigClusterResolver::Create(
      R"({"sparseCluster":{"worker":{},"ps":["stratum-ps-0.ml.svc:2222"]},"task":{"type":"ps","index":0}})");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->master(), "stratum-ps-0.ml.svc:2222");
}

TEST(KubeflowTfConfigTest, SparseFormGivesTheChiefNothingAndSaysSo) {
  EXPECT_EQ(
      ErrorOf(R"({"sparseCluster":{"worker":{},"ps":[]},"task":{"type":"chief","index":0}})"),
      "TF_CONFIG sparseCluster (written by Kubeflow for a TFJob with enableDynamicWorker) does "
      "not list chief:0, and a Stratum chief needs the whole cluster: set enableDynamicWorker to "
      "false in the TFJob");
  EXPECT_EQ(ErrorOf(absl::StrCat(R"({"cluster":)", kKubeflowCluster,
                                 R"(,"sparseCluster":{"ps":[]},"task":{"type":"ps","index":0}})")),
            "TF_CONFIG has both \"cluster\" and \"sparseCluster\": keep one");
}

TEST(TFConfigClusterResolverTest, ClusterWithoutTaskIsAllowed) {
  auto resolver = TFConfigClusterResolver::Create(absl::StrCat("{", kCluster, "}"));
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_FALSE(resolver->has_task());
}

TEST(TFConfigClusterResolverTest, OverridesWin) {
  TaskOverrides overrides{.task_type = "ps", .task_index = 0, .rpc_layer = std::nullopt};
  auto resolver =
      TFConfigClusterResolver::Create(Config(R"({"type": "worker", "index": 1})"), overrides);
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->task(), (TaskKey{"ps", 0}));
}

TEST(TFConfigClusterResolverTest, OverriddenTaskIsValidatedToo) {
  EXPECT_EQ(ErrorOf(Config(R"({"type": "worker", "index": 1})"), {.task_index = 5}),
            "TF_CONFIG task.index 5 is out of range: job \"worker\" has 2 tasks (0..1)");
}

TEST(TFConfigClusterResolverTest, NumAcceleratorsMatchesVisibleGpus) {
  auto resolver = TFConfigClusterResolver::Create(Config(R"({"type": "worker", "index": 0})"));
  ASSERT_OK(resolver);
  EXPECT_EQ(resolver->num_accelerators(), VisibleGpuCount());
  EXPECT_GE(resolver->num_accelerators(), 0);
}

// One test per rule; each message is one sentence with the field, the value and the fix.
TEST(TFConfigValidationTest, NotJson) {
  EXPECT_THAT(ErrorOf("{cluster: }"),
              StartsWith("TF_CONFIG is not valid JSON (error at byte 2): set it to a JSON "
                         "object such as {\"cluster\""));
}

TEST(TFConfigValidationTest, ANumberOutOfRange) {
  EXPECT_THAT(
      ErrorOf(R"({"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 1e400}})"),
      StartsWith("TF_CONFIG holds a number out of range ("));
}

// JSON keeps the last of two equal keys silently: TF_CONFIG would mean another task.
TEST(TFConfigValidationTest, AKeyGivenTwice) {
  EXPECT_THAT(
      ErrorOf(
          R"({"cluster": {"ps": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "ps", "index": 0}, "task": {"type": "ps", "index": 1}})"),
      StartsWith("TF_CONFIG: key \"task\" appears twice in the top object"));
}

TEST(TFConfigValidationTest, NotAnObject) {
  EXPECT_THAT(ErrorOf("[1, 2]"), StartsWith("TF_CONFIG is [1,2], not a JSON object"));
}

TEST(TFConfigValidationTest, UnknownKey) {
  EXPECT_EQ(ErrorOf(R"({"custer": {}})"),
            "TF_CONFIG has unknown key \"custer\": the keys are \"cluster\", \"task\", "
            "\"rpc_layer\" and \"environment\"");
}

TEST(TFConfigValidationTest, NoCluster) {
  EXPECT_THAT(ErrorOf(R"({"task": {"type": "worker", "index": 0}})"),
              StartsWith("TF_CONFIG has no \"cluster\": add one"));
}

TEST(TFConfigValidationTest, EmptyCluster) {
  EXPECT_THAT(ErrorOf(R"({"cluster": {}, "task": {"type": "worker", "index": 0}})"),
              StartsWith("TF_CONFIG cluster is empty"));
}

TEST(TFConfigValidationTest, TaskNotAnObject) {
  EXPECT_THAT(ErrorOf(Config(R"("worker")")), StartsWith("TF_CONFIG task is \"worker\", not an"));
}

TEST(TFConfigValidationTest, UnknownTaskType) {
  EXPECT_EQ(ErrorOf(Config(R"({"type": "master", "index": 0})")),
            "TF_CONFIG task.type \"master\" is not a task type: use chief, worker, ps or "
            "evaluator");
}

TEST(TFConfigValidationTest, TaskTypeNotString) {
  EXPECT_THAT(ErrorOf(Config(R"({"type": 1, "index": 0})")),
              StartsWith("TF_CONFIG task.type is 1, not a string"));
}

TEST(TFConfigValidationTest, TaskTypeAbsentFromCluster) {
  EXPECT_THAT(ErrorOf(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "ps", "index": 0}})"),
              StartsWith("TF_CONFIG task.type \"ps\" is not a job of the cluster (jobs: worker)"));
}

TEST(TFConfigValidationTest, IndexOutOfRange) {
  EXPECT_EQ(ErrorOf(Config(R"({"type": "worker", "index": 3})")),
            "TF_CONFIG task.index 3 is out of range: job \"worker\" has 2 tasks (0..1)");
}

TEST(TFConfigValidationTest, IndexNotAnInteger) {
  EXPECT_EQ(ErrorOf(Config(R"({"type": "worker", "index": "1"})")),
            "TF_CONFIG task.index is \"1\", not a task index: use a non-negative integer such "
            "as 0");
  EXPECT_THAT(ErrorOf(Config(R"({"type": "worker", "index": -1})")),
              StartsWith("TF_CONFIG task.index is -1, not a task index"));
  EXPECT_THAT(ErrorOf(Config(R"({"type": "worker", "index": 1.5})")),
              StartsWith("TF_CONFIG task.index is 1.5, not a task index"));
}

TEST(TFConfigValidationTest, TypeWithoutIndexAndIndexWithoutType) {
  EXPECT_EQ(ErrorOf(Config(R"({"type": "worker"})")),
            "TF_CONFIG task has a type (\"worker\") but no index: add \"index\": 0 (or the "
            "task's index)");
  EXPECT_THAT(ErrorOf(Config(R"({"index": 0})")),
              StartsWith("TF_CONFIG task has an index but no type"));
}

TEST(TFConfigValidationTest, UnknownTaskKey) {
  EXPECT_THAT(ErrorOf(Config(R"({"type": "worker", "index": 0, "idx": 1})")),
              StartsWith("TF_CONFIG task has unknown key \"idx\""));
}

TEST(TFConfigValidationTest, TwoChiefs) {
  EXPECT_THAT(
      ErrorOf(R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}})"),
      StartsWith("TF_CONFIG cluster.chief has 2 tasks, but a cluster has at most one "
                 "chief"));
}

TEST(TFConfigValidationTest, BadAddress) {
  EXPECT_THAT(
      ErrorOf(R"({"cluster": {"worker": ["w:99999"]}, "task": {"type": "worker", "index": 0}})"),
      StartsWith("TF_CONFIG cluster address \"w:99999\" of worker:0 is not valid"));
}

TEST(TFConfigValidationTest, RpcLayer) {
  EXPECT_EQ(ErrorOf(Config(R"({"type": "worker", "index": 0})", R"(, "rpc_layer": "http")")),
            "TF_CONFIG rpc_layer \"http\" is not supported: use \"grpc\" (plaintext) or "
            "\"grpc+tls\"");
  EXPECT_THAT(ErrorOf(Config(R"({"type": "worker", "index": 0})", R"(, "rpc_layer": 1)")),
              StartsWith("TF_CONFIG rpc_layer is 1, not a string"));
}

TEST(SimpleClusterResolverTest, WrapsAValidSpec) {
  ClusterSpec spec;
  spec.SetTask("worker", 0, "localhost:1");
  spec.SetTask("worker", 1, "localhost:2");
  auto resolver = SimpleClusterResolver::Create(spec, "worker", 1);
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->master(), "grpc://localhost:2");
  EXPECT_EQ(*resolver->worker_count(), 2);
}

TEST(SimpleClusterResolverTest, ValidatesSpecAndTask) {
  ClusterSpec spec;
  spec.SetTask("worker", 0, "localhost");
  EXPECT_THAT(std::string(SimpleClusterResolver::Create(spec).status().message()),
              StartsWith("cluster spec cluster address \"localhost\" of worker:0 is not valid"));
  ClusterSpec good;
  good.SetTask("worker", 0, "localhost:1");
  EXPECT_THAT(std::string(SimpleClusterResolver::Create(good, "worker", 2).status().message()),
              StartsWith("cluster spec task.index 2 is out of range"));
}

TEST(MakeTfConfigTest, RoundTripsThroughTheResolver) {
  ClusterSpec spec;
  spec.SetTask("chief", 0, "127.0.0.1:1");
  spec.SetTask("worker", 0, "127.0.0.1:2");
  spec.SetTask("ps", 0, "127.0.0.1:3");
  const std::string text = MakeTfConfig(spec, {"ps", 0});
  EXPECT_THAT(text, HasSubstr(R"("task":{"type":"ps","index":0})"));
  auto resolver = TFConfigClusterResolver::Create(text);
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->cluster_spec(), spec);
  EXPECT_EQ(resolver->task(), (TaskKey{"ps", 0}));
}

}  // namespace
}  // namespace stratum
