#include "common/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

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
      return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 2;
    case absl::StatusCode::kDeadlineExceeded:
      return 3;
    default:
      return 1;
  }
}

}  // namespace trainyard
