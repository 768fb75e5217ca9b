#include "server/straggler_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::IsEmpty;

absl::Time At(double seconds) { return absl::FromUnixSeconds(1'000'000) + absl::Seconds(seconds); }

// One report from every rank at `t`, ranks in order; returns the changes they caused.
std::vector<StragglerChange> Round(StragglerDetector& detector, const std::vector<double>& times,
                                   double t) {
  std::vector<StragglerChange> changes;
  for (int rank = 0; rank < static_cast<int>(times.size()); ++rank) {
    if (std::optional<StragglerChange> change = detector.Report(rank, times[rank], At(t))) {
      changes.push_back(*change);
    }
  }
  return changes;
}

TEST(StragglerDetectorTest, SlowRankIsFlaggedAtTheWindowthSlowReportNotBefore) {
  StragglerDetector detector;  // margin 0.25, window 5
  const std::vector<double> times = {1.0, 1.1, 0.9, 1.5};
  for (int round = 0; round < 4; ++round) {
    EXPECT_THAT(Round(detector, times, round), IsEmpty()) << "round " << round;
  }
  EXPECT_THAT(detector.Flagged(), IsEmpty());

  const std::vector<StragglerChange> changes = Round(detector, times, 4);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 3);
  EXPECT_TRUE(changes[0].flagged);
  EXPECT_EQ(changes[0].at, At(4));
  // Its median (1.5) over the median of the others' medians (1.0).
  EXPECT_DOUBLE_EQ(changes[0].score, 1.5);

  const std::vector<Straggler> flagged = detector.Flagged();
  ASSERT_EQ(flagged.size(), 1u);
  EXPECT_EQ(flagged[0].rank, 3);
  EXPECT_DOUBLE_EQ(flagged[0].score, 1.5);
  EXPECT_EQ(flagged[0].since, At(4));
  // Staying slow changes nothing.
  EXPECT_THAT(Round(detector, times, 5), IsEmpty());
  EXPECT_EQ(detector.Flagged()[0].since, At(4));
}

TEST(StragglerDetectorTest, ReportWithinTheMarginRestartsTheRun) {
  StragglerDetector detector;
  for (int round = 0; round < 4; ++round) Round(detector, {1.0, 1.0, 1.0, 1.4}, round);
  Round(detector, {1.0, 1.0, 1.0, 1.2}, 4);  // 20% slower: within the margin
  for (int round = 5; round < 9; ++round) {
    EXPECT_THAT(Round(detector, {1.0, 1.0, 1.0, 1.4}, round), IsEmpty()) << "round " << round;
  }
  EXPECT_THAT(Round(detector, {1.0, 1.0, 1.0, 1.4}, 9),
              ElementsAre(Field(&StragglerChange::rank, 3)));
}

TEST(StragglerDetectorTest, RankThatRecoversForAWindowIsUnflagged) {
  StragglerDetector detector;
  for (int round = 0; round < 5; ++round) Round(detector, {1.0, 1.0, 2.0}, round);
  ASSERT_EQ(detector.Flagged().size(), 1u);

  for (int round = 5; round < 9; ++round) {
    EXPECT_THAT(Round(detector, {1.0, 1.0, 1.0}, round), IsEmpty()) << "round " << round;
    EXPECT_EQ(detector.Flagged().size(), 1u);
  }
  const std::vector<StragglerChange> changes = Round(detector, {1.0, 1.0, 1.0}, 9);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 2);
  EXPECT_FALSE(changes[0].flagged);
  EXPECT_DOUBLE_EQ(changes[0].score, 1.0);  // its last five reports were all 1.0
  EXPECT_THAT(detector.Flagged(), IsEmpty());
}

TEST(StragglerDetectorTest, SingleRankIsNeverFlaggedNorScored) {
  StragglerDetector detector;
  for (int round = 0; round < 20; ++round) {
    EXPECT_FALSE(detector.Report(0, 10.0 + round, At(round)).has_value());
  }
  EXPECT_THAT(detector.Flagged(), IsEmpty());
  EXPECT_THAT(detector.Scores(At(19)), IsEmpty());
}

TEST(StragglerDetectorTest, TwoRanksAreEnoughToFlagTheSlowerOne) {
  StragglerDetector detector;
  for (int round = 0; round < 5; ++round) Round(detector, {1.0, 2.0}, round);
  EXPECT_THAT(detector.Flagged(), ElementsAre(Field(&Straggler::rank, 1)));
}

