#include "server/checkpoint_ledger.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainyard::server {

const std::vector<double>& CheckpointSecondsBuckets() {
  static const auto* buckets =
      new std::vector<double>{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600};
  return *buckets;
}

void Histogram::Observe(double value) {
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  ++counts_[bucket - bounds_.begin()];
  ++count_;
  sum_ += value;
}

void CheckpointLedger::Load(std::vector<CheckpointInfo> records) { records_ = std::move(records); }

absl::Status CheckpointLedger::Validate(const CheckpointInfo& record) {
  const int state = static_cast<int>(record.state);
  if (state < static_cast<int>(CheckpointState::kCommitted) ||
      state > static_cast<int>(CheckpointState::kSkipped)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint record of step ", record.step,
                                                   " has no valid state (", state, ")"));
  }
  if (record.path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint record of step ", record.step, " has no path"));
  }
  if (record.step < 0 || record.bytes < 0 || !(record.write_seconds >= 0) ||
      !(record.blocked_seconds >= 0) || !std::isfinite(record.write_seconds) ||
      !std::isfinite(record.blocked_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint record ", record.path,
                                                   " has a negative or non-finite step, size "
                                                   "or time"));
  }
  return absl::OkStatus();
}

CheckpointLedger::Outcome CheckpointLedger::Apply(const CheckpointInfo& record) {
  auto known = std::find_if(records_.begin(), records_.end(),
                            [&](const CheckpointInfo& r) { return r.path == record.path; });
  Outcome outcome = Outcome::kNew;
  if (known != records_.end()) {
    if (known->state == record.state && known->step == record.step &&
        known->attempt_id == record.attempt_id) {
      return Outcome::kRepeat;
    }
    records_.erase(known);
    outcome = Outcome::kReplaced;
  }
  records_.push_back(record);
  Observe(record);
  return outcome;
}

void CheckpointLedger::Observe(const CheckpointInfo& record) {
  switch (record.state) {
    case CheckpointState::kCommitted:
      stats_.write_seconds.Observe(record.write_seconds);
      stats_.blocked_seconds.Observe(record.blocked_seconds);
      break;
    case CheckpointState::kFailed:
      stats_.blocked_seconds.Observe(record.blocked_seconds);
      ++stats_.failures;
      break;
    case CheckpointState::kSkipped:
      break;
  }
}

std::vector<CheckpointInfo> CheckpointLedger::Chronological() const {
  std::vector<CheckpointInfo> sorted = records_;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const CheckpointInfo& a, const CheckpointInfo& b) {
                     if (a.written != b.written) return a.written < b.written;
                     return a.step < b.step;
                   });
  return sorted;
}

const CheckpointInfo* CheckpointLedger::Find(const std::string& path) const {
  auto it = std::find_if(records_.begin(), records_.end(),
                         [&](const CheckpointInfo& r) { return r.path == path; });
  return it == records_.end() ? nullptr : &*it;
}

CheckpointInfo CheckpointLedger::NewestCommitted(const CheckpointInfo& reported) const {
  const CheckpointInfo* newest = nullptr;
  for (const CheckpointInfo& record : records_) {
    if (record.state != CheckpointState::kCommitted) continue;
    if (newest == nullptr || record.step > newest->step) newest = &record;
  }
  const bool reported_counts = !reported.path.empty() && Find(reported.path) == nullptr;
  if (reported_counts && (newest == nullptr || reported.step > newest->step)) return reported;
  return newest != nullptr ? *newest : CheckpointInfo{};
}

std::string DescribeCheckpoint(const CheckpointInfo& record) {
  const std::string what = absl::StrCat("checkpoint of step ", record.step);
  switch (record.state) {
    case CheckpointState::kCommitted:
      return absl::StrFormat(
          "%s committed at %s (%.1f MiB, written in %.2f s, training blocked "
          "%.2f s)",
          what, record.path, static_cast<double>(record.bytes) / (1 << 20), record.write_seconds,
          record.blocked_seconds);
    case CheckpointState::kFailed:
      return absl::StrCat(what,
                          " failed: ", record.message.empty() ? "no reason given" : record.message);
    case CheckpointState::kSkipped:
      return absl::StrCat(
          what, " skipped: ", record.message.empty() ? "no reason given" : record.message);
  }
  return what;
}

}  // namespace trainyard::server
