#include "stratum/net/host_port.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

}  // namespace stratum
