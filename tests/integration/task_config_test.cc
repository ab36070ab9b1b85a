// How the role binaries find their cluster, as they are run in deploy/: TF_CONFIG built
// from a Kubernetes pod's name and replica counts (flags or environment), an explicit
// TF_CONFIG winning over them, the exact TF_CONFIGs Kubeflow's operator writes, and the
// TLS settings, each mistake refused with exit code 2 and one sentence.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using Env = std::vector<std::pair<std::string, std::string>>;

struct BinaryRun {
  ExitInfo exit;
  std::string output;
};

// Runs a binary to its end. The environment is cleared of what the test's own could leak.
BinaryRun RunBinary(const std::string& binary, std::vector<std::string> args, Env env) {
  SubprocessOptions options;
  options.argv = {std::string(STRATUM_BIN_DIR) + "/" + binary};
  for (std::string& arg : args) options.argv.push_back(std::move(arg));
  for (const char* name : {"TF_CONFIG",
                           "STRATUM_POD_NAME",
                           "STRATUM_POD_NAMESPACE",
                           "STRATUM_K8S_NAME_PREFIX",
                           "STRATUM_K8S_PORT",
                           "STRATUM_K8S_CHIEF_REPLICAS",
                           "STRATUM_K8S_WORKER_REPLICAS",
                           "STRATUM_K8S_PS_REPLICAS",
                           "STRATUM_K8S_EVALUATOR_REPLICAS",
                           "STRATUM_TLS_CERT",
                           "STRATUM_TLS_KEY",
                           "STRATUM_TLS_CA",
                           "STRATUM_TLS_SERVER_NAME",
                           "STRATUM_HEALTH_PORT",
                           "SLURM_PROCID",
                           "SLURM_STEP_NODELIST",
                           "SLURM_STEP_TASKS_PER_NODE",
                           "SLURM_STEP_GPUS",
                           "SLURM_JOB_NODELIST",
                           "SLURM_TASKS_PER_NODE"}) {
    bool given = false;
    for (const auto& [key, value] : env) given = given || key == name;
    if (!given) options.env.push_back({name, ""});
  }
  for (auto& entry : env) options.env.push_back(std::move(entry));
  options.forward_fd = -1;
  options.capture_output = true;
  auto process = Subprocess::Spawn(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return {};
  auto exit = (*process)->Wait(absl::Seconds(20));
  EXPECT_TRUE(exit.ok()) << binary << " did not exit: " << exit.status();
  if (!exit.ok()) return {};
  return {*exit, (*process)->output()};
}

// --print_tf_config's line, parsed; fails the test when the binary did not print one.
nlohmann::json PrintedTfConfig(const std::string& binary, Env env,
                               std::vector<std::string> args = {}) {
  args.push_back("--print_tf_config");
  BinaryRun run = RunBinary(binary, std::move(args), std::move(env));
  EXPECT_EQ(run.exit.exit_code, 0) << run.output;
  try {
    return nlohmann::json::parse(run.output);
  } catch (const nlohmann::json::exception&) {
    ADD_FAILURE() << binary << " printed no TF_CONFIG: " << run.output;
    return {};
  }
}

Env Pod(const std::string& name) {
  return {{"STRATUM_POD_NAME", name},
          {"STRATUM_POD_NAMESPACE", "ml"},
          {"STRATUM_K8S_CHIEF_REPLICAS", "1"},
          {"STRATUM_K8S_WORKER_REPLICAS", "3"},
          {"STRATUM_K8S_PS_REPLICAS", "2"}};
}

TEST(SlurmTfConfigTest, ARoleBinaryInASlurmStepResolvesItsTaskFromTheStep) {
  const Env step = {{"SLURM_PROCID", "1"},
                    {"SLURM_STEP_NODELIST", "gpu[07-08]"},
                    {"SLURM_STEP_TASKS_PER_NODE", "2,1"}};
  // auto: no TF_CONFIG, no pod: the Slurm step.
  const nlohmann::json config =
      PrintedTfConfig("stratum-worker", step, {"--slurm_jobs=ps:1,worker:2"});
  EXPECT_EQ(config["cluster"], nlohmann::json::parse(R"({"ps": ["gpu07:8888"],
      "worker": ["gpu07:8889", "gpu08:8888"]})"));
  EXPECT_EQ(config["task"], nlohmann::json::parse(R"({"type": "worker", "index": 0})"));
  // TF_CONFIG, when set, wins in auto; --cluster_resolver slurm without a step is refused.
  BinaryRun run =
      RunBinary("stratum-worker", {"--cluster_resolver=slurm", "--print_tf_config"}, {});
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("SLURM_PROCID is not set, so this process is not a task of "
                                    "a Slurm step: start it with srun"));
  run = RunBinary("stratum-worker", {"--slurm_jobs=boss:1", "--print_tf_config"}, step);
  EXPECT_EQ(run.exit.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--slurm_jobs has \"boss:1\""));
}

