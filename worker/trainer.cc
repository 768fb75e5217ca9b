#include "worker/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/moe_load.h"
#include "common/status.h"
#include "config/mesh.h"
#include "worker/checkpoint/writer.h"
#include "worker/checkpointing.h"
#include "worker/convert/init_from.h"
#include "worker/data/dataset.h"
#include "worker/data/sample_text.h"
#include "worker/data/sampler.h"
#include "worker/generate.h"
#include "worker/hang_watchdog.h"
#include "worker/model.h"
#include "worker/moe_routing.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/parallel_dims.h"
#include "worker/parallel/pipeline.h"
#include "worker/parallel/sharded_params.h"
#include "worker/sampling.h"
#include "worker/shape/parameters.h"
#include "worker/shape/stages.h"
#include "worker/train_state.h"

namespace trainyard::worker {

OptimizerConfig OptimizerConfigFromSpec(const config::TrainingSpec& t) {
  OptimizerConfig c;
  c.lr = t.lr;
  c.min_lr_ratio = t.min_lr_ratio;
  c.warmup_steps = t.warmup_steps;
  c.total_steps = t.steps;
  c.schedule = t.schedule == "linear"     ? LrSchedule::kLinear
               : t.schedule == "constant" ? LrSchedule::kConstant
               : t.schedule == "wsd"      ? LrSchedule::kWarmupStableDecay
                                          : LrSchedule::kCosine;
  c.decay_steps = t.decay_steps;
  c.decay_shape = t.decay_shape == "cosine"   ? DecayShape::kCosine
                  : t.decay_shape == "1-sqrt" ? DecayShape::kOneMinusSqrt
                                              : DecayShape::kLinear;
  c.weight_decay = t.weight_decay;
  c.beta1 = t.beta1;
  c.beta2 = t.beta2;
  c.eps = t.eps;
  c.grad_clip = t.grad_clip;
  return c;
}

namespace {

// Which windows a rank evaluates: eval_batches global batches of `global_batch` windows (the
// same windows on every mesh, so the validation loss does not depend on it); data-parallel rank
// `dp_rank` takes windows [dp_rank·per_rank, (dp_rank+1)·per_rank) of each, `micro` at a time.
struct EvalShare {
  int eval_batches = 1;
  int global_batch = 1;
  int dp_rank = 0;
  int per_rank = 1;
  int micro = 1;
};

// Mean validation loss over the windows of EvalShare. With pipeline stages, activations are
// handed forward virtual stage by virtual stage (VirtualStage: the last rank hands its chunk's
// output to the first rank's next chunk) and the last virtual stage's loss is shared; the
// data-parallel ranks' sums are added up.
absl::StatusOr<double> Evaluate(Model& model, Backend& backend, parallel::Communicator& dp,
                                parallel::Communicator& pp, int chunks, const BatchSampler& sampler,
                                const EvalShare& share, int64_t transfer_count) {
  const int t = sampler.seq_len();
  const int p = pp.size(), s = pp.rank(), virtual_stages = p * chunks;
  std::vector<int32_t> inputs(int64_t{share.micro} * t), targets(inputs.size());
  const DType dtype = backend.act_dtype();
  Buffer<Act> in = p > 1 ? backend.AllocAct(transfer_count) : Buffer<Act>();
  Buffer<Act> out = p > 1 ? backend.AllocAct(transfer_count) : Buffer<Act>();
  double total = 0.0;
  uint32_t message = 0;
  for (int i = 0; i < share.eval_batches; ++i) {
    for (int m = 0; m < share.per_rank / share.micro; ++m, ++message) {
      sampler.FillEvalWindows(int64_t{i} * share.global_batch +
                                  int64_t{share.dp_rank} * share.per_rank +
                                  int64_t{m} * share.micro,
                              share.micro, inputs.data(), targets.data());
      // The tag of the hand-off into virtual stage v.
      constexpr uint32_t kEvalTag = 1u << 30;
      auto tag = [&](int v) { return kEvalTag + message * virtual_stages + v; };
      for (int c = 0; c < chunks; ++c) {
        const int v = VirtualStage(p, s, c);
        if (v > 0) {
          TY_RETURN_IF_ERROR(
              pp.Recv(in.data(), in.size(), dtype, StageChunkOf(p, v - 1).stage, tag(v)));
        }
        TY_ASSIGN_OR_RETURN(double loss, model.StageLoss(c, inputs.data(), targets.data(),
                                                         share.micro, t, in.data(), out.data()));
        if (v + 1 < virtual_stages) {
          TY_RETURN_IF_ERROR(
              pp.Send(out.data(), out.size(), dtype, StageChunkOf(p, v + 1).stage, tag(v + 1)));
        }
        total += loss;
      }
    }
  }
  TY_ASSIGN_OR_RETURN(total, parallel::AllReduceDouble(pp, total));
  TY_ASSIGN_OR_RETURN(total, parallel::AllReduceDouble(dp, total));
  return total / (static_cast<double>(share.eval_batches) * share.global_batch * t);
}

std::string EvalLine(const EvalPoint& e, const std::optional<double>& entropy) {
  std::string line = absl::StrFormat("eval step %d | val loss %.4f", e.step, e.loss);
  if (entropy) {
    absl::StrAppendFormat(&line, " | data entropy %.4f | gap %+.1f%%", *entropy,
                          100.0 * (e.loss - *entropy) / *entropy);
  }
  return line;
}

}  // namespace

std::string SummaryLine(const TrainResult& result) {
  const int64_t steps = result.first_step + static_cast<int64_t>(result.train_losses.size());
  if (result.train_losses.empty()) {
    // Resumed from a checkpoint of the last step: nothing left to train.
    if (result.first_step == 0) return "done: 0 steps";
    return absl::StrFormat("done: %d steps | final train loss %.4f | exact final loss %a", steps,
                           result.resumed_loss, result.resumed_loss);
  }
  std::string line =
      absl::StrFormat("done: %d steps | final train loss %.4f", steps, result.train_losses.back());
  if (!result.train_z_losses.empty())
    absl::StrAppendFormat(&line, " | z-loss %.4g", result.train_z_losses.back());
  if (!result.evals.empty())
    absl::StrAppendFormat(&line, " | val loss %.4f", result.evals.back().loss);
  if (result.entropy_nats)
    absl::StrAppendFormat(&line, " | data entropy %.4f", *result.entropy_nats);
  std::vector<double> times = result.step_seconds;
  std::sort(times.begin(), times.end());
  absl::StrAppendFormat(&line, " | %.0f tok/s | median step %.2f ms", result.tokens_per_second,
                        1e3 * times[times.size() / 2]);
  // MoE runs: of the layers this rank holds, the largest share of a layer's tokens that one
  // expert took over the run (1: a collapsed router), and the picks dropped in them all; under
  // expert parallelism, what their all-to-alls moved and took per rank.
  if (!result.moe_routing.empty()) {
    const Model::MoeLayerStats* worst = nullptr;
    double worst_share = -1;
    int64_t dropped = 0, exchange_bytes = 0;
    double exchange_seconds = 0;
    for (const Model::MoeLayerStats& layer : result.moe_routing) {
      const double share = SummarizeExpertLoad(layer.picks, layer.tokens).max_share;
      if (share > worst_share) {
        worst_share = share;
        worst = &layer;
      }
      dropped += layer.dropped;
      exchange_bytes += layer.exchange_bytes;
      exchange_seconds += layer.exchange_seconds;
    }
    absl::StrAppendFormat(&line, " | moe max expert share %.3f (layer %d), %d dropped", worst_share,
                          worst->layer, dropped);
    if (exchange_bytes > 0) {
      absl::StrAppendFormat(&line, " | all-to-all %.2f MiB, %.3f s per rank",
                            exchange_bytes / double{1 << 20}, exchange_seconds);
    }
  }
  absl::StrAppendFormat(&line, " | exact final loss %a", result.train_losses.back());
  return line;
}

absl::StatusOr<TrainResult> Train(const config::JobSpec& spec, Backend& backend,
                                  const TrainOptions& options) {
  return TrainRank(spec, RankContext{}, backend, options);
}

namespace {

// The name of this run's checkpoint directories: random, and the same on every rank (rank 0
// draws it and shares it through the rendezvous store).
absl::StatusOr<std::string> SaveToken(const RankContext& rank, int world) {
  if (world > 1 && rank.rank != 0) {
    return rank.store->Get("checkpoint.save_token", rank.gloo.timeout);
  }
  std::random_device random;
  const std::string token =
      absl::StrFormat("%08x", (uint64_t{random()} << 32 | random()) & 0xffffffffu);
  if (world > 1) TY_RETURN_IF_ERROR(rank.store->Set("checkpoint.save_token", token));
  return token;
}

std::string OutcomeLine(const checkpoint::SaveOutcome& o) {
  if (!o.committed) return absl::StrCat("checkpoint step ", o.step, " FAILED: ", o.message);
  std::string line = absl::StrFormat(
      "checkpoint step %d committed: %s (%.1f MiB, training blocked %.1f ms, written in %.2f s)",
      o.step, o.path, o.bytes / 1048576.0, 1e3 * o.blocked_seconds, o.write_seconds);
  // At most one save is in flight: a save that came due during the previous one waited for it.
  if (o.waited_seconds >= 1e-3) {
    absl::StrAppendFormat(&line, "; it waited %.1f ms for the previous save to finish",
                          1e3 * o.waited_seconds);
  }
  return line;
}

// One rank of a training job, from connecting its groups to the last step.
class RankTrainer {
 public:
  RankTrainer(const config::JobSpec& spec, const RankContext& rank, Backend& backend,
              const TrainOptions& options)
      : spec_(spec),
        rank_(rank),
        backend_(backend),
        options_(options),
        fs_(options.fs ? *options.fs : *RealFileSystem()),
        data_fs_(options.data_fs ? *options.data_fs : fs_),
        clock_(options.clock ? *options.clock : *RealClock()),
        out_(rank.rank == 0 ? options.progress : nullptr) {}

