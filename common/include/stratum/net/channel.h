// gRPC channels and server addresses with the settings every Stratum process shares.
// Thread-safe (channels are).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"
#include "stratum/net/tls.h"

namespace stratum {

struct ChannelOptions {
  // gRPC's default reconnect back-off grows to 120 s, so a peer that starts late (a pod
  // still pulling its image) would be noticed minutes after it came up. Stratum retries
  // connections quickly instead; these bound the back-off.
  int initial_reconnect_backoff_ms = 100;
  int max_reconnect_backoff_ms = 1000;
  // gRPC also uses its "min reconnect back-off" as the deadline of one connection attempt
  // (TCP connect plus the HTTP/2 handshake): it must not be short, or a busy peer's
  // handshake is cut off again and again.
  int connect_timeout_ms = 5000;
  // Explicit message limits (gRPC's default receive limit is 4 MiB).
  int max_message_bytes = 256 * 1024 * 1024;
  // Keepalive pings while calls are in flight. A peer cut off by the network sends no
  // reset, so without them a call waits out its whole deadline (minutes, for a training
  // closure); with them the connection is declared dead, and its calls fail UNAVAILABLE,
  // within about keepalive_time_ms + keepalive_timeout_ms. Task servers accept pings
  // down to kMinKeepaliveTimeMs apart.
  int keepalive_time_ms = 2000;
  int keepalive_timeout_ms = 5000;
  // Mutual TLS with the cluster's certificates; plaintext when empty. Every client a
  // binary creates takes the options its main built (TaskContext::channel_options()).
  std::optional<TlsCredentials> tls = std::nullopt;
};

// The shortest interval between keepalive pings a task server accepts (gRPC's default,
// 5 minutes, would answer Stratum's clients with "too many pings" and close the connection).
inline constexpr int kMinKeepaliveTimeMs = 1000;

// A channel to "host:port": plaintext, or mutual TLS when `options.tls` is set.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelOptions& options = {});

// The address a server for the cluster address `address` listens on: the address itself
// when its host is an IP literal or "localhost" (so tests stay on loopback), else all
// interfaces on its port, as TensorFlow does (a pod's DNS name is not an interface).
absl::StatusOr<std::string> ListenAddressFor(const std::string& address);

}  // namespace stratum
