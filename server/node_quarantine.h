// NodeQuarantine: cordons a node on which attempts keep failing, whichever jobs they belong to,
// so that the scheduler stops placing new attempts there while it cools down.
//
// The caller records only infrastructure failures blamed on one node: the classes crash, hang,
// node_lost and collective_timeout of RestartPolicy, never user_error (a bad spec fails on every
// node alike). When `failures` of them fall within `window` (the newest failure and every one at
// most `window` older than it), the node is cordoned for `cooldown`; its failure history is
// consumed then, and failures reported while it stays cordoned (late reports from attempts that
// were already there) are ignored. The cordon lifts by itself once the cooldown has passed or by
// Uncordon(); either way the node starts over with an empty history.
//
// The Supervisor stores each cordon and its lifting (JobStore) and gives a restarted coordinator
// its cordons back (Restore); failure histories short of a cordon are not stored. It undoes
// (Uncordon) a cordon that would leave the failing job no node to run on. Times are the caller's
// (absl::Time now); they should not go backwards.
//
// Pure: no clock, no I/O. Threading: none; the owner (Supervisor) calls it under its lock.
#ifndef TRAINYARD_SERVER_NODE_QUARANTINE_H_
#define TRAINYARD_SERVER_NODE_QUARANTINE_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace trainyard::server {

struct QuarantineOptions {
  int failures = 3;  // failures within `window` that cordon a node; 0 turns quarantine off
  absl::Duration window = absl::Minutes(10);
  absl::Duration cooldown = absl::Minutes(30);  // absl::InfiniteDuration(): until uncordoned
};

// INVALID_ARGUMENT, naming the field, when `failures` is negative or, with quarantine on, the
// window is not a finite positive duration or the cooldown is not positive.
[[nodiscard]] absl::Status Validate(const QuarantineOptions& options);

struct Cordon {
  std::string node_id;
  std::string reason;  // "3 failures in 10m: <what of the last one>"
  absl::Time since;    // the failure that cordoned the node
  absl::Time until;    // since + cooldown; the node is usable again from then on
};

class NodeQuarantine {
 public:
  // `options` should have passed Validate().
  explicit NodeQuarantine(QuarantineOptions options = {}) : options_(options) {}

  // Counts one infrastructure failure blamed on `node_id` at `now`; `what` describes it for the
  // cordon's reason. True when this failure cordons the node. Nothing is counted while the
  // node is cordoned or when quarantine is off.
  bool RecordFailure(const std::string& node_id, absl::Time now, const std::string& what);

  // Whether `node_id` is cordoned at `now` (a cordon is over from its `until` on).
  bool IsCordoned(const std::string& node_id, absl::Time now) const;
  // The cordon in force on `node_id` at `now`; nullopt when none.
  std::optional<Cordon> Find(const std::string& node_id, absl::Time now) const;
  // Every cordon in force at `now`, by node id.
  std::vector<Cordon> Cordoned(absl::Time now) const;

  // A stored cordon, as RecordFailure made it (a restarted coordinator's); it replaces any cordon
  // on record for its node.
  void Restore(const Cordon& cordon) { nodes_[cordon.node_id].cordon = cordon; }

  // Lifts the cordon on `node_id` and forgets its failures. False when no cordon was on record
  // (one whose cooldown has passed but that no later RecordFailure has cleared still counts).
  bool Uncordon(const std::string& node_id);

  // Failures of `node_id` still counted at `now` (at most `window` old); 0 while cordoned.
  int RecentFailures(const std::string& node_id, absl::Time now) const;

  const QuarantineOptions& options() const { return options_; }

 private:
  struct NodeRecord {
    std::vector<absl::Time> failures;  // not yet consumed by a cordon; some may be too old
    std::optional<Cordon> cordon;      // may have expired: readers compare `until` with now
  };

  // Whether `failure` still counts at `now`.
  bool InWindow(absl::Time failure, absl::Time now) const;
  // The cordon of `record` if it is in force at `now`.
  static const Cordon* Active(const NodeRecord& record, absl::Time now);

  QuarantineOptions options_;
  std::map<std::string, NodeRecord> nodes_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_NODE_QUARANTINE_H_