  absl::Status Setup();
  absl::Status Restore();
  absl::Status InitializeParameters();
  absl::StatusOr<TrainResult> Run();

 private:
  // Every rank: the full parameters (layout order) into `out`, when it is set (tests).
  absl::Status GatherParametersInto(std::vector<float>* out);
  // The step's passes, queued; the loss stays on the device until OptimizerStep reads it.
  absl::Status ForwardBackward();
  struct OptimizerStepped {
    // The batch's loss over every rank's tokens, and with model.z_loss_coeff > 0 the Σ lse² of
    // its logits (else 0).
    double batch_sums[2] = {0, 0};
    double grad_norm = 0;  // before clipping
    double lr = 0;
    int64_t wait_nanos = 0;  // waiting for the device to finish the passes
  };
  // After the step's last micro-batch: the gradients made final, their squares queued, the
  // step's loss read (one wait for the device, which covers the squares too), the gradients
  // clipped by their global norm, and AdamW's update of this rank's slices at the step's
  // learning rate. The loss sum, this rank's, becomes the batch's in the norm's collectives.
  absl::StatusOr<OptimizerStepped> OptimizerStep();
  absl::Status MoeStep();
  [[nodiscard]] absl::Status AddStepDetail(StepReport& report, int64_t optimizer_nanos);
  std::vector<MoeLayerReport> moe_report_;  // the last step's
  absl::StatusOr<double> SumOverWorld(double value);
  absl::Status SumOverWorld(std::span<double> values);
  // What every rank does after this step, agreed over the world: stop (a drain), and the step
  // of the next ordered checkpoint (rank 0's view of the coordinator's order).
  struct Agreement {
    bool stop = false;
    int64_t checkpoint_at = 0;
    int64_t memory_interval = 1;  // steps between memory snapshots (rank 0's choice)
    // Copy this step's memory snapshot to the peer nodes: no rank's earlier copy is under way.
    bool copy_memory = true;
  };
  // Rank 0's choice of the memory snapshot interval (memory_every_steps, or for `auto` the
  // fewest steps between snapshots that keep their measured cost within
  // config::kMemorySnapshotBudget of the step time).
  int64_t ProposedMemoryInterval(double step_seconds);
  absl::StatusOr<Agreement> Agree(double step_seconds);
  double CollectiveWaitSeconds() const;  // exposed collective waits so far (every axis)
  double WaitSeconds() const;            // those and the pipeline's waits so far
  absl::Status Checkpoint(bool save, bool wait);
  absl::Status Sample();
  // The validation loss of the model as it stands, added to result_.evals.
  absl::Status EvaluateNow();
  // Runs `body` as a phase of the iteration other than the step (see TrainOptions::on_phase):
  // held to that phase's own hang limit, its time left out of the step's, and left by every rank
  // together (a world barrier), so that a rank still in it is not taken for hung by a peer that
  // is back in the step and waits for it in a collective.
  absl::Status InPhase(config::HangPhase phase, const std::function<absl::Status()>& body);
  void LogStep(double loss, double z_loss, double lr, double norm);
  void Finish();

