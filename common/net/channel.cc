#include "stratum/net/channel.h"

#include <arpa/inet.h>

#include <algorithm>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stratum/cluster/cluster_spec.h"
#include "stratum/net/host_port.h"

namespace stratum {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelOptions& options) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, options.connect_timeout_ms);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, options.initial_reconnect_backoff_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options.max_reconnect_backoff_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, std::max(options.keepalive_time_ms, kMinKeepaliveTimeMs));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  // A closure may run for a long time without a data frame: keep pinging through it.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (!options.tls) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  if (!options.tls->server_name.empty()) args.SetSslTargetNameOverride(options.tls->server_name);
  return grpc::CreateCustomChannel(address, MakeTlsChannelCredentials(*options.tls), args);
}

absl::StatusOr<std::string> ListenAddressFor(const std::string& address) {
  if (absl::Status status = ValidateAddress(address); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" is not valid because ", status.message()));
  }
  const HostPort split = SplitHostPort(address);
  if (split.host == "localhost" || absl::StrContains(split.host, ':')) return address;
  in_addr ipv4;
  if (inet_pton(AF_INET, split.host.c_str(), &ipv4) == 1) return address;
  return JoinHostPort("::", split.port);
}

}  // namespace stratum
