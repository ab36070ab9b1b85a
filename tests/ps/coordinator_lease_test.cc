#include "stratum/ps/coordinator_lease.h"

#include <algorithm>
#include <functional>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "stratum/testing/fake_clock.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using testing::FakeClock;
using ::testing::HasSubstr;

const CoordinatorClaimant kFirst = {.incarnation = 11,
                                    .secret = "secret-a",
                                    .who = "first",
                                    .address = "a:1",
                                    .host = "host-a",
                                    .peer = "10.0.0.1"};
const CoordinatorClaimant kSecond = {.incarnation = 22,
                                     .secret = "secret-b",
                                     .who = "second",
                                     .address = "b:2",
                                     .host = "host-b",
                                     .peer = "10.0.0.2"};

CoordinatorCredential Of(const CoordinatorClaimant& claimant) {
  return {claimant.incarnation, claimant.secret};
}

// A FakeClock that remembers the latest time a reader has seen, so that WhileTimeMoves
// moves the time on only once the waiting call has looked at it: the call sees every step,
// however the threads are scheduled.
// (FakeClock's wait reads the time through Now(), so each look it takes is seen too.)
class SteppedClock final : public FakeClock {
 public:
  absl::Time Now() const override {
    const absl::Time now = FakeClock::Now();
    absl::MutexLock lock(&mutex_);
    seen_ = std::max(seen_, now);
    return now;
  }

  // Runs `call` (a claim that waits) on a thread while the time moves on in `step`s, with
  // `each_step` (a holder's heartbeat, or nothing) before each; its status. After each step
  // it waits (up to 10 s) until the call has read the new time or returned.
  absl::Status WhileTimeMoves(const std::function<absl::Status()>& call, absl::Duration step,
                              const std::function<void()>& each_step) {
    {
      absl::MutexLock lock(&mutex_);
      returned_ = false;
    }
    absl::Status status;
    std::thread caller([&] {
      status = call();
      absl::MutexLock lock(&mutex_);
      returned_ = true;
    });
    while (!returned()) {
      if (each_step) each_step();
      Advance(step);
      const absl::Time now = FakeClock::Now();
      absl::MutexLock lock(&mutex_);
      auto looked = [this, now]()
                        ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return returned_ || seen_ >= now; };
      EXPECT_TRUE(mutex_.AwaitWithTimeout(absl::Condition(&looked), absl::Seconds(10)))
          << "the waiting call did not look at the time within 10 s";
    }
    caller.join();
    return status;
  }

 private:
  bool returned() const {
    absl::MutexLock lock(&mutex_);
    return returned_;
  }

  mutable absl::Mutex mutex_;
  mutable absl::Time seen_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  bool returned_ ABSL_GUARDED_BY(mutex_) = false;
};

TEST(CoordinatorLeaseTest, ASecondCoordinatorIsRefusedWhileTheHolderIsHeardFrom) {
  SteppedClock clock;
  CoordinatorLease lease(absl::Milliseconds(300), {}, clock);
  ASSERT_OK(lease.Claim(kFirst));
  clock.Advance(absl::Milliseconds(401));  // the holder is still within its lease
  ASSERT_OK(lease.Heartbeat(Of(kFirst)));
  clock.Advance(absl::Milliseconds(299));
  const absl::Status refused = lease.Claim(kSecond);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(std::string("this parameter server ") + kHeldByAnotherCoordinator +
                        " (first), heard from 299ms ago"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("stop that one first"));
  // Nor may it change the variables or heartbeat meanwhile; an anonymous caller neither.
  EXPECT_FALSE(lease.Heartbeat(Of(kSecond)).ok());
  EXPECT_FALSE(lease.Heartbeat({}).ok());
  // The holder's heartbeats keep it through a wait longer than the lease.
  EXPECT_FALSE(clock
                   .WhileTimeMoves([&] { return lease.Claim(kSecond, absl::Milliseconds(600)); },
                                   absl::Milliseconds(100),
                                   [&] { EXPECT_OK(lease.Heartbeat(Of(kFirst))); })
                   .ok());
}