TEST(StragglerDetectorTest, StaleRanksDoNotCount) {
  StragglerOptions options;
  options.stale_after = absl::Seconds(10);
  StragglerDetector detector(options);
  // Two fast ranks report once and go silent.
  detector.Report(2, 0.5, At(0));
  detector.Report(3, 0.5, At(0));
  // Counted, they would make the two live ranks look twice as slow as their peers.
  for (int round = 11; round < 30; ++round) {
    EXPECT_THAT(Round(detector, {1.0, 1.0}, round), IsEmpty()) << "round " << round;
  }
  EXPECT_THAT(detector.Flagged(), IsEmpty());
  EXPECT_THAT(detector.Scores(At(29)),
              ElementsAre(Field(&RankScore::rank, 0), Field(&RankScore::rank, 1)));
  EXPECT_THAT(detector.Scores(At(29 + 11)), IsEmpty());  // everyone silent

  // The same reports with a longer staleness threshold flag both live ranks.
  options.stale_after = absl::Seconds(100);
  StragglerDetector patient(options);
  patient.Report(2, 0.5, At(0));
  patient.Report(3, 0.5, At(0));
  for (int round = 11; round < 30; ++round) Round(patient, {1.0, 1.0}, round);
  EXPECT_THAT(patient.Flagged(), ElementsAre(Field(&Straggler::score, DoubleNear(2.0, 1e-12)),
                                             Field(&Straggler::score, DoubleNear(2.0, 1e-12))));
}

TEST(StragglerDetectorTest, ScoresCoverEveryFreshRank) {
  StragglerDetector detector;
  for (int round = 0; round < 3; ++round) Round(detector, {1.0, 1.0, 1.0, 3.0}, round);
  EXPECT_THAT(detector.Scores(At(2)),
              ElementsAre(Field(&RankScore::score, DoubleNear(1.0, 1e-12)),
                          Field(&RankScore::score, DoubleNear(1.0, 1e-12)),
                          Field(&RankScore::score, DoubleNear(1.0, 1e-12)),
                          Field(&RankScore::score, DoubleNear(3.0, 1e-12))));
}

TEST(StragglerDetectorTest, EqualTimesAreNeverFlagged) {
  StragglerDetector detector;
  for (int round = 0; round < 100; ++round) {
    // A little jitter, always well within the margin.
    const double jitter = (round % 3) * 0.01;
    EXPECT_THAT(Round(detector, std::vector<double>(8, 0.2 + jitter), round), IsEmpty());
  }
  EXPECT_THAT(detector.Flagged(), IsEmpty());
  for (const RankScore& score : detector.Scores(At(99))) EXPECT_NEAR(score.score, 1.0, 0.2);
}

TEST(StragglerDetectorTest, InvalidReportsAreIgnored) {
  StragglerDetector detector;
  for (int round = 0; round < 10; ++round) {
    Round(detector, {1.0, 1.0}, round);
    EXPECT_FALSE(detector.Report(-1, 5.0, At(round)).has_value());
    EXPECT_FALSE(detector.Report(2, std::nan(""), At(round)).has_value());
    EXPECT_FALSE(detector.Report(3, -1.0, At(round)).has_value());
    EXPECT_FALSE(
        detector.Report(4, std::numeric_limits<double>::infinity(), At(round)).has_value());
  }
  EXPECT_THAT(detector.Flagged(), IsEmpty());
  EXPECT_EQ(detector.Scores(At(9)).size(), 2u);
}

// The detector's definition (header comment) evaluated directly, walking every rank at every
// report: what the detector's sorted bookkeeping must reproduce exactly.
class DefinitionDetector {
 public:
  explicit DefinitionDetector(StragglerOptions options) : options_(options) {}

