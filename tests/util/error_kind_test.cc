// ErrorKind: what a failure is travels with it, through wrapping and across the gRPC edge,
// whatever its words.
#include "stratum/util/error_kind.h"

#include <gtest/gtest.h>

#include "stratum/net/status.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

TEST(ErrorKindTest, AKindAndItsTaskRideInTheStatus) {
  const absl::Status failed = WithErrorKind(absl::InternalError("worker:2 failed: out of memory"),
                                            ErrorKind::kTaskFailed, "worker:2", "out of memory");
  EXPECT_EQ(ErrorKindOf(failed), ErrorKind::kTaskFailed);
  EXPECT_EQ(ErrorTaskOf(failed), "worker:2");
  EXPECT_EQ(ErrorCauseOf(failed), "out of memory");
  EXPECT_TRUE(IsErrorKind(failed, ErrorKind::kTaskFailed));
  EXPECT_FALSE(IsErrorKind(failed, ErrorKind::kNotSetUp));
  // Words alone are no kind; OK has none.
  EXPECT_EQ(ErrorKindOf(absl::FailedPreconditionError("not set up")), ErrorKind::kUnspecified);
  EXPECT_OK(WithErrorKind(absl::OkStatus(), ErrorKind::kNotSetUp));
  EXPECT_FALSE(IsErrorKind(absl::OkStatus(), ErrorKind::kUnspecified));
}

TEST(ErrorKindTest, RewrappingKeepsTheKind) {
  const absl::Status lost =
      WithErrorKind(absl::FailedPreconditionError("ps:0 lost it"), ErrorKind::kPsLostItsVariables);
  const absl::Status wrapped = Rewrapped(lost, "closure \"train_step\" on worker:0: ps:0 lost it");
  EXPECT_EQ(wrapped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(wrapped.message(), "closure \"train_step\" on worker:0: ps:0 lost it");
  EXPECT_EQ(ErrorKindOf(wrapped), ErrorKind::kPsLostItsVariables);
  EXPECT_EQ(Rewrapped(lost, absl::StatusCode::kUnavailable, "x").code(),
            absl::StatusCode::kUnavailable);
}

TEST(ErrorKindTest, TheKindCrossesTheGrpcEdge) {
  const absl::Status held = WithErrorKind(absl::FailedPreconditionError("held"),
                                          ErrorKind::kHeldByAnotherCoordinator, "chief:0");
  const grpc::Status sent = ToGrpcStatus(held);
  EXPECT_EQ(sent.error_message(), "held");
  const absl::Status received = FromGrpcStatus(sent, "worker:1 at h:1");
  EXPECT_EQ(received.message(), "worker:1 at h:1: held");
  EXPECT_EQ(ErrorKindOf(received), ErrorKind::kHeldByAnotherCoordinator);
  EXPECT_EQ(ErrorTaskOf(received), "chief:0");
  // A status without a kind, or error details that are not ours, give none.
  EXPECT_EQ(ErrorKindOf(FromGrpcStatus(ToGrpcStatus(absl::NotFoundError("x")), "p")),
            ErrorKind::kUnspecified);
  EXPECT_EQ(ErrorKindOf(FromGrpcStatus(
                grpc::Status(grpc::StatusCode::NOT_FOUND, "x", "\xff\xff not a proto"), "p")),
            ErrorKind::kUnspecified);
}

}  // namespace
}  // namespace stratum
