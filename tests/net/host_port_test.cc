// SplitHostPort and friends: the one reading of "host:port" (IPv6 hosts in brackets).
#include "stratum/net/host_port.h"

#include <gtest/gtest.h>

namespace stratum {
namespace {

TEST(HostPortTest, SplitsAtTheLastColonAndUnbracketsIpv6) {
  EXPECT_EQ(SplitHostPort("127.0.0.1:2222").host, "127.0.0.1");
  EXPECT_EQ(SplitHostPort("127.0.0.1:2222").port, "2222");
  EXPECT_EQ(SplitHostPort("[::1]:2222").host, "::1");
  EXPECT_EQ(SplitHostPort("[::1]:2222").port, "2222");
  EXPECT_EQ(SplitHostPort("worker-0.svc:29001").host, "worker-0.svc");
  EXPECT_EQ(SplitHostPort("[::]:0").host, "::");
}

TEST(HostPortTest, AnAddressWithoutAPortIsAllHost) {
  EXPECT_EQ(SplitHostPort("localhost").host, "localhost");
  EXPECT_EQ(SplitHostPort("localhost").port, "");
  EXPECT_EQ(SplitHostPort("::1").host, "::1");  // a bare IPv6 address has no port
  EXPECT_EQ(SplitHostPort("::1").port, "");
  EXPECT_EQ(SplitHostPort("[::1]").host, "::1");
  EXPECT_EQ(SplitHostPort("").host, "");
  EXPECT_EQ(SplitHostPort(":2222").host, "");
  EXPECT_EQ(SplitHostPort(":2222").port, "2222");
}

TEST(HostPortTest, JoinsBracketingIpv6OnceAndReplacesPorts) {
  EXPECT_EQ(JoinHostPort("127.0.0.1", "22"), "127.0.0.1:22");
  EXPECT_EQ(JoinHostPort("::1", "22"), "[::1]:22");
  EXPECT_EQ(JoinHostPort("[::1]", "22"), "[::1]:22");
  EXPECT_EQ(WithPort("[::]:2222", "8081"), "[::]:8081");
  EXPECT_EQ(WithPort("chief.svc:2222", "8081"), "chief.svc:8081");
  EXPECT_EQ(HostOf("[::1]:2222"), "::1");
}

}  // namespace
}  // namespace stratum