  std::optional<StragglerChange> Report(int rank, double compute_seconds, absl::Time t) {
    if (rank >= static_cast<int>(ranks_.size())) ranks_.resize(rank + 1);
    Rank& state = ranks_[rank];
    state.reported = true;
    state.recent.push_back(compute_seconds);
    if (static_cast<int>(state.recent.size()) > options_.window) {
      state.recent.erase(state.recent.begin());
    }
    state.recent_median = Median(state.recent);
    state.last_report = std::max(state.last_report, t);
    std::vector<double> peers;
    for (int peer = 0; peer < static_cast<int>(ranks_.size()); ++peer) {
      if (peer != rank && Fresh(ranks_[peer], t)) peers.push_back(ranks_[peer].recent_median);
    }
    const double peer_median = Median(peers);
    if (static_cast<int>(peers.size()) + 1 < options_.min_ranks || !(peer_median > 0)) {
      state.slow_run = state.normal_run = 0;
      return std::nullopt;
    }
    state.score = state.recent_median / peer_median;
    const bool slow = compute_seconds > (1 + options_.margin) * peer_median;
    state.slow_run = slow ? state.slow_run + 1 : 0;
    state.normal_run = slow ? 0 : state.normal_run + 1;
    if (!state.flagged && state.slow_run >= options_.window) {
      state.flagged = true;
      return StragglerChange{rank, true, state.score, t};
    }
    if (state.flagged && state.normal_run >= options_.window) {
      state.flagged = false;
      return StragglerChange{rank, false, state.score, t};
    }
    return std::nullopt;
  }

 private:
  struct Rank {
    bool reported = false;
    std::vector<double> recent;
    double recent_median = 0;
    absl::Time last_report = absl::InfinitePast();
    int slow_run = 0;
    int normal_run = 0;
    bool flagged = false;
    double score = 0;
  };
  static double Median(std::vector<double> values) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  }
  bool Fresh(const Rank& state, absl::Time t) const {
    return state.reported && t - state.last_report <= options_.stale_after;
  }

  StragglerOptions options_;
  std::vector<Rank> ranks_;
};

TEST(StragglerDetectorTest, EveryReportAgreesWithTheDefinitionEvaluatedDirectly) {
  std::mt19937 random(20261130);
  for (int trial = 0; trial < 200; ++trial) {
    StragglerOptions options;
    options.window = 1 + static_cast<int>(random() % 5);
    options.min_ranks = 2 + static_cast<int>(random() % 3);
    options.margin = 0.1 + 0.1 * static_cast<double>(random() % 4);
    options.stale_after = absl::Seconds(2 + random() % 6);
    StragglerDetector detector(options);
    DefinitionDetector definition(options);
    const int ranks = 1 + static_cast<int>(random() % 12);
    double t = 0;
    for (int report = 0; report < 400; ++report) {
      // Mostly forward in small steps; now and then a long silence or a clock that goes back.
      const int move = static_cast<int>(random() % 100);
      t += move < 3 ? 10.0 : move < 5 ? -3.0 : 0.25 * static_cast<double>(random() % 3);
      const int rank = static_cast<int>(random() % ranks);
      // Few distinct values, so that equal medians are common; rank 0 is often slow.
      double compute = 1.0 + 0.25 * static_cast<double>(random() % 3);
      if (rank == 0 && random() % 3 != 0) compute *= 2;
      if (random() % 50 == 0) compute = 0;
      const std::optional<StragglerChange> got = detector.Report(rank, compute, At(t));
      const std::optional<StragglerChange> want = definition.Report(rank, compute, At(t));
      ASSERT_EQ(got.has_value(), want.has_value()) << "trial " << trial << " report " << report;
      if (!got) continue;
      EXPECT_EQ(got->rank, want->rank);
      EXPECT_EQ(got->flagged, want->flagged);
      EXPECT_DOUBLE_EQ(got->score, want->score);
    }
  }
}

TEST(StragglerDetectorTest, ValidateNamesTheBadOption) {
  EXPECT_TRUE(StragglerDetector::Validate({}).ok());
  StragglerOptions options;
  options.margin = 0;
  EXPECT_THAT(StragglerDetector::Validate(options).message(), testing::HasSubstr("margin"));
  options = {};
  options.window = 0;
  EXPECT_THAT(StragglerDetector::Validate(options).message(), testing::HasSubstr("window"));
  options = {};
  options.min_ranks = 1;
  EXPECT_THAT(StragglerDetector::Validate(options).message(), testing::HasSubstr("min_ranks"));
  options = {};
  options.stale_after = absl::ZeroDuration();
  EXPECT_EQ(StragglerDetector::Validate(options).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::server
