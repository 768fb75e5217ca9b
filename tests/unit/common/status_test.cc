#include "common/status.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

absl::Status Fail(absl::StatusCode code) { return absl::Status(code, "disk on fire"); }

absl::StatusOr<int> Number(bool ok) {
  if (!ok) return absl::NotFoundError("no number");
  return 42;
}

absl::Status ReturnIfError(absl::Status inner, bool* reached_end) {
  TY_RETURN_IF_ERROR(inner);
  *reached_end = true;
  return absl::OkStatus();
}

absl::Status ReturnIfErrorOnStatusOr(bool ok, bool* reached_end) {
  TY_RETURN_IF_ERROR(Number(ok));
  *reached_end = true;
  return absl::OkStatus();
}

absl::Status ReturnIfErrorWith(absl::Status inner, int shard) {
  TY_RETURN_IF_ERROR_WITH(inner, absl::StrCat("writing shard ", shard));
  return absl::OkStatus();
}

absl::StatusOr<int> AssignOrReturn(bool ok) {
  TY_ASSIGN_OR_RETURN(int value, Number(ok));
  TY_ASSIGN_OR_RETURN(auto twice, absl::StatusOr<int>(value * 2));
  return twice + 1;
}

absl::StatusOr<std::string> AssignOrReturnWith(bool ok) {
  std::string context = "loading spec";
  TY_ASSIGN_OR_RETURN_WITH(int value, Number(ok), context);
  return absl::StrCat("value=", value);
}

absl::StatusOr<int> AssignMoveOnly(bool ok) {
  std::unique_ptr<int> held;
  auto make = [ok]() -> absl::StatusOr<std::unique_ptr<int>> {
    if (!ok) return absl::InternalError("no memory");
    return std::make_unique<int>(7);
  };
  TY_ASSIGN_OR_RETURN(held, make());
  return *held;
}

TEST(StatusMacrosTest, ReturnIfErrorPassesErrorsThroughUnchanged) {
  bool reached = false;
  absl::Status s = ReturnIfError(Fail(absl::StatusCode::kUnavailable), &reached);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "disk on fire");
  EXPECT_FALSE(reached);
  EXPECT_TRUE(ReturnIfError(absl::OkStatus(), &reached).ok());
  EXPECT_TRUE(reached);
}

TEST(StatusMacrosTest, ReturnIfErrorAcceptsStatusOr) {
  bool reached = false;
  absl::Status s = ReturnIfErrorOnStatusOr(false, &reached);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(reached);
  EXPECT_TRUE(ReturnIfErrorOnStatusOr(true, &reached).ok());
  EXPECT_TRUE(reached);
}

TEST(StatusMacrosTest, WithPrefixesContextAndKeepsCode) {
  absl::Status s = ReturnIfErrorWith(Fail(absl::StatusCode::kResourceExhausted), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "writing shard 3: disk on fire");
  EXPECT_TRUE(ReturnIfErrorWith(absl::OkStatus(), 3).ok());
}

TEST(StatusMacrosTest, AssignOrReturnAssignsValueOrReturnsError) {
  absl::StatusOr<int> good = AssignOrReturn(true);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, 85);
  absl::StatusOr<int> bad = AssignOrReturn(false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bad.status().message(), "no number");
}

TEST(StatusMacrosTest, AssignOrReturnWithAnnotates) {
  absl::StatusOr<std::string> good = AssignOrReturnWith(true);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, "value=42");
  absl::StatusOr<std::string> bad = AssignOrReturnWith(false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bad.status().message(), "loading spec: no number");
}

TEST(StatusMacrosTest, AssignOrReturnMovesIntoExistingVariable) {
  absl::StatusOr<int> good = AssignMoveOnly(true);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 7);
  EXPECT_EQ(AssignMoveOnly(false).status().code(), absl::StatusCode::kInternal);
}

TEST(AnnotateTest, KeepsOkAndPayloads) {
  EXPECT_TRUE(Annotate(absl::OkStatus(), "context").ok());
  absl::Status s = absl::DataLossError("bad checksum");
  s.SetPayload("type.trainyard/shard", absl::Cord("7"));
  absl::Status annotated = Annotate(s, "checkpoint 12");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(annotated.message(), "checkpoint 12: bad checksum");
  ASSERT_TRUE(annotated.GetPayload("type.trainyard/shard").has_value());
  EXPECT_EQ(*annotated.GetPayload("type.trainyard/shard"), "7");
  EXPECT_EQ(Annotate(s, "").message(), "bad checksum");
}

TEST(ExitCodeTest, MapsCodesByWhatTheUserShouldDo) {
  EXPECT_EQ(ExitCodeForStatus(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCodeForStatus(absl::InvalidArgumentError("x")), 2);
  EXPECT_EQ(ExitCodeForStatus(absl::NotFoundError("x")), 2);
  EXPECT_EQ(ExitCodeForStatus(absl::FailedPreconditionError("x")), 2);
  EXPECT_EQ(ExitCodeForStatus(absl::OutOfRangeError("x")), 2);
  EXPECT_EQ(ExitCodeForStatus(absl::DeadlineExceededError("x")), 3);
  EXPECT_EQ(ExitCodeForStatus(absl::InternalError("x")), 1);
  EXPECT_EQ(ExitCodeForStatus(absl::UnavailableError("x")), 3);
  EXPECT_EQ(ExitCodeForStatus(absl::ResourceExhaustedError("x")), 2);
  EXPECT_EQ(ExitCodeForStatus(absl::AlreadyExistsError("x")), 2);
  EXPECT_EQ(ExitCodeForStatus(absl::PermissionDeniedError("x")), 2);
  EXPECT_EQ(ExitCodeForStatus(absl::UnauthenticatedError("x")), 2);
  // The way back (a launcher reading a child's exit code) lands in the same row.
  for (int code : {0, 1, 2, 3}) {
    EXPECT_EQ(ExitCodeForStatus(absl::Status(StatusCodeForExitCode(code), "x")), code) << code;
  }
}

}  // namespace
}  // namespace trainyard
