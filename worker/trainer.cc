#include "worker/trainer.h"

#ifdef TRAINYARD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/dist/cuda_device_copier.h"
#include "worker/dist/nccl_communicator.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "config/mesh.h"
#include "worker/cuda_backend.h"
#include "worker/data/dataset.h"
#include "worker/data/sampler.h"
#include "worker/dist/communicator.h"
#include "worker/dist/sharded_params.h"
#include "worker/dist/staging_communicator.h"
#include "worker/model.h"
#include "worker/parameters.h"
#include "worker/pipeline.h"

namespace trainyard::worker {

OptimizerConfig OptimizerConfigFromSpec(const config::TrainingSpec& t) {
  OptimizerConfig c;
  c.lr = t.lr;
  c.min_lr_ratio = t.min_lr_ratio;
  c.warmup_steps = t.warmup_steps;
  c.total_steps = t.steps;
  c.schedule = t.schedule == "linear"     ? LrSchedule::kLinear
               : t.schedule == "constant" ? LrSchedule::kConstant
                                          : LrSchedule::kCosine;
  c.weight_decay = t.weight_decay;
  c.beta1 = t.beta1;
  c.beta2 = t.beta2;
  c.eps = t.eps;
  c.grad_clip = t.grad_clip;
  return c;
}

namespace {

// Mean validation loss over eval_batches batches of micro_batch windows. With pipeline stages,
// activations are handed forward stage by stage and the last stage's loss is shared.
absl::StatusOr<double> Evaluate(Model& model, Backend& backend, dist::Communicator& pp,
                                const BatchSampler& sampler, int micro_batch, int eval_batches,
                                int64_t transfer_count) {
  const int t = sampler.seq_len();
  const bool first = pp.rank() == 0, last = pp.rank() == pp.size() - 1;
  std::vector<int32_t> inputs(int64_t{micro_batch} * t), targets(inputs.size());
  const DType dtype = backend.act_dtype();
  Buffer<Act> in = first ? Buffer<Act>() : backend.AllocAct(transfer_count);
  Buffer<Act> out = last ? Buffer<Act>() : backend.AllocAct(transfer_count);
  double total = 0.0;
  for (int i = 0; i < eval_batches; ++i) {
    sampler.FillEval(i, micro_batch, inputs.data(), targets.data());
    constexpr uint32_t kEvalTag = 1u << 30;
    if (!first) {
      TY_RETURN_IF_ERROR(pp.Recv(in.data(), in.size(), dtype, pp.rank() - 1, kEvalTag + i));
    }
    TY_ASSIGN_OR_RETURN(double loss, model.StageLoss(inputs.data(), targets.data(), micro_batch, t,
                                                     in.data(), out.data()));
    if (!last) {
      TY_RETURN_IF_ERROR(pp.Send(out.data(), out.size(), dtype, pp.rank() + 1, kEvalTag + i));
    }
    total += loss;
  }
  TY_ASSIGN_OR_RETURN(total, dist::AllReduceDouble(pp, total));
  return total / (static_cast<double>(eval_batches) * micro_batch * t);
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
  if (result.train_losses.empty()) return "done: 0 steps";
  std::string line = absl::StrFormat("done: %d steps | final train loss %.4f",
                                     result.train_losses.size(), result.train_losses.back());
  if (!result.evals.empty())
    absl::StrAppendFormat(&line, " | val loss %.4f", result.evals.back().loss);
  if (result.entropy_nats)
    absl::StrAppendFormat(&line, " | data entropy %.4f", *result.entropy_nats);
  std::vector<double> times = result.step_seconds;
  std::sort(times.begin(), times.end());
  absl::StrAppendFormat(&line, " | %.0f tok/s | median step %.2f ms | exact final loss %a",
                        result.tokens_per_second, 1e3 * times[times.size() / 2],
                        result.train_losses.back());
  return line;
}

absl::StatusOr<TrainResult> Train(const config::JobSpec& spec, Backend& backend,
                                  const TrainOptions& options) {
  return TrainRank(spec, RankContext{}, backend, options);
}

absl::StatusOr<TrainResult> TrainRank(const config::JobSpec& spec, const RankContext& rank,
                                      Backend& backend, const TrainOptions& options) {
  FileSystem& fs = options.fs ? *options.fs : *RealFileSystem();
  Clock& clock = options.clock ? *options.clock : *RealClock();
  const config::TrainingSpec& tr = spec.training;
  const config::ParallelismSpec& mesh = spec.parallelism;
  if (mesh.pp > spec.model.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.pp: ", mesh.pp, " stages for ", spec.model.layers, " layers"));
  }
  const int world = mesh.world_size();
  if (rank.rank < 0 || rank.rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank.rank, " outside a world of ", world, " ranks"));
  }
  if (world > 1 && rank.store == nullptr) {
    return absl::InvalidArgumentError("a multi-rank job needs a rendezvous store");
  }
  const int micro = config::MicroBatchPerRank(tr, mesh);
  const int per_rank = tr.batch / mesh.dp;
  // Mesh coordinates, tensor-parallel innermost: rank = (pp_rank · dp + dp_rank) · tp + tp_rank.
  const int tp_rank = rank.rank % mesh.tp;
  const int dp_rank = rank.rank / mesh.tp % mesh.dp;
  const int pp_rank = rank.rank / (mesh.tp * mesh.dp);
  const int micro_batches = per_rank / micro;
  const int t = tr.seq_len;

