#include "worker/progress_reporter.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/moe_load.h"
#include "worker/grpc_kv_store.h"

namespace trainyard::worker {
namespace {

namespace v1 = ::trainyard::v1;

// Stub: WorkerService's or ProgressRelay's, which have the same ReportProgress.
template <typename Stub>
class GrpcProgressChannel : public ProgressChannel {
 public:
  explicit GrpcProgressChannel(std::shared_ptr<Stub> stub) : stub_(std::move(stub)) {}

  absl::StatusOr<v1::ProgressReply> Report(const v1::ProgressReport& report,
                                           absl::Duration timeout) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
    v1::ProgressReply reply;
    const absl::Status status = rpc::FromGrpc(stub_->ReportProgress(&context, report, &reply));
    if (!status.ok()) return status;
    return reply;
  }

 private:
  std::shared_ptr<Stub> stub_;
};

class FallbackProgressChannel : public ProgressChannel {
 public:
  FallbackProgressChannel(std::unique_ptr<ProgressChannel> relay,
                          std::unique_ptr<ProgressChannel> coordinator, Clock* clock)
      : relay_(std::move(relay)), coordinator_(std::move(coordinator)), clock_(clock) {}

  absl::StatusOr<v1::ProgressReply> Report(const v1::ProgressReport& report,
                                           absl::Duration timeout) override {
    const int64_t start = clock_->NowNanosMonotonic();
    absl::StatusOr<v1::ProgressReply> reply = relay_->Report(report, timeout);
    // The relay's own answers stand; so does an order or refusal it relayed. It cannot answer
    // when it is gone or has lost the coordinator, nor once it forgot this attempt (its agent
    // restarted, or the job ended): the coordinator can.
    if (reply.ok() ||
        (!absl::IsUnavailable(reply.status()) && !absl::IsDeadlineExceeded(reply.status()) &&
         !absl::IsUnauthenticated(reply.status()))) {
      return reply;
    }
    const absl::Duration left = timeout - absl::Nanoseconds(clock_->NowNanosMonotonic() - start);
    if (left <= absl::ZeroDuration()) return reply;
    absl::StatusOr<v1::ProgressReply> direct = coordinator_->Report(report, left);
    if (direct.ok() || !absl::IsUnavailable(direct.status())) return direct;
    return reply;  // neither answered: say why the relay did not
  }

 private:
  std::unique_ptr<ProgressChannel> relay_;
  std::unique_ptr<ProgressChannel> coordinator_;
  Clock* clock_;
};

}  // namespace

std::unique_ptr<ProgressChannel> MakeFallbackProgressChannel(
    std::unique_ptr<ProgressChannel> relay, std::unique_ptr<ProgressChannel> coordinator,
    Clock* clock) {
  return std::make_unique<FallbackProgressChannel>(std::move(relay), std::move(coordinator), clock);
}

std::unique_ptr<ProgressChannel> MakeGrpcProgressChannel(
    std::shared_ptr<v1::WorkerService::StubInterface> stub) {
  return std::make_unique<GrpcProgressChannel<v1::WorkerService::StubInterface>>(std::move(stub));
}

std::unique_ptr<ProgressChannel> MakeGrpcProgressChannel(
    std::shared_ptr<v1::ProgressRelay::StubInterface> stub) {
  return std::make_unique<GrpcProgressChannel<v1::ProgressRelay::StubInterface>>(std::move(stub));
}

MoeProgressWindow::MoeProgressWindow(v1::MoeBalance balance, int top_k)
    : balance_(balance), top_k_(std::max(top_k, 1)) {}

void MoeProgressWindow::Add(const std::vector<MoeLayerReport>& step) {
  if (layers_.size() != step.size()) layers_.assign(step.size(), Layer{});
  for (size_t i = 0; i < step.size(); ++i) {
    const MoeLayerReport& report = step[i];
    Layer& layer = layers_[i];
    if (layer.layer != report.layer || layer.picks.size() != report.tokens_per_expert.size()) {
      layer = Layer{report.layer, std::vector<int64_t>(report.tokens_per_expert.size())};
    }
    for (size_t e = 0; e < layer.picks.size(); ++e) layer.picks[e] += report.tokens_per_expert[e];
    ++layer.steps;
    layer.dropped += report.dropped;
    layer.dropped_total += report.dropped;
    layer.aux_loss += report.aux_loss;
    layer.z_loss += report.z_loss;
    layer.bias_spread = report.bias_spread;
  }
}