  const config::JobSpec& spec_;
  const RankContext& rank_;
  Backend& backend_;
  const TrainOptions& options_;
  FileSystem& fs_;       // checkpoints
  FileSystem& data_fs_;  // training data
  Clock& clock_;
  std::ostream* out_;

  ParallelDims dims_;
  std::unique_ptr<ParameterLayout> layout_;
  std::unique_ptr<parallel::ShardedParams> params_;
  OptimizerConfig optimizer_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Checkpointer> checkpointer_;
  DataSplits data_;
  std::unique_ptr<BatchSampler> train_sampler_, val_sampler_;
  data::SampleText sample_text_;  // training.sample_tokenizer, on rank 0
  TrainState state_;
  TrainResult result_;

  std::vector<int32_t> inputs_, targets_;
  int64_t stage_transfer_ = 0;  // elements of the residual stream a pipeline stage hands on
  int64_t tokens_per_step_ = 0;
  int64_t train_nanos_ = 0;
  int64_t phase_nanos_ = 0;  // of the running iteration, in InPhase
  int64_t data_nanos_ = 0;   // drawing batches, since the last step's report
  double pipeline_wait_ = 0.0;
  int64_t window_start_ = 0, window_steps_ = 0;
  double step_ema_ = 0.0, memory_cost_ema_ = 0.0;  // seconds (rank 0, for `auto`)
  double memory_cost_seen_ = 0.0;
  // Bytes the data-parallel group sent per collective kind, and the tensor- and pipeline-parallel
  // groups in all.
  struct Traffic {
    std::array<int64_t, static_cast<int>(parallel::CollectiveKind::kCount)> dp{};
    int64_t tp = 0, pp = 0, ep = 0;
  };
  Traffic SentSoFar() const;
  // What the samples' gathers sent (training.sample_every), left out of the run's counts.
  Traffic sample_traffic_;
};

absl::Status RankTrainer::Setup() {
  TY_RETURN_IF_ERROR(PositionOf(spec_, rank_).status());  // the mesh before the data
  const config::TrainingSpec& tr = spec_.training;
  const config::ModelConfig& mc = spec_.model;
  TY_ASSIGN_OR_RETURN(data_, OpenData(spec_.data, data_fs_));
  if (data_.vocab_bound > mc.vocab) {
    return absl::InvalidArgumentError(absl::StrCat("data: tokens reach ", data_.vocab_bound - 1,
                                                   " but model.vocab is ", mc.vocab, " (",
                                                   data_.description, ")"));
  }
  TY_RETURN_IF_ERROR_WITH(BatchSampler::Check(*data_.train, tr.seq_len), "data: training split");
  TY_RETURN_IF_ERROR_WITH(BatchSampler::Check(*data_.val, tr.seq_len), "data: validation split");
  train_sampler_ = std::make_unique<BatchSampler>(*data_.train, tr.seq_len, tr.seed);
  val_sampler_ = std::make_unique<BatchSampler>(*data_.val, tr.seq_len, tr.seed);
  // Every rank reads the samples' tokenizer, so that a bad one fails them all alike; rank 0
  // keeps it.
  TY_ASSIGN_OR_RETURN(sample_text_, data::LoadSampleText(data_fs_, spec_));
  if (rank_.rank != 0) sample_text_ = {};
  TY_ASSIGN_OR_RETURN(dims_, ParallelDims::Connect(spec_, rank_, backend_));
  TY_RETURN_IF_ERROR(config::ValidateModelConfig(mc));
  const config::ParallelismSpec& mesh = spec_.parallelism;
  const int ep_rank = dims_.ep ? dims_.ep->rank() : 0, ep = dims_.ep ? dims_.ep->size() : 1;
  layout_ =
      std::make_unique<ParameterLayout>(mc, dims_.at.tp_rank, mesh.tp, dims_.chunks, ep_rank, ep);
  TY_ASSIGN_OR_RETURN(params_,
                      parallel::ShardedParams::Create(
                          *layout_, &backend_, dims_.dp.get(), dims_.tp.get(), dims_.pp.get(),
                          {.zero_stage = mesh.zero, .bucket_bytes = rank_.bucket_bytes},
                          {.ep = dims_.ep.get(), .edp = dims_.edp.get()}));
  optimizer_ = OptimizerConfigFromSpec(tr);
  // The parameters stay uninitialised until Restore: a restart that finds a checkpoint skips the
  // seed's initialisation (or model.init_from's read) that the checkpoint would overwrite.
  TY_ASSIGN_OR_RETURN(
      model_, Model::Create(mc, &backend_, params_.get(),
                            {.tp = dims_.tp.get(),
                             .cp = dims_.cp.get(),
                             .ep = dims_.ep.get(),
                             .chunks = dims_.chunks,
                             .sequence_parallel = mesh.sequence_parallel,
                             .split_backward = mesh.pp > 1 && SplitsBackward(mesh.schedule)}));
  state_ = TrainState{
      .params = params_.get(), .seed = tr.seed, .global_batch = tr.batch, .seq_len = tr.seq_len};
  inputs_.resize(int64_t{dims_.at.micro} * tr.seq_len);
  targets_.resize(inputs_.size());
  // Pipeline stages exchange the residual stream of a micro-batch: this rank's rows of it under
  // context and sequence parallelism.
  stage_transfer_ = int64_t{dims_.at.micro} * tr.seq_len / mesh.cp /
                    (mesh.sequence_parallel ? mesh.tp : 1) * mc.width;
  tokens_per_step_ = int64_t{tr.batch} * tr.seq_len;
  result_.entropy_nats = data_.entropy_nats;
  result_.parameters = model_->num_params();
  if (out_) {
    *out_ << absl::StrFormat(
                 "model %s: %d layers, width %d, %d heads (%d kv), %.3fM parameters per rank | "
                 "mesh dp %d%s%s x tp %d x pp %d (ZeRO-%d%s) | data %s\n",
                 config::FamilyName(mc.family), mc.layers, mc.width, mc.heads, mc.kv_heads,
                 model_->num_params() / 1e6, mesh.dp,
                 mesh.ep > 1 ? absl::StrCat(" (experts over ep ", mesh.ep, ")") : "",
                 mesh.cp > 1 ? absl::StrCat(" x cp ", mesh.cp) : "", mesh.tp, mesh.pp, mesh.zero,
                 mesh.pp > 1 ? absl::StrCat(", ", config::ScheduleName(mesh.schedule),
                                            mesh.virtual_stages > 1
                                                ? absl::StrCat(" over ", mesh.virtual_stages,
                                                               " virtual stages")
                                                : "")
                             : "",
                 data_.description)
          << std::flush;
  }
  return absl::OkStatus();
}

// Step 0's parameters: the seed's random initialisation, or model.init_from's weights; Restore
// calls it when it finds no checkpoint to resume from.
absl::Status RankTrainer::InitializeParameters() {
  if (spec_.init_from.empty()) {
    params_->Initialize(spec_.training.seed);
    return absl::OkStatus();
  }
  TY_RETURN_IF_ERROR(params_->BeginRestore());
  TY_ASSIGN_OR_RETURN(const std::string loaded,
                      convert::LoadInitFrom(data_fs_, spec_, *layout_,
                                            [&](const ParamTensor& t, const float* local) {
                                              params_->RestoreTensor(0, t, local);
                                            }));
  TY_RETURN_IF_ERROR(params_->FinishRestore());
  if (out_) *out_ << "initialised from " << spec_.init_from << ": " << loaded << "\n";
  return absl::OkStatus();
}

absl::StatusOr<double> RankTrainer::SumOverWorld(double value) {
  TY_ASSIGN_OR_RETURN(value, params_->SumOverRanks(value));
  TY_ASSIGN_OR_RETURN(value, parallel::AllReduceDouble(*dims_.tp, value));
  return parallel::AllReduceDouble(*dims_.pp, value);
}

absl::Status RankTrainer::SumOverWorld(std::span<double> values) {
  TY_RETURN_IF_ERROR(params_->SumOverRanks(values));
  TY_RETURN_IF_ERROR(parallel::AllReduceDoubles(*dims_.tp, values));
  return parallel::AllReduceDoubles(*dims_.pp, values);
}

double RankTrainer::CollectiveWaitSeconds() const {
  return params_->exposed_comm_seconds() + model_->tp_comm_seconds() + model_->cp_comm_seconds() +
         model_->ep_comm_seconds();
}

double RankTrainer::WaitSeconds() const { return CollectiveWaitSeconds() + pipeline_wait_; }

absl::Status RankTrainer::GatherParametersInto(std::vector<float>* out) {
  if (out == nullptr) return absl::OkStatus();
  out->resize(layout_->total());
  return params_->GatherParameters(out->data());
}

absl::Status RankTrainer::Restore() {
  const int world = spec_.world_size();
  TY_ASSIGN_OR_RETURN(std::string token, SaveToken(rank_, world));
  checkpointer_ = std::make_unique<Checkpointer>(
      &fs_, &clock_, spec_, *layout_,
      CheckpointRank{.rank = rank_.rank,
                     .world = world,
                     .tp_rank = dims_.at.tp_rank,
                     .micro_batch = dims_.at.micro},
      std::move(token), [this](std::span<double> v) { return SumOverWorld(v); },
      options_.memory_tier, options_.attempt);
  if (options_.may_commit) checkpointer_->set_commit_guard(options_.may_commit);
  const int64_t start = clock_.NowNanosMonotonic();
  bool from_memory = false;
  TY_ASSIGN_OR_RETURN(const std::optional<std::string> from,
                      checkpointer_->Restore(state_, options_.recorded_checkpoint, &from_memory));
  result_.restore_began_ns = start;
  result_.restore_ended_ns = clock_.NowNanosMonotonic();
  if (!from) {
    TY_RETURN_IF_ERROR(InitializeParameters());
    // A candidate that failed part way may have replaced some moments.
    if (checkpointer_->left_partial_state()) params_->ZeroMoments();
  }
  if (rank_.rank == 0 && options_.on_resumed) {
    options_.on_resumed(ResumeInfo{.step = state_.step,
                                   .from = from.value_or(""),
                                   .from_memory = from_memory,
                                   .restore_seconds = result_.restore_seconds()});
  }
  if (from) {
    result_.first_step = state_.step;
    result_.resumed_from = *from;
    result_.resumed_loss = state_.last_loss;
    if (out_) {
      *out_ << absl::StrFormat("resumed from step %d: %s (restored in %.2f s)\n", state_.step,
                               *from, result_.restore_seconds())
            << std::flush;
    }
  }
  return GatherParametersInto(options_.restored_parameters);
}

absl::Status RankTrainer::ForwardBackward() {
  const int t = spec_.training.seq_len;
  const float grad_scale = 1.0f / static_cast<float>(tokens_per_step_);
  // This rank's share of the global batch: samples [dp_rank·per_rank, (dp_rank+1)·per_rank),
  // the same samples the single-process run draws for those positions.
  auto fill = [&](int i) {
    const int64_t started = clock_.NowNanosMonotonic();
    train_sampler_->FillTrain(
        state_.step, int64_t{dims_.at.dp_rank} * dims_.at.per_rank + int64_t{i} * dims_.at.micro,
        dims_.at.micro, inputs_.data(), targets_.data());
    data_nanos_ += clock_.NowNanosMonotonic() - started;
  };
  if (spec_.parallelism.pp == 1) {
    for (int i = 0; i < dims_.at.micro_batches; ++i) {
      params_->SetLastMicroBatch(i + 1 == dims_.at.micro_batches);
      fill(i);
      TY_RETURN_IF_ERROR(model_->StageForward({}, inputs_.data(), targets_.data(), dims_.at.micro,
                                              t, nullptr, grad_scale, nullptr));
      TY_RETURN_IF_ERROR(model_->StageBackward({}, nullptr, nullptr));
    }
    return absl::OkStatus();
  }
  const ScheduleShape shape{.schedule = spec_.parallelism.schedule,
                            .stages = spec_.parallelism.pp,
                            .micro_batches = dims_.at.micro_batches,
                            .virtual_stages = spec_.parallelism.virtual_stages};
  StageWork work;
  work.run = [&](const Pass& pass, int slot, const Act* in, Act* out) -> absl::Status {
    if (ComputesWeightGradients(shape, dims_.at.pp_rank, pass)) {
      params_->SetLastMicroBatch(pass.micro_batch + 1 == dims_.at.micro_batches);
    }
    const StageSlot at{.chunk = pass.chunk, .slot = slot};
    if (pass.kind == PassKind::kBackward) return model_->StageBackward(at, in, out);
    if (pass.kind == PassKind::kWeight) return model_->StageWeightGradients(at);
    fill(pass.micro_batch);
    return model_->StageForward(at, inputs_.data(), targets_.data(), dims_.at.micro, t, in,
                                grad_scale, out);
  };
  ScheduleStats schedule;
  TY_RETURN_IF_ERROR(RunSchedule(*dims_.pp, backend_, shape, stage_transfer_, work, &schedule));
  pipeline_wait_ += schedule.wait_seconds;
  return absl::OkStatus();
}

absl::StatusOr<RankTrainer::OptimizerStepped> RankTrainer::OptimizerStep() {
  TY_RETURN_IF_ERROR(params_->FinishGradients(dims_.tied.get()));
  OptimizerStepped stepped;
  params_->QueueGradientSquares();
  const int64_t wait_start = clock_.NowNanosMonotonic();
  const bool z_loss = spec_.model.z_loss_coeff > 0.0f;
  TY_ASSIGN_OR_RETURN(stepped.batch_sums[0], model_->TakeTrainingLoss());
  if (z_loss) {
    TY_ASSIGN_OR_RETURN(stepped.batch_sums[1], model_->TakeLogitSquares());
  }
  stepped.wait_nanos = clock_.NowNanosMonotonic() - wait_start;
  // Only the last pipeline stage computes the loss; the pipeline's sum gives every stage it. The
  // logits' Σ lse² rides along with a z-loss.
  TY_ASSIGN_OR_RETURN(stepped.grad_norm,
                      params_->GradientNorm(std::span(stepped.batch_sums).first(z_loss ? 2 : 1)));
  stepped.lr = AdamWStep(backend_, optimizer_, state_.step,
                         ClipScale(optimizer_, stepped.grad_norm), params_->OptimizerSlices());
  TY_RETURN_IF_ERROR(MoeStep());
  TY_RETURN_IF_ERROR(params_->FinishUpdate());
  return stepped;
}

// The step's routing in the MoE layers, summed over the data-parallel group (every rank of it
// holds the same layers); under the bias rule, each selection bias moved by its layer's loads,
// on the slices this rank updates (before they are reassembled).
// Where the step's time went (the passes, the optimizer, the data) and its MoE routing.
absl::Status RankTrainer::AddStepDetail(StepReport& report, int64_t optimizer_nanos) {
  report.tokens_per_second = tokens_per_step_ / std::max(report.step_seconds, 1e-9);
  TY_ASSIGN_OR_RETURN(const Model::PhaseSeconds passes, model_->TakePhaseSeconds());
  report.forward_seconds = passes.forward;
  report.backward_seconds = passes.backward;
  report.optimizer_seconds = optimizer_nanos / 1e9;
  report.data_seconds = std::exchange(data_nanos_, 0) / 1e9;
  report.moe = moe_report_;
  return absl::OkStatus();
}

absl::Status RankTrainer::MoeStep() {
  const config::MoeConfig& moe = spec_.model.moe;
  if (!moe.enabled()) return absl::OkStatus();
  std::vector<Model::MoeLayerStats> stats = model_->TakeMoeStats();
  // Per MoE layer of the model: picks per expert, drops, Σ aux · tokens, tokens, the bias
  // spread, the exchanges and Σ z-loss · tokens; zeros for layers other stages hold. Summed over
  // the data-parallel group (its context-parallel ranks too), then over the pipeline (each layer on
  // one stage; the bias spread summed only over the latter). The exchanges' bytes and seconds are
  // means over the group.
  const size_t per_layer = moe.experts + 7;
  const int layers = spec_.model.layers;
  std::vector<double> sums(layers * per_layer, 0.0), spreads(layers, 0.0);
  for (const Model::MoeLayerStats& s : stats) {
    double* at = &sums[s.layer * per_layer];
    for (int e = 0; e < moe.experts; ++e) at[e] = static_cast<double>(s.picks[e]);
    at[moe.experts] = static_cast<double>(s.dropped);
    at[moe.experts + 1] = s.aux_loss;
    at[moe.experts + 2] = static_cast<double>(s.tokens);
    at[moe.experts + 4] = static_cast<double>(s.exchange_bytes);
    at[moe.experts + 5] = s.exchange_seconds;
    at[moe.experts + 6] = s.z_loss;
    spreads[s.layer] = s.bias_spread;  // the same on every data-parallel rank
  }
  TY_RETURN_IF_ERROR(params_->SumOverRanks(sums));
  const double data_ranks = spec_.parallelism.dp * spec_.parallelism.cp;
  for (int l = 0; l < layers; ++l) sums[l * per_layer + moe.experts + 3] = spreads[l];
  TY_RETURN_IF_ERROR(parallel::AllReduceDoubles(*dims_.pp, sums));
  moe_report_.clear();
  for (int l = 0; l < layers; ++l) {
    if (!moe.IsMoeLayer(l)) continue;
    const double* at = &sums[l * per_layer];
    MoeLayerReport& r = moe_report_.emplace_back();
    r.layer = l;
    for (int e = 0; e < moe.experts; ++e) r.tokens_per_expert.push_back(std::llround(at[e]));
    r.dropped = std::llround(at[moe.experts]);
    r.aux_loss = at[moe.experts + 2] > 0 ? at[moe.experts + 1] / at[moe.experts + 2] : 0.0;
    r.z_loss = at[moe.experts + 2] > 0 ? at[moe.experts + 6] / at[moe.experts + 2] : 0.0;
    r.bias_spread = at[moe.experts + 3];
    r.all_to_all_bytes = at[moe.experts + 4] / data_ranks;
    r.all_to_all_seconds = at[moe.experts + 5] / data_ranks;
  }
  if (result_.moe_routing.empty()) {
    for (const Model::MoeLayerStats& s : stats) {
      result_.moe_routing.push_back({s.layer, std::vector<int64_t>(moe.experts)});
    }
  }
  for (Model::MoeLayerStats& run : result_.moe_routing) {
    const double* at = &sums[run.layer * per_layer];
    for (int e = 0; e < moe.experts; ++e) run.picks[e] += std::llround(at[e]);
    run.dropped += std::llround(at[moe.experts]);
    run.aux_loss += at[moe.experts + 1];
    run.z_loss += at[moe.experts + 6];
    run.tokens += std::llround(at[moe.experts + 2]);
    run.bias_spread = at[moe.experts + 3];
    run.exchange_bytes += std::llround(at[moe.experts + 4] / data_ranks);
    run.exchange_seconds += at[moe.experts + 5] / data_ranks;
  }
  if (!moe.has_bias()) return absl::OkStatus();
  for (const OptimizerSlice& slice : params_->OptimizerSlices()) {
    if (slice.tensor == nullptr || slice.tensor->trainable) continue;
    for (size_t i = 0; i < stats.size(); ++i) {
      if (layout_->block(stats[i].layer).router_bias != slice.tensor->offset) continue;
      const std::vector<float> delta =
          BiasUpdate(moe, std::span<const double>(&sums[stats[i].layer * per_layer],
                                                  static_cast<size_t>(moe.experts)));
      std::vector<float> bias(slice.n);
      backend_.CopyToHost(bias.data(), slice.param, slice.n);
      for (int64_t j = 0; j < slice.n; ++j) bias[j] += delta[slice.first + j];
      backend_.CopyFromHost(slice.param, bias.data(), slice.n);
    }
  }
  return absl::OkStatus();
}

// Every rank stops at the same step boundary: a stop asked of any rank (a signal, a drain order)
// is summed over the world after every step, and so is the ordered checkpoint step, to which
// only rank 0 contributes.
int64_t RankTrainer::ProposedMemoryInterval(double step_seconds) {
  const std::optional<int64_t>& every = spec_.fault_tolerance.memory_every_steps;
  if (every) return *every;
  auto smooth = [](double& ema, double value) {
    ema = ema == 0.0 ? value : 0.8 * ema + 0.2 * value;
  };
  smooth(step_ema_, step_seconds);
  const double cost = checkpointer_->memory_cost_seconds();
  if (cost != memory_cost_seen_) {  // a snapshot completed since
    memory_cost_seen_ = cost;
    smooth(memory_cost_ema_, cost);
  }
  if (memory_cost_ema_ == 0.0 || step_ema_ <= 0.0) return 1;  // measure first
  const double steps = memory_cost_ema_ / (config::kMemorySnapshotBudget * step_ema_);
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(steps)), 1, 10000);
}

