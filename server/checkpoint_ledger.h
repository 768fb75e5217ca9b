// CheckpointLedger: one job's checkpoint saves as its rank 0 reported them, keyed by checkpoint
// path, and what the coordinator derives from them: the newest committed checkpoint (the one a
// new attempt resumes from) and the cost statistics /metrics exports.
//
// Workers re-send a record until a report carrying it is answered, so Apply() must tell a
// repeat (same path, state, step and attempt) from news; only news is stored, announced in an
// event and observed in the statistics. A record for a path already known with another state,
// step or attempt replaces the old one (a later attempt that re-wrote the same directory, or a
// save that failed after all).
//
// Statistics count what was applied since the coordinator started: records restored with Load()
// are not observed again (Prometheus counters and histograms restart with the process).
//
// Threading: none; the Supervisor owns one per job under its lock.
#ifndef TRAINYARD_SERVER_CHECKPOINT_LEDGER_H_
#define TRAINYARD_SERVER_CHECKPOINT_LEDGER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/types.h"

namespace trainyard::server {

// Bucket bounds, in seconds, of the checkpoint duration histograms: 0.1 s to 1 h.
const std::vector<double>& CheckpointSecondsBuckets();

// A histogram with fixed upper bounds plus an implicit +Inf bucket.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void Observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket (not cumulative); the last one counts values above every bound.
  const std::vector<uint64_t>& counts() const { return counts_; }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

struct CheckpointStats {
  Histogram write_seconds{CheckpointSecondsBuckets()};    // committed saves
  Histogram blocked_seconds{CheckpointSecondsBuckets()};  // committed and failed saves
  int64_t failures = 0;                                   // failed saves
};

class CheckpointLedger {
 public:
  enum class Outcome { kRepeat, kNew, kReplaced };

  // Restores stored records (oldest first) without observing them.
  void Load(std::vector<CheckpointInfo> records);

  // INVALID_ARGUMENT when the record cannot be kept: no path, a negative step, size or time, or
  // a state outside CheckpointState.
  [[nodiscard]] static absl::Status Validate(const CheckpointInfo& record);

  // Records a valid record (see Validate) and observes it unless it is a repeat.
  Outcome Apply(const CheckpointInfo& record);

  // In the order they were first applied (or loaded); a replaced record moves to the end.
  const std::vector<CheckpointInfo>& records() const { return records_; }
  // Oldest first by written time, then step.
  std::vector<CheckpointInfo> Chronological() const;
  // The record of `path`; null when none.
  const CheckpointInfo* Find(const std::string& path) const;

  // The newest committed checkpoint, by step: the newest committed record, or `reported` (what
  // a worker named in ProgressReport.last_checkpoint, path empty: none) when its step is higher
  // and the ledger does not know its path (a ledger record of that path is the truth about it).
  // Ties go to the ledger's record. Path empty: none.
  CheckpointInfo NewestCommitted(const CheckpointInfo& reported) const;

  const CheckpointStats& stats() const { return stats_; }

 private:
  void Observe(const CheckpointInfo& record);

  std::vector<CheckpointInfo> records_;
  CheckpointStats stats_;
};

// The cause of the "checkpoint" event for a record: "checkpoint of step N committed at PATH
// (X MiB, written in Y s, training blocked Z s)", "checkpoint of step N failed: MSG",
// "checkpoint of step N skipped: MSG".
std::string DescribeCheckpoint(const CheckpointInfo& record);

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_CHECKPOINT_LEDGER_H_