std::vector<v1::MoeLayerProgress> MoeProgressWindow::Take() {
  std::vector<v1::MoeLayerProgress> taken;
  for (Layer& layer : layers_) {
    if (layer.steps == 0) continue;
    int64_t picks = 0;
    for (const int64_t p : layer.picks) picks += p;
    const int64_t tokens = picks / top_k_;  // every token picks top_k experts
    const ExpertLoad load = SummarizeExpertLoad(layer.picks, tokens);
    v1::MoeLayerProgress& out = taken.emplace_back();
    out.set_layer(layer.layer);
    out.set_steps(layer.steps);
    for (const int64_t p : layer.picks) out.add_tokens_per_expert(p);
    out.set_tokens(tokens);
    out.set_tokens_min(load.min);
    out.set_tokens_max(load.max);
    out.set_tokens_cv(load.cv);
    out.set_tokens_max_share(load.max_share);
    out.set_dead_experts(load.dead);
    out.set_dropped(layer.dropped);
    out.set_dropped_total(layer.dropped_total);
    out.set_balance(balance_);
    out.set_aux_loss(layer.aux_loss / static_cast<double>(layer.steps));
    out.set_z_loss(layer.z_loss / static_cast<double>(layer.steps));
    out.set_bias_spread(layer.bias_spread);
    std::fill(layer.picks.begin(), layer.picks.end(), 0);
    layer.steps = 0;
    layer.dropped = 0;
    layer.aux_loss = 0;
    layer.z_loss = 0;
  }
  return taken;
}

ProgressReporter::ProgressReporter(ProgressChannel* channel, WorkerIdentity identity, Clock* clock,
                                   absl::Duration min_interval, absl::Duration orphan_timeout,
                                   std::atomic<bool>* drain, std::atomic<int64_t>* checkpoint_order)
    : channel_(channel),
      identity_(std::move(identity)),
      clock_(clock),
      min_interval_(min_interval),
      orphan_timeout_(orphan_timeout),
      drain_(drain),
      checkpoint_order_(checkpoint_order) {}

void ProgressReporter::AddCheckpoint(const v1::Checkpoint& checkpoint) {
  pending_checkpoints_.push_back(checkpoint);
  if (checkpoint.state() == v1::CHECKPOINT_STATE_COMMITTED) last_committed_ = checkpoint;
}

void ProgressReporter::SetMoe(v1::MoeBalance balance, int top_k) {
  moe_ = MoeProgressWindow(balance, top_k);
}

void ProgressReporter::SetResumed(const v1::Resumed& resumed) { resumed_ = resumed; }

// The coordinator's answer; none while it cannot be reached and the orphan timeout has not
// passed (training goes on); ABORTED when it ended this attempt; UNAVAILABLE past the orphan
// timeout.
absl::StatusOr<std::optional<v1::ProgressReply>> ProgressReporter::Send(
    const v1::ProgressReport& report, int64_t now) {
  absl::StatusOr<v1::ProgressReply> reply =
      channel_->Report(report, unreachable_since_nanos_ ? kUnreachableTimeout : kReportTimeout);
  if (reply.ok()) return std::optional<v1::ProgressReply>(*std::move(reply));
  if (absl::IsFailedPrecondition(reply.status()) || absl::IsNotFound(reply.status())) {
    return absl::AbortedError(
        absl::StrCat("the coordinator ended this attempt: ", reply.status().message()));
  }
  if (!unreachable_since_nanos_) {
    TY_LOG(WARNING) << "cannot report progress (training goes on): " << reply.status();
    unreachable_since_nanos_ = now;
  } else if (now - *unreachable_since_nanos_ > absl::ToInt64Nanoseconds(orphan_timeout_)) {
    return absl::UnavailableError(absl::StrCat(
        "the coordinator has been unreachable for over ", absl::FormatDuration(orphan_timeout_),
        "; stopping, since nothing supervises this worker any more (last error: ",
        reply.status().message(), ")"));
  }
  return std::nullopt;
}

void ProgressReporter::Identify(v1::ProgressReport& report) const {
  report.set_job_id(identity_.job_id);
  report.set_attempt_id(identity_.attempt_id);
  report.set_rank(identity_.rank);
}

