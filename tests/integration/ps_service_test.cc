// The parameter-server service over real gRPC against a real stratum-ps process: the
// calls workers make, and every bad request refused without harm.
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/client_context.h>

#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "proto/ps.grpc.pb.h"
#include "stratum/net/channel.h"
#include "stratum/net/host_port.h"
#include "stratum/ps/ps_client.h"
#include "stratum/tensor/tensor_proto.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/process_info.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using testing::LocalCluster;
using testing::RemoveFolder;
using testing::TempPath;

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.5}})");

class PsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = LocalCluster::Start(
        {.num_workers = 1, .num_ps = 1, .not_started = {{"worker", 0}}, .forward_output = false});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    client_ = std::make_unique<PsClient>("ps:0", cluster_->Address({"ps", 0}), client_options_);
    auto created = client_->CreateVariables(
        {{"w", Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4})}, {"b", Tensor::Scalar(1)}}, kSgd);
    ASSERT_TRUE(created.ok()) << created.status();
  }

  Tensor Value(const std::string& name) { return (*client_->Pull({name}))[0]; }

  // This test's process is the coordinator; its checkpoint folder is where TempPath puts files.
  const PsClientOptions client_options_{
      .timeout = absl::Seconds(5),
      .checkpoint_dir = std::filesystem::path(TempPath("x")).parent_path().string()};

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<PsClient> client_;
};

TEST_F(PsServiceTest, PushThenPullInOneCall) {
  std::vector<Tensor> pulled;
  ASSERT_TRUE(
      client_->Push({{"w", Tensor::FromVector<float>({2, 2}, {2, 2, 2, 2})}}, &pulled).ok());
  ASSERT_EQ(pulled.size(), 1u);
  EXPECT_TRUE(pulled[0].BitwiseEqual(Tensor::FromVector<float>({2, 2}, {0, 1, 2, 3})));
  EXPECT_TRUE(Value("w").BitwiseEqual(pulled[0]));
  auto list = client_->ListVariables();
  ASSERT_OK(list);
  EXPECT_EQ(list->variables_size(), 2);
  EXPECT_EQ(list->total_bytes(), 20);
}

TEST_F(PsServiceTest, CreateIsIdempotentAndConflictsAreNamed) {
  auto again = client_->CreateVariables({{"w", Tensor(DType::kFloat32, {2, 2})}}, kSgd);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE((*again)[0]);
  auto conflict = client_->CreateVariables({{"w", Tensor(DType::kFloat32, {3})}}, kSgd);
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(conflict.status().message()),
              HasSubstr("ps:0 at " + cluster_->Address({"ps", 0}) + ": variable \"w\" exists"));
}

// A new job's coordinator on long-lived parameter servers: what an earlier job trained
// (value, update count; even another shape) does not leak into the new one.
TEST_F(PsServiceTest, CreateWithReplaceStartsExistingVariablesAfresh) {
  ASSERT_OK(client_->Push({{"w", Tensor::FromVector<float>({2, 2}, {2, 2, 2, 2})}}));
  const Tensor initial = Tensor::FromVector<float>({2, 2}, {5, 6, 7, 8});
  auto replaced = client_->CreateVariables({{"w", initial}}, kSgd, /*replace=*/true);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_FALSE((*replaced)[0]);
  EXPECT_TRUE(Value("w").BitwiseEqual(initial));
  auto list = client_->ListVariables();
  ASSERT_OK(list);
  for (const auto& variable : list->variables()) {
    if (variable.name() == "w") {
      EXPECT_EQ(variable.updates(), 0);
    }
  }
  auto reshaped = client_->CreateVariables({{"w", Tensor::FromVector<float>({3}, {1, 2, 3})}}, kSgd,
                                           /*replace=*/true);
  ASSERT_TRUE(reshaped.ok()) << reshaped.status();
  EXPECT_EQ(Value("w").shape(), Shape({3}));
}

