// Mutual TLS against real binaries, with certificates made at test time by
// deploy/make_tls_certs.sh (openssl): a client with a certificate from the cluster's CA is
// served; a plaintext client, a TLS client without a certificate and a client whose
// certificate comes from another CA are refused. The plaintext health port answers the
// probes and nothing else, and a whole cluster checks itself and trains over TLS.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <grpcpp/client_context.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "proto/task.grpc.pb.h"
#include "stratum/cluster/cluster_resolver.h"
#include "stratum/net/channel.h"
#include "stratum/net/free_port.h"
#include "stratum/net/health.h"
#include "stratum/ps/ps_client.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/subprocess.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

namespace fs = std::filesystem;

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.5}})");

// `count` different loopback addresses with free ports.
std::vector<std::string> FreeAddresses(int count) {
  absl::StatusOr<std::vector<int>> ports = PickFreePorts(count);
  EXPECT_TRUE(ports.ok()) << ports.status();
  std::vector<std::string> addresses;
  for (int i = 0; i < count; ++i) {
    addresses.push_back(absl::StrCat("127.0.0.1:", ports.ok() ? (*ports)[i] : 0));
  }
  return addresses;
}

// Runs a command to its end; returns its output, or an error with it.
absl::StatusOr<std::string> RunToEnd(std::vector<std::string> argv,
                                     std::vector<std::pair<std::string, std::string>> env = {}) {
  SubprocessOptions options;
  options.argv = std::move(argv);
  options.env = std::move(env);
  options.forward_fd = -1;
  options.capture_output = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Spawn(options);
  if (!process.ok()) return process.status();
  absl::StatusOr<ExitInfo> exit = (*process)->Wait(absl::Seconds(60));
  if (!exit.ok()) return exit.status();
  if (!exit->success()) {
    return absl::InternalError(options.argv[0] + " " + exit->ToString() + ":\n" +
                               (*process)->output());
  }
  return (*process)->output();
}

// The files of one CA and the certificate it signed.
struct CertDir {
  std::string dir;
  TlsFiles Files(const std::string& server_name = "") const {
    return {.cert_file = dir + "/tls.crt",
            .key_file = dir + "/tls.key",
            .ca_file = dir + "/ca.crt",
            .server_name = server_name};
  }
  std::vector<std::string> Flags() const {
    return {"--tls_cert=" + dir + "/tls.crt", "--tls_key=" + dir + "/tls.key",
            "--tls_ca=" + dir + "/ca.crt"};
  }
};

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(
        (fs::temp_directory_path() / ("stratum-tls-test-" + std::to_string(getpid()))).string());
    for (const char* name : {"cluster", "other"}) {
      absl::StatusOr<std::string> made = RunToEnd(
          {std::string(STRATUM_SOURCE_DIR) + "/deploy/make_tls_certs.sh", *root_ + "/" + name},
          {{"DAYS", "2"}});
      ASSERT_TRUE(made.ok()) << made.status();
    }
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    fs::remove_all(*root_, ignored);
    delete root_;
  }

  static CertDir Cluster() { return {*root_ + "/cluster"}; }
  static CertDir Other() { return {*root_ + "/other"}; }

  static ChannelOptions Tls(const CertDir& certs, const std::string& server_name = "") {
    absl::StatusOr<TlsCredentials> tls = LoadTlsCredentials(certs.Files(server_name));
    EXPECT_TRUE(tls.ok()) << tls.status();
    ChannelOptions options;
    if (tls.ok()) options.tls = *tls;
    return options;
  }

  // Starts a binary of `cluster` as `task` with `args`; waits until it answers over TLS.
  std::unique_ptr<Subprocess> Start(const std::string& binary, const ClusterSpec& cluster,
                                    const TaskKey& task, std::vector<std::string> args) {
    SubprocessOptions options;
    options.argv = {std::string(STRATUM_BIN_DIR) + "/" + binary};
    for (std::string& arg : args) options.argv.push_back(std::move(arg));
    options.env = {{"TF_CONFIG", MakeTfConfig(cluster, task)}};
    options.output_prefix = absl::StrCat("[", task.ToString(), "] ");
    options.forward_fd = 2;
    options.capture_output = true;
    absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Spawn(options);
    EXPECT_TRUE(process.ok()) << process.status();
    if (!process.ok()) return nullptr;
    ClusterSpec one;
    one.SetTask(task.type, task.index, *cluster.TaskAddress(task.type, task.index));
    auto healthy = WaitForClusterHealthy(
        one, {.timeout = absl::Seconds(20), .optional_jobs = {}, .channel = Tls(Cluster())});
    EXPECT_TRUE(healthy.ok()) << healthy.status() << "\n" << (*process)->output();
    return *std::move(process);
  }

  static std::string* root_;
};

