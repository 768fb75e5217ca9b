// The single-process training loop: data → micro-batches → forward/backward → clip → AdamW,
// with periodic validation and a progress line every few steps.
#ifndef TRAINYARD_WORKER_TRAINER_H_
#define TRAINYARD_WORKER_TRAINER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "config/hang_limit.h"
#include "config/spec.h"
#include "worker/backend.h"
#include "worker/model.h"
#include "worker/optimizer.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/rank_context.h"
#include "worker/parallel/sharded_params.h"

namespace trainyard::worker {

// What the loop reports after every optimizer step (to a coordinator, a test, a log).
// One MoE layer's routing in one optimizer step (config::MoeConfig), over the whole data-parallel
// group.
struct MoeLayerReport {
  int layer = 0;
  std::vector<int64_t> tokens_per_expert;  // picks, before capacity drops
  int64_t dropped = 0;                     // picks over an expert's capacity
  double aux_loss = 0;     // the aux loss, token-weighted over micro-batches (aux_loss rule)
  double bias_spread = 0;  // max − min of the selection bias the step routed with (bias rule)
  double z_loss = 0;       // the router z-loss, token-weighted over micro-batches (0: none)
  // Expert parallelism's all-to-alls (forward, backward, recomputation), per rank on average:
  // bytes sent to other ranks and seconds spent.
  double all_to_all_bytes = 0;
  double all_to_all_seconds = 0;
};

struct StepReport {
  int64_t step = 0;  // optimizer steps completed
  int64_t total_steps = 0;
  double loss = 0.0;  // mean training loss of this step
  // model.z_loss_coeff times the step's mean lse² over its tokens (lse: the log-sum-exp of a
  // token's logits), the z-loss's share of the objective; 0 without one.
  double z_loss = 0.0;
  double learning_rate = 0.0;
  double grad_norm = 0.0;
  double step_seconds = 0.0;  // wall time of this step
  // Of step_seconds, waiting for collectives and pipeline peers: the rest is this rank's own
  // compute, which is what tells a straggler from the peers that wait for it.
  double wait_seconds = 0.0;
  // From the step's start to its report, leaving out evaluation, sampling and checkpoint saves
  // (phases with hang limits of their own, config/hang_limit.h).
  double iteration_seconds = 0.0;
  // Of step_seconds: the forward and backward passes, the optimizer (OptimizerStep: gradient
  // reduction and the update) and drawing the batch. Collectives that block inside a phase count
  // in it and in wait_seconds too.
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;
  double optimizer_seconds = 0.0;
  double data_seconds = 0.0;
  double tokens_per_second = 0.0;
  std::optional<double> val_loss;  // set on steps that evaluated
  // Every MoE layer of the model (whichever pipeline stage holds it), in layer order; empty for a
  // dense model.
  std::vector<MoeLayerReport> moe;
};

namespace checkpoint {
struct SaveOutcome;
}
class HangWatchdog;
class MemoryTierClient;

// Where a run started from.
struct ResumeInfo {
  int64_t step = 0;          // 0: from scratch
  std::string from;          // the checkpoint or memory snapshot
  bool from_memory = false;  // the memory tier supplied it
  double restore_seconds = 0.0;
};

struct TrainOptions {
  FileSystem* fs = nullptr;          // checkpoints; defaults to RealFileSystem()
  FileSystem* data_fs = nullptr;     // training data; defaults to `fs`
  Clock* clock = nullptr;            // defaults to RealClock()
  std::ostream* progress = nullptr;  // progress lines; none when null
  // Called on the training thread after every step; a non-OK status stops training with it
  // (e.g. CANCELLED when the coordinator orders a stop).
  std::function<absl::Status(const StepReport&)> on_step;
  // When set, receives the full parameters (layout order) after the last step (tests).
  std::vector<float>* final_parameters = nullptr;
  // When set, receives the full parameters (layout order) once the state is restored or
  // initialised, before the first step (tests).
  std::vector<float>* restored_parameters = nullptr;
  // Set from another thread or a signal handler to drain: at the next step boundary every rank
  // agrees to stop, a checkpoint is taken and committed (with checkpoint.dir), and training ends
  // with TrainResult::drained.
  const std::atomic<bool>* stop_requested = nullptr;
  // The coordinator's record of the job's newest committed checkpoint, tried first on resume.
  std::string recorded_checkpoint;
  // Called on the training thread of rank 0 for every save that ended (committed or failed).
  std::function<void(const checkpoint::SaveOutcome&)> on_checkpoint;
  // Stop after this many optimizer steps of the run even if the spec asks for more (tests and
  // benchmarks of resumption); 0: no limit. The schedule still follows training.steps.
  int64_t stop_after_step = 0;
  // Told when each step and each phase within it (evaluation, sampling, a checkpoint save)
  // starts and ends, so that a hung step or phase is noticed (none when null).
  HangWatchdog* watchdog = nullptr;
  // With a watchdog: called when such a phase begins, with the limit it is held to and the steps
  // completed, so that the coordinator's own check allows for it (none when null).
  std::function<void(config::HangPhase phase, double limit_s, int64_t step)> on_phase;
  // Fault injection for tests of the phase limits: every such phase of this rank first sleeps
  // this long (seconds, by config::HangPhase). 0: off.
  std::array<double, config::kHangPhases> slow_phase_s{};
  // With `checkpoint.every_steps: auto`, the step at which the coordinator ordered the next
  // save (0: none yet), as rank 0 last heard it; every rank saves at the step rank 0 names.
  // Null: the fixed interval config::CheckpointSpec::interval_steps gives.
  const std::atomic<int64_t>* checkpoint_order = nullptr;
  // Fault injection for tests of hang detection: on this rank (spin_rank), step
  // spin_at_step + 1 never finishes (it spins on the CPU). 0: off.
  int64_t spin_at_step = 0;
  int spin_rank = 0;
  // The node's memory tier (none when null) and the attempt whose snapshots this run writes.
  MemoryTierClient* memory_tier = nullptr;
  int attempt = 0;
  // Asked by rank 0 just before each checkpoint commit; an error (this attempt is no longer the
  // job's, or that cannot be confirmed) fails the save. None when null.
  std::function<absl::Status()> may_commit;
  // Called on rank 0 once the state is restored (or training starts from step 0).
  std::function<void(const ResumeInfo&)> on_resumed;
};

struct EvalPoint {
  int64_t step;  // optimizer steps completed when it was measured
  double loss;   // mean validation cross-entropy, nats per token
};

// A sample of training.sample_every (rank 0 only): the prompt and the tokens that followed it.
struct SamplePoint {
  int64_t step;
  std::vector<int32_t> prompt, tokens;
};

struct TrainResult {
  int64_t first_step = 0;     // the step training resumed from (0: from scratch)
  std::string resumed_from;   // the checkpoint it resumed from, if any
  double resumed_loss = 0.0;  // the loss of the step it resumed from
  bool drained = false;       // stopped early by stop_requested (after a checkpoint)
  // When this rank's restore (choosing, verifying and loading the checkpoint) began and ended
  // (Clock::NowNanosMonotonic). Its seconds include waiting for peers still starting up, which
  // ranks sharing one clock can take out (the last start to the last end).
  int64_t restore_began_ns = 0, restore_ended_ns = 0;
  double restore_seconds() const { return (restore_ended_ns - restore_began_ns) / 1e9; }
  std::vector<double> train_losses;    // mean loss of every optimizer step this run took
  std::vector<double> train_z_losses;  // with model.z_loss_coeff > 0: each step's z-loss
  std::vector<double> grad_norms;      // the global gradient norm of each, before clipping
  std::vector<double> step_seconds;    // wall time of every optimizer step
  std::vector<EvalPoint> evals;
  std::vector<SamplePoint> samples;    // rank 0's; empty on the other ranks
  std::optional<double> entropy_nats;  // the data's entropy rate, when known
  double tokens_per_second = 0.0;      // over the whole run, evaluation excluded
  int64_t parameters = 0;
  // Accounting of this rank: persistent bytes by kind, the largest transient footprint, and
  // activation memory; bytes its data-parallel group sent per collective kind over the whole
  // run; and when the last
  // step's gradient collectives finished against the end of its backward pass.
  struct Memory : parallel::MemoryAccount {
    int64_t activations = 0;
  } memory;
  std::array<int64_t, static_cast<int>(parallel::CollectiveKind::kCount)> bytes_sent{};
  // Bytes this rank sent on the other axes over the whole run: its tensor-parallel group, its
  // pipeline group with the tied embedding's first-to-last-stage sum, and its context-parallel
  // ring.
  int64_t tp_bytes_sent = 0;
  int64_t pp_bytes_sent = 0;
  int64_t cp_bytes_sent = 0;  // ring attention's keys, values and their gradients
  // Expert parallelism's group: the all-to-alls of tokens and their gradients, the counts per
  // expert, and under ZeRO-0 the experts' share of the gradient norm (the routed experts'
  // reductions over the ranks holding the same experts are in bytes_sent).
  int64_t ep_bytes_sent = 0;
  parallel::OverlapTimeline overlap;
  // Pipeline stages: the fraction of training time this stage spent blocked sending or
  // receiving activations (the schedule's bubble plus transfers).
  double pipeline_wait_fraction = 0.0;
  // Where this rank's training time went (evaluation excluded): the rest of it was compute.
  double train_seconds = 0.0;
  // Waiting for collectives: data-parallel (what the overlap did not hide), tensor-parallel,
  // ring attention's and expert parallelism's.
  double exposed_comm_seconds = 0.0;
  double pipeline_wait_seconds = 0.0;
  // The MoE layers this rank holds (config::MoeConfig): their routing over the run, summed over
  // the data-parallel group (picks per expert, drops, Σ aux loss · tokens, tokens; all-to-all
  // bytes and seconds as the group's mean per rank).
  std::vector<Model::MoeLayerStats> moe_routing;
};

OptimizerConfig OptimizerConfigFromSpec(const config::TrainingSpec& training);

// The one-line summary a rank prints when training ends ("done: N steps | final train loss …").
// It ends with the final loss as an exact hexadecimal float, so that two runs can be compared
// bit for bit from their logs.
std::string SummaryLine(const TrainResult& result);

// Runs rank `rank.rank` of the job's mesh (every rank of the job calls it). With a world of one
// rank, Train below.
[[nodiscard]] absl::StatusOr<TrainResult> TrainRank(const config::JobSpec& spec,
                                                    const RankContext& rank, Backend& backend,
                                                    const TrainOptions& options);

// Trains spec.model on spec.data for spec.training.steps steps on `backend`. Errors: bad data
// (INVALID_ARGUMENT / NOT_FOUND naming the file), or a model/data mismatch (INVALID_ARGUMENT).
[[nodiscard]] absl::StatusOr<TrainResult> Train(const config::JobSpec& spec, Backend& backend,
                                                const TrainOptions& options);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_TRAINER_H_
