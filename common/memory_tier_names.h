// Names in a node's memory tier, shared by the agent that owns it and the workers that write it:
//
//   <tier root>/<job>/a<attempt>-step-<step>/shard-<rank>-of-<world>.bin   a rank's records
//   <tier root>/<job>/a<attempt>-step-<step>/rank-<rank>.json              its manifest, last
//
// A snapshot directory holds one file pair per rank written on this node or copied here from a
// peer; a rank's snapshot exists once its manifest does.
#ifndef TRAINYARD_COMMON_MEMORY_TIER_NAMES_H_
#define TRAINYARD_COMMON_MEMORY_TIER_NAMES_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace trainyard {

struct MemorySnapshotId {
  int attempt = 0;
  int64_t step = 0;
  // Newest first: the later step, then the later attempt.
  bool operator<(const MemorySnapshotId& o) const {
    return step != o.step ? step < o.step : attempt < o.attempt;
  }
  bool operator==(const MemorySnapshotId& o) const = default;
};

inline std::string MemorySnapshotName(MemorySnapshotId id) {
  char name[48];
  std::snprintf(name, sizeof(name), "a%04d-step-%08lld", id.attempt,
                static_cast<long long>(id.step));
  return name;
}

inline std::optional<MemorySnapshotId> ParseMemorySnapshotName(const std::string& name) {
  int attempt = 0;
  long long step = 0;
  int consumed = 0;
  if (std::sscanf(name.c_str(), "a%d-step-%lld%n", &attempt, &step, &consumed) != 2 ||
      consumed != static_cast<int>(name.size()) || attempt < 0 || step < 0) {
    return std::nullopt;
  }
  return MemorySnapshotId{attempt, step};
}

inline std::string MemoryRankManifestName(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.json", rank);
  return name;
}

// Whether `name` may name a job or file in the tier: no separators, no dot-names.
inline bool IsPlainTierName(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_MEMORY_TIER_NAMES_H_