TEST(KubernetesTfConfigTest, EveryRoleBuildsItsTfConfigFromThePod) {
  const nlohmann::json cluster = {
      {"chief", {"stratum-chief-0.stratum-chief.ml.svc:2222"}},
      {"worker",
       {"stratum-worker-0.stratum-worker.ml.svc:2222",
        "stratum-worker-1.stratum-worker.ml.svc:2222",
        "stratum-worker-2.stratum-worker.ml.svc:2222"}},
      {"ps", {"stratum-ps-0.stratum-ps.ml.svc:2222", "stratum-ps-1.stratum-ps.ml.svc:2222"}}};
  for (const auto& [binary, pod, type, index] :
       std::vector<std::tuple<std::string, std::string, std::string, int>>{
           {"stratum-coordinator", "stratum-chief-0", "chief", 0},
           {"stratum-worker", "stratum-worker-2", "worker", 2},
           {"stratum-ps", "stratum-ps-1", "ps", 1}}) {
    const nlohmann::json printed = PrintedTfConfig(binary, Pod(pod));
    EXPECT_EQ(printed["cluster"], cluster) << binary;
    EXPECT_EQ(printed["task"], (nlohmann::json{{"type", type}, {"index", index}})) << binary;
    EXPECT_FALSE(printed.contains("rpc_layer")) << binary;
  }
}

TEST(KubernetesTfConfigTest, FlagsOverrideTheEnvironment) {
  const nlohmann::json printed =
      PrintedTfConfig("stratum-worker", Pod("stratum-worker-3"),
                      {"--k8s_worker_replicas=4", "--k8s_port=3000", "--k8s_namespace=prod"});
  EXPECT_EQ(printed["cluster"]["worker"].size(), 4u);
  EXPECT_EQ(printed["cluster"]["worker"][3], "stratum-worker-3.stratum-worker.prod.svc:3000");
  EXPECT_EQ(printed["task"]["index"], 3);
}

TEST(KubernetesTfConfigTest, ExplicitTfConfigWins) {
  Env env = Pod("stratum-worker-0");
  env.push_back(
      {"TF_CONFIG",
       R"({"cluster": {"worker": ["w:1"], "ps": ["p:2"]}, "task": {"type": "ps", "index": 0}})"});
  const nlohmann::json printed = PrintedTfConfig("stratum-ps", env);
  EXPECT_EQ(printed["cluster"]["worker"], nlohmann::json({"w:1"}));
  EXPECT_EQ(printed["task"]["type"], "ps");
}

