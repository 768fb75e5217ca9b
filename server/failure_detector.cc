#include "server/failure_detector.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/hang_limit.h"

namespace trainyard::server {
namespace {

std::string Witness(const HangReport& r) {
  if (r.operation.empty()) {
    return absl::StrFormat("rank %d reports step %d running %.1f s outside any collective", r.rank,
                           r.step + 1, r.elapsed_s);
  }
  return absl::StrFormat("rank %d waited %.1f s for it in %s (%s group)", r.rank, r.waiting_s,
                         r.operation, r.group);
}

}  // namespace

FailureDetector::FailureDetector(Options options, int world_size, absl::Time running_since)
    : options_(std::move(options)), world_size_(world_size), last_progress_(running_since) {}

void FailureDetector::Progress(int rank, int64_t step, double max_step_s, absl::Time now) {
  if (rank < 0 || rank >= world_size_) return;
  last_report_[rank] = now;
  if (max_step_s > 0) {
    recent_.push_back(max_step_s);
    if (recent_.size() > config::kHangLimitHistory) recent_.pop_front();
  }
  if (step > step_ || (!moved_ && step > 0)) {
    step_ = std::max(step_, step);
    moved_ = true;
    last_progress_ = now;
    phase_.reset();
  }
}

void FailureDetector::PhaseStarted(int rank, int64_t step, config::HangPhase phase, double limit_s,
                                   absl::Time now) {
  if (rank < 0 || rank >= world_size_ || !(limit_s > 0)) return;
  Progress(rank, step, 0, now);
  // A rank's word: bounded, so that no report can switch the check off.
  limit_s = std::min(limit_s, 1e7);
  if (!phase_ || now + absl::Seconds(limit_s) > phase_->since + absl::Seconds(phase_->limit_s)) {
    phase_ = RunningPhase{phase, limit_s, now};
  }
}

void FailureDetector::HangReported(const HangReport& report, absl::Time now) {
  if (decided_ || report.rank < 0 || report.rank >= world_size_) return;
  reports_.emplace(report.rank, report);
  if (!first_report_) first_report_ = now;
}

void FailureDetector::RankExited(int rank) { exited_.insert(rank); }

double FailureDetector::LimitSeconds() const {
  if (!moved_) return options_.limits.hang_startup_s;
  const std::vector<double> recent(recent_.begin(), recent_.end());
  return config::HangLimitSeconds(options_.limits, recent);
}

double FailureDetector::LimitInUse() const {
  return phase_ && moved_ ? phase_->limit_s : LimitSeconds();
}

std::string FailureDetector::LimitOf() const {
  if (!moved_) return "start-up";
  return phase_ ? config::HangPhaseName(phase_->phase) : "step";
}

std::optional<HangVerdict> FailureDetector::Check(absl::Time now) {
  if (decided_) return std::nullopt;
  if (first_report_) {
    bool all_in = true;
    for (int r = 0; r < world_size_; ++r) {
      if (!reports_.contains(r) && !exited_.contains(r)) all_in = false;
    }
    if (!all_in && now < *first_report_ + options_.gather) return std::nullopt;
    decided_ = true;
    return BlameFromReports(now);
  }
  if (suspended_) return std::nullopt;
  // No limit is shorter than the floor or the start-up limit (HangLimitSeconds): while those
  // have not run out, the limit itself need not be worked out.
  const double shortest = std::min(options_.limits.hang_floor_s, options_.limits.hang_startup_s);
  if (now <= last_progress_ + absl::Seconds(shortest) + options_.slack) return std::nullopt;
  absl::Time deadline = last_progress_ + absl::Seconds(LimitSeconds());
  if (phase_) deadline = std::max(deadline, phase_->since + absl::Seconds(phase_->limit_s));
  if (now <= deadline + options_.slack) return std::nullopt;
  decided_ = true;
  return BlameFromSilence(now);
}

HangVerdict FailureDetector::BlameFromReports(absl::Time now) const {
  // Ranks waited for that do not report waiting themselves, with their witnesses.
  std::map<int, std::vector<const HangReport*>> sinks;
  for (const auto& [rank, report] : reports_) {
    for (int peer : report.waiting_for) {
      if (!reports_.contains(peer) && peer >= 0 && peer < world_size_) {
        sinks[peer].push_back(&report);
      }
    }
  }
  HangVerdict verdict;
  verdict.fault = last_progress_;
  verdict.detected = now;
  verdict.from_workers = true;
  const std::string idle =
      absl::StrFormat("no step finished for %.1f s after step %d (limit %.1f s)",
                      absl::ToDoubleSeconds(now - last_progress_), step_, LimitSeconds());
  if (!sinks.empty()) {
    auto most = std::max_element(sinks.begin(), sinks.end(), [](const auto& a, const auto& b) {
      return a.second.size() < b.second.size();  // ties: the lowest rank (map order)
    });
    verdict.rank = most->first;
    std::string witnesses;
    for (const HangReport* w : most->second) {
      absl::StrAppend(&witnesses, witnesses.empty() ? "" : "; ", Witness(*w));
    }
    verdict.reason = absl::StrCat(witnesses, "; ", idle);
    return verdict;
  }
  // Stuck outside a collective (it reported itself), else the longest wait of a cycle.
  const HangReport* chosen = nullptr;
  for (const auto& [rank, report] : reports_) {
    if (report.operation.empty()) {
      chosen = &report;
      break;
    }
  }
  if (chosen == nullptr) {
    for (const auto& [rank, report] : reports_) {
      if (chosen == nullptr || report.waiting_s > chosen->waiting_s) chosen = &report;
    }
  }
  verdict.rank = chosen->rank;
  verdict.reason =
      chosen->operation.empty()
          ? absl::StrCat(
                "its watchdog found step ", chosen->step + 1,
                absl::StrFormat(" running %.1f s outside any collective", chosen->elapsed_s), "; ",
                idle)
          : absl::StrCat("every rank reported waiting for another; it waited longest (",
                         Witness(*chosen), "); ", idle);
  return verdict;
}

HangVerdict FailureDetector::BlameFromSilence(absl::Time now) const {
  HangVerdict verdict;
  verdict.fault = last_progress_;
  verdict.detected = now;
  // The rank silent longest among those still running; never reported beats any report.
  int blamed = -1;
  absl::Time oldest = absl::InfiniteFuture();
  for (int r = 0; r < world_size_; ++r) {
    if (exited_.contains(r)) continue;
    auto it = last_report_.find(r);
    const absl::Time seen = it == last_report_.end() ? absl::InfinitePast() : it->second;
    if (blamed < 0 || seen < oldest) {
      blamed = r;
      oldest = seen;
    }
  }
  verdict.rank = std::max(blamed, 0);
  const std::string silent =
      oldest == absl::InfinitePast()
          ? std::string("it never reported progress")
          : absl::StrFormat("its last report was %.1f s ago", absl::ToDoubleSeconds(now - oldest));
  verdict.reason = moved_ ? absl::StrFormat(
                                "no step finished for %.1f s after step %d (%s limit %.1f s "
                                "+ %.0f s); %s",
                                absl::ToDoubleSeconds(now - last_progress_), step_, LimitOf(),
                                LimitInUse(), absl::ToDoubleSeconds(options_.slack), silent)
                          : absl::StrFormat(
                                "no step finished %.1f s after the attempt started "
                                "(hang_startup_s %.0f s); %s",
                                absl::ToDoubleSeconds(now - last_progress_),
                                options_.limits.hang_startup_s, silent);
  return verdict;
}

}  // namespace trainyard::server
