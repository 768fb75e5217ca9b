#include "common/logging.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainyard {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

struct LogState {
  absl::Mutex mu;
  std::string prefix ABSL_GUARDED_BY(mu);
};

LogState& State() {
  static LogState* state = new LogState;
  return *state;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
  }
  return '?';
}

absl::string_view Basename(const char* path) {
  absl::string_view p(path);
  size_t slash = p.rfind('/');
  return slash == absl::string_view::npos ? p : p.substr(slash + 1);
}

// Keeps one message on one line: drops trailing newlines, escapes inner ones.
void AppendOneLine(std::string_view text, std::string* out) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  for (char c : text) {
    if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else {
      out->push_back(c);
    }
  }
}

void WriteAll(const std::string& line) {
  size_t written = 0;
  while (written < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone; there is nowhere left to report it
    written += static_cast<size_t>(n);
  }
}

void WriteLine(LogLevel level, const char* file, int line_number, std::string_view text) {
  std::string line;
  line.push_back(LevelLetter(level));
  absl::StrAppend(&line, absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone()),
                  " ", static_cast<long>(::syscall(SYS_gettid)), " ");
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  absl::StrAppend(&line, state.prefix, Basename(file), ":", line_number, "] ");
  AppendOneLine(text, &line);
  line.push_back('\n');
  WriteAll(line);
}

}  // namespace

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }

LogLevel MinLogLevel() { return static_cast<LogLevel>(g_min_level.load()); }

absl::StatusOr<LogLevel> ParseLogLevel(std::string_view name) {
  const absl::string_view text(name.data(), name.size());
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", text, "' (expected debug, info, warning or error)"));
}

void SetLogContext(std::string job, int rank) {
  std::string prefix;
  if (!job.empty() && rank >= 0) {
    prefix = absl::StrCat("[job=", job, " rank=", rank, "] ");
  } else if (!job.empty()) {
    prefix = absl::StrCat("[job=", job, "] ");
  } else if (rank >= 0) {
    prefix = absl::StrCat("[rank=", rank, "] ");
  }
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  state.prefix = std::move(prefix);
}

namespace logging_internal {

bool ShouldLog(LogLevel level) { return static_cast<int>(level) >= g_min_level.load(); }

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage::~LogMessage() { WriteLine(level_, file_, line_, stream_.str()); }

CheckFailure::CheckFailure(const char* condition, const char* file, int line)
    : file_(file), line_(line) {
  stream_ << "Check failed: " << condition << " ";
}

CheckFailure::~CheckFailure() {
  WriteLine(LogLevel::kError, file_, line_, stream_.str());
  std::abort();
}

}  // namespace logging_internal
}  // namespace trainyard