TEST(KubernetesTfConfigTest, MistakesExitTwoWithOneSentence) {
  BinaryRun outside = RunBinary("stratum-worker", {}, Pod("trainer-0"));
  EXPECT_EQ(outside.exit.exit_code, 2);
  EXPECT_THAT(outside.output, HasSubstr("stratum-worker: pod name \"trainer-0\" is not a pod of "
                                        "this cluster"));
  BinaryRun beyond = RunBinary("stratum-worker", {}, Pod("stratum-worker-3"));
  EXPECT_EQ(beyond.exit.exit_code, 2);
  EXPECT_THAT(beyond.output, HasSubstr("pod stratum-worker-3 is worker 3, but the cluster has 3"));
  BinaryRun role = RunBinary("stratum-ps", {}, Pod("stratum-worker-0"));
  EXPECT_EQ(role.exit.exit_code, 2);
  EXPECT_THAT(role.output, HasSubstr("task.type \"worker\" is not a task stratum-ps runs"));
  BinaryRun no_counts = RunBinary("stratum-ps", {}, {{"STRATUM_POD_NAME", "stratum-ps-0"}});
  EXPECT_EQ(no_counts.exit.exit_code, 2);
  EXPECT_THAT(no_counts.output, HasSubstr("has no replica counts"));
  Env bad = Pod("stratum-ps-0");
  for (auto& [key, value] : bad) {
    if (key == "STRATUM_K8S_PS_REPLICAS") value = "two";
  }
  BinaryRun not_a_number = RunBinary("stratum-ps", {}, bad);
  EXPECT_EQ(not_a_number.exit.exit_code, 2);
  EXPECT_THAT(not_a_number.output,
              HasSubstr("STRATUM_K8S_PS_REPLICAS is \"two\", not a non-negative integer"));
}

// The TF_CONFIGs of Kubeflow's training operator, byte for byte as Go's encoding/json
// writes its TFConfig and SparseTFConfig structs (pkg/controller.v1/tensorflow).
constexpr char kKubeflowCluster[] =
    R"({"chief":["stratum-chief-0.ml.svc:2222"],"ps":["stratum-ps-0.ml.svc:2222","stratum-ps-1.ml.svc:2222"],"worker":["stratum-worker-0.ml.svc:2222","stratum-worker-1.ml.svc:2222"]})";

TEST(KubeflowTfConfigTest, EveryRoleAcceptsTheOperatorsTfConfig) {
  for (const auto& [binary, type, index] :
       std::vector<std::tuple<std::string, std::string, int>>{{"stratum-coordinator", "chief", 0},
                                                              {"stratum-ps", "ps", 1},
                                                              {"stratum-worker", "worker", 1}}) {
    const std::string tf_config = std::string(R"({"cluster":)") + kKubeflowCluster +
                                  R"(,"task":{"type":")" + type + R"(","index":)" +
                                  std::to_string(index) + R"(},"environment":"cloud"})";
    const nlohmann::json printed = PrintedTfConfig(binary, {{"TF_CONFIG", tf_config}});
    EXPECT_EQ(printed["cluster"], nlohmann::json::parse(kKubeflowCluster)) << binary;
    EXPECT_EQ(printed["task"], (nlohmann::json{{"type", type}, {"index", index}})) << binary;
  }
}

TEST(KubeflowTfConfigTest, DynamicWorkersSparseForm) {
  const nlohmann::json worker = PrintedTfConfig(
      "stratum-worker",
      {{"TF_CONFIG",
        R"({"sparseCluster":{"worker":{"1":"stratum-worker-1.ml.svc:2222"},"ps":["stratum-ps-0.ml.svc:2222","stratum-ps-1.ml.svc:2222"]},"task":{"type":"worker","index":1}})"}});
  EXPECT_EQ(worker["cluster"]["worker"], (nlohmann::json{{"1", "stratum-worker-1.ml.svc:2222"}}));
  EXPECT_EQ(worker["cluster"]["ps"].size(), 2u);
  const nlohmann::json ps = PrintedTfConfig(
      "stratum-ps",
      {{"TF_CONFIG",
        R"({"sparseCluster":{"worker":{},"ps":["stratum-ps-1.ml.svc:2222"]},"task":{"type":"ps","index":1}})"}});
  EXPECT_EQ(ps["cluster"], (nlohmann::json{{"ps", {{"1", "stratum-ps-1.ml.svc:2222"}}}}));
  BinaryRun chief =
      RunBinary("stratum-coordinator", {},
                {{"TF_CONFIG",
                  R"({"sparseCluster":{"worker":{},"ps":[]},"task":{"type":"chief","index":0}})"}});
  EXPECT_EQ(chief.exit.exit_code, 2);
  EXPECT_THAT(chief.output, HasSubstr("set enableDynamicWorker to false in the TFJob"));
}

