#include "stratum/cluster/kubernetes_cluster_resolver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

KubernetesClusterOptions Pod(const std::string& name) {
  KubernetesClusterOptions options;
  options.pod_name = name;
  options.pod_namespace = "ml";
  options.replicas = {{"chief", 1}, {"worker", 3}, {"ps", 2}};
  return options;
}

std::string ErrorOf(const KubernetesClusterOptions& options) {
  auto resolver = KubernetesClusterResolver::Create(options);
  EXPECT_FALSE(resolver.ok());
  if (resolver.ok()) return "";
  EXPECT_EQ(resolver.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(resolver.status().message());
}

TEST(KubernetesClusterResolverTest, BuildsTheClusterFromReplicaCounts) {
  auto resolver = KubernetesClusterResolver::Create(Pod("stratum-worker-2"));
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->task(), (TaskKey{"worker", 2}));
  const ClusterSpec& spec = resolver->cluster_spec();
  EXPECT_EQ(spec.num_tasks("chief"), 1);
  EXPECT_EQ(spec.num_tasks("worker"), 3);
  EXPECT_EQ(spec.num_tasks("ps"), 2);
  EXPECT_EQ(*spec.TaskAddress("chief", 0), "stratum-chief-0.stratum-chief.ml.svc:2222");
  EXPECT_EQ(*spec.TaskAddress("worker", 2), "stratum-worker-2.stratum-worker.ml.svc:2222");
  EXPECT_EQ(*spec.TaskAddress("ps", 1), "stratum-ps-1.stratum-ps.ml.svc:2222");
  EXPECT_EQ(resolver->master(), "stratum-worker-2.stratum-worker.ml.svc:2222");
}

TEST(KubernetesClusterResolverTest, TfConfigRoundTripsThroughTheTfConfigResolver) {
  KubernetesClusterOptions options = Pod("stratum-ps-1");
  options.rpc_layer = "grpc+tls";
  auto resolver = KubernetesClusterResolver::Create(options);
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  auto parsed = TFConfigClusterResolver::Create(resolver->ToTfConfig());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->cluster_spec(), resolver->cluster_spec());
  EXPECT_EQ(parsed->task(), (TaskKey{"ps", 1}));
  EXPECT_EQ(parsed->rpc_layer(), "grpc+tls");
}

TEST(KubernetesClusterResolverTest, PrefixPortAndNoNamespace) {
  KubernetesClusterOptions options = Pod("team-a-ps-0");
  options.name_prefix = "team-a";
  options.pod_namespace = "";
  options.port = 3000;
  auto resolver = KubernetesClusterResolver::Create(options);
  ASSERT_TRUE(resolver.ok()) << resolver.status();
  EXPECT_EQ(resolver->task(), (TaskKey{"ps", 0}));
  EXPECT_EQ(*resolver->cluster_spec().TaskAddress("worker", 0),
            "team-a-worker-0.team-a-worker:3000");
}

TEST(KubernetesClusterResolverTest, TheAddressHelperMatchesTheCluster) {
  EXPECT_EQ(KubernetesTaskAddress(Pod("x"), "evaluator", 0),
            "stratum-evaluator-0.stratum-evaluator.ml.svc:2222");
}

TEST(KubernetesClusterResolverTest, PodOutsideTheClusterIsNamed) {
  EXPECT_EQ(ErrorOf(Pod("stratum-trainer-0")),
            "pod name \"stratum-trainer-0\" is not a pod of this cluster (stratum-chief-<i>, "
            "stratum-ps-<i>, stratum-worker-<i>): name the StatefulSets \"stratum-<type>\" after "
            "their Services, or set --k8s_name_prefix (STRATUM_K8S_NAME_PREFIX) to their prefix");
  EXPECT_THAT(ErrorOf(Pod("stratum-worker-x")), StartsWith("pod name \"stratum-worker-x\" is not"));
  EXPECT_THAT(ErrorOf(Pod("stratum-worker")), StartsWith("pod name \"stratum-worker\" is not"));
}

TEST(KubernetesClusterResolverTest, OrdinalBeyondTheReplicasIsNamed) {
  EXPECT_EQ(ErrorOf(Pod("stratum-worker-3")),
            "pod stratum-worker-3 is worker 3, but the cluster has 3 worker replicas (0..2): set "
            "the replica count (STRATUM_K8S_WORKER_REPLICAS or --k8s_worker_replicas) to the "
            "StatefulSet's replicas; the manifests' kustomization copies it");
}

TEST(KubernetesClusterResolverTest, BadClusters) {
  KubernetesClusterOptions two_chiefs = Pod("stratum-chief-0");
  two_chiefs.replicas["chief"] = 2;
  EXPECT_THAT(ErrorOf(two_chiefs), HasSubstr("cluster.chief has 2 tasks, but a cluster has at "
                                             "most one chief"));
  KubernetesClusterOptions unknown = Pod("stratum-worker-0");
  unknown.replicas["master"] = 1;
  EXPECT_THAT(ErrorOf(unknown), HasSubstr("\"master\", which is not a task type"));
  KubernetesClusterOptions port = Pod("stratum-worker-0");
  port.port = 0;
  EXPECT_THAT(ErrorOf(port), StartsWith("Kubernetes port 0 is not a port"));
}

}  // namespace
}  // namespace stratum