absl::StatusOr<RankTrainer::Agreement> RankTrainer::Agree(double step_seconds) {
  const bool stop = options_.stop_requested != nullptr && options_.stop_requested->load();
  const int64_t order = options_.checkpoint_order != nullptr && rank_.rank == 0
                            ? options_.checkpoint_order->load()
                            : 0;
  const int64_t interval = rank_.rank == 0 ? ProposedMemoryInterval(step_seconds) : 0;
  if (spec_.world_size() == 1) return Agreement{stop, order, interval};
  if (options_.checkpoint_order == nullptr) {
    TY_ASSIGN_OR_RETURN(const double asked, SumOverWorld(stop ? 1.0 : 0.0));
    return Agreement{asked > 0, 0, 0};  // (no coordinator, no memory tier)
  }
  // Only rank 0 votes for the checkpoint order and the snapshot interval: every rank then
  // saves at the same steps. Every rank votes against copying the snapshot while its agent may
  // still copy an earlier one, so that every node copies the same steps.
  const bool copy_pending = checkpointer_->MemoryCopyPending();
  double votes[4] = {stop ? 1.0 : 0.0, static_cast<double>(order), static_cast<double>(interval),
                     copy_pending ? 1.0 : 0.0};
  TY_RETURN_IF_ERROR(SumOverWorld(votes));
  return Agreement{votes[0] > 0, std::llround(votes[1]), std::llround(votes[2]), votes[3] == 0};
}