const char kLocalCluster[] = R"({"cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}, )";

std::string PsTfConfig(const std::string& rpc_layer = "") {
  return std::string(kLocalCluster) + R"("task": {"type": "ps", "index": 0})" +
         (rpc_layer.empty() ? "" : R"(, "rpc_layer": ")" + rpc_layer + "\"") + "}";
}

TEST(TlsConfigTest, TlsRpcLayerWithoutCertificatesNamesTheFlags) {
  BinaryRun run = RunBinary("stratum-ps", {}, {{"TF_CONFIG", PsTfConfig("grpc+tls")}});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_EQ(run.output,
            "stratum-ps: TF_CONFIG rpc_layer is \"grpc+tls\", but no TLS certificate is set: pass "
            "--tls_cert, --tls_key and --tls_ca (or set STRATUM_TLS_CERT, STRATUM_TLS_KEY and "
            "STRATUM_TLS_CA) to the PEM files of this task's certificate, its key and the "
            "cluster's CA\n");
}

TEST(TlsConfigTest, CertificatesWithPlaintextRpcLayerAreAContradiction) {
  BinaryRun run = RunBinary("stratum-ps", {"--tls_cert=a", "--tls_key=b", "--tls_ca=c"},
                            {{"TF_CONFIG", PsTfConfig("grpc")}});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("TF_CONFIG rpc_layer is \"grpc\" (plaintext), but TLS "
                                    "certificates are set"));
}

TEST(TlsConfigTest, PartOfTheCertificatesIsNamed) {
  BinaryRun run =
      RunBinary("stratum-ps", {}, {{"TF_CONFIG", PsTfConfig()}, {"STRATUM_TLS_CERT", "a"}});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("TLS needs a certificate, its key and the CA together, but "
                                    "--tls_key (STRATUM_TLS_KEY) and --tls_ca (STRATUM_TLS_CA) "
                                    "are not set"));
}

TEST(TlsConfigTest, UnreadableFileIsNamed) {
  BinaryRun run = RunBinary("stratum-ps",
                            {"--tls_cert=/nonexistent/tls.crt", "--tls_key=/nonexistent/tls.key",
                             "--tls_ca=/nonexistent/ca.crt"},
                            {{"TF_CONFIG", PsTfConfig()}});
  EXPECT_EQ(run.exit.exit_code, 2);
  EXPECT_THAT(
      run.output,
      HasSubstr("stratum-ps: TLS certificate file \"/nonexistent/tls.crt\" cannot be read"));
}

TEST(TlsConfigTest, CertificatesTurnTlsOnWhenRpcLayerIsLeftOut) {
  Env env = Pod("stratum-ps-0");
  env.push_back({"STRATUM_TLS_CERT", "/etc/stratum/tls/tls.crt"});
  env.push_back({"STRATUM_TLS_KEY", "/etc/stratum/tls/tls.key"});
  env.push_back({"STRATUM_TLS_CA", "/etc/stratum/tls/ca.crt"});
  EXPECT_EQ(PrintedTfConfig("stratum-ps", env)["rpc_layer"], "grpc+tls");
  EXPECT_EQ(PrintedTfConfig("stratum-ps", {{"TF_CONFIG", PsTfConfig()},
                                           {"STRATUM_TLS_CERT", "a"},
                                           {"STRATUM_TLS_KEY", "b"},
                                           {"STRATUM_TLS_CA", "c"}})["rpc_layer"],
            "grpc+tls");
}

}  // namespace
}  // namespace stratum
