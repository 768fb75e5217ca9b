// The node agent's durable list of the workers it started, kept in its work directory so that an
// agent that restarts (alone, or inside the embedded server) finds its still-running workers and
// reports them to the coordinator instead of losing them.
//
// Format: a first line "trainyard-agent-workers 1", then one line per worker,
// "<job_id> <attempt_id> <rank> <pid> <start_ticks> <started_unix_ms>".
//
// Threading: plain functions and values.
#ifndef TRAINYARD_SERVER_AGENT_WORKER_RECORDS_H_
#define TRAINYARD_SERVER_AGENT_WORKER_RECORDS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/agent/process_launcher.h"

namespace trainyard::server::agent {

struct WorkerKey {
  std::string job_id;
  int attempt_id = 0;
  int rank = 0;

  auto operator<=>(const WorkerKey&) const = default;
};

struct WorkerRecord {
  WorkerKey key;
  ProcessId process;
  int64_t started_unix_ms = 0;
};

// True for ids that are safe as one path component: 1-128 of [A-Za-z0-9._-], not "." or "..".
bool IsSafeJobId(std::string_view job_id);

std::string SerializeWorkerRecords(const std::vector<WorkerRecord>& records);

// INVALID_ARGUMENT naming the line for a malformed file.
[[nodiscard]] absl::StatusOr<std::vector<WorkerRecord>> ParseWorkerRecords(std::string_view text);

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_WORKER_RECORDS_H_
