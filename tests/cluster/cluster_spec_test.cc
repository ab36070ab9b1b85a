#include "stratum/cluster/cluster_spec.h"
#include "stratum/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

nlohmann::json Json(const char* text) { return nlohmann::json::parse(text); }

std::string ErrorOf(const char* cluster_json) {
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromJson(Json(cluster_json));
  EXPECT_FALSE(spec.ok()) << cluster_json;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST(ClusterSpecTest, ParsesDenseForm) {
  auto spec = ClusterSpec::FromJson(
      Json(R"({"worker": ["w0:1", "w1:2"], "ps": ["p0:3"], "chief": ["c:4"]})"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_tasks("worker"), 2);
  EXPECT_EQ(*spec->TaskAddress("worker", 1), "w1:2");
  EXPECT_EQ(*spec->TaskAddress("ps", 0), "p0:3");
  EXPECT_THAT(spec->job_names(), ElementsAre("chief", "worker", "ps"));
  EXPECT_THAT(spec->AllTasks(), ElementsAre(TaskKey{"chief", 0}, TaskKey{"worker", 0},
                                            TaskKey{"worker", 1}, TaskKey{"ps", 0}));
}

TEST(ClusterSpecTest, ParsesSparseFormThatKubeflowWrites) {
  auto spec = ClusterSpec::FromJson(Json(R"({"worker": {"1": "w1:2222", "3": "w3:2222"}})"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_tasks("worker"), 2);
  EXPECT_THAT(spec->task_indices("worker"), ElementsAre(1, 3));
  EXPECT_FALSE(spec->HasTask("worker", 0));
  EXPECT_EQ(*spec->TaskAddress("worker", 3), "w3:2222");
}

TEST(ClusterSpecTest, ToJsonRoundTripsBothForms) {
  const auto text = Json(R"({"ps": ["p:1"], "worker": {"1": "w1:2", "4": "w4:3"}})");
  auto spec = ClusterSpec::FromJson(text);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ToJson(), text);
  auto again = ClusterSpec::FromJson(spec->ToJson());
  ASSERT_OK(again);
  EXPECT_EQ(*again, *spec);
}

TEST(ClusterSpecTest, TaskAddressOfMissingTaskIsNotFound) {
  auto spec = ClusterSpec::FromJson(Json(R"({"worker": ["w:1"]})"));
  EXPECT_EQ(spec->TaskAddress("worker", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(spec->TaskAddress("ps", 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(ClusterSpecValidationTest, RejectsNonObjectCluster) {
  EXPECT_THAT(ErrorOf(R"(["w:1"])"),
              HasSubstr("TF_CONFIG cluster is [\"w:1\"], not an object: write it as"));
}

TEST(ClusterSpecValidationTest, RejectsEmptyCluster) {
  EXPECT_THAT(ErrorOf("{}"), HasSubstr("TF_CONFIG cluster is empty: list the tasks"));
}

TEST(ClusterSpecValidationTest, RejectsUnknownJob) {
  EXPECT_EQ(ErrorOf(R"({"master": ["m:1"]})"),
            "TF_CONFIG cluster has job \"master\", which is not a task type: name jobs chief, "
            "worker, ps or evaluator");
}

TEST(ClusterSpecValidationTest, RejectsEmptyJob) {
  EXPECT_THAT(ErrorOf(R"({"worker": []})"),
              HasSubstr("TF_CONFIG cluster.worker is empty: list at least one"));
}

TEST(ClusterSpecValidationTest, RejectsJobThatIsNeitherListNorObject) {
  EXPECT_THAT(ErrorOf(R"({"worker": "w:1"})"),
              HasSubstr("TF_CONFIG cluster.worker is \"w:1\": write it as a list of"));
}

TEST(ClusterSpecValidationTest, RejectsNonStringAddress) {
  EXPECT_THAT(ErrorOf(R"({"worker": ["w:1", 2222]})"),
              HasSubstr("TF_CONFIG cluster.worker[1] is 2222, which is not an address"));
}

TEST(ClusterSpecValidationTest, RejectsSparseKeyThatIsNotAnIndex) {
  EXPECT_THAT(ErrorOf(R"({"worker": {"one": "w:1"}})"),
              HasSubstr("TF_CONFIG cluster.worker has key \"one\", which is not a task index"));
  EXPECT_THAT(ErrorOf(R"({"worker": {"-1": "w:1"}})"), HasSubstr("key \"-1\""));
  // "01" would alias task 1 and silently replace its address.
  EXPECT_THAT(ErrorOf(R"({"worker": {"1": "a:1", "01": "b:2"}})"), HasSubstr("key \"01\""));
}

TEST(ClusterSpecValidationTest, RejectsTwoChiefs) {
  EXPECT_EQ(ErrorOf(R"({"chief": ["a:1", "b:2"], "worker": ["w:3"]})"),
            "TF_CONFIG cluster.chief has 2 tasks, but a cluster has at most one chief: keep one "
            "and list the others under \"worker\"");
}

TEST(ClusterSpecValidationTest, RejectsTwoEvaluators) {
  EXPECT_THAT(ErrorOf(R"({"evaluator": ["a:1", "b:2"]})"),
              HasSubstr("cluster.evaluator has 2 tasks, but a cluster has at most one evaluator"));
}

TEST(ClusterSpecValidationTest, RejectsBadAddresses) {
  EXPECT_EQ(ErrorOf(R"({"worker": ["localhost"]})"),
            "TF_CONFIG cluster address \"localhost\" of worker:0 is not valid because it has no "
            "port: write it as host:port, for example \"localhost:2222\"");
  EXPECT_THAT(ErrorOf(R"({"worker": ["h:0"]})"),
              HasSubstr("its port \"0\" is not a number from 1 to 65535"));
  EXPECT_THAT(ErrorOf(R"({"worker": ["h:70000"]})"), HasSubstr("port \"70000\""));
  EXPECT_THAT(ErrorOf(R"({"worker": ["h:x"]})"), HasSubstr("port \"x\""));
  EXPECT_THAT(ErrorOf(R"({"worker": [":2222"]})"), HasSubstr("its host is empty"));
  EXPECT_THAT(ErrorOf(R"({"worker": ["a b:2222"]})"), HasSubstr("character a host name"));
  EXPECT_THAT(ErrorOf(R"({"worker": ["[::1:2222"]})"), HasSubstr("not closed by ']'"));
}

TEST(ClusterSpecValidationTest, AcceptsIpv6AndNames) {
  EXPECT_OK(ValidateAddress("[::1]:2222"));
  EXPECT_OK(ValidateAddress("[fe80::1:2]:2222"));
  EXPECT_OK(ValidateAddress("worker-0.worker.default.svc:2222"));
  EXPECT_OK(ValidateAddress("worker-0.worker.default.svc.:2222"));  // fully qualified
  EXPECT_OK(ValidateAddress("trainer_worker_1:2222"));              // Docker Compose names
  EXPECT_OK(ValidateAddress("10.0.0.1:65535"));
}

// What resolves as nothing, or as something else, is refused before any task waits on it
// (QA: "999.1.1.1:2222" was taken for a host name, and a worker looked it up until its
// cluster timeout).
TEST(ClusterSpecValidationTest, RejectsHostsThatAreNeitherAnIpNorAName) {
  EXPECT_EQ(ErrorOf(R"({"worker": ["999.1.1.1:2222"]})"),
            "TF_CONFIG cluster address \"999.1.1.1:2222\" of worker:0 is not valid because its "
            "host \"999.1.1.1\" is not an IPv4 address (four numbers from 0 to 255, like "
            "10.0.0.1), and a host name has a letter in its last part: write it as host:port, "
            "for example \"localhost:2222\"");
  EXPECT_THAT(ErrorOf(R"({"worker": ["10.0.1:2222"]})"), HasSubstr("not an IPv4 address"));
  // An IPv6 host without brackets: the fix is the brackets (QA round 4, finding 9).
  EXPECT_THAT(ErrorOf(R"({"worker": ["::1:2222"]})"),
              HasSubstr("its IPv6 host is not in brackets (write \"[::1]:2222\")"));
  EXPECT_THAT(ErrorOf(R"({"worker": ["[::g]:2222"]})"),
              HasSubstr("its host \"[::g]\" is not an IPv6 address"));
  EXPECT_THAT(ErrorOf(R"({"worker": ["-worker:2222"]})"),
              HasSubstr("its host \"-worker\" has a part that starts or ends with '-'"));
  EXPECT_THAT(ErrorOf(R"({"worker": ["worker..ps:2222"]})"),
              HasSubstr("its host \"worker..ps\" has an empty part between dots"));
  EXPECT_THAT(ErrorOf(R"({"worker": ["w\u00e9:2222"]})"),
              HasSubstr("its host has a character a host name cannot have"));
  EXPECT_THAT(ErrorOf(R"({"worker": ["w!:2222"]})"),
              HasSubstr("its host has a character a host name cannot have"));
  const std::string long_label(64, 'a');
  EXPECT_THAT(std::string(ValidateAddress(long_label + ":2222").message()),
              HasSubstr("longer than 63 characters"));
}

TEST(ClusterSpecValidationTest, RejectsSharedAddress) {
  EXPECT_EQ(ErrorOf(R"({"worker": ["h:1"], "ps": ["h:1"]})"),
            "TF_CONFIG cluster address \"h:1\" is given to both worker:0 and ps:0: give every "
            "task its own host:port");
}

// One socket under two spellings: the second task could not bind (or would reach the first).
TEST(ClusterSpecValidationTest, RejectsOneSocketSpelledTwoWays) {
  EXPECT_EQ(ErrorOf(R"({"worker": ["127.0.0.1:7000", "localhost:7000"]})"),
            "TF_CONFIG cluster addresses \"127.0.0.1:7000\" of worker:0 and \"localhost:7000\" of "
            "worker:1 are one socket (this machine's loopback, port 7000): give every task its own "
            "host:port");
  EXPECT_THAT(ErrorOf(R"({"worker": ["[::1]:7000"], "ps": ["LocalHost:7000"]})"),
              HasSubstr("one socket"));
  EXPECT_THAT(ErrorOf(R"({"worker": ["Host-A:7000"], "ps": ["host-a:7000"]})"),
              HasSubstr("are one socket (host host-a, port 7000)"));
  // A port is a number, however it is written (QA: "029001" passed as another socket).
  EXPECT_THAT(ErrorOf(R"({"worker": ["127.0.0.1:29001", "127.0.0.1:029001"]})"),
              HasSubstr("are one socket (this machine's loopback, port 29001)"));
  // One IPv6 address however it is written, and an IPv4-mapped one as its IPv4 address (QA
  // round 4, finding 8: the second task failed later with "the port is in use").
  EXPECT_THAT(ErrorOf(R"({"ps": ["[::1]:7000", "[0:0:0:0:0:0:0:1]:7000"]})"),
              HasSubstr("are one socket (this machine's loopback, port 7000)"));
  EXPECT_THAT(ErrorOf(R"({"ps": ["[fe80::1]:7000", "[FE80:0::0001]:7000"]})"),
              HasSubstr("are one socket (host fe80::1, port 7000)"));
  EXPECT_THAT(ErrorOf(R"({"ps": ["[::ffff:127.0.0.1]:7000"], "worker": ["127.0.0.1:7000"]})"),
              HasSubstr("are one socket (this machine's loopback, port 7000)"));
  // Other loopback addresses, other hosts and other ports are other sockets.
  EXPECT_TRUE(
      ClusterSpec::FromJson(
          Json(R"({"worker": ["127.0.0.1:7000", "127.0.0.2:7000", "h:7000", "localhost:7001"]})"))
          .ok());
}

TEST(ValidateTaskTest, AcceptsTasksOfTheCluster) {
  auto spec = ClusterSpec::FromJson(Json(R"({"worker": ["w:1", "w:2"], "ps": ["p:1"]})"));
  EXPECT_OK(ValidateTask(*spec, "worker", 1));
  EXPECT_OK(ValidateTask(*spec, "ps", 0));
}

TEST(ValidateTaskTest, EvaluatorMayBeOutsideTheCluster) {
  auto spec = ClusterSpec::FromJson(Json(R"({"worker": ["w:1"]})"));
  EXPECT_OK(ValidateTask(*spec, "evaluator", 0));
}

TEST(ValidateTaskTest, RejectsUnknownType) {
  auto spec = ClusterSpec::FromJson(Json(R"({"worker": ["w:1"]})"));
  EXPECT_EQ(ValidateTask(*spec, "master", 0).message(),
            "TF_CONFIG task.type \"master\" is not a task type: use chief, worker, ps or "
            "evaluator");
}

TEST(ValidateTaskTest, RejectsTypeAbsentFromCluster) {
  auto spec = ClusterSpec::FromJson(Json(R"({"worker": ["w:1"], "chief": ["c:1"]})"));
  EXPECT_EQ(ValidateTask(*spec, "ps", 0).message(),
            "TF_CONFIG task.type \"ps\" is not a job of the cluster (jobs: chief, worker): add a "
            "\"ps\" job to cluster or fix task.type");
}

TEST(ValidateTaskTest, RejectsIndexOutOfRange) {
  auto spec = ClusterSpec::FromJson(Json(R"({"worker": ["w:1", "w:2"]})"));
  EXPECT_EQ(ValidateTask(*spec, "worker", 3).message(),
            "TF_CONFIG task.index 3 is out of range: job \"worker\" has 2 tasks (0..1)");
  auto sparse = ClusterSpec::FromJson(Json(R"({"worker": {"1": "w:1", "3": "w:3"}})"));
  EXPECT_EQ(ValidateTask(*sparse, "worker", 0).message(),
            "TF_CONFIG task.index 0 is out of range: job \"worker\" has 2 tasks (1, 3)");
  auto one = ClusterSpec::FromJson(Json(R"({"ps": ["p:1"]})"));
  EXPECT_EQ(ValidateTask(*one, "ps", 1).message(),
            "TF_CONFIG task.index 1 is out of range: job \"ps\" has 1 task (0..0)");
}

TEST(ValidateTaskTest, RejectsNegativeIndex) {
  auto spec = ClusterSpec::FromJson(Json(R"({"worker": ["w:1"]})"));
  EXPECT_THAT(std::string(ValidateTask(*spec, "worker", -1).message()), HasSubstr("is negative"));
}

TEST(ChiefRulesTest, ChiefIsChiefZeroElseWorkerZero) {
  auto with_chief = ClusterSpec::FromJson(Json(R"({"chief": ["c:1"], "worker": ["w:1"]})"));
  EXPECT_EQ(*ChiefTask(*with_chief), (TaskKey{"chief", 0}));
  EXPECT_TRUE(IsChief(*with_chief, "chief", 0));
  EXPECT_FALSE(IsChief(*with_chief, "worker", 0));

  auto without = ClusterSpec::FromJson(Json(R"({"worker": ["w:1", "w:2"], "ps": ["p:1"]})"));
  EXPECT_EQ(*ChiefTask(*without), (TaskKey{"worker", 0}));
  EXPECT_TRUE(IsChief(*without, "worker", 0));
  EXPECT_FALSE(IsChief(*without, "worker", 1));
  EXPECT_FALSE(IsChief(*without, "ps", 0));

  auto ps_only = ClusterSpec::FromJson(Json(R"({"ps": ["p:1"]})"));
  EXPECT_EQ(ChiefTask(*ps_only).status().code(), absl::StatusCode::kNotFound);
}

TEST(ChiefRulesTest, IdInClusterFollowsTensorFlow) {
  auto spec = ClusterSpec::FromJson(
      Json(R"({"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"], "evaluator": ["e:1"]})"));
  EXPECT_EQ(*IdInCluster(*spec, "chief", 0), 0);
  EXPECT_EQ(*IdInCluster(*spec, "worker", 0), 1);
  EXPECT_EQ(*IdInCluster(*spec, "worker", 1), 2);
  EXPECT_EQ(*IdInCluster(*spec, "evaluator", 0), 0);
  EXPECT_THAT(std::string(IdInCluster(*spec, "ps", 0).status().message()), HasSubstr("has no id"));

  auto no_chief = ClusterSpec::FromJson(Json(R"({"worker": ["w:1", "w:2"]})"));
  EXPECT_EQ(*IdInCluster(*no_chief, "worker", 1), 1);

  // A sparse worker job (Kubeflow's form) is numbered without its gaps.
  auto sparse = ClusterSpec::FromJson(Json(R"({"worker": {"0": "w:1", "2": "w:2", "5": "w:3"}})"));
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_EQ(*IdInCluster(*sparse, "worker", 0), 0);
  EXPECT_EQ(*IdInCluster(*sparse, "worker", 2), 1);
  EXPECT_EQ(*IdInCluster(*sparse, "worker", 5), 2);
}

TEST(ChiefRulesTest, WorkerCountFollowsTensorFlow) {
  auto spec = ClusterSpec::FromJson(
      Json(R"({"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"], "evaluator": ["e:1"]})"));
  EXPECT_EQ(*WorkerCount(*spec, "worker"), 3);
  EXPECT_EQ(*WorkerCount(*spec, "chief"), 3);
  EXPECT_EQ(*WorkerCount(*spec, "evaluator"), 1);
  EXPECT_FALSE(WorkerCount(*spec, "ps").ok());
}

}  // namespace
}  // namespace stratum
