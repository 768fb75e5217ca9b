// Leveled logging to stderr, one line per message:
//
//   TY_LOG(INFO) << "step " << step << " loss " << loss;
//   TY_CHECK(offset <= size) << "offset " << offset;   // invariant; logs and aborts if false
//
// Each line reads
//   I2024-05-01T12:34:56.123456Z 4242 [job=tiny rank=0] trainer.cc:87] step 10 loss 3.2
// (level letter D/I/W/E, UTC time, thread id, the process-wide context, source location, text).
// Newlines inside the text are written as "\n" so that one message is always one line.
//
// Threading: every function here may be called from any thread. Lines from different threads
// never interleave (one mutex around the write). The arguments of a TY_LOG statement below the
// minimum level are not evaluated.
//
// TY_CHECK is for programmer errors only. Bad input and environmental failures are reported with
// absl::Status (see common/status.h), never with TY_CHECK.
#ifndef TRAINYARD_COMMON_LOGGING_H_
#define TRAINYARD_COMMON_LOGGING_H_

#include <sstream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace trainyard {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below `level` are dropped. The default is kInfo.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

// Parses "debug", "info", "warning" or "error" (any case), for command-line flags.
[[nodiscard]] absl::StatusOr<LogLevel> ParseLogLevel(std::string_view name);

// Sets the prefix every later line carries: "[job=<job> rank=<rank>]". An empty `job` or a
// negative `rank` leaves that part out; both absent means no prefix.
void SetLogContext(std::string job, int rank);

namespace logging_internal {

bool ShouldLog(LogLevel level);

// Collects one message and writes it when destroyed.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();

  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Logs "Check failed: <condition> <text>" at ERROR level whatever the minimum level, then aborts.
class CheckFailure {
 public:
  CheckFailure(const char* condition, const char* file, int line);
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure();

  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Gives a `cond ? (void)0 : Voidify() & stream` expression type void; `&` binds looser than `<<`.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace trainyard

#define TY_LOG_LEVEL_DEBUG_ ::trainyard::LogLevel::kDebug
#define TY_LOG_LEVEL_INFO_ ::trainyard::LogLevel::kInfo
#define TY_LOG_LEVEL_WARNING_ ::trainyard::LogLevel::kWarning
#define TY_LOG_LEVEL_ERROR_ ::trainyard::LogLevel::kError

#define TY_LOG(level)                                                                              \
  !::trainyard::logging_internal::ShouldLog(TY_LOG_LEVEL_##level##_)                               \
      ? (void)0                                                                                    \
      : ::trainyard::logging_internal::Voidify() &                                                 \
            ::trainyard::logging_internal::LogMessage(TY_LOG_LEVEL_##level##_, __FILE__, __LINE__) \
                .stream()

#define TY_CHECK(condition)                        \
  (condition)                                      \
      ? (void)0                                    \
      : ::trainyard::logging_internal::Voidify() & \
            ::trainyard::logging_internal::CheckFailure(#condition, __FILE__, __LINE__).stream()

#endif  // TRAINYARD_COMMON_LOGGING_H_