TEST_F(PsServiceTest, BadRequestsAreRefusedAndChangeNothing) {
  const Tensor before = Value("w");
  auto expect_refused = [&](absl::Status status, absl::StatusCode code, const std::string& text) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(text));
  };
  expect_refused(client_->Push({{"nope", Tensor::Scalar(1)}}), absl::StatusCode::kNotFound,
                 "variable \"nope\" does not exist");
  expect_refused(client_->Push({{"w", Tensor(DType::kFloat32, {4})}}),
                 absl::StatusCode::kInvalidArgument,
                 "is float32[4] but the variable is float32[2, 2]");
  Tensor nan =
      Tensor::FromVector<float>({2, 2}, {0, std::numeric_limits<float>::quiet_NaN(), 0, 0});
  expect_refused(client_->Push({{"w", nan}}), absl::StatusCode::kInvalidArgument, "NaN or Inf");
  // One bad gradient in a request: the good one before it is not applied either.
  expect_refused(client_->Push({{"b", Tensor::Scalar(1)}, {"w", Tensor(DType::kInt32, {2, 2})}}),
                 absl::StatusCode::kInvalidArgument, "gradient for variable \"w\" is int32[2, 2]");
  EXPECT_TRUE(Value("b").BitwiseEqual(Tensor::Scalar(1)));

  // A malformed tensor: content that does not match its shape.
  auto stub = proto::ParameterServer::NewStub(MakeChannel(cluster_->Address({"ps", 0})));
  proto::PushRequest request;
  proto::NamedTensor* gradient = request.add_gradients();
  gradient->set_name("w");
  TensorToProto(Tensor(DType::kFloat32, {2, 2}), gradient->mutable_tensor());
  gradient->mutable_tensor()->set_content("short");
  grpc::ClientContext context;
  proto::PushResponse response;
  grpc::Status status = stub->Push(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("needs 16 bytes but carries 5"));

  EXPECT_TRUE(Value("w").BitwiseEqual(before));
  EXPECT_EQ(client_->ListVariables()->refused_non_finite(), 1);
}

// While a coordinator holds the PS, another one's Assign or Restore (a coordinator that was
// taken over, or a second job by mistake) is refused and changes nothing.
TEST_F(PsServiceTest, AssignAndRestoreFromACoordinatorThatDoesNotHoldThePsAreRefused) {
  ASSERT_OK(client_->Watch(/*saves_checkpoints=*/true, /*leaving=*/false, /*claim=*/true));
  const Tensor before = Value("w");
  auto stub = proto::ParameterServer::NewStub(MakeChannel(cluster_->Address({"ps", 0})));
  proto::CoordinatorId other;
  other.set_incarnation(ProcessIncarnation() + 1);
  other.set_description("the other coordinator");
  proto::AssignRequest assign;
  *assign.mutable_coordinator() = other;
  proto::NamedTensor* value = assign.add_values();
  value->set_name("w");
  TensorToProto(Tensor::FromVector<float>({2, 2}, {9, 9, 9, 9}), value->mutable_tensor());
  grpc::ClientContext assign_context;
  proto::AssignResponse assigned;
  grpc::Status status = stub->Assign(&assign_context, assign, &assigned);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("held by another coordinator"));

  proto::RestoreRequest restore;
  *restore.mutable_coordinator() = other;
  restore.set_path(TempPath("never_read.safetensors"));
  grpc::ClientContext restore_context;
  proto::RestoreResponse restored;
  status = stub->Restore(&restore_context, restore, &restored);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("held by another coordinator"));

  EXPECT_TRUE(Value("w").BitwiseEqual(before));
  // The holder's own Assign goes through.
  const Tensor mine = Tensor::FromVector<float>({2, 2}, {5, 6, 7, 8});
  ASSERT_OK(client_->Assign({{"w", mine}}));
  EXPECT_TRUE(Value("w").BitwiseEqual(mine));
}

