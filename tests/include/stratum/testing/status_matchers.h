// gMock matchers for absl::Status, shared by the tests.
#pragma once

#include <string>

#include <gmock/gmock.h>

#include "absl/status/status.h"

namespace stratum::testing {

// StatusIs(code, message_matcher): the status has `code` and its message matches.
MATCHER_P2(StatusIs, code, message, "") {
  const absl::Status& status = arg;
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::ExplainMatchResult(message, std::string(status.message()), result_listener);
}

}  // namespace stratum::testing
