// gMock matchers and assertions for absl::Status, shared by the tests. A test that fails
// on a status says which status, not only "Value of: x.ok(), Actual: false".
#pragma once

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stratum::testing {

// StatusIs(code, message_matcher): the status has `code` and its message matches.
MATCHER_P2(StatusIs, code, message, "") {
  const absl::Status& status = arg;
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::ExplainMatchResult(message, std::string(status.message()), result_listener);
}

// For EXPECT_OK / ASSERT_OK: success, or a failure that prints the status.
inline ::testing::AssertionResult IsOk(const absl::Status& status) {
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << status;
}

template <typename T>
::testing::AssertionResult IsOk(const absl::StatusOr<T>& status_or) {
  return IsOk(status_or.status());
}

// A grpc::Status (a service called directly).
template <typename GrpcStatus>
requires requires(const GrpcStatus& status) { status.error_message(); }
::testing::AssertionResult IsOk(const GrpcStatus& status) {
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "gRPC status " << static_cast<int>(status.error_code())
                                       << ": " << status.error_message();
}

}  // namespace stratum::testing

// EXPECT_OK(x) / ASSERT_OK(x) for an absl::Status or absl::StatusOr<T>.
#define EXPECT_OK(expression) EXPECT_TRUE(::stratum::testing::IsOk(expression))
#define ASSERT_OK(expression) ASSERT_TRUE(::stratum::testing::IsOk(expression))
