// Splitting and joining "host:port" addresses as TF_CONFIG, --listen_address and gRPC write
// them: the port follows the last ':', and an IPv6 host is bracketed ("[::1]:2222"). The one
// place for it (it was spelled out in a dozen files, not all alike about brackets).
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace stratum {

struct HostPort {
  std::string host;  // without the brackets of an IPv6 address
  std::string port;  // the text after the last ':'; empty when there is none
};

// Splits `address` at its last ':'; an address without one is all host. The text is not
// checked (ValidateAddress does that).
HostPort SplitHostPort(absl::string_view address);

// The host of `address`, without brackets: "[::1]:2222" -> "::1".
std::string HostOf(absl::string_view address);

// "host:port", bracketing an IPv6 host that is not bracketed yet: ("::1", "22") -> "[::1]:22".
std::string JoinHostPort(absl::string_view host, absl::string_view port);

// `address` with its port replaced: ("[::]:2222", "8081") -> "[::]:8081".
std::string WithPort(absl::string_view address, absl::string_view port);

// Where a gRPC caller calls from (ServerContext::peer()), without the scheme and the port,
// to tell callers apart by address: "ipv4:10.0.0.2:5312" -> "10.0.0.2", "ipv6:[::1]:5312"
// -> "::1", an IPv4 address in IPv6 form ("ipv6:[::ffff:10.0.0.2]:5312") -> "10.0.0.2";
// a Unix-socket caller ("unix:...", "unix-abstract:...") -> "local"; "" -> "".
std::string PeerHostOf(absl::string_view grpc_peer);

}  // namespace stratum