std::string* TlsTest::root_ = nullptr;

class TlsPsTest : public TlsTest {
 protected:
  void SetUp() override {
    const std::vector<std::string> addresses = FreeAddresses(2);
    address_ = addresses[0];
    health_address_ = addresses[1];
    cluster_.SetTask("ps", 0, address_);
    std::vector<std::string> args = Cluster().Flags();
    args.push_back("--health_port=" + health_address_.substr(health_address_.rfind(':') + 1));
    ps_ = Start("stratum-ps", cluster_, {"ps", 0}, args);
    ASSERT_NE(ps_, nullptr);
  }
  void TearDown() override {
    if (ps_) {
      EXPECT_TRUE(ps_->Stop(absl::Seconds(10)).success()) << ps_->output();
    }
  }

  std::string address_;
  std::string health_address_;
  ClusterSpec cluster_;
  std::unique_ptr<Subprocess> ps_;
};

TEST_F(TlsPsTest, ClientWithTheClustersCertificateIsServed) {
  EXPECT_OK(CheckHealth(address_, absl::Seconds(5), Tls(Cluster())));
  PsClient client("ps:0", address_, {.timeout = absl::Seconds(5), .channel = Tls(Cluster())});
  auto created = client.CreateVariables({{"w", Tensor::FromVector<float>({2}, {1, 2})}}, kSgd);
  ASSERT_TRUE(created.ok()) << created.status();
  auto pulled = client.Pull({"w"});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE((*pulled)[0].BitwiseEqual(Tensor::FromVector<float>({2}, {1, 2})));
  EXPECT_THAT(ps_->output(), HasSubstr("with mutual TLS"));
}

TEST_F(TlsPsTest, PlaintextClientIsRefused) {
  const absl::Status status = CheckHealth(address_, absl::Seconds(3));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  PsClient client("ps:0", address_, {.timeout = absl::Seconds(3)});
  EXPECT_FALSE(client.ListVariables().ok());
}

TEST_F(TlsPsTest, ClientWithACertificateFromAnotherCaIsRefused) {
  // It trusts the cluster's CA, so only the server's check of its certificate can refuse it.
  ChannelOptions options = Tls(Other());
  options.tls->ca_pem = Tls(Cluster()).tls->ca_pem;
  const absl::Status status = CheckHealth(address_, absl::Seconds(3), options);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  PsClient client("ps:0", address_, {.timeout = absl::Seconds(3), .channel = options});
  EXPECT_FALSE(client.ListVariables().ok());
}