TEST(CoordinatorLeaseTest, ASilentHolderLosesThePsAndIsRefusedWhenItComesBack) {
  SteppedClock clock;
  CoordinatorLease lease(absl::Milliseconds(200), {}, clock);
  // Heartbeats do not claim: a PS nobody holds answers them, and stays free.
  EXPECT_OK(lease.Heartbeat(Of(kSecond)));
  ASSERT_OK(lease.Claim(kFirst));
  clock.Advance(absl::Milliseconds(200));
  EXPECT_FALSE(lease.Claim(kSecond).ok());  // heard from just within the lease
  // Once the holder is silent for longer, a claim that waits gets the PS.
  const absl::Time start = clock.Now();
  EXPECT_OK(clock.WhileTimeMoves([&] { return lease.Claim(kSecond, absl::Seconds(5)); },
                                 absl::Milliseconds(10), nullptr));
  EXPECT_LT(clock.Now() - start, absl::Seconds(5));
  EXPECT_TRUE(lease.Release(Of(kSecond)));
  for (const absl::Status& back : {lease.Heartbeat(Of(kFirst)), lease.Claim(kFirst)}) {
    EXPECT_THAT(std::string(back.message()),
                HasSubstr("second took it over after this coordinator was silent for "));
  }
  EXPECT_FALSE(lease.Release(Of(kFirst)));
}

TEST(CoordinatorLeaseTest, AReleaseOrARestartOnTheHoldersAddressHandsItOverAtOnce) {
  CoordinatorLease lease(absl::Seconds(60));
  ASSERT_OK(lease.Claim(kFirst));
  EXPECT_FALSE(lease.Release(Of(kSecond)));  // not the holder's: nothing changes
  EXPECT_FALSE(lease.Claim(kSecond).ok());
  EXPECT_TRUE(lease.Release(Of(kFirst)));
  EXPECT_OK(lease.Claim(kSecond));
  // The same address on another host is another coordinator, not a restart.
  EXPECT_FALSE(lease
                   .Claim({.incarnation = 33,
                           .secret = "secret-c",
                           .who = "elsewhere",
                           .address = "b:2",
                           .host = "host-c"})
                   .ok());
  EXPECT_TRUE(lease
                  .Claim({.incarnation = 44,
                          .secret = "secret-d",
                          .who = "second, restarted",
                          .address = "b:2",
                          .host = "host-b",
                          .peer = "10.0.0.2"})
                  .ok());
  EXPECT_THAT(std::string(lease.Heartbeat(Of(kSecond)).message()),
              HasSubstr("second, restarted took it over: it serves on this coordinator's address "
                        "on the same host and calls from the same network address"));
}

