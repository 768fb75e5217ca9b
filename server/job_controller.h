// JobController: one job's policies, and what they remember from one attempt to the next.
//
// The Supervisor keeps a job's records and carries decisions out (events, state transitions,
// orders, metrics); the controller makes them, from the spec's fault_tolerance and checkpoint
// sections: whether a failed attempt is restarted and after what backoff (RestartPolicy, against
// the per-class budgets counted from the job's attempts and the failures since its last durable
// progress), which nodes the next attempt avoids (its stragglers' nodes, with
// exclude_stragglers), when a backoff has run out, at which step the next checkpoint is ordered
// for `every_steps: auto` (CheckpointPolicy, Young–Daly, fed the job's running time, failures,
// step times and checkpoint costs), the failure summary, restart budgets and Young–Daly
// estimates `status` shows, and the restart's latency (failure found to the next attempt's first
// step).
//
// A coordinator restart rebuilds it: Configure and ChooseCheckpoints from the spec, Restore from
// the stored attempts (the budgets used, the failures in a row, the failures the Young–Daly
// estimate counts), LoadCheckpointEstimates from the job's stored accounts; a backoff under way
// is not stored and ends at once.
//
// Threading: not thread-safe; the Supervisor calls it under its lock.
#ifndef TRAINYARD_SERVER_JOB_CONTROLLER_H_
#define TRAINYARD_SERVER_JOB_CONTROLLER_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "config/spec.h"
#include "proto/stored.pb.h"
#include "server/checkpoint_policy.h"
#include "server/restart_policy.h"
#include "server/straggler_detector.h"
#include "server/types.h"

namespace trainyard::server {

class JobController {
 public:
  // The spec's fault tolerance section (the defaults for a spec that no longer parses). Until
  // it is called (a job that had ended when the coordinator restarted), `status` shows no
  // budgets, and Decide uses the defaults.
  void Configure(const config::FaultToleranceSpec& fault_tolerance);
  // The restarts already used, from the job's stored attempts (oldest first): each classified
  // failure followed by another attempt counts against its class; the failed attempts at the
  // end are the failures in a row.
  void Restore(const std::deque<AttemptRecord>& attempts);
  const config::FaultToleranceSpec& fault_tolerance() const { return fault_tolerance_; }

  struct Failure {
    FailureClass failure_class = FailureClass::kCrash;
    std::string cause;
    int rank = -1;     // blamed; -1: none
    absl::Time fault;  // when it happened (at most the `now` it is recorded at)
  };
  // `attempt` failed, found at `now`: the summary `status` shows from now on (returned). The
  // attempt's running time ends, and a failure that is not the user's counts in Young–Daly's
  // failure rate.
  const FailureSummary& Record(const Failure& failure, const AttemptRecord& attempt,
                               absl::Time now);

  struct Exclusion {
    std::string node_id;
    int rank = 0;
    double score = 0;  // the straggler's step time over its peers' median
  };
  struct Verdict {
    bool restart = false;
    std::string reason;               // the restart policy's sentence
    std::vector<Exclusion> excluded;  // nodes the next attempt avoids, newly
  };
  // Whether the failure just recorded restarts the job. A granted restart is counted at once
  // against its class's budget and the job's (so that `status` shows the same count while it
  // waits for a node) and starts the backoff. `stragglers`: the attempt's flagged ranks;
  // `jitter_draw`: uniform in [0, 1), for the backoff's jitter.
  Verdict Decide(const AttemptRecord& attempt, const std::vector<Straggler>& stragglers,
                 absl::Time now, double jitter_draw);

  // Durable progress (a checkpoint of the current attempt committed): the next failure's
  // backoff starts afresh.
  void ProgressCommitted() { consecutive_failures_ = 0; }
  // Every worker of the failed attempt is gone: true when the restart waits for the backoff
  // (until restart_at()); BackoffEnded then says, once, when it has run out.
  bool HoldForBackoff(absl::Time now);
  bool BackoffEnded(absl::Time now);
  // A new attempt was placed.
  void AttemptPlaced() { backing_off_ = false; }
  // The first step of a restarted attempt: the time since the failure was found, once per
  // restart; nullopt otherwise.
  std::optional<absl::Duration> FirstStep(absl::Time now);

  // --- The checkpoint interval, for `checkpoint.every_steps: auto` -------------------------
  // `options`: the Young–Daly policy's, when the coordinator chooses the job's interval;
  // nullopt: it does not. Call before Restore.
  void ChooseCheckpoints(std::optional<CheckpointPolicyOptions> options);
  bool chooses_checkpoints() const { return checkpoint_policy_ != nullptr; }
  // The estimates kept across coordinator restarts, in the job's stored accounts.
  void SaveCheckpointEstimates(stored::JobAccounts& accounts) const;
  [[nodiscard]] absl::Status LoadCheckpointEstimates(const stored::JobAccounts& accounts);
  // An attempt runs from `since` on `nodes` nodes; Tick passes the time on (running time is
  // failure exposure, in proportion to the nodes).
  void AttemptRunning(absl::Time since, int nodes);
  void RunningUntil(absl::Time now);
  // A committed checkpoint that blocked training `blocked_seconds`; `of_current_attempt`:
  // durable progress of the attempt that runs (ProgressCommitted).
  void CheckpointCommitted(double blocked_seconds, bool of_current_attempt);
  // Rank 0's step took `seconds`.
  void StepTook(double seconds);
  // Rank 0 reported `step`, the newest save being at `last_saved`: the step at which to order
  // the next checkpoint, if one is due.
  std::optional<int64_t> CheckpointDue(int64_t step, int64_t last_saved);

  const FailureSummary& last_failure() const { return last_failure_; }
  absl::Time restart_at() const { return restart_at_; }
  const std::set<std::string>& avoid_nodes() const { return avoid_nodes_; }
  // The last failure, the budgets, (while `restarting`) the backoff's end, and the Young–Daly
  // estimates (with the checkpoint ordered next, `next_checkpoint_step`), for `status`.
  void FillHealth(JobHealth& health, bool restarting, absl::Time now,
                  int64_t next_checkpoint_step) const;

 private:
  config::FaultToleranceSpec fault_tolerance_;
  std::unique_ptr<RestartPolicy> policy_;
  std::map<FailureClass, int> restarts_by_class_;
  int consecutive_failures_ = 0;  // since an attempt last committed a checkpoint
  FailureClass last_class_ = FailureClass::kCrash;
  FailureSummary last_failure_;
  absl::Time restart_at_ = absl::InfinitePast();
  bool backing_off_ = false;  // every worker gone, waiting for restart_at_
  std::set<std::string> avoid_nodes_;
  absl::Time failed_at_ = absl::InfinitePast();  // the last restarted failure's detection
  bool awaiting_first_step_ = false;
  std::unique_ptr<CheckpointPolicy> checkpoint_policy_;  // `every_steps: auto` only
  absl::Time exposure_mark_ = absl::InfinitePast();      // running time counted up to here
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_JOB_CONTROLLER_H_
