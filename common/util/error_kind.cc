#include "stratum/util/error_kind.h"

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace stratum {
namespace {

constexpr char kKindUrl[] = "type.stratum/stratum.ErrorKind";
constexpr char kTaskUrl[] = "type.stratum/stratum.ErrorTask";
constexpr char kCauseUrl[] = "type.stratum/stratum.ErrorCause";

std::string PayloadOf(const absl::Status& status, absl::string_view url) {
  const auto payload = status.GetPayload(url);
  return payload.has_value() ? std::string(*payload) : std::string();
}

}  // namespace

absl::Status WithErrorKind(absl::Status status, ErrorKind kind, absl::string_view task,
                           absl::string_view cause) {
  if (status.ok()) return status;
  status.SetPayload(kKindUrl, absl::Cord(std::to_string(static_cast<uint32_t>(kind))));
  if (!task.empty()) status.SetPayload(kTaskUrl, absl::Cord(task));
  if (!cause.empty()) status.SetPayload(kCauseUrl, absl::Cord(cause));
  return status;
}

ErrorKind ErrorKindOf(const absl::Status& status) {
  uint32_t kind = 0;
  if (!absl::SimpleAtoi(PayloadOf(status, kKindUrl), &kind)) return ErrorKind::kUnspecified;
  return static_cast<ErrorKind>(kind);
}

std::string ErrorTaskOf(const absl::Status& status) { return PayloadOf(status, kTaskUrl); }
std::string ErrorCauseOf(const absl::Status& status) { return PayloadOf(status, kCauseUrl); }

absl::Status Rewrapped(const absl::Status& from, absl::StatusCode code, absl::string_view message) {
  absl::Status status(code, message);
  from.ForEachPayload([&status](absl::string_view url, const absl::Cord& payload) {
    status.SetPayload(url, payload);
  });
  return status;
}

}  // namespace stratum
