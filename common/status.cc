#include "common/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"

namespace trainyard {

absl::Status ErrnoStatus(int error, const std::string& context) {
  if (error == EIO) return absl::DataLossError(absl::StrCat(context, ": Input/output error"));
  return absl::ErrnoToStatus(error, context);
}

absl::Status ErrnoEnvironmentError(int error, const std::string& context) {
  return absl::UnavailableError(absl::StrCat(context, ": ", std::strerror(error)));
}

absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok() || context.empty()) return status;
  absl::Status annotated(
      status.code(),
      absl::StrCat(absl::string_view(context.data(), context.size()), ": ", status.message()));
  status.ForEachPayload([&annotated](absl::string_view type_url, const absl::Cord& payload) {
    annotated.SetPayload(type_url, payload);
  });
  return annotated;
}

#if !ABSL_USES_STD_STRING_VIEW
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return Annotate(status, std::string_view(context.data(), context.size()));
}
#endif

absl::Status Annotate(const absl::Status& status, const char* context) {
  return Annotate(status, std::string_view(context));
}

absl::Status Annotate(const absl::Status& status, const std::string& context) {
  return Annotate(status, std::string_view(context));
}

int ExitCodeForStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return kExitUserError;
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnavailable:
      return kExitUnavailable;
    default:
      return kExitInternalError;
  }
}

absl::StatusCode StatusCodeForExitCode(int exit_code) {
  switch (exit_code) {
    case kExitOk:
      return absl::StatusCode::kOk;
    case kExitUserError:
      return absl::StatusCode::kInvalidArgument;
    case kExitUnavailable:
      return absl::StatusCode::kDeadlineExceeded;
    case kExitOutOfMemory:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace trainyard