  TY_ASSIGN_OR_RETURN(DataSplits data, OpenData(spec.data, fs));
  if (data.vocab_bound > spec.model.vocab) {
    return absl::InvalidArgumentError(absl::StrCat("data: tokens reach ", data.vocab_bound - 1,
                                                   " but model.vocab is ", spec.model.vocab, " (",
                                                   data.description, ")"));
  }
  TY_RETURN_IF_ERROR_WITH(BatchSampler::Check(*data.train, t), "data: training split");
  TY_RETURN_IF_ERROR_WITH(BatchSampler::Check(*data.val, t), "data: validation split");
  const BatchSampler train_sampler(*data.train, t, tr.seed);
  const BatchSampler val_sampler(*data.val, t, tr.seed);

  // One process group per mesh axis: the ranks that differ from this one in that coordinate
  // only.
  // On a GPU backend, collectives must reach device memory: through NCCL, or through Gloo with
  // host staging (the default, and the only way for ranks sharing one GPU).
  void* const device_stream = CudaStreamOf(backend);
  RankContext::Collectives collectives = rank.collectives;
  if (device_stream != nullptr && collectives == RankContext::Collectives::kHost) {
    collectives = RankContext::Collectives::kStaged;
  }
  if (device_stream == nullptr && collectives != RankContext::Collectives::kHost) {
    return absl::FailedPreconditionError("staged and NCCL collectives need the CUDA backend");
  }
  auto connect = [&](const std::string& group, int index,
                     int size) -> absl::StatusOr<std::unique_ptr<dist::Communicator>> {
#ifdef TRAINYARD_HAVE_CUDA
    auto* stream = static_cast<cudaStream_t>(device_stream);
    if (collectives == RankContext::Collectives::kNccl && size > 1) {
      return dist::ConnectNccl(*rank.store, group, index, size, stream, rank.gloo.timeout);
    }
#endif
    std::unique_ptr<dist::Communicator> host;
    if (size == 1) {
      host = dist::MakeSelfCommunicator();
    } else {
      TY_ASSIGN_OR_RETURN(host, dist::ConnectGloo(*rank.store, group, index, size, rank.gloo));
    }
    if (collectives == RankContext::Collectives::kHost) return host;
#ifdef TRAINYARD_HAVE_CUDA
    return dist::MakeStagingCommunicator(std::move(host), dist::MakeCudaDeviceCopier(stream));
#else
    return absl::FailedPreconditionError("this build has no CUDA support");
#endif
  };
  TY_ASSIGN_OR_RETURN(std::unique_ptr<dist::Communicator> dp_comm,
                      connect(absl::StrCat("dp.tp", tp_rank, ".pp", pp_rank), dp_rank, mesh.dp));
  TY_ASSIGN_OR_RETURN(std::unique_ptr<dist::Communicator> tp_comm,
                      connect(absl::StrCat("tp.dp", dp_rank, ".pp", pp_rank), tp_rank, mesh.tp));
  TY_ASSIGN_OR_RETURN(std::unique_ptr<dist::Communicator> pp_comm,
                      connect(absl::StrCat("pp.dp", dp_rank, ".tp", tp_rank), pp_rank, mesh.pp));
  const config::ModelConfig& mc = spec.model;
  TY_RETURN_IF_ERROR(config::ValidateModelConfig(mc));
  const PipelineStage stage = BalanceStages(mc, t, mesh.pp)[pp_rank];
  // The first and last stages both hold a tied embedding: a group of those two.
  std::unique_ptr<dist::Communicator> tied_comm;
  if (mesh.pp > 1 && mc.tied_embeddings && (stage.first || stage.last)) {
    TY_ASSIGN_OR_RETURN(tied_comm, connect(absl::StrCat("tie.dp", dp_rank, ".tp", tp_rank),
                                           stage.first ? 0 : 1, 2));
  }
  const ParameterLayout layout(mc, tp_rank, mesh.tp, stage);  // the same layout the model builds
  TY_ASSIGN_OR_RETURN(
      std::unique_ptr<dist::ShardedParams> params,
      dist::ShardedParams::Create(layout, &backend, dp_comm.get(), tp_comm.get(), pp_comm.get(),
                                  {.zero_stage = mesh.zero, .bucket_bytes = rank.bucket_bytes},
                                  OptimizerConfigFromSpec(tr)));
  params->Initialize(tr.seed);
  TY_ASSIGN_OR_RETURN(
      std::unique_ptr<Model> model,
      Model::Create(mc, &backend, params.get(), tp_comm.get(), stage, mesh.sequence_parallel));

