// ProgressReporter: a coordinated worker's TrainOptions::on_step. It sends WorkerService
// ReportProgress at most every `min_interval` (and always on the last step and on steps that
// evaluated), with the step times averaged and the MoE layers' routing summed over the steps
// since the previous report, and obeys the order in the reply.
//
// Checkpoint saves that ended (AddCheckpoint) make the next step's report due and ride along in
// every report until one is answered. ORDER_CHECKPOINT stores its step in `checkpoint_order`
// (TrainOptions::checkpoint_order), where the training loop finds it.
//
// Outcomes of OnStep: OK, keep training (also when the coordinator cannot be reached: training
// goes on, and while it is unreachable a report is tried only kUnreachableRetry after the
// previous try ended, with a deadline of kUnreachableTimeout, so a partition that swallows calls
// until their deadline slows training by a third at most instead of blocking it on every step; and
// for ORDER_DRAIN, which sets the drain flag the training loop watches: every rank then stops at
// the same step after a checkpoint); CANCELLED for ORDER_STOP, and for ORDER_DRAIN when no drain
// flag was given; ABORTED when the coordinator answers FAILED_PRECONDITION or NOT_FOUND, i.e. this
// attempt is over or unknown and the worker must exit; UNAVAILABLE once the coordinator has been
// unreachable for longer than `orphan_timeout` (a coordinator restart takes seconds; a worker
// nobody supervises any more must not train forever).
//
// Threading: not thread-safe; used from the training thread only.
#ifndef TRAINYARD_WORKER_PROGRESS_REPORTER_H_
#define TRAINYARD_WORKER_PROGRESS_REPORTER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/trainyard.grpc.pb.h"
#include "worker/trainer.h"

namespace trainyard::worker {

// One ReportProgress call with a deadline `timeout` from now (the gRPC adapter, or a fake in
// tests).
class ProgressChannel {
 public:
  virtual ~ProgressChannel() = default;
  [[nodiscard]] virtual absl::StatusOr<trainyard::v1::ProgressReply> Report(
      const trainyard::v1::ProgressReport& report, absl::Duration timeout) = 0;
};

// A report's deadline while the coordinator answers; and while it does not, how long a report
// may take and how often one is tried.
inline constexpr absl::Duration kReportTimeout = absl::Seconds(5);
inline constexpr absl::Duration kUnreachableTimeout = absl::Seconds(1);
inline constexpr absl::Duration kUnreachableRetry = absl::Seconds(2);

// ReportProgress over `stub`: to the coordinator, or to the node agent's progress relay.
std::unique_ptr<ProgressChannel> MakeGrpcProgressChannel(
    std::shared_ptr<trainyard::v1::WorkerService::StubInterface> stub);
std::unique_ptr<ProgressChannel> MakeGrpcProgressChannel(
    std::shared_ptr<trainyard::v1::ProgressRelay::StubInterface> stub);

// Reports through `relay` (the node agent's), and to `coordinator` directly when the relay
// cannot answer: UNAVAILABLE or DEADLINE_EXCEEDED (the agent is gone or has lost the
// coordinator) or UNAUTHENTICATED (it does not know this attempt: its agent restarted without
// learning it, or the job ended), so that such a worker still learns that its attempt ended.
// Both calls share the one deadline: the coordinator gets what the relay left of it (a relay
// answers UNAVAILABLE itself after kProgressAnswerLimit, which leaves a second of
// kReportTimeout), and is not asked when nothing is left, so that a report never blocks the
// training loop for longer than its timeout. `clock` measures what is left.
std::unique_ptr<ProgressChannel> MakeFallbackProgressChannel(
    std::unique_ptr<ProgressChannel> relay, std::unique_ptr<ProgressChannel> coordinator,
    Clock* clock = RealClock());

// The MoE layers' routing (StepReport::moe) summed over the steps since the last Take: what a
// progress report carries of each layer (v1::MoeLayerProgress), its derived figures computed by
// SummarizeExpertLoad (common/moe_load.h).
class MoeProgressWindow {
 public:
  // `balance` and `top_k` as the job's spec has them (model.moe): top_k turns picks into the
  // tokens a layer routed.
  explicit MoeProgressWindow(
      trainyard::v1::MoeBalance balance = trainyard::v1::MOE_BALANCE_UNSPECIFIED, int top_k = 1);

