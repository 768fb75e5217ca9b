// Reading the per-rank log files a node agent writes: tails for exit reports and `logs`, and
// ranges for streaming while a worker runs.
//
// Threading: plain functions; files may be appended to concurrently by the workers.
#ifndef TRAINYARD_SERVER_AGENT_LOG_FILES_H_
#define TRAINYARD_SERVER_AGENT_LOG_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard::server::agent {

// The last `count` lines of the file (without their newlines; a final line without one counts),
// looking at most at its last 64 KiB. A missing file is NOT_FOUND.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> LastLines(const std::string& path,
                                                                 int count);

// The offset where the last `count` lines of the file start (0 when it has fewer), looking at
// most at its last 1 MiB.
[[nodiscard]] absl::StatusOr<int64_t> OffsetOfLastLines(const std::string& path, int count);

// Up to `max_bytes` bytes of the file from `offset` ("" at or past the end).
[[nodiscard]] absl::StatusOr<std::string> ReadRange(const std::string& path, int64_t offset,
                                                    int64_t max_bytes);

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_LOG_FILES_H_