// Saves when `save` (waiting for the commit when `wait`), and reports the saves that ended.
absl::Status RankTrainer::Checkpoint(bool save, bool wait) {
  absl::Status saved = save ? checkpointer_->Save(state_) : absl::OkStatus();
  if (!saved.ok()) {
    TY_LOG(WARNING) << "checkpoint of step " << state_.step << " not taken: " << saved.message();
  }
  if (wait) (void)checkpointer_->Wait();  // a failure is reported as an outcome below
  for (const checkpoint::SaveOutcome& outcome : checkpointer_->TakeOutcomes()) {
    if (rank_.rank != 0) continue;  // rank 0 reports every save, including other ranks' failures
    if (out_) *out_ << OutcomeLine(outcome) << "\n" << std::flush;
    if (options_.on_checkpoint) options_.on_checkpoint(outcome);
  }
  return absl::OkStatus();
}

absl::Status RankTrainer::EvaluateNow() {
  const config::TrainingSpec& tr = spec_.training;
  const EvalShare share{.eval_batches = tr.eval_batches,
                        .global_batch = tr.batch,
                        .dp_rank = dims_.at.dp_rank,
                        .per_rank = dims_.at.per_rank,
                        .micro = dims_.at.micro};
  TY_ASSIGN_OR_RETURN(const double val, Evaluate(*model_, backend_, *dims_.dp, *dims_.pp,
                                                 spec_.parallelism.virtual_stages, *val_sampler_,
                                                 share, stage_transfer_));
  result_.evals.push_back({state_.step, val});
  return absl::OkStatus();
}