// Hardening case 4: the holder's incarnation is public (GetTaskStatus reports it, and so
// does the launcher's table); without the holder's secret, a call that names it is refused
// and logged, and the variables stay as they are.
TEST_F(PsServiceTest, TheHoldersIncarnationWithoutItsSecretChangesNothing) {
  ASSERT_OK(client_->Watch(/*saves_checkpoints=*/true, /*leaving=*/false, /*claim=*/true));
  const Tensor before = Value("w");
  auto stub = proto::ParameterServer::NewStub(MakeChannel(cluster_->Address({"ps", 0})));
  proto::CoordinatorId forged = ThisCoordinator(client_options_);
  forged.set_secret("guessed");
  proto::AssignRequest assign;
  *assign.mutable_coordinator() = forged;
  proto::NamedTensor* value = assign.add_values();
  value->set_name("w");
  TensorToProto(Tensor::FromVector<float>({2, 2}, {NAN, 0, 0, 0}), value->mutable_tensor());
  grpc::ClientContext assign_context;
  proto::AssignResponse assigned;
  const grpc::Status status = stub->Assign(&assign_context, assign, &assigned);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("without that coordinator's secret"));
  proto::SaveRequest save;
  *save.mutable_coordinator() = forged;
  save.set_path(TempPath("forged.safetensors"));
  grpc::ClientContext save_context;
  proto::SaveResponse saved;
  EXPECT_EQ(stub->Save(&save_context, save, &saved).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_FALSE(std::filesystem::exists(save.path()));
  EXPECT_TRUE(Value("w").BitwiseEqual(before));
  EXPECT_THAT(cluster_->Output({"ps", 0}), HasSubstr("refused a call that names the incarnation"));
  // The holder itself goes on.
  ASSERT_OK(client_->Assign({{"w", Tensor::FromVector<float>({2, 2}, {5, 6, 7, 8})}}));
}