TEST_F(TlsPsTest, ClientWithoutACertificateIsRefused) {
  ChannelOptions options = Tls(Cluster());
  options.tls->cert_pem.clear();
  options.tls->key_pem.clear();
  EXPECT_EQ(CheckHealth(address_, absl::Seconds(3), options).code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TlsPsTest, ClientRefusesAServerFromAnotherCa) {
  // Our certificate is fine for the server, but we trust only the other CA.
  ChannelOptions options = Tls(Cluster());
  options.tls->ca_pem = Tls(Other()).tls->ca_pem;
  EXPECT_EQ(CheckHealth(address_, absl::Seconds(3), options).code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TlsPsTest, ServerNameOverrideChecksThatName) {
  // The certificate is for "stratum": dialled at 127.0.0.1 and checked as "stratum", it
  // passes; checked as another name, it does not.
  EXPECT_OK(CheckHealth(address_, absl::Seconds(5), Tls(Cluster(), "stratum")));
  EXPECT_EQ(CheckHealth(address_, absl::Seconds(3), Tls(Cluster(), "ps.example")).code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TlsPsTest, PlaintextHealthPortAnswersProbesOnly) {
  EXPECT_OK(CheckHealth(health_address_, absl::Seconds(5)));
  auto stub = proto::TaskService::NewStub(MakeChannel(health_address_));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  proto::GetTaskStatusResponse response;
  EXPECT_EQ(stub->GetTaskStatus(&context, {}, &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(TlsPsTest, HealthPortStopsWithTheServer) {
  ps_->Signal(SIGTERM);
  ASSERT_OK(ps_->Wait(absl::Seconds(10)));
  EXPECT_FALSE(CheckHealth(health_address_, absl::Seconds(1)).ok());
  ps_.reset();
}

// A ps and a worker serving over mutual TLS (settings from the environment, rpc_layer
// grpc+tls), and the chief's command line; stopped when the object goes.
class TlsCluster {
 public:
  explicit TlsCluster(const CertDir& certs) {
    const std::vector<std::string> addresses = FreeAddresses(3);
    cluster_.SetTask("chief", 0, addresses[0]);
    cluster_.SetTask("worker", 0, addresses[1]);
    cluster_.SetTask("ps", 0, addresses[2]);
    env_ = {{"STRATUM_TLS_CERT", certs.dir + "/tls.crt"},
            {"STRATUM_TLS_KEY", certs.dir + "/tls.key"},
            {"STRATUM_TLS_CA", certs.dir + "/ca.crt"},
            {"STRATUM_TLS_SERVER_NAME", "stratum"}};
    for (const auto& [binary, task] : {std::pair<std::string, TaskKey>{"stratum-ps", {"ps", 0}},
                                       {"stratum-worker", {"worker", 0}}}) {
      SubprocessOptions options;
      options.argv = {std::string(STRATUM_BIN_DIR) + "/" + binary};
      options.env = env_;
      options.env.push_back({"TF_CONFIG", MakeTfConfig(cluster_, task, "grpc+tls")});
      options.forward_fd = -1;
      options.capture_output = true;
      auto process = Subprocess::Spawn(options);
      EXPECT_TRUE(process.ok()) << process.status();
      if (process.ok()) servers_.push_back(*std::move(process));
    }
  }
  ~TlsCluster() {
    for (auto& server : servers_) EXPECT_TRUE(server->Stop(absl::Seconds(10)).success());
  }
  // Runs stratum-coordinator as the chief to its end.
  absl::StatusOr<std::string> RunChief(std::vector<std::string> args) const {
    std::vector<std::pair<std::string, std::string>> env = env_;
    env.push_back({"TF_CONFIG", MakeTfConfig(cluster_, {"chief", 0}, "grpc+tls")});
    args.insert(args.begin(), std::string(STRATUM_BIN_DIR) + "/stratum-coordinator");
    return RunToEnd(std::move(args), std::move(env));
  }

 private:
  ClusterSpec cluster_;
  std::vector<std::pair<std::string, std::string>> env_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
};

TEST_F(TlsTest, ClusterChecksItselfOverTls) {
  // The coordinator reaches every task over mutual TLS, prints the cluster and exits 0.
  TlsCluster cluster(Cluster());
  absl::StatusOr<std::string> out = cluster.RunChief({"--cluster_timeout=30s"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out.value(), HasSubstr("stratum-worker"));
  EXPECT_THAT(out.value(), HasSubstr("stratum-ps"));
}

TEST_F(TlsTest, TrainsAPsJobOverTls) {
  // Every connection of a training job is TLS: coordinator -> worker, coordinator -> ps and
  // worker -> ps (the worker dials the ps with the task's own certificate).
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_ps.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["fit"]["epochs"] = 1;
  job["fit"]["steps_per_epoch"] = 20;
  job.erase("checkpoint");
  const std::string job_path =
      (fs::temp_directory_path() / ("stratum-tls-job-" + std::to_string(getpid()) + ".json"))
          .string();
  std::ofstream(job_path) << job.dump();
  TlsCluster cluster(Cluster());
  absl::StatusOr<std::string> out = cluster.RunChief({"--job=" + job_path});
  fs::remove(job_path);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out.value(), HasSubstr("Epoch 1/1 - 20 steps on 1 worker - "));
}

}  // namespace
}  // namespace stratum