absl::Status RankTrainer::InPhase(config::HangPhase phase,
                                  const std::function<absl::Status()>& body) {
  const int64_t start = clock_.NowNanosMonotonic();
  HangWatchdog* const watchdog = options_.watchdog;
  if (watchdog != nullptr) {
    const double limit_s = watchdog->PhaseStarted(phase);
    if (options_.on_phase) options_.on_phase(phase, limit_s, state_.step);
  }
  if (const double slow_s = options_.slow_phase_s[static_cast<int>(phase)]; slow_s > 0) {
    clock_.SleepFor(absl::Seconds(slow_s));
  }
  absl::Status status = body();
  if (status.ok() && watchdog != nullptr && spec_.world_size() > 1) {
    status = SumOverWorld(0.0).status();
  }
  if (watchdog != nullptr) watchdog->PhaseFinished();
  phase_nanos_ += clock_.NowNanosMonotonic() - start;
  return status;
}

// training.sample_every: rank 0 continues the prompt with the model as it stands.
absl::Status RankTrainer::Sample() {
  // Its traffic is not training's: the run's byte counts leave it out.
  const Traffic before = SentSoFar();
  absl::StatusOr<std::vector<float>> gathered =
      GatherWholeModel(spec_, dims_, *layout_, *params_, backend_);
  const Traffic after = SentSoFar();
  for (size_t k = 0; k < after.dp.size(); ++k) sample_traffic_.dp[k] += after.dp[k] - before.dp[k];
  sample_traffic_.tp += after.tp - before.tp;
  sample_traffic_.pp += after.pp - before.pp;
  sample_traffic_.ep += after.ep - before.ep;
  TY_ASSIGN_OR_RETURN(std::vector<float> whole, std::move(gathered));
  if (rank_.rank != 0) return absl::OkStatus();
  const config::TrainingSpec& tr = spec_.training;
  TY_ASSIGN_OR_RETURN(std::unique_ptr<Generator> generator,
                      Generator::Create(spec_.model, &backend_, whole.data()));
  whole = {};
  SamplePoint sample{.step = state_.step,
                     .prompt = sample_text_.prompt.empty() ? SamplePrompt(tr, *val_sampler_)
                                                           : sample_text_.prompt};
  TY_ASSIGN_OR_RETURN(sample.tokens,
                      generator->Generate(sample.prompt, SampleOptionsAt(tr, state_.step)));
  if (out_) {
    *out_ << SampleLine(sample.step, sample.prompt, sample.tokens, spec_.model.vocab,
                        sample_text_.tokenizer.get())
          << "\n"
          << std::flush;
  }
  result_.samples.push_back(std::move(sample));
  return absl::OkStatus();
}

