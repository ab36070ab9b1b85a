#include "stratum/net/host_port.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace stratum {

HostPort SplitHostPort(absl::string_view address) {
  HostPort split;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close != absl::string_view::npos) {
      split.host = std::string(address.substr(1, close - 1));
      if (close + 1 < address.size() && address[close + 1] == ':') {
        split.port = std::string(address.substr(close + 2));
      }
      return split;
    }
  }
  const size_t colon = address.rfind(':');
  // No port, or a bare IPv6 address ("::1"), whose colons are all its own.
  if (colon == absl::string_view::npos || address.find(':') != colon) {
    split.host = std::string(address);
    return split;
  }
  split.host = std::string(address.substr(0, colon));
  split.port = std::string(address.substr(colon + 1));
  return split;
}

std::string HostOf(absl::string_view address) { return SplitHostPort(address).host; }

std::string JoinHostPort(absl::string_view host, absl::string_view port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::string WithPort(absl::string_view address, absl::string_view port) {
  return JoinHostPort(SplitHostPort(address).host, port);
}

namespace {

// gRPC writes peers as URIs: "ipv6:%5B::1%5D:5312".
std::string PercentDecoded(absl::string_view text) {
  std::string decoded;
  decoded.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    int value = 0;
    if (text[i] == '%' && i + 2 < text.size() &&
        absl::SimpleHexAtoi(text.substr(i + 1, 2), &value)) {
      decoded.push_back(static_cast<char>(value));
      i += 2;
    } else {
      decoded.push_back(text[i]);
    }
  }
  return decoded;
}

}  // namespace

std::string PeerHostOf(absl::string_view grpc_peer) {
  if (absl::StartsWith(grpc_peer, "unix")) return "local";
  const std::string decoded = PercentDecoded(grpc_peer);
  absl::string_view address = decoded;
  if (absl::ConsumePrefix(&address, "ipv4:") || absl::ConsumePrefix(&address, "ipv6:")) {
    std::string host = HostOf(address);
    // A dual-stack listener sees IPv4 callers as ::ffff:a.b.c.d.
    absl::string_view v4 = host;
    if (absl::ConsumePrefix(&v4, "::ffff:") && !absl::StrContains(v4, ':')) return std::string(v4);
    return host;
  }
  return std::string(grpc_peer);
}

}  // namespace stratum
