// How a stopping PS decides that its wait is over (PsService::StopNeedNotWait), in-process:
// its own shard file written is not enough, only a checkpoint holding it that the
// coordinator committed (its manifest written) is, because that commit may still fail.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stratum/ps/ps_service.h"
#include "stratum/testing/fake_clock.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/process_info.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWatchWindow = absl::Seconds(30);

class PsServiceStopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(store_.Create("w", Tensor::FromVector<float>({2}, {1, 2}), nullptr));
    std::filesystem::create_directories(dir_);
    // A coordinator that saves checkpoints holds the PS and watches it.
    ASSERT_OK(Watch(/*committed_save=*/0, nullptr, /*claim=*/true));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  grpc::Status Watch(uint64_t committed_save, proto::WatchResponse* response = nullptr,
                     bool claim = false) {
    proto::WatchRequest request;
    request.set_saves_checkpoints(true);
    request.set_claim(claim);
    request.mutable_coordinator()->set_incarnation(kCoordinator);
    request.mutable_coordinator()->set_secret(kSecret);
    request.mutable_coordinator()->set_checkpoint_dir(dir_);
    request.set_committed_save(committed_save);
    proto::WatchResponse ignored;
    return service_.Watch(nullptr, &request, response != nullptr ? response : &ignored);
  }

  proto::SaveResponse Save(const std::string& name) {
    proto::SaveRequest request;
    request.set_path(dir_ + "/" + name);
    request.mutable_coordinator()->set_incarnation(kCoordinator);
    request.mutable_coordinator()->set_secret(kSecret);
    proto::SaveResponse response;
    const grpc::Status status = service_.Save(nullptr, &request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  static constexpr uint64_t kCoordinator = 42;
  static constexpr char kSecret[] = "the coordinator's secret";
  const std::string dir_ =
      absl::StrCat(std::filesystem::temp_directory_path().string(), "/ps_service_stop_", getpid());
  VariableStore store_;
  testing::FakeClock clock_;  // the watch window and the probe interval are counted in it
  PsService service_{store_, {}, absl::Seconds(5), clock_};
};

TEST_F(PsServiceStopTest, AStoppingPsWaitsUntilTheSaveThatHoldsItsStateIsCommitted) {
  service_.BeginStopping();
  EXPECT_EQ(service_.StopNeedNotWait(kWatchWindow), "");
  const proto::SaveResponse saved = Save("ps-0.safetensors");
  EXPECT_TRUE(saved.stopping());
  // The shard file is written, but the coordinator has not committed the checkpoint (it may
  // fail to): going now would lose what was trained since the last committed one.
  EXPECT_EQ(service_.StopNeedNotWait(kWatchWindow), "");
  proto::WatchResponse answer;
  ASSERT_OK(Watch(/*committed_save=*/0, &answer));
  EXPECT_TRUE(answer.stopping());
  EXPECT_FALSE(answer.saved());
  EXPECT_EQ(answer.incarnation(), ProcessIncarnation());

  ASSERT_OK(Watch(saved.save_id(), &answer));
  EXPECT_TRUE(answer.saved());
  EXPECT_THAT(service_.StopNeedNotWait(kWatchWindow),
              HasSubstr("the coordinator saved the job's state"));
}

// A checkpoint committed from a save begun before the signal does not hold what was trained
// after it; nor does a save id this PS never gave.
TEST_F(PsServiceStopTest, OnlyTheCommitOfASaveBegunAfterTheSignalEndsTheWait) {
  const proto::SaveResponse before = Save("before.safetensors");
  EXPECT_FALSE(before.stopping());
  service_.BeginStopping();
  ASSERT_OK(Watch(before.save_id()));
  EXPECT_EQ(service_.StopNeedNotWait(kWatchWindow), "");

  const proto::SaveResponse failed = Save("failed.safetensors");  // its commit fails
  const proto::SaveResponse after = Save("after.safetensors");
  EXPECT_NE(failed.save_id(), after.save_id());
  EXPECT_NE(before.save_id(), after.save_id());
  ASSERT_OK(Watch(after.save_id() + 1000));
  EXPECT_EQ(service_.StopNeedNotWait(kWatchWindow), "");
  ASSERT_OK(Watch(after.save_id()));
  EXPECT_THAT(service_.StopNeedNotWait(kWatchWindow),
              HasSubstr("the coordinator saved the job's state"));
}

// A coordinator that leaves after a save whose commit failed will commit nothing more: the
// PS goes, and says that the job resumes from its last committed checkpoint.
TEST_F(PsServiceStopTest, ACoordinatorLeavingWithoutACommitEndsTheWaitWithoutASave) {
  service_.BeginStopping();
  (void)Save("uncommitted.safetensors");
  proto::WatchRequest leaving;
  leaving.set_saves_checkpoints(true);
  leaving.set_leaving(true);
  leaving.mutable_coordinator()->set_incarnation(kCoordinator);
  leaving.mutable_coordinator()->set_secret(kSecret);
  proto::WatchResponse answer;
  ASSERT_OK(service_.Watch(nullptr, &leaving, &answer));
  const std::string why = service_.StopNeedNotWait(kWatchWindow);
  EXPECT_THAT(why, HasSubstr("was not committed"));
  EXPECT_THAT(why, ::testing::Not(HasSubstr("saved the job's state")));
}

// A coordinator that falls silent is waited for while it still listens (paused, or too busy
// to watch: its kernel accepts connections), and is gone once its address refuses them (QA:
// a PS stopping while its coordinator was paused took it for gone within 2 s and went,
// so the job rolled back to its last checkpoint when the coordinator came back).
TEST_F(PsServiceStopTest, ASilentCoordinatorIsWaitedForUntilItsAddressRefusesConnections) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(listener, 4), 0);  // never accepts, as a stopped process
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  proto::WatchRequest request;
  request.set_saves_checkpoints(true);
  request.mutable_coordinator()->set_incarnation(kCoordinator);
  request.mutable_coordinator()->set_secret(kSecret);
  request.mutable_coordinator()->set_address(absl::StrCat("127.0.0.1:", ntohs(address.sin_port)));
  proto::WatchResponse answer;
  ASSERT_OK(service_.Watch(nullptr, &request, &answer));
  service_.BeginStopping();
  clock_.Advance(absl::Milliseconds(20));
  // Silent for longer than the window, but still there.
  EXPECT_EQ(service_.StopNeedNotWait(absl::Milliseconds(1)), "");
  close(listener);
  // Probed again once the probe interval (0.5 s) has passed.
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_THAT(service_.StopNeedNotWait(absl::Milliseconds(1)),
              HasSubstr("its coordinator is gone"));
}

}  // namespace
}  // namespace stratum