void RankTrainer::LogStep(double loss, double z_loss, double lr, double norm) {
  const int64_t steps = spec_.training.steps;
  const bool last = state_.step == steps;
  const int64_t every = spec_.training.log_every;
  if (!out_ || !(last || (every > 0 && state_.step % every == 0))) return;
  const double window_s = (clock_.NowNanosMonotonic() - window_start_) / 1e9;
  const std::string z =
      spec_.model.z_loss_coeff > 0.0f ? absl::StrFormat(" | z-loss %.3g", z_loss) : "";
  *out_ << absl::StrFormat(
               "step %*d/%d | loss %.4f%s | lr %.2e | grad norm %.3f | %.0f tok/s | %.1f ms/step\n",
               static_cast<int>(std::to_string(steps).size()), state_.step, steps, loss, z, lr,
               norm, window_steps_ * tokens_per_step_ / std::max(window_s, 1e-9),
               1e3 * window_s / std::max<int64_t>(window_steps_, 1))
        << std::flush;
  window_start_ = clock_.NowNanosMonotonic();
  window_steps_ = 0;
}

absl::StatusOr<TrainResult> RankTrainer::Run() {
  const config::TrainingSpec& tr = spec_.training;
  window_start_ = clock_.NowNanosMonotonic();
  HangWatchdog* const watchdog = options_.watchdog;
  const bool ordered = options_.checkpoint_order != nullptr && !spec_.checkpoint.every_steps;
  while (state_.step < tr.steps) {
    if (options_.stop_after_step > 0 && state_.step >= options_.stop_after_step) break;
    const int64_t start = clock_.NowNanosMonotonic();
    phase_nanos_ = 0;
    const double wait_before = WaitSeconds();
    if (watchdog != nullptr) watchdog->StepStarted(state_.step);
    if (options_.spin_at_step > 0 && state_.step == options_.spin_at_step &&
        rank_.rank == options_.spin_rank) {
      TY_LOG(WARNING) << "fault injection: step " << state_.step + 1 << " spins forever";
      volatile uint64_t spins = 0;
      for (;;) spins = spins + 1;
    }
    TY_RETURN_IF_ERROR(params_->BeginStep());
    TY_RETURN_IF_ERROR(ForwardBackward());
    const int64_t optimizer_start = clock_.NowNanosMonotonic();
    TY_ASSIGN_OR_RETURN(const OptimizerStepped stepped, OptimizerStep());
    const double norm = stepped.grad_norm, lr = stepped.lr;
    const int64_t optimizer_nanos =
        clock_.NowNanosMonotonic() - optimizer_start - stepped.wait_nanos;
    const double loss = stepped.batch_sums[0] / static_cast<double>(tokens_per_step_);
    const double z_loss =
        spec_.model.z_loss_coeff * stepped.batch_sums[1] / static_cast<double>(tokens_per_step_);
    ++state_.step;
    state_.last_loss = loss;
    if (!std::isfinite(loss)) {
      return absl::InternalError(
          absl::StrCat("training diverged: loss is ", loss, " at step ", state_.step));
    }
    const int64_t step_nanos = clock_.NowNanosMonotonic() - start;
    result_.train_losses.push_back(loss);
    if (spec_.model.z_loss_coeff > 0.0f) result_.train_z_losses.push_back(z_loss);
    result_.grad_norms.push_back(norm);
    result_.step_seconds.push_back(step_nanos / 1e9);
    train_nanos_ += step_nanos;
    ++window_steps_;
    LogStep(loss, z_loss, lr, norm);

    const bool last = state_.step == tr.steps;
    StepReport report{.step = state_.step,
                      .total_steps = tr.steps,
                      .loss = loss,
                      .z_loss = z_loss,
                      .learning_rate = lr,
                      .grad_norm = norm,
                      .step_seconds = step_nanos / 1e9,
                      .wait_seconds = WaitSeconds() - wait_before};
    TY_RETURN_IF_ERROR(AddStepDetail(report, optimizer_nanos));
    if (tr.eval_every > 0 && (last || state_.step % tr.eval_every == 0)) {
      TY_RETURN_IF_ERROR(InPhase(config::HangPhase::kEvaluation, [&] { return EvaluateNow(); }));
      report.val_loss = result_.evals.back().loss;
      if (out_) *out_ << EvalLine(result_.evals.back(), data_.entropy_nats) << "\n" << std::flush;
      window_start_ = clock_.NowNanosMonotonic();
    }
    if (tr.sample_every > 0 && (last || state_.step % tr.sample_every == 0)) {
      TY_RETURN_IF_ERROR(InPhase(config::HangPhase::kSampling, [&] { return Sample(); }));
      window_start_ = clock_.NowNanosMonotonic();
    }
    TY_ASSIGN_OR_RETURN(const Agreement agreed, Agree(report.step_seconds));
    const bool stopping = agreed.stop && !last;
    const bool due =
        ordered ? spec_.checkpoint.enabled() && (last || state_.step == agreed.checkpoint_at)
                : checkpointer_->Due(state_, tr.steps);
    const bool save = due || (stopping && spec_.checkpoint.enabled());
    if (watchdog != nullptr && save && (last || stopping)) watchdog->Suspend();
    // Every rank agrees on `save` (a phase's barrier needs them all); a memory snapshot, a copy
    // within the node that a rank may skip after failures of its own, stays in the step.
    const auto checkpoint = [&] { return Checkpoint(save, /*wait=*/save && (last || stopping)); };
    TY_RETURN_IF_ERROR(save ? InPhase(config::HangPhase::kCheckpoint, checkpoint) : checkpoint());
    if (!stopping && checkpointer_->MemoryDue(state_, tr.steps, agreed.memory_interval)) {
      if (absl::Status s = checkpointer_->SaveToMemory(state_, agreed.copy_memory); !s.ok()) {
        TY_LOG(WARNING) << "memory snapshot of step " << state_.step
                        << " not taken: " << s.message();
      }
    }
    report.iteration_seconds = (clock_.NowNanosMonotonic() - start - phase_nanos_) / 1e9;
    if (options_.on_step) TY_RETURN_IF_ERROR(options_.on_step(report));
    if (watchdog != nullptr) watchdog->StepFinished();
    if (stopping) {
      result_.drained = true;
      if (out_) *out_ << "drained at step " << state_.step << "\n" << std::flush;
      break;
    }
  }
  if (watchdog != nullptr) watchdog->Suspend();
  TY_RETURN_IF_ERROR(Checkpoint(/*save=*/false, /*wait=*/true));  // the save still in flight
  Finish();
  TY_RETURN_IF_ERROR(GatherParametersInto(options_.final_parameters));
  return std::move(result_);
}

