#include "stratum/net/status.h"

#include "absl/strings/str_cat.h"
#include "proto/task.pb.h"

namespace stratum {

void PayloadsToProto(const absl::Status& status, proto::StatusPayloads* payloads) {
  status.ForEachPayload([payloads](absl::string_view url, const absl::Cord& payload) {
    (*payloads->mutable_payloads())[std::string(url)] = std::string(payload);
  });
}

void PayloadsFromProto(const proto::StatusPayloads& payloads, absl::Status& status) {
  if (status.ok()) return;
  for (const auto& [url, payload] : payloads.payloads())
    status.SetPayload(url, absl::Cord(payload));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  proto::StatusPayloads payloads;
  PayloadsToProto(status, &payloads);
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()),
                      payloads.payloads().empty() ? std::string() : payloads.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& peer) {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted(static_cast<absl::StatusCode>(status.error_code()),
                         absl::StrCat(peer, ": ", status.error_message()));
  proto::StatusPayloads payloads;
  if (!status.error_details().empty() && payloads.ParseFromString(status.error_details())) {
    PayloadsFromProto(payloads, converted);
  }
  return converted;
}

}  // namespace stratum
