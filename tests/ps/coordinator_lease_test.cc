#include "stratum/ps/coordinator_lease.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kFirst = 11, kSecond = 22;

TEST(CoordinatorLeaseTest, ASecondCoordinatorIsRefusedWhileTheHolderIsHeardFrom) {
  CoordinatorLease lease(absl::Milliseconds(300));
  ASSERT_TRUE(lease.Claim(kFirst, "chief:0 at a:1", "a:1").ok());
  const absl::Status refused = lease.Claim(kSecond, "chief:0 at b:2", "b:2");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(std::string("this parameter server ") + kHeldByAnotherCoordinator +
                        " (chief:0 at a:1), heard from "));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("stop that one first"));
  // The holder's heartbeats keep it through a wait longer than the lease.
  std::thread heartbeats([&lease] {
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE(lease.Claim(kFirst, "chief:0 at a:1", "a:1").ok());
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  EXPECT_FALSE(lease.Claim(kSecond, "chief:0 at b:2", "b:2", absl::Milliseconds(600)).ok());
  heartbeats.join();
  // A caller that does not say who it is is let through, and holds nothing.
  EXPECT_TRUE(lease.Claim(0, "", "").ok());
}

TEST(CoordinatorLeaseTest, ASilentHolderLosesThePsAndIsRefusedWhenItComesBack) {
  CoordinatorLease lease(absl::Milliseconds(200));
  ASSERT_TRUE(lease.Claim(kFirst, "first", "a:1").ok());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(lease.Claim(kSecond, "second", "b:2", absl::Seconds(5)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));  // once the holder fell silent
  lease.Release(kSecond);
  const absl::Status back = lease.Claim(kFirst, "first", "a:1");
  EXPECT_THAT(std::string(back.message()), HasSubstr("(second) that took it over"));
}

TEST(CoordinatorLeaseTest, AReleaseOrARestartOnTheHoldersAddressHandsItOverAtOnce) {
  CoordinatorLease lease(absl::Seconds(60));
  ASSERT_TRUE(lease.Claim(kFirst, "first", "a:1").ok());
  lease.Release(kSecond);  // not the holder's: nothing changes
  EXPECT_FALSE(lease.Claim(kSecond, "second", "b:2").ok());
  lease.Release(kFirst);
  EXPECT_TRUE(lease.Claim(kSecond, "second", "b:2").ok());
  EXPECT_TRUE(lease.Claim(kFirst + 1, "second, restarted", "b:2").ok());
  EXPECT_FALSE(lease.Claim(kSecond, "second", "b:2").ok());  // the old process, if it was not dead
}

}  // namespace
}  // namespace stratum
