// ProgressRelay: the agent's side of its workers' progress reports (the ProgressRelay service of
// trainyard.proto). Workers report to their own node's agent; the relay gathers the reports of
// the node's ranks into one ProgressBatch, which the coordinator answers with one
// ProgressAnswers, and answers each worker's call with its own answer. At 8 ranks a node that is
// one message per round of reports where there were 8 calls, and the coordinator takes its lock
// once per batch.
//
// When a batch is due: when every rank of some attempt on this node has a report waiting (ranks
// of one job step together, so they report within a moment of each other), when a report has
// waited `window`, or at once for a report the coordinator should hear of now (checkpoints, a
// resume, a run report, a validation loss, the last step, a phase notice). Before a worker's exit
// is reported the transport takes whatever waits (TakeBatch with force), so the coordinator sees a
// rank's last report before its exit.
//
// A report stays with the relay until the coordinator has answered the batch that carried it.
// When the agent's stream breaks, the waiting calls are answered UNAVAILABLE, and the batches
// sent but not answered go back to the waiting reports and are sent again after the agent
// reconnects (the coordinator treats a repeated checkpoint or resume as a no-op). Reports of a
// rank not yet sent merge: the newest wins, the slowest step is the slowest of both, the MoE
// layers' routing adds up over both reports' steps, and checkpoints, the resume, the run report
// and a validation loss carry over; a phase notice (ProgressReport.phase) joins a waiting
// report, which keeps its figures. (A batch the coordinator did take, whose answer the broken
// stream lost, is sent again: its MoE routing then counts twice in that one report's window.)
//
// Authentication: the relay admits the attempt secrets of the StartWorker orders the agent got;
// a report must present its own attempt's secret (an attempt started without one admits reports
// without one).
//
// Threading: thread-safe (one internal mutex); answers are delivered outside it. gRPC's threads
// call Report, the agent's loop the rest.
#ifndef TRAINYARD_SERVER_AGENT_PROGRESS_RELAY_H_
#define TRAINYARD_SERVER_AGENT_PROGRESS_RELAY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/trainyard.pb.h"

namespace trainyard::server::agent {

namespace v1 = ::trainyard::v1;

// How long a report may wait for the reports of its attempt's other ranks on the node.
inline constexpr absl::Duration kProgressWindow = absl::Milliseconds(20);
// How long a worker's call may wait for the coordinator's answer before it is answered
// UNAVAILABLE (its report stays, and goes with the next batch).
inline constexpr absl::Duration kProgressAnswerLimit = absl::Seconds(4);

class ProgressRelay {
 public:
  using Answer = std::function<void(absl::StatusOr<v1::ProgressReply>)>;

  // `clock` must outlive the relay. `on_due` (may be empty) is called, outside the lock, when a
  // report makes a batch due, so the transport need not wait for its next tick.
  ProgressRelay(Clock* clock, std::function<void()> on_due = {},
                absl::Duration window = kProgressWindow);

  // A StartWorker order: the attempt's workers present `secret` (empty: no secret).
  void Admit(const std::string& job_id, int attempt_id, const std::string& secret);
  // The ranks this node runs (started, or adopted after a restart) and the ones that ended.
  void AddRank(const std::string& job_id, int attempt_id, int rank);
  void RemoveRank(const std::string& job_id, int attempt_id, int rank);
  // The job ended (ReleaseMemory): its attempts' secrets are dropped (its reports still waiting
  // are sent all the same).
  void ForgetJob(const std::string& job_id);

  // A worker's report, presenting `secret`: `answer` is called exactly once, at once for
  // UNAUTHENTICATED (unknown secret), PERMISSION_DENIED (another attempt's) and UNAVAILABLE (not
  // connected; the report is kept), else with the coordinator's answer.
  void Report(const v1::ProgressReport& report, const std::string& secret, Answer answer);

  // The agent registered on a new stream (true) or its stream ended (false).
  void SetConnected(bool connected);
  // The batch to send now, if one is due (`force`: whenever anything waits). Its reports count
  // as in flight until OnAnswers. Also answers the calls that waited past kProgressAnswerLimit.
  std::optional<v1::ProgressBatch> TakeBatch(bool force = false);
  void OnAnswers(const v1::ProgressAnswers& answers);

  // Reports not yet sent, and batches sent and not yet answered.
  int pending() const;
  int in_flight() const;

 private:
  using AttemptKey = std::pair<std::string, int>;     // job, attempt
  using RankKey = std::tuple<std::string, int, int>;  // job, attempt, rank
  struct Waiter {
    Answer answer;
    int64_t since_nanos = 0;
  };
  struct Pending {
    v1::ProgressReport report;
    int64_t since_nanos = 0;  // monotonic: when the oldest merged report arrived
    bool urgent = false;
  };
  struct Sent {
    std::vector<v1::ProgressReport> reports;
  };
  using Deliveries = std::vector<std::pair<Answer, absl::StatusOr<v1::ProgressReply>>>;
  // Answers every call waiting on `key`'s report with `result` (into `out`).
  void AnswerLocked(const RankKey& key, const absl::StatusOr<v1::ProgressReply>& result,
                    Deliveries& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Folds `newer` into `older` (the result in *older).
  static void Merge(v1::ProgressReport* older, const v1::ProgressReport& newer);
  static bool IsUrgent(const v1::ProgressReport& report);
  static RankKey KeyOf(const v1::ProgressReport& report);
  [[nodiscard]] absl::Status CheckSecret(const v1::ProgressReport& report,
                                         const std::string& secret) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds `report` to `into`, merged under the rank's report there if any (the oldest arrival
  // and any urgency kept).
  static void Fold(std::map<RankKey, Pending>& into, const v1::ProgressReport& report,
                   int64_t since_nanos, bool urgent);
  // Keeps the report; true when it makes a batch due.
  bool Keep(const v1::ProgressReport& report, int64_t now_nanos) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DueLocked(int64_t now_nanos) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every waiting call gets `status`.
  void AnswerAllLocked(const absl::Status& status, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Deliver(Deliveries& deliveries);

  Clock* const clock_;
  const std::function<void()> on_due_;
  const absl::Duration window_;
  mutable absl::Mutex mu_;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  std::map<AttemptKey, std::string> secrets_ ABSL_GUARDED_BY(mu_);
  std::map<AttemptKey, std::set<int>> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<RankKey, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Sent> in_flight_ ABSL_GUARDED_BY(mu_);
  std::map<RankKey, std::vector<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
  int64_t next_batch_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_PROGRESS_RELAY_H_
