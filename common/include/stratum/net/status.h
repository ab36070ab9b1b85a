// absl::Status <-> grpc::Status, for service adapters and clients only (the logic
// underneath speaks absl::Status). The codes map one to one, and the payloads (the
// ErrorKind, stratum/util/error_kind.h) travel in the gRPC status's error details.
#pragma once

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace stratum {

grpc::Status ToGrpcStatus(const absl::Status& status);

namespace proto {
class StatusPayloads;
}
// A status's payloads into `payloads`, and back onto `status`: for statuses that travel
// in a message's fields rather than as an RPC's status.
void PayloadsToProto(const absl::Status& status, proto::StatusPayloads* payloads);
void PayloadsFromProto(const proto::StatusPayloads& payloads, absl::Status& status);

// `peer` ("ps:0 at 127.0.0.1:2222") is put in front of the message, so an error a user
// sees names the task it came from.
absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& peer);

}  // namespace stratum
