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

TEST(HostPortTest, APeersHostLosesItsSchemeAndPort) {
  EXPECT_EQ(PeerHostOf("ipv4:10.0.0.2:5312"), "10.0.0.2");
  EXPECT_EQ(PeerHostOf("ipv6:[::1]:5312"), "::1");
  // As ServerContext::peer() writes them: URIs, the brackets escaped.
  EXPECT_EQ(PeerHostOf("ipv6:%5B::1%5D:5312"), "::1");
  EXPECT_EQ(PeerHostOf("ipv6:%5Bfe80::1%25eth0%5D:80"), "fe80::1%eth0");
  // One caller is one address, however the listener's socket family shows it.
  EXPECT_EQ(PeerHostOf("ipv6:[::ffff:10.0.0.2]:5312"), "10.0.0.2");
  EXPECT_EQ(PeerHostOf("unix:/tmp/ps.sock"), "local");
  EXPECT_EQ(PeerHostOf("unix-abstract:stratum"), "local");
  EXPECT_EQ(PeerHostOf(""), "");
}

}  // namespace
}  // namespace stratum