// A coordinator restarted on its old address takes the PS over at once; address and host
// are public, though, so that holds only for a claim from the network address the holder
// called from. One from elsewhere that names them waits out the lease, and while the holder
// is heard from it is refused. The PS listens on every address (host "::"): the holder
// calls it on 127.0.0.1, the claimant that names it on ::1.
TEST(PsServiceClaimTest, AClaimNamingTheHoldersAddressFromElsewhereDoesNotTakeOver) {
  auto cluster = LocalCluster::Start({.num_workers = 1,
                                      .num_ps = 1,
                                      .not_started = {{"worker", 0}},
                                      .host = "::",
                                      .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string port = SplitHostPort((*cluster)->Address({"ps", 0})).port;
  PsClientOptions options;
  options.timeout = absl::Seconds(20);
  options.coordinator = "the chief";
  options.coordinator_address = "localhost:1";
  PsClient holder("ps:0", "127.0.0.1:" + port, options);
  ASSERT_OK(holder.CreateVariables({{"w", Tensor::Scalar(1)}}, kSgd));
  ASSERT_OK(holder.Watch(/*saves_checkpoints=*/false, /*leaving=*/false, /*claim=*/true));
  std::atomic<bool> done = false;
  std::thread heartbeats([&holder, &done] {
    while (!done) {
      EXPECT_OK(holder.Watch(/*saves_checkpoints=*/false));
      absl::SleepFor(absl::Milliseconds(300));
    }
  });
  // Same address, same host, a new incarnation and a secret of its own: a restart, but for
  // where it calls from.
  auto Claim = [&](const std::string& target, uint64_t incarnation, const std::string& secret) {
    proto::WatchRequest request;
    *request.mutable_coordinator() = ThisCoordinator(options);
    request.mutable_coordinator()->set_incarnation(incarnation);
    request.mutable_coordinator()->set_secret(secret);
    request.set_claim(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    proto::WatchResponse response;
    return proto::ParameterServer::NewStub(MakeChannel(target))
        ->Watch(&context, request, &response);
  };
  const grpc::Status elsewhere = Claim("[::1]:" + port, 0x5eed, "a secret of its own");
  done = true;
  heartbeats.join();
  EXPECT_EQ(elsewhere.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << elsewhere.error_message();
  EXPECT_THAT(elsewhere.error_message(), HasSubstr("is held by another coordinator (the chief)"));
  EXPECT_THAT((*cluster)->Output({"ps", 0}), HasSubstr("but calls from ::1, not 127.0.0.1"));
  ASSERT_OK(holder.Assign({{"w", Tensor::Scalar(2)}}));  // still the holder's
  // From where the holder called, the same claim is the holder restarted: at once.
  const absl::Time start = absl::Now();
  const grpc::Status restarted = Claim("127.0.0.1:" + port, 0x5eee, "the restarted one's");
  EXPECT_TRUE(restarted.ok()) << restarted.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_FALSE(holder.Assign({{"w", Tensor::Scalar(3)}}).ok());
}

// Hardening case 3: Save and Restore touch files only inside the checkpoint folder the
// holder declared, whatever path they name (absolute, "..", a link that leads out), and
// only for the holder; a file outside keeps its contents and mode.
TEST_F(PsServiceTest, SaveAndRestoreStayInsideTheHoldersCheckpointFolder) {
  const std::string folder = TempPath("confined_checkpoints");
  RemoveFolder(folder);
  std::filesystem::create_directories(folder);
  const std::string outside = TempPath("outside_the_folder");
  { std::ofstream(outside) << "precious"; }
  ASSERT_EQ(chmod(outside.c_str(), 0600), 0);
  std::filesystem::create_symlink(outside, folder + "/link");
  PsClientOptions options = client_options_;
  options.checkpoint_dir = folder;
  PsClient coordinator("ps:0", cluster_->Address({"ps", 0}), options);
  // No coordinator holds the PS yet: nothing is saved, even inside the folder.
  auto unheld = coordinator.Save(folder + "/ps-0.safetensors");
  EXPECT_EQ(unheld.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unheld.status().message()), HasSubstr("no coordinator holds it"));
  ASSERT_TRUE(
      coordinator.Watch(/*saves_checkpoints=*/true, /*leaving=*/false, /*claim=*/true).ok());
  for (const std::string& path : {outside, folder + "/../outside_the_folder", folder + "/link",
                                  std::string("/etc/stratum-test-never-written"), folder}) {
    auto saved = coordinator.Save(path);
    EXPECT_EQ(saved.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(std::string(saved.status().message()),
                HasSubstr("which is not inside the job's checkpoint folder"))
        << path;
    auto restored = coordinator.Restore(path, 0);
    EXPECT_EQ(restored.code(), absl::StatusCode::kPermissionDenied) << path;
  }
  std::ifstream kept(outside);
  std::string contents;
  kept >> contents;
  EXPECT_EQ(contents, "precious");
  struct stat info {};
  ASSERT_EQ(stat(outside.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  // Inside the folder, the holder saves and restores.
  auto saved = coordinator.Save(folder + "/ps-0.safetensors");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_OK(coordinator.Restore(folder + "/ps-0.safetensors", saved->crc32()));
  std::remove(outside.c_str());
  RemoveFolder(folder);
}

// With --checkpoint_root, a claim whose checkpoint folder is elsewhere is refused: whoever
// claims a PS that no coordinator holds cannot make it write outside that root.
TEST(PsServiceRootTest, AClaimOfAFolderOutsideTheCheckpointRootIsRefused) {
  const std::string root = TempPath("checkpoint_root");
  RemoveFolder(root);
  std::filesystem::create_directories(root + "/job");
  auto cluster = LocalCluster::Start({.num_workers = 1,
                                      .num_ps = 1,
                                      .not_started = {{"worker", 0}},
                                      .args_by_type = {{"ps", {"--checkpoint_root=" + root}}},
                                      .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (const std::string& elsewhere : {std::string("/"), TempPath("not_the_root"), root + "/.."}) {
    PsClientOptions options;
    options.timeout = absl::Seconds(5);
    options.checkpoint_dir = elsewhere;
    PsClient outsider("ps:0", (*cluster)->Address({"ps", 0}), options);
    auto claimed = outsider.Watch(/*saves_checkpoints=*/true, /*leaving=*/false, /*claim=*/true);
    EXPECT_EQ(claimed.status().code(), absl::StatusCode::kPermissionDenied) << elsewhere;
    EXPECT_THAT(std::string(claimed.status().message()), HasSubstr("is outside --checkpoint_root"));
  }
  for (const std::string& inside : {root, root + "/job"}) {
    PsClientOptions options;
    options.timeout = absl::Seconds(5);
    options.checkpoint_dir = inside;
    PsClient coordinator("ps:0", (*cluster)->Address({"ps", 0}), options);
    ASSERT_TRUE(coordinator.Watch(true, false, /*claim=*/true).ok()) << inside;
    ASSERT_OK(coordinator.Watch(true, /*leaving=*/true));
  }
  RemoveFolder(root);
}

// Hardening case 6: a Restore that names a FIFO is refused at once, and the PS still stops
// on SIGTERM (was: open() blocked for a writer, and SIGTERM never ended the PS).
TEST_F(PsServiceTest, ARestoreOfAFifoIsRefusedAtOnce) {
  const std::string fifo = TempPath("restore_fifo");
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_OK(client_->Watch(/*saves_checkpoints=*/true, /*leaving=*/false, /*claim=*/true));
  auto stub = proto::ParameterServer::NewStub(MakeChannel(cluster_->Address({"ps", 0})));
  proto::RestoreRequest restore;
  *restore.mutable_coordinator() = ThisCoordinator(client_options_);
  restore.set_path(fifo);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::RestoreResponse restored;
  const grpc::Status status = stub->Restore(&context, restore, &restored);
  EXPECT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("it is not a regular file"));
  unlink(fifo.c_str());
  ASSERT_OK(cluster_->Signal({"ps", 0}, SIGTERM));
  auto exit = cluster_->WaitForExit({"ps", 0}, absl::Seconds(30));
  ASSERT_TRUE(exit.ok()) << exit.status();
}

TEST_F(PsServiceTest, OversizedMessagesAreRefusedAndThePsLivesOn) {
  // 300 MiB is over the 256 MiB limit Stratum sets on both ends.
  auto stub = proto::ParameterServer::NewStub(
      MakeChannel(cluster_->Address({"ps", 0}), {.max_message_bytes = 512 * 1024 * 1024}));
  proto::PushRequest request;
  proto::NamedTensor* gradient = request.add_gradients();
  gradient->set_name("w");
  gradient->mutable_tensor()->set_content(std::string(300 << 20, '\0'));
  grpc::ClientContext context;
  proto::PushResponse response;
  grpc::Status status = stub->Push(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_OK(client_->Pull({"w"}));
}

TEST_F(PsServiceTest, ADeadPsIsNamedWithinTheDeadline) {
  ASSERT_OK(cluster_->Kill({"ps", 0}));
  const absl::Time start = absl::Now();
  auto pulled = client_->Pull({"w"});
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(pulled.status().message()),
              HasSubstr("ps:0 at " + cluster_->Address({"ps", 0})));
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
}

Tensor Filled(int64_t elements, float value) {
  Tensor tensor(DType::kFloat32, {elements});
  tensor.Flat().setConstant(value);
  return tensor;
}

TEST_F(PsServiceTest, LargeTensorsTakeTheDataPathAndAgreeWithGrpc) {
  constexpr int64_t kElements = 1 << 20;  // 4 MiB
  ASSERT_OK(client_->CreateVariables({{"big", Filled(kElements, 1)}}, kSgd));
  const std::string address = cluster_->Address({"ps", 0});
  PsClient tcp("ps:0", address, {.timeout = absl::Seconds(5), .shared_memory = false});
  PsClient grpc("ps:0", address, {.timeout = absl::Seconds(5), .data_path_min_bytes = -1});
  float expected = 1;
  for (PsClient* client : {client_.get(), &tcp, &grpc}) {
    std::vector<Tensor> pulled;
    ASSERT_OK(client->Push({{"big", Filled(kElements, 2)}}, &pulled));
    expected -= 1;  // 0.5 * 2
    ASSERT_EQ(pulled.size(), 1u);
    EXPECT_TRUE((pulled[0].Flat() == expected).all()) << client->transport();
    auto value = client->Pull({"big"});
    ASSERT_TRUE(value.ok()) << value.status();
    EXPECT_TRUE((*value)[0].BitwiseEqual(pulled[0]));
  }
  EXPECT_EQ(client_->transport(), "shared memory");
  EXPECT_EQ(tcp.transport(), "tcp");
  EXPECT_EQ(grpc.transport(), "grpc");
  auto list = client_->ListVariables();
  ASSERT_OK(list);
  for (const proto::VariableStatus& variable : list->variables()) {
    if (variable.name() == "big") {
      EXPECT_EQ(variable.updates(), 3);
    }
  }
}

TEST_F(PsServiceTest, ADeadPsIsNamedWithinTheDeadlineOnTheDataPath) {
  constexpr int64_t kElements = 1 << 20;
  ASSERT_OK(client_->CreateVariables({{"big", Filled(kElements, 1)}}, kSgd));
  ASSERT_OK(client_->Push({{"big", Filled(kElements, 1)}}));
  ASSERT_EQ(client_->transport(), "shared memory");
  ASSERT_OK(cluster_->Kill({"ps", 0}));
  const absl::Time start = absl::Now();
  const absl::Status status = client_->Push({{"big", Filled(kElements, 1)}});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("ps:0 at " + cluster_->Address({"ps", 0})));
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));

  // A PS that comes back has a new data path; the client finds it.
  ASSERT_OK(cluster_->Restart({"ps", 0}));
  ASSERT_OK(client_->CreateVariables({{"big", Filled(kElements, 1)}}, kSgd));
  std::vector<Tensor> pulled;
  ASSERT_OK(client_->Push({{"big", Filled(kElements, 2)}}, &pulled));
  EXPECT_TRUE((pulled[0].Flat() == 0).all());
  EXPECT_EQ(client_->transport(), "shared memory");
}

TEST(PsServiceDataPathTest, APsWithoutADataPathServesOverGrpc) {
  auto cluster = LocalCluster::Start({.num_workers = 1,
                                      .num_ps = 1,
                                      .not_started = {{"worker", 0}},
                                      .args_by_type = {{"ps", {"--data_path=false"}}},
                                      .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  PsClient client("ps:0", (*cluster)->Address({"ps", 0}), {.timeout = absl::Seconds(5)});
  ASSERT_TRUE(client.CreateVariables({{"big", Filled(1 << 18, 1)}}, kSgd).ok());
  std::vector<Tensor> pulled;
  ASSERT_TRUE(client.Push({{"big", Filled(1 << 18, 2)}}, &pulled).ok());
  EXPECT_TRUE((pulled[0].Flat() == 0).all());
  EXPECT_EQ(client.transport(), "grpc");
}

// Stopping (proto::WatchRequest): a PS that gets SIGTERM while a coordinator that saves
// checkpoints watches it serves on, says it is stopping, and exits once a checkpoint begun
// after the signal is committed: its own file written is not enough.
TEST_F(PsServiceTest, ASigtermedPsServesOnUntilItsWatchingCoordinatorSaves) {
  auto watched = client_->Watch(/*saves_checkpoints=*/true, /*leaving=*/false, /*claim=*/true);
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_FALSE(watched->stopping());
  ASSERT_OK(cluster_->Signal({"ps", 0}, SIGTERM));
  bool stopping = false;
  for (int i = 0; i < 50 && !stopping; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    auto answer = client_->Watch(true);
    ASSERT_TRUE(answer.ok()) << answer.status();
    stopping = answer->stopping();
  }
  ASSERT_TRUE(stopping);
  // Still serving: the coordinator's last pushes and its save get through.
  ASSERT_OK(client_->Push({{"w", Tensor::FromVector<float>({2, 2}, {2, 2, 2, 2})}}));
  absl::SleepFor(absl::Seconds(1));
  ASSERT_OK(client_->Watch(true));
  EXPECT_FALSE(cluster_->WaitForExit({"ps", 0}, absl::ZeroDuration()).ok());
  const std::string file = TempPath("stopping_ps.safetensors");
  auto saved = client_->Save(file);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(saved->stopping());
  absl::SleepFor(absl::Milliseconds(500));
  auto uncommitted = client_->Watch(true);
  ASSERT_TRUE(uncommitted.ok()) << uncommitted.status();
  EXPECT_FALSE(uncommitted->saved());
  EXPECT_FALSE(cluster_->WaitForExit({"ps", 0}, absl::ZeroDuration()).ok());
  auto committed = client_->Watch(true, /*leaving=*/false, /*claim=*/false, saved->save_id());
  std::remove(file.c_str());
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->saved());
  auto exit = cluster_->WaitForExit({"ps", 0}, absl::Seconds(5));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_THAT(cluster_->Output({"ps", 0}), HasSubstr("the coordinator saved the job's state"));
}

// No coordinator that saves watches (none ever did, or it said it is leaving): nothing to
// wait for, the PS stops at once as any server.
TEST_F(PsServiceTest, ASigtermedPsThatNoSavingCoordinatorWatchesStopsAtOnce) {
  ASSERT_OK(client_->Watch(/*saves_checkpoints=*/true));
  ASSERT_OK(client_->Watch(true, /*leaving=*/true));
  const absl::Time start = absl::Now();
  ASSERT_OK(cluster_->Signal({"ps", 0}, SIGTERM));
  auto exit = cluster_->WaitForExit({"ps", 0}, absl::Seconds(10));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 0);
  // At most the gRPC server's shutdown grace (3 s), which this test's open channel takes.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(cluster_->Output({"ps", 0}), ::testing::Not(HasSubstr("serving on until")));
}

// A coordinator that watches but never saves (stuck): the PS goes after --stop_timeout,
// saying that the job resumes from its last checkpoint.
TEST(PsServiceStopTest, ASigtermedPsStopsAfterItsStopTimeoutWhenNoSaveComes) {
  auto cluster = LocalCluster::Start({.num_workers = 1,
                                      .num_ps = 1,
                                      .not_started = {{"worker", 0}},
                                      .args_by_type = {{"ps", {"--stop_timeout=1s"}}},
                                      .forward_output = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  PsClient client("ps:0", (*cluster)->Address({"ps", 0}), {.timeout = absl::Seconds(5)});
  std::atomic<bool> done{false};
  absl::Notification watching;  // the PS knows a coordinator that saves watches it
  std::thread watcher([&] {
    while (!done) {
      if (client.Watch(true).ok() && !watching.HasBeenNotified()) watching.Notify();
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  EXPECT_TRUE(watching.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const absl::Time start = absl::Now();
  ASSERT_OK((*cluster)->Signal({"ps", 0}, SIGTERM));
  auto exit = (*cluster)->WaitForExit({"ps", 0}, absl::Seconds(10));
  done = true;
  watcher.join();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  EXPECT_THAT((*cluster)->Output({"ps", 0}),
              HasSubstr("the coordinator saved nothing within --stop_timeout 1s: stopping; the "
                        "job resumes from its last checkpoint"));
}

}  // namespace
}  // namespace stratum
