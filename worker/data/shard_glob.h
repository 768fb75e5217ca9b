// Expansion of a shard path that may be a glob pattern ("data/fineweb_train_*.bin").
#ifndef TRAINYARD_WORKER_DATA_SHARD_GLOB_H_
#define TRAINYARD_WORKER_DATA_SHARD_GLOB_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard::worker {

// True when `path` contains a glob(3) metacharacter ('*', '?' or '[').
bool IsGlobPattern(const std::string& path);

// A path without metacharacters is returned unchanged (as the only element) without touching the
// disk, so that it may name a file of any FileSystem, and a missing file is reported by whoever
// opens it. A pattern is matched against the real filesystem with glob(3); directories are skipped
// and the matches are sorted bytewise (independent of the locale). No match: NOT_FOUND naming the
// pattern; an unreadable directory: INVALID_ARGUMENT.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ExpandShardPattern(const std::string& path);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DATA_SHARD_GLOB_H_