RankTrainer::Traffic RankTrainer::SentSoFar() const {
  Traffic sent;
  for (size_t k = 0; k < sent.dp.size(); ++k) {
    // The routed experts' reductions (expert parallelism) count as data-parallel traffic.
    const auto kind = static_cast<parallel::CollectiveKind>(k);
    sent.dp[k] =
        dims_.dp->stats().bytes_sent(kind) + (dims_.edp ? dims_.edp->stats().bytes_sent(kind) : 0);
  }
  sent.tp = dims_.tp->stats().total();
  sent.pp = dims_.pp->stats().total();
  sent.ep = dims_.ep ? dims_.ep->stats().total() : 0;
  return sent;
}

void RankTrainer::Finish() {
  const int64_t steps = static_cast<int64_t>(result_.train_losses.size());
  const double train_s = train_nanos_ / 1e9;
  result_.tokens_per_second = train_nanos_ > 0 ? steps * tokens_per_step_ / train_s : 0.0;
  result_.pipeline_wait_fraction = train_nanos_ > 0 ? pipeline_wait_ / train_s : 0.0;
  result_.train_seconds = train_s;
  result_.pipeline_wait_seconds = pipeline_wait_;
  result_.exposed_comm_seconds = CollectiveWaitSeconds();
  static_cast<parallel::MemoryAccount&>(result_.memory) = params_->memory();
  result_.memory.activations = model_->activation_bytes();
  const Traffic sent = SentSoFar();
  for (int k = 0; k < static_cast<int>(parallel::CollectiveKind::kCount); ++k) {
    result_.bytes_sent[k] = sent.dp[k] - sample_traffic_.dp[k];
  }
  result_.tp_bytes_sent = sent.tp - sample_traffic_.tp;
  result_.pp_bytes_sent = sent.pp - sample_traffic_.pp;
  result_.cp_bytes_sent = dims_.cp->stats().total();
  result_.ep_bytes_sent = sent.ep - sample_traffic_.ep;
  if (dims_.tied) result_.pp_bytes_sent += dims_.tied->stats().total();
  result_.overlap = params_->timeline();
}

}  // namespace

absl::StatusOr<TrainResult> TrainRank(const config::JobSpec& spec, const RankContext& rank,
                                      Backend& backend, const TrainOptions& options) {
  RankTrainer trainer(spec, rank, backend, options);
  TY_RETURN_IF_ERROR(trainer.Setup());
  TY_RETURN_IF_ERROR(trainer.Restore());
  return trainer.Run();
}

}  // namespace trainyard::worker