absl::Status ProgressReporter::OnStep(const StepReport& step) {
  ++steps_;
  seconds_ += step.step_seconds;
  forward_seconds_ += step.forward_seconds;
  backward_seconds_ += step.backward_seconds;
  optimizer_seconds_ += step.optimizer_seconds;
  data_seconds_ += step.data_seconds;
  wait_seconds_ += step.wait_seconds;
  max_step_seconds_ =
      std::max(max_step_seconds_, std::max(step.step_seconds, step.iteration_seconds));
  tokens_ += step.tokens_per_second * step.step_seconds;
  if (step.val_loss) val_loss_ = step.val_loss;
  moe_.Add(step.moe);
  const int64_t now = clock_->NowNanosMonotonic();
  const int64_t since_last = last_report_nanos_ ? now - *last_report_nanos_ : INT64_MAX;
  const bool due = unreachable_since_nanos_
                       ? since_last >= absl::ToInt64Nanoseconds(kUnreachableRetry) ||
                             step.step >= step.total_steps
                       : since_last >= absl::ToInt64Nanoseconds(min_interval_) ||
                             step.step >= step.total_steps || step.val_loss.has_value() ||
                             !pending_checkpoints_.empty();
  if (!due) return absl::OkStatus();

  v1::ProgressReport report;
  Identify(report);
  report.set_step(step.step);
  report.set_total_steps(step.total_steps);
  report.set_loss(step.loss);
  report.set_logit_z_loss(step.z_loss);
  report.set_learning_rate(step.learning_rate);
  report.set_grad_norm(step.grad_norm);
  report.set_tokens_per_second(seconds_ > 0 ? tokens_ / seconds_ : step.tokens_per_second);
  report.mutable_step_times()->set_total_ms(1e3 * seconds_ / steps_);
  report.mutable_step_times()->set_communication_ms(1e3 * wait_seconds_ / steps_);
  report.mutable_step_times()->set_forward_ms(1e3 * forward_seconds_ / steps_);
  report.mutable_step_times()->set_backward_ms(1e3 * backward_seconds_ / steps_);
  report.mutable_step_times()->set_optimizer_ms(1e3 * optimizer_seconds_ / steps_);
  report.mutable_step_times()->set_data_ms(1e3 * data_seconds_ / steps_);
  report.set_max_step_ms(1e3 * max_step_seconds_);
  if (val_loss_) {
    report.set_has_val_loss(true);
    report.set_val_loss(*val_loss_);
  }
  for (v1::MoeLayerProgress& layer : moe_.Take()) *report.add_moe() = std::move(layer);
  for (const v1::Checkpoint& c : pending_checkpoints_) *report.add_checkpoints() = c;
  if (resumed_) *report.mutable_resumed() = *resumed_;
  if (!last_committed_.path().empty()) *report.mutable_last_checkpoint() = last_committed_;
  last_report_ = report;
  steps_ = 0;
  seconds_ = 0;
  forward_seconds_ = backward_seconds_ = optimizer_seconds_ = data_seconds_ = 0;
  wait_seconds_ = 0;
  max_step_seconds_ = 0;
  tokens_ = 0;

  absl::StatusOr<std::optional<v1::ProgressReply>> sent = Send(report, now);
  // The last step's report carries the run's final progress and checkpoints, which nothing after
  // it would repeat: while the coordinator is unreachable (restarting, say) it is tried again
  // every kUnreachableRetry until answered or the orphan timeout.
  while (sent.ok() && !sent->has_value() && step.step >= step.total_steps) {
    clock_->SleepFor(kUnreachableRetry);
    sent = Send(report, clock_->NowNanosMonotonic());
  }
  // The next report is due counting from this one's end: a try that took its whole deadline
  // leaves training kUnreachableRetry before the next.
  last_report_nanos_ = clock_->NowNanosMonotonic();
  if (!sent.ok()) return sent.status();
  if (!sent->has_value()) return absl::OkStatus();
  const v1::ProgressReply& reply = **sent;
  ++reports_sent_;
  unreachable_since_nanos_.reset();
  pending_checkpoints_.erase(pending_checkpoints_.begin(),
                             pending_checkpoints_.begin() + report.checkpoints_size());
  resumed_.reset();
  switch (reply.order()) {
    case v1::ORDER_STOP:
      return absl::CancelledError(absl::StrCat("stopped by the coordinator at step ", step.step));
    case v1::ORDER_DRAIN:
      if (drain_ != nullptr) {
        if (!drain_->exchange(true)) TY_LOG(INFO) << "drain ordered at step " << step.step;
        return absl::OkStatus();
      }
      return absl::CancelledError(absl::StrCat("drained by the coordinator at step ", step.step,
                                               " (this worker writes no checkpoints)"));
    case v1::ORDER_CHECKPOINT:
      if (checkpoint_order_ != nullptr && reply.checkpoint_step() > step.step &&
          checkpoint_order_->exchange(reply.checkpoint_step()) != reply.checkpoint_step()) {
        TY_LOG(INFO) << "checkpoint ordered at step " << reply.checkpoint_step();
      }
      return absl::OkStatus();
    default:
      return absl::OkStatus();
  }
}

static_assert(static_cast<int>(config::HangPhase::kEvaluation) == v1::ITERATION_PHASE_EVALUATION &&
              static_cast<int>(config::HangPhase::kSampling) == v1::ITERATION_PHASE_SAMPLING &&
              static_cast<int>(config::HangPhase::kCheckpoint) == v1::ITERATION_PHASE_CHECKPOINT);

void ProgressReporter::OnPhase(config::HangPhase phase, double limit_s, int64_t step) {
  if (unreachable_since_nanos_) return;
  v1::ProgressReport report;
  Identify(report);
  report.set_step(step);
  report.set_phase(static_cast<v1::IterationPhase>(phase));
  report.set_phase_limit_s(limit_s);
  if (absl::Status sent = channel_->Report(report, kUnreachableTimeout).status(); !sent.ok()) {
    TY_LOG(WARNING) << "cannot tell the coordinator of the " << config::HangPhaseName(phase)
                    << " after step " << step << ": " << sent;
  }
}

absl::Status ProgressReporter::SendRunReport(const v1::RunReport& run_report) {
  v1::ProgressReport report = last_report_;
  Identify(report);
  report.clear_checkpoints();
  report.clear_resumed();
  *report.mutable_run_report() = run_report;
  return channel_->Report(report, kReportTimeout).status();
}

}  // namespace trainyard::worker
