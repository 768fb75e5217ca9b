#include "server/types.h"

#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainyard::server {

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kStarting:
      return "STARTING";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kRestarting:
      return "RESTARTING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
    case JobState::kDrained:
      return "DRAINED";
  }
  return "UNKNOWN";
}

const char* CheckpointStateName(CheckpointState state) {
  switch (state) {
    case CheckpointState::kCommitted:
      return "COMMITTED";
    case CheckpointState::kFailed:
      return "FAILED";
    case CheckpointState::kSkipped:
      return "SKIPPED";
  }
  return "UNKNOWN";
}

const char* AttemptStateName(AttemptState state) {
  switch (state) {
    case AttemptState::kStarting:
      return "STARTING";
    case AttemptState::kRunning:
      return "RUNNING";
    case AttemptState::kStopping:
      return "STOPPING";
    case AttemptState::kSucceeded:
      return "SUCCEEDED";
    case AttemptState::kFailed:
      return "FAILED";
    case AttemptState::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

bool IsFinal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled || state == JobState::kDrained;
}

int64_t SmallestGpuMemory(const NodeRecord& node) {
  int64_t smallest = 0;
  for (const GpuInfo& gpu : node.gpus) {
    if (gpu.memory_bytes > 0 && (smallest == 0 || gpu.memory_bytes < smallest)) {
      smallest = gpu.memory_bytes;
    }
  }
  return smallest;
}

bool AllRanksExited(const AttemptRecord& attempt) {
  for (const RankSlot& slot : attempt.ranks) {
    if (!slot.exit.has_value()) return false;
  }
  return true;
}

bool IsFinal(AttemptState state) {
  return state == AttemptState::kSucceeded || state == AttemptState::kFailed ||
         state == AttemptState::kCancelled;
}

absl::StatusOr<JobState> JobStateFromInt(int64_t value) {
  if (value < 1 || value > kLastJobState) {
    return absl::InternalError(absl::StrCat("bad job state ", value));
  }
  return static_cast<JobState>(value);
}

absl::StatusOr<AttemptState> AttemptStateFromInt(int64_t value) {
  if (value < 1 || value > 6) {
    return absl::InternalError(absl::StrCat("bad attempt state ", value));
  }
  return static_cast<AttemptState>(value);
}

absl::StatusOr<CheckpointState> CheckpointStateFromInt(int64_t value) {
  if (value < 1 || value > 3) {
    return absl::InternalError(absl::StrCat("bad checkpoint state ", value));
  }
  return static_cast<CheckpointState>(value);
}

std::string JobIdForSeq(int64_t seq) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "j-%06lld", static_cast<long long>(seq));
  return buffer;
}

std::string RequestCause(const std::string& what, const std::string& anonymous,
                         const std::string& user, const std::string& reason) {
  if (user.empty()) return reason.empty() ? anonymous : reason;
  return absl::StrCat(what, " by ", user, reason.empty() ? "" : ": ", reason);
}

}  // namespace trainyard::server
