#include "server/node_quarantine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace trainyard::server {

absl::Status Validate(const QuarantineOptions& options) {
  if (options.failures < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "failures: must be at least 0, 0 to turn quarantine off (got ", options.failures, ")"));
  }
  if (options.failures == 0) return absl::OkStatus();
  if (options.window <= absl::ZeroDuration() || options.window == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("window: must be a finite duration above 0 (got ",
                     absl::FormatDuration(options.window), ")"));
  }
  if (options.cooldown <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("cooldown: must be a duration above 0 (got ",
                                                   absl::FormatDuration(options.cooldown), ")"));
  }
  return absl::OkStatus();
}

bool NodeQuarantine::InWindow(absl::Time failure, absl::Time now) const {
  return now - failure <= options_.window;
}

const Cordon* NodeQuarantine::Active(const NodeRecord& record, absl::Time now) {
  if (!record.cordon.has_value() || now >= record.cordon->until) return nullptr;
  return &*record.cordon;
}

bool NodeQuarantine::RecordFailure(const std::string& node_id, absl::Time now,
                                   const std::string& what) {
  if (options_.failures <= 0) return false;
  NodeRecord& record = nodes_[node_id];
  if (record.cordon.has_value()) {
    if (Active(record, now) != nullptr) return false;
    // Lifted by expiry. The failures that led to it were consumed when it was imposed and those
    // reported during it were ignored, so the node starts over with an empty history.
    record.cordon.reset();
  }
  std::erase_if(record.failures, [&](absl::Time failure) { return !InWindow(failure, now); });
  record.failures.push_back(now);
  const int count = static_cast<int>(record.failures.size());
  if (count < options_.failures) return false;
  record.failures.clear();
  record.cordon = Cordon{
      .node_id = node_id,
      .reason = absl::StrCat(count, count == 1 ? " failure" : " failures", " in ",
                             absl::FormatDuration(options_.window), ": ", what),
      .since = now,
      .until = now + options_.cooldown,
  };
  return true;
}

bool NodeQuarantine::IsCordoned(const std::string& node_id, absl::Time now) const {
  return Find(node_id, now).has_value();
}

std::optional<Cordon> NodeQuarantine::Find(const std::string& node_id, absl::Time now) const {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return std::nullopt;
  const Cordon* cordon = Active(it->second, now);
  if (cordon == nullptr) return std::nullopt;
  return *cordon;
}

std::vector<Cordon> NodeQuarantine::Cordoned(absl::Time now) const {
  std::vector<Cordon> cordons;
  for (const auto& [node_id, record] : nodes_) {
    if (const Cordon* cordon = Active(record, now)) cordons.push_back(*cordon);
  }
  return cordons;
}

bool NodeQuarantine::Uncordon(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return false;
  const bool was_cordoned = it->second.cordon.has_value();
  nodes_.erase(it);
  return was_cordoned;
}

int NodeQuarantine::RecentFailures(const std::string& node_id, absl::Time now) const {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || Active(it->second, now) != nullptr) return 0;
  return static_cast<int>(
      std::count_if(it->second.failures.begin(), it->second.failures.end(),
                    [&](absl::Time failure) { return InWindow(failure, now); }));
}

}  // namespace trainyard::server
