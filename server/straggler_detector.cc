#include "server/straggler_detector.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace trainyard::server {
namespace {

// The median of `values`, which it reorders; 0 when empty.
double Median(std::vector<double>& values) {
  if (values.empty()) return 0;
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + middle);
  return (lower + upper) / 2;
}

StragglerOptions Sanitized(StragglerOptions options) {
  if (!(options.margin > 0) || !std::isfinite(options.margin)) options.margin = 0.25;
  options.window = std::max(options.window, 1);
  options.min_ranks = std::max(options.min_ranks, 2);
  if (options.stale_after <= absl::ZeroDuration()) options.stale_after = absl::Seconds(30);
  return options;
}

bool FreshAt(absl::Time last_report, absl::Time t, absl::Duration stale_after) {
  return t - last_report <= stale_after;
}

// The median of `sorted` (ascending) with one element equal to `value` left out, and how many
// elements that leaves; 0 when none. `value` must be in `sorted`.
std::pair<double, int> MedianWithout(const std::vector<double>& sorted, double value) {
  const int left = static_cast<int>(sorted.size()) - 1;
  if (left <= 0) return {0, 0};
  const size_t gone = std::lower_bound(sorted.begin(), sorted.end(), value) - sorted.begin();
  const auto at = [&](size_t k) { return k < gone ? sorted[k] : sorted[k + 1]; };
  const size_t middle = left / 2;
  if (left % 2 == 1) return {at(middle), left};
  return {(at(middle - 1) + at(middle)) / 2, left};
}

void InsertSorted(std::vector<double>& sorted, double value) {
  sorted.insert(std::upper_bound(sorted.begin(), sorted.end(), value), value);
}

void EraseSorted(std::vector<double>& sorted, double value) {
  sorted.erase(std::lower_bound(sorted.begin(), sorted.end(), value));
}

}  // namespace

absl::Status StragglerDetector::Validate(const StragglerOptions& options) {
  if (!(options.margin > 0) || !std::isfinite(options.margin)) {
    return absl::InvalidArgumentError(
        absl::StrCat("straggler margin must be a positive fraction, not ", options.margin));
  }
  if (options.window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("straggler window must be at least 1 report, not ", options.window));
  }
  if (options.min_ranks < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("straggler min_ranks must be at least 2, not ", options.min_ranks));
  }
  if (options.stale_after <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("straggler stale_after must be positive, not ",
                                                   absl::FormatDuration(options.stale_after)));
  }
  return absl::OkStatus();
}

StragglerDetector::StragglerDetector(StragglerOptions options)
    : options_(Sanitized(std::move(options))) {}

void StragglerDetector::Recount(absl::Time t) {
  fresh_medians_.clear();
  oldest_counted_ = absl::InfiniteFuture();
  for (Rank& state : ranks_) {
    state.counted = state.reported && FreshAt(state.last_report, t, options_.stale_after);
    if (!state.counted) continue;
    fresh_medians_.push_back(state.recent_median);
    oldest_counted_ = std::min(oldest_counted_, state.last_report);
  }
  std::sort(fresh_medians_.begin(), fresh_medians_.end());
}

std::optional<StragglerChange> StragglerDetector::Report(int rank, double compute_seconds,
                                                         absl::Time t) {
  if (rank < 0 || rank >= kMaxRanks || !std::isfinite(compute_seconds) || compute_seconds < 0) {
    return std::nullopt;
  }
  if (t < latest_report_ || !FreshAt(oldest_counted_, t, options_.stale_after)) Recount(t);
  latest_report_ = std::max(latest_report_, t);
  if (rank >= static_cast<int>(ranks_.size())) ranks_.resize(rank + 1);
  Rank& state = ranks_[rank];
  state.reported = true;
  if (static_cast<int>(state.recent.size()) < options_.window) {
    state.recent.push_back(compute_seconds);
  } else {
    state.recent[state.oldest] = compute_seconds;
    state.oldest = (state.oldest + 1) % options_.window;
  }
  if (state.counted) EraseSorted(fresh_medians_, state.recent_median);
  scratch_.assign(state.recent.begin(), state.recent.end());
  state.recent_median = Median(scratch_);
  InsertSorted(fresh_medians_, state.recent_median);
  state.counted = true;
  state.last_report = std::max(state.last_report, t);
  oldest_counted_ = std::min(oldest_counted_, state.last_report);

  const auto [peer_median, peers] = MedianWithout(fresh_medians_, state.recent_median);
  if (peers + 1 < options_.min_ranks || !(peer_median > 0)) {
    state.slow_run = 0;
    state.normal_run = 0;
    return std::nullopt;
  }
  state.score = state.recent_median / peer_median;
  if (compute_seconds > (1 + options_.margin) * peer_median) {
    ++state.slow_run;
    state.normal_run = 0;
  } else {
    ++state.normal_run;
    state.slow_run = 0;
  }
  if (!state.flagged && state.slow_run >= options_.window) {
    state.flagged = true;
    state.since = t;
    return StragglerChange{rank, true, state.score, t};
  }
  if (state.flagged && state.normal_run >= options_.window) {
    state.flagged = false;
    return StragglerChange{rank, false, state.score, t};
  }
  return std::nullopt;
}

std::vector<Straggler> StragglerDetector::Flagged() const {
  std::vector<Straggler> flagged;
  for (int rank = 0; rank < static_cast<int>(ranks_.size()); ++rank) {
    const Rank& state = ranks_[rank];
    if (state.flagged) flagged.push_back(Straggler{rank, state.score, state.since});
  }
  return flagged;
}

std::vector<RankScore> StragglerDetector::Scores(absl::Time now) const {
  scratch_.clear();
  for (const Rank& state : ranks_) {
    if (state.reported && FreshAt(state.last_report, now, options_.stale_after)) {
      scratch_.push_back(state.recent_median);
    }
  }
  std::sort(scratch_.begin(), scratch_.end());
  std::vector<RankScore> scores;
  for (int rank = 0; rank < static_cast<int>(ranks_.size()); ++rank) {
    const Rank& state = ranks_[rank];
    if (!state.reported || !FreshAt(state.last_report, now, options_.stale_after)) continue;
    const auto [peer_median, peers] = MedianWithout(scratch_, state.recent_median);
    if (peers + 1 < options_.min_ranks || !(peer_median > 0)) continue;
    scores.push_back(RankScore{rank, state.recent_median / peer_median});
  }
  return scores;
}

}  // namespace trainyard::server