// Address and host are public (every TF_CONFIG names them): a claim that names the
// holder's but calls from another network address is not taken for the holder restarted.
// It waits out the lease like any other, so it cannot take over while the holder lives.
TEST(CoordinatorLeaseTest, ARestartFromAnotherNetworkAddressWaitsOutTheLease) {
  SteppedClock clock;
  CoordinatorLease lease(absl::Milliseconds(300), {}, clock);
  ASSERT_OK(lease.Claim(kFirst));
  CoordinatorClaimant forger = kFirst;
  forger.incarnation = 99;
  forger.secret = "secret-of-the-forger";
  forger.who = "forger";
  forger.peer = "10.0.0.66";
  const absl::Status refused =
      clock.WhileTimeMoves([&] { return lease.Claim(forger, absl::Milliseconds(700)); },
                           absl::Milliseconds(50), [&] { EXPECT_OK(lease.Heartbeat(Of(kFirst))); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("held by another coordinator (first)"));
  EXPECT_OK(lease.Heartbeat(Of(kFirst)));
  // Unknown is not the same: a claimant whose address cannot be told waits too.
  forger.peer = "";
  EXPECT_FALSE(lease.Claim(forger).ok());
  // A holder restarted on a new network address (a pod rescheduled) still takes over,
  // once the old process has been silent for the lease.
  forger.peer = "10.0.0.7";
  forger.who = "first, rescheduled";
  EXPECT_OK(clock.WhileTimeMoves([&] { return lease.Claim(forger, absl::Seconds(5)); },
                                 absl::Milliseconds(50), nullptr));
  EXPECT_THAT(std::string(lease.Heartbeat(Of(kFirst)).message()),
              HasSubstr("first, rescheduled took it over after this coordinator was silent"));
}

// The holder's incarnation is public (status calls report it); without the holder's secret
// a call that names it is refused, whatever it asks, and the holder keeps the PS.
TEST(CoordinatorLeaseTest, TheHoldersIncarnationWithoutItsSecretIsRefused) {
  CoordinatorLease lease(absl::Seconds(60));
  ASSERT_TRUE(lease
                  .Claim({.incarnation = 11,
                          .secret = "secret-a",
                          .who = "first",
                          .address = "a:1",
                          .host = "host-a",
                          .checkpoint_dir = "/ckpt"})
                  .ok());
  for (const std::string& wrong :
       {std::string(), std::string("secret-b"), std::string("secret-")}) {
    const CoordinatorCredential forged{11, wrong};
    const absl::Status refused = lease.Heartbeat(forged);
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
    EXPECT_THAT(std::string(refused.message()),
                HasSubstr("names the incarnation of the coordinator that holds it (first) "
                          "without that coordinator's secret"));
    EXPECT_EQ(lease.HolderCheckpointDir(forged, "Save").status().code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_FALSE(lease.Release(forged));
    EXPECT_EQ(lease.Claim({.incarnation = 11, .secret = wrong, .who = "forger"}).code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_OK(lease.Heartbeat(Of(kFirst)));
  const absl::StatusOr<std::string> folder = lease.HolderCheckpointDir(Of(kFirst), "Save");
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(*folder, "/ckpt");
}

// Files are the holder's alone: no holder, another holder, or a holder that declared no
// checkpoint folder, and Save and Restore are refused.
// A claim must carry a secret: an empty one would be matched by every caller that
// presents none, so the holder's calls could be made by anyone who read its incarnation.
TEST(CoordinatorLeaseTest, AClaimWithoutASecretIsRefused) {
  CoordinatorLease lease(absl::Milliseconds(300));
  CoordinatorClaimant anonymous = kFirst;
  anonymous.secret.clear();
  const absl::Status refused = lease.Claim(anonymous);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("carries no coordinator secret"));
  // Nothing was taken: a real coordinator claims it at once, and the empty secret is not its.
  ASSERT_OK(lease.Claim(kSecond));
  EXPECT_EQ(lease.Heartbeat({kSecond.incarnation, ""}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_OK(lease.Heartbeat(Of(kSecond)));
}

TEST(CoordinatorLeaseTest, OnlyTheHolderWithACheckpointFolderGetsOne) {
  CoordinatorLease lease(absl::Seconds(60));
  const absl::StatusOr<std::string> nobody = lease.HolderCheckpointDir(Of(kSecond), "Save");
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(nobody.status().message()),
              HasSubstr("Save is refused: only the coordinator that holds this parameter server "
                        "may ask for it, and no coordinator holds it"));
  ASSERT_OK(lease.Claim(kFirst));
  EXPECT_THAT(std::string(lease.HolderCheckpointDir(Of(kSecond), "Restore").status().message()),
              HasSubstr("is held by another coordinator"));
  EXPECT_THAT(std::string(lease.HolderCheckpointDir(Of(kFirst), "Save").status().message()),
              HasSubstr("declared no checkpoint folder"));
}

}  // namespace
}  // namespace stratum