  void Add(const std::vector<MoeLayerReport>& step);
  // Every layer a step added since the last Take (none for a dense model), in the order the
  // steps listed them; then the window starts again (dropped_total goes on counting).
  std::vector<trainyard::v1::MoeLayerProgress> Take();

 private:
  struct Layer {
    int layer = 0;
    std::vector<int64_t> picks;  // per expert, over the window
    int64_t steps = 0;
    int64_t dropped = 0;
    int64_t dropped_total = 0;  // since the first step added
    double aux_loss = 0;        // Σ over the window's steps
    double z_loss = 0;          // the same of the router z-loss
    double bias_spread = 0;     // the latest step's
  };
  trainyard::v1::MoeBalance balance_;
  int top_k_;
  std::vector<Layer> layers_;
};

struct WorkerIdentity {
  std::string job_id;
  int attempt_id = 0;
  int rank = 0;
};

class ProgressReporter {
 public:
  // `channel` and `clock` must outlive the reporter.
  ProgressReporter(ProgressChannel* channel, WorkerIdentity identity, Clock* clock,
                   absl::Duration min_interval = absl::Milliseconds(500),
                   absl::Duration orphan_timeout = absl::Minutes(10),
                   std::atomic<bool>* drain = nullptr,
                   std::atomic<int64_t>* checkpoint_order = nullptr);

  [[nodiscard]] absl::Status OnStep(const StepReport& step);
  // A phase of the iteration other than the step begins (TrainOptions::on_phase): the
  // coordinator hears of it at once, with the phase's hang limit (ProgressReport.phase). Not
  // sent while the coordinator is unreachable; a failure is logged, and the reply's order waits
  // for the next step's report.
  void OnPhase(config::HangPhase phase, double limit_s, int64_t step);
  // An MoE job's balance rule and top_k (model.moe), which its reports' MoE figures need; call
  // it before the first step.
  void SetMoe(trainyard::v1::MoeBalance balance, int top_k);
  // A checkpoint save that ended, to report with the next step.
  void AddCheckpoint(const trainyard::v1::Checkpoint& checkpoint);
  // Where the attempt started from; it rides along until a report is answered.
  void SetResumed(const trainyard::v1::Resumed& resumed);

  // Rank 0 after its last step: the planner's prediction beside what was measured, riding on a
  // copy of the last progress report (so the progress the coordinator shows stays as it was).
  // One try; the caller logs a failure (the run itself succeeded).
  [[nodiscard]] absl::Status SendRunReport(const trainyard::v1::RunReport& run_report);

  int64_t reports_sent() const { return reports_sent_; }

 private:
  // Sets the report's job, attempt and rank to this worker's.
  void Identify(trainyard::v1::ProgressReport& report) const;
  [[nodiscard]] absl::StatusOr<std::optional<trainyard::v1::ProgressReply>> Send(
      const trainyard::v1::ProgressReport& report, int64_t now);

  ProgressChannel* channel_;
  WorkerIdentity identity_;
  Clock* clock_;
  absl::Duration min_interval_;
  absl::Duration orphan_timeout_;
  std::optional<int64_t> unreachable_since_nanos_;
  std::optional<int64_t> last_report_nanos_;
  // Since the previous report.
  int steps_ = 0;
  double seconds_ = 0;
  double forward_seconds_ = 0, backward_seconds_ = 0, optimizer_seconds_ = 0, data_seconds_ = 0;
  double wait_seconds_ = 0;
  double max_step_seconds_ = 0;
  double tokens_ = 0;
  std::optional<double> val_loss_;
  MoeProgressWindow moe_;
  int64_t reports_sent_ = 0;
  std::atomic<bool>* drain_;
  std::atomic<int64_t>* checkpoint_order_;
  std::vector<trainyard::v1::Checkpoint> pending_checkpoints_;  // not yet acknowledged
  std::optional<trainyard::v1::Resumed> resumed_;               // not yet acknowledged
  trainyard::v1::Checkpoint last_committed_;
  trainyard::v1::ProgressReport last_report_;  // the newest sent, for SendRunReport
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_PROGRESS_REPORTER_H_
