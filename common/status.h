// Status conventions shared by every Trainyard module: one error type (absl::Status) end to end,
// propagated with the macros below and annotated with context on the way up.
//
//   TY_RETURN_IF_ERROR(expr);                    // expr is an absl::Status or absl::StatusOr<T>
//   TY_RETURN_IF_ERROR_WITH(expr, context);      // same, message becomes "context: message"
//   TY_ASSIGN_OR_RETURN(auto value, expr);       // expr is an absl::StatusOr<T>
//   TY_ASSIGN_OR_RETURN_WITH(value, expr, context);
//
// `context` is evaluated only on error and may be anything convertible to std::string_view
// (a literal, a std::string, an absl::StrCat(...) result). The status code is always kept.
// Macro arguments that contain top-level commas must be wrapped in parentheses.
#ifndef TRAINYARD_COMMON_STATUS_H_
#define TRAINYARD_COMMON_STATUS_H_

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// Returns `status` with its message prefixed by "context: ", keeping the code and any payloads.
// An OK status is returned unchanged; an empty context leaves the message as it is.
[[nodiscard]] absl::Status Annotate(const absl::Status& status, std::string_view context);
// The same for the other string types (absl::string_view is not std::string_view in every Abseil
// build, and neither converts to the other).
#if !ABSL_USES_STD_STRING_VIEW
[[nodiscard]] absl::Status Annotate(const absl::Status& status, absl::string_view context);
#endif
[[nodiscard]] absl::Status Annotate(const absl::Status& status, const char* context);
[[nodiscard]] absl::Status Annotate(const absl::Status& status, const std::string& context);

// The one conversion of an errno value: "context: <strerror>" with the code errno implies
// (absl::ErrnoToStatus: ENOENT NOT_FOUND, EACCES PERMISSION_DENIED, ...), except that EIO is
// DATA_LOSS (after a failed write or fsync the kernel may have dropped the data: retrying the
// same call is wrong).
[[nodiscard]] absl::Status ErrnoStatus(int error, const std::string& context);
// The same message as UNAVAILABLE whatever the errno: for calls that fail because of the machine
// (fork, pipe, a temporary directory), which must not read as the job's input being at fault
// (ENOENT would be NOT_FOUND, exit code 2) or as the job not fitting (ENOMEM would be
// RESOURCE_EXHAUSTED).
[[nodiscard]] absl::Status ErrnoEnvironmentError(int error, const std::string& context);

// The one table from a status to a process exit code (common/exit_codes.h), for every program of
// the project — worker, agent, server and CLI alike:
//   0  OK;
//   2  the caller's input is at fault and retrying will not help (INVALID_ARGUMENT, NOT_FOUND,
//      FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS, RESOURCE_EXHAUSTED, PERMISSION_DENIED,
//      UNAUTHENTICATED) — fix the spec, file, flags or credentials;
//   3  DEADLINE_EXCEEDED or UNAVAILABLE — a peer, the coordinator or the machine did not answer
//      in time; the same call may succeed later;
//   1  anything else (an internal failure).
int ExitCodeForStatus(const absl::Status& status);
// The other way, for a launcher that turns a child's exit code back into a status: 0 OK, 2
// INVALID_ARGUMENT, 3 DEADLINE_EXCEEDED, 5 RESOURCE_EXHAUSTED, anything else INTERNAL.
absl::StatusCode StatusCodeForExitCode(int exit_code);

namespace status_internal {

inline const absl::Status& AsStatus(const absl::Status& status) { return status; }

template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace status_internal
}  // namespace trainyard

#define TY_STATUS_CONCAT_INNER_(a, b) a##b
#define TY_STATUS_CONCAT_(a, b) TY_STATUS_CONCAT_INNER_(a, b)

#define TY_RETURN_IF_ERROR(expr)                                                    \
  do {                                                                              \
    const ::absl::Status ty_status_ = ::trainyard::status_internal::AsStatus(expr); \
    if (!ty_status_.ok()) return ty_status_;                                        \
  } while (false)

#define TY_RETURN_IF_ERROR_WITH(expr, context)                                      \
  do {                                                                              \
    const ::absl::Status ty_status_ = ::trainyard::status_internal::AsStatus(expr); \
    if (!ty_status_.ok()) return ::trainyard::Annotate(ty_status_, (context));      \
  } while (false)

#define TY_ASSIGN_OR_RETURN(lhs, expr) \
  TY_ASSIGN_OR_RETURN_IMPL_(TY_STATUS_CONCAT_(ty_status_or_, __COUNTER__), lhs, expr)

#define TY_ASSIGN_OR_RETURN_IMPL_(status_or, lhs, expr)      \
  auto status_or = (expr);                                   \
  if (!status_or.ok()) return std::move(status_or).status(); \
  lhs = std::move(status_or).value()

#define TY_ASSIGN_OR_RETURN_WITH(lhs, expr, context) \
  TY_ASSIGN_OR_RETURN_WITH_IMPL_(TY_STATUS_CONCAT_(ty_status_or_, __COUNTER__), lhs, expr, context)

#define TY_ASSIGN_OR_RETURN_WITH_IMPL_(status_or, lhs, expr, context)               \
  auto status_or = (expr);                                                          \
  if (!status_or.ok()) return ::trainyard::Annotate(status_or.status(), (context)); \
  lhs = std::move(status_or).value()

#endif  // TRAINYARD_COMMON_STATUS_H_
