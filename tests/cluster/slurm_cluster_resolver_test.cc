#include "stratum/cluster/slurm_cluster_resolver.h"

#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::stratum::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

// The environment srun gives a task.
std::function<std::optional<std::string>(const char*)> Step(Env env) {
  return [env](const char* name) -> std::optional<std::string> {
    const auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

TEST(SlurmHostlistTest, ExpandsBracketRangesKeepingOrderAndZeroPadding) {
  EXPECT_THAT(*ExpandSlurmHostlist("n[1-2],m5,o[3-4,6,08-10]"),
              ElementsAre("n1", "n2", "m5", "o3", "o4", "o6", "o08", "o09", "o10"));
  EXPECT_THAT(*ExpandSlurmHostlist("gpu[01-02]-ib"), ElementsAre("gpu01-ib", "gpu02-ib"));
  EXPECT_THAT(ExpandSlurmHostlist("n[1-").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unbalanced")));
  EXPECT_THAT(ExpandSlurmHostlist("a]b,c[1]").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a ']' before its '['")));
  EXPECT_THAT(ExpandSlurmHostlist("n[3-1]").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has the range \"3-1\"")));
  EXPECT_THAT(*ExpandSlurmTasksPerNode("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(ExpandSlurmTasksPerNode("2(3)").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"2(x3),1\"")));
}

TEST(SlurmClusterResolverTest, DealsTheStepsTasksToTheJobsAsTensorFlowDoes) {
  // Two nodes (node9 before node10, as Slurm orders them), two tasks each, four GPUs each.
  const Env env = {{"SLURM_PROCID", "2"},
                   {"SLURM_STEP_NODELIST", "node[9-10]"},
                   {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                   {"SLURM_STEP_GPUS", "4,5,6,7"},
                   {"SLURMD_NODENAME", "node10"}};
  SlurmClusterOptions options;
  options.jobs = {{"worker", 3}, {"ps", 1}};
  absl::StatusOr<SlurmClusterResolver> resolver = SlurmClusterResolver::Create(options, Step(env));
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  // Slurm's block order (nodes as listed, then local rank); jobs in name order (ps first).
  EXPECT_EQ(resolver->cluster_spec().ToJson(), nlohmann::json::parse(R"({"ps": ["node9:8888"],
                                      "worker": ["node9:8889", "node10:8888", "node10:8889"]})"));
  EXPECT_EQ(resolver->task().ToString(), "worker:1");
  EXPECT_EQ(resolver->cuda_visible_devices(), "4,5");  // the step's ids, first half
  Env last = env;
  last["SLURM_PROCID"] = "3";
  EXPECT_EQ(SlurmClusterResolver::Create(options, Step(last))->cuda_visible_devices(), "6,7");
  // A rank that runs elsewhere than the block order says (a cyclic step) is refused.
  Env cyclic = env;
  cyclic["SLURMD_NODENAME"] = "node9";
  EXPECT_THAT(SlurmClusterResolver::Create(options, Step(cyclic)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("SLURM_PROCID 2 runs on node9, but the step's block order puts "
                                 "it on node10")));
  // Without jobs: every task a worker; without GPUs: none.
  Env cpu = {
      {"SLURM_PROCID", "0"}, {"SLURM_STEP_NODELIST", "a"}, {"SLURM_STEP_TASKS_PER_NODE", "3"}};
  absl::StatusOr<SlurmClusterResolver> workers = SlurmClusterResolver::Create({}, Step(cpu));
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_EQ(workers->cluster_spec().num_tasks("worker"), 3);
  EXPECT_EQ(workers->task().ToString(), "worker:0");
  EXPECT_EQ(workers->cuda_visible_devices(), "");
}

TEST(SlurmClusterResolverTest, AStepThatDoesNotFitIsRefusedWithTheFix) {
  const Env env = {{"SLURM_PROCID", "0"},
                   {"SLURM_STEP_NODELIST", "n[1-2]"},
                   {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}};
  SlurmClusterOptions options;
  options.jobs = {{"worker", 3}};
  EXPECT_THAT(SlurmClusterResolver::Create(options, Step(env)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the jobs want 3 tasks, but the Slurm step has 2: start the "
                                 "step with srun --ntasks=3")));
  EXPECT_THAT(SlurmClusterResolver::Create({}, Step({})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("SLURM_PROCID is not set, so this process is not a task of a "
                                 "Slurm step")));
  options.jobs = {};
  options.gpus_per_node = 1;
  options.gpus_per_task = 2;
  EXPECT_THAT(SlurmClusterResolver::Create(options, Step(env)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 tasks on a node with 2 GPUs each need 2 GPUs, but a node "
                                 "has 1")));
  Env mismatch = env;
  mismatch["SLURM_STEP_TASKS_PER_NODE"] = "1";
  EXPECT_THAT(SlurmClusterResolver::Create({}, Step(mismatch)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gives 1 nodes")));
}

TEST(UnionClusterResolverTest, JoinsTheJobsAndTakesTheTaskFromTheFirstThatHasOne) {
  ClusterSpec ps;
  ps.SetTask("ps", 0, "p:1");
  ClusterSpec workers;
  workers.SetTask("worker", 0, "w:1");
  workers.SetTask("worker", 1, "w:2");
  auto a = SimpleClusterResolver::Create(ps);
  auto b = SimpleClusterResolver::Create(workers, "worker", 1);
  ASSERT_OK(a);
  ASSERT_OK(b);
  absl::StatusOr<UnionClusterResolver> both = UnionClusterResolver::Create({&*a, &*b});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->cluster_spec().num_tasks("ps"), 1);
  EXPECT_EQ(both->cluster_spec().num_tasks("worker"), 2);
  EXPECT_EQ(both->task().ToString(), "worker:1");
  EXPECT_THAT(UnionClusterResolver::Create({&*b, &*b}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("two of the union's resolvers define the job \"worker\"")));
}

}  // namespace
}  // namespace stratum