  TrainResult result;
  result.entropy_nats = data.entropy_nats;
  result.parameters = model->num_params();
  std::ostream* out = rank.rank == 0 ? options.progress : nullptr;
  if (out) {
    *out << absl::StrFormat(
                "model %s: %d layers, width %d, %d heads (%d kv), %.3fM parameters per rank | "
                "mesh dp %d x tp %d x pp %d (ZeRO-%d) | data %s\n",
                config::FamilyName(mc.family), mc.layers, mc.width, mc.heads, mc.kv_heads,
                model->num_params() / 1e6, mesh.dp, mesh.tp, mesh.pp, mesh.zero, data.description)
         << std::flush;
  }

  std::vector<int32_t> inputs(int64_t{micro} * t), targets(inputs.size());
  // Pipeline stages exchange the residual stream of a micro-batch: this rank's rows of it under
  // sequence parallelism.
  const int64_t stage_transfer =
      int64_t{micro} * t / (mesh.sequence_parallel ? mesh.tp : 1) * mc.width;
  const int64_t tokens_per_step = int64_t{tr.batch} * t;
  const float grad_scale = 1.0f / static_cast<float>(tokens_per_step);
  int64_t train_nanos = 0;
  double pipeline_wait = 0.0;
  int64_t window_start = clock.NowNanosMonotonic(), window_steps = 0;
  for (int64_t step = 0; step < tr.steps; ++step) {
    const int64_t start = clock.NowNanosMonotonic();
    double loss_sum = 0.0;
    TY_RETURN_IF_ERROR(params->BeginStep());
    // This rank's share of the global batch: samples [dp_rank·per_rank, (dp_rank+1)·per_rank),
    // the same samples the single-process run draws for those positions.
    auto fill = [&](int i) {
      train_sampler.FillTrain(step, int64_t{dp_rank} * per_rank + int64_t{i} * micro, micro,
                              inputs.data(), targets.data());
    };
    if (mesh.pp == 1) {
      for (int i = 0; i < micro_batches; ++i) {
        params->SetLastMicroBatch(i + 1 == micro_batches);
        fill(i);
        TY_ASSIGN_OR_RETURN(double loss, model->ForwardBackward(inputs.data(), targets.data(),
                                                                micro, t, grad_scale));
        loss_sum += loss;
      }
    } else {
      StageWork work;
      work.forward = [&](int i, int slot, const Act* in, Act* out_acts) -> absl::Status {
        fill(i);
        // The last stage runs the micro-batch's backward here too.
        if (stage.last) params->SetLastMicroBatch(i + 1 == micro_batches);
        double loss = 0.0;
        TY_RETURN_IF_ERROR(model->StageForward(slot, inputs.data(), targets.data(), micro, t, in,
                                               grad_scale, &loss, out_acts));
        loss_sum += loss;
        return absl::OkStatus();
      };
      work.backward = [&](int i, int slot, const Act* dout, Act* din) -> absl::Status {
        if (!stage.last) params->SetLastMicroBatch(i + 1 == micro_batches);
        return model->StageBackward(slot, dout, din);
      };
      ScheduleStats schedule;
      TY_RETURN_IF_ERROR(RunOneForwardOneBackward(*pp_comm, backend, micro_batches, stage_transfer,
                                                  work, &schedule));
      pipeline_wait += schedule.wait_seconds;
    }
    double lr = 0.0;
    TY_ASSIGN_OR_RETURN(const double norm, params->FinishStep(step, &lr, tied_comm.get()));
    TY_ASSIGN_OR_RETURN(loss_sum, params->SumOverRanks(loss_sum));
    // Only the last pipeline stage computes the loss; every stage reports it.
    TY_ASSIGN_OR_RETURN(loss_sum, dist::AllReduceDouble(*pp_comm, loss_sum));
    const double loss = loss_sum / static_cast<double>(tokens_per_step);
    if (!std::isfinite(loss)) {
      return absl::InternalError(
          absl::StrCat("training diverged: loss is ", loss, " at step ", step + 1));
    }
    result.train_losses.push_back(loss);
    result.step_seconds.push_back((clock.NowNanosMonotonic() - start) / 1e9);
    train_nanos += clock.NowNanosMonotonic() - start;
    ++window_steps;

    const bool last = step + 1 == tr.steps;
    if (out && (last || (tr.log_every > 0 && (step + 1) % tr.log_every == 0))) {
      const double window_s = (clock.NowNanosMonotonic() - window_start) / 1e9;
      *out
          << absl::StrFormat(
                 "step %*d/%d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.1f ms/step\n",
                 static_cast<int>(std::to_string(tr.steps).size()), step + 1, tr.steps, loss, lr,
                 norm, window_steps * tokens_per_step / std::max(window_s, 1e-9),
                 1e3 * window_s / window_steps)
          << std::flush;
      window_start = clock.NowNanosMonotonic();
      window_steps = 0;
    }
    StepReport report{.step = step + 1,
                      .total_steps = tr.steps,
                      .loss = loss,
                      .learning_rate = lr,
                      .grad_norm = norm,
                      .step_seconds = (clock.NowNanosMonotonic() - start) / 1e9};
    report.tokens_per_second = tokens_per_step / std::max(report.step_seconds, 1e-9);
    if (tr.eval_every > 0 && (last || (step + 1) % tr.eval_every == 0)) {
      TY_ASSIGN_OR_RETURN(double val, Evaluate(*model, backend, *pp_comm, val_sampler, micro,
                                               tr.eval_batches, stage_transfer));
      result.evals.push_back({step + 1, val});
      report.val_loss = val;
      if (out) *out << EvalLine(result.evals.back(), data.entropy_nats) << "\n" << std::flush;
      window_start = clock.NowNanosMonotonic();
    }
    if (options.on_step) TY_RETURN_IF_ERROR(options.on_step(report));
  }
  result.tokens_per_second =
      train_nanos > 0 ? tr.steps * tokens_per_step / (train_nanos / 1e9) : 0.0;
  result.pipeline_wait_fraction = train_nanos > 0 ? pipeline_wait / (train_nanos / 1e9) : 0.0;
  result.train_seconds = train_nanos / 1e9;
  result.pipeline_wait_seconds = pipeline_wait;
  result.exposed_comm_seconds = params->exposed_comm_seconds() + model->tp_comm_seconds();
  static_cast<dist::MemoryAccount&>(result.memory) = params->memory();
  result.memory.activations = model->activation_bytes();
  for (int k = 0; k < static_cast<int>(dist::CollectiveKind::kCount); ++k) {
    result.bytes_sent[k] = dp_comm->stats().bytes_sent(static_cast<dist::CollectiveKind>(k));
  }
  result.overlap = params->timeline();
  if (options.final_parameters != nullptr) {
    options.final_parameters->resize(layout.total());
    TY_RETURN_IF_ERROR(params->GatherParameters(options.final_parameters->data()));
  }
  return result;
}

}  // namespace trainyard::worker
