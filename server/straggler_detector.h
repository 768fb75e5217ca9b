// StragglerDetector: finds the ranks of one attempt that compute persistently slower than their
// peers. Every rank reports its compute time per step: its step time less the time it waited
// in collectives. Raw step times cannot tell a straggler apart, since in a synchronous job its
// peers wait for it and every rank's step takes equally long; compute time can.
//
// Definitions, evaluated at each report of rank r at time t:
// - r's recent median: the median of its last `window` reports.
// - fresh peers: the other ranks whose latest report is at most `stale_after` older than t.
//   Silent ranks (gone, hung, or left by an elastic resize) thus stop counting.
// - peer median: the median of the fresh peers' recent medians. The report is comparable when
//   r and its fresh peers number at least `min_ranks` and the peer median is above 0.
// - the report is slow when it exceeds the peer median by more than `margin` (as a fraction),
//   i.e. compute_seconds > (1 + margin) * peer median.
// - r is flagged at its `window`-th consecutive slow report, and un-flagged at its `window`-th
//   consecutive comparable report that is not slow. A report that is not comparable breaks
//   both runs.
// - r's score: its recent median over the peer median (1: typical, 1.5: half again as slow).
//
// Reports with a rank out of [0, kMaxRanks) or a negative or non-finite compute time are ignored. A
// flagged rank that falls silent stays flagged; each attempt gets a new detector.
//
// Threading: none; the Supervisor owns one per attempt under its lock.
#ifndef TRAINYARD_SERVER_STRAGGLER_DETECTOR_H_
#define TRAINYARD_SERVER_STRAGGLER_DETECTOR_H_

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace trainyard::server {

struct StragglerOptions {
  // How much slower than the peer median a report must be to count as slow (0.25: 25%); > 0.
  double margin = 0.25;
  // Consecutive reports that flag or un-flag a rank, and the reports a recent median spans; >= 1.
  int window = 5;
  // Ranks, the reporting one included, that must be fresh for a report to be compared; >= 2.
  int min_ranks = 2;
  // A rank whose latest report is older than this stops counting as a peer; > 0.
  absl::Duration stale_after = absl::Seconds(30);
};

struct RankScore {
  int rank = 0;
  double score = 0;
};

struct Straggler {
  int rank = 0;
  double score = 0;  // at its latest comparable report
  absl::Time since;  // the report that flagged it
};

// A rank's report flagged it (`flagged`) or un-flagged it (`!flagged`).
struct StragglerChange {
  int rank = 0;
  bool flagged = false;
  double score = 0;
  absl::Time at;
};

class StragglerDetector {
 public:
  static constexpr int kMaxRanks = 1 << 20;

  // INVALID_ARGUMENT naming the first option out of its range.
  [[nodiscard]] static absl::Status Validate(const StragglerOptions& options);

  // `options` must pass Validate; values out of range are moved to the nearest valid one.
  explicit StragglerDetector(StragglerOptions options = {});

  // Records that `rank` computed for `compute_seconds` per step, as reported at `t`; returns the
  // change it caused, if any.
  std::optional<StragglerChange> Report(int rank, double compute_seconds, absl::Time t);

  // The flagged ranks, by rank.
  std::vector<Straggler> Flagged() const;
  // The score of every rank fresh at `now` (reported at most stale_after before it), by rank;
  // empty when fewer than min_ranks are fresh. Ranks whose fresh peers' median is 0 are left
  // out.
  std::vector<RankScore> Scores(absl::Time now) const;

 private:
  struct Rank {
    bool reported = false;       // a report of this rank was recorded
    bool counted = false;        // its recent median is in fresh_medians_
    std::vector<double> recent;  // the last `window` reports, a ring once full
    int oldest = 0;              // where the ring's oldest report is
    double recent_median = 0;
    absl::Time last_report = absl::InfinitePast();
    int slow_run = 0;
    int normal_run = 0;
    bool flagged = false;
    absl::Time since;
    double score = 0;
  };

  // Makes fresh_medians_ hold the ranks fresh at `t` again, from scratch.
  void Recount(absl::Time t);

  const StragglerOptions options_;
  std::vector<Rank> ranks_;  // by rank
  // The recent medians of the counted ranks, sorted: a report finds its peer median in it
  // without walking every rank. At a report's time t the counted ranks are exactly the ranks
  // fresh at t: none was counted before oldest_counted_, so all stay fresh while t is within
  // stale_after of it, and a rank left out as stale stays stale while t does not go back.
  // Otherwise the report recounts (about once per stale_after while every rank reports).
  std::vector<double> fresh_medians_;
  absl::Time oldest_counted_ = absl::InfiniteFuture();
  absl::Time latest_report_ = absl::InfinitePast();
  // Reused by every report, so that one allocates nothing once the vectors have grown.
  mutable std::vector<double> scratch_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_STRAGGLER_DETECTOR_H_
