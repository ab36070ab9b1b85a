#include "stratum/ps/coordinator_lease.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

const CoordinatorClaimant kFirst = {11, "first", "a:1", "host-a"};
const CoordinatorClaimant kSecond = {22, "second", "b:2", "host-b"};

TEST(CoordinatorLeaseTest, ASecondCoordinatorIsRefusedWhileTheHolderIsHeardFrom) {
  CoordinatorLease lease(absl::Milliseconds(300));
  ASSERT_TRUE(lease.Claim(kFirst).ok());
  const absl::Status refused = lease.Claim(kSecond);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(std::string("this parameter server ") + kHeldByAnotherCoordinator +
                        " (first), heard from "));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("stop that one first"));
  // Nor may it change the variables or heartbeat meanwhile; an anonymous caller neither.
  EXPECT_FALSE(lease.Heartbeat(kSecond.incarnation).ok());
  EXPECT_FALSE(lease.Heartbeat(0).ok());
  // The holder's heartbeats keep it through a wait longer than the lease.
  std::thread heartbeats([&lease] {
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE(lease.Heartbeat(kFirst.incarnation).ok());
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  EXPECT_FALSE(lease.Claim(kSecond, absl::Milliseconds(600)).ok());
  heartbeats.join();
}

TEST(CoordinatorLeaseTest, ASilentHolderLosesThePsAndIsRefusedWhenItComesBack) {
  CoordinatorLease lease(absl::Milliseconds(200));
  // Heartbeats do not claim: a PS nobody holds answers them, and stays free.
  EXPECT_TRUE(lease.Heartbeat(kSecond.incarnation).ok());
  ASSERT_TRUE(lease.Claim(kFirst).ok());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(lease.Claim(kSecond, absl::Seconds(5)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));  // once the holder fell silent
  EXPECT_TRUE(lease.Release(kSecond.incarnation));
  for (const absl::Status& back : {lease.Heartbeat(kFirst.incarnation), lease.Claim(kFirst)}) {
    EXPECT_THAT(std::string(back.message()),
                HasSubstr("second took it over after this coordinator was silent for "));
  }
  EXPECT_FALSE(lease.Release(kFirst.incarnation));
}

TEST(CoordinatorLeaseTest, AReleaseOrARestartOnTheHoldersAddressHandsItOverAtOnce) {
  CoordinatorLease lease(absl::Seconds(60));
  ASSERT_TRUE(lease.Claim(kFirst).ok());
  EXPECT_FALSE(lease.Release(kSecond.incarnation));  // not the holder's: nothing changes
  EXPECT_FALSE(lease.Claim(kSecond).ok());
  EXPECT_TRUE(lease.Release(kFirst.incarnation));
  EXPECT_TRUE(lease.Claim(kSecond).ok());
  // The same address on another host is another coordinator, not a restart.
  EXPECT_FALSE(lease.Claim({33, "elsewhere", "b:2", "host-c"}).ok());
  EXPECT_TRUE(lease.Claim({44, "second, restarted", "b:2", "host-b"}).ok());
  EXPECT_THAT(std::string(lease.Heartbeat(kSecond.incarnation).message()),
              HasSubstr("second, restarted took it over: it serves on this coordinator's address "
                        "on the same host"));
}

}  // namespace
}  // namespace stratum
