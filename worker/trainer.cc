#include "worker/trainer.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "worker/data/dataset.h"
#include "worker/data/sampler.h"
#include "worker/model.h"

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

// Mean validation loss over eval_batches batches of micro_batch windows.
absl::StatusOr<double> Evaluate(Model& model, const BatchSampler& sampler, int micro_batch,
                                int eval_batches) {
  const int t = sampler.seq_len();
  std::vector<int32_t> inputs(int64_t{micro_batch} * t), targets(inputs.size());
  double total = 0.0;
  for (int i = 0; i < eval_batches; ++i) {
    sampler.FillEval(i, micro_batch, inputs.data(), targets.data());
    TY_ASSIGN_OR_RETURN(double loss, model.Loss(inputs.data(), targets.data(), micro_batch, t));
    total += loss;
  }
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

absl::StatusOr<TrainResult> Train(const config::JobSpec& spec, Backend& backend,
                                  const TrainOptions& options) {
  FileSystem& fs = options.fs ? *options.fs : *RealFileSystem();
  Clock& clock = options.clock ? *options.clock : *RealClock();
  const config::TrainingSpec& tr = spec.training;
  const int micro = tr.micro_batch > 0 ? tr.micro_batch : tr.batch;
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

  TY_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(spec.model, &backend));
  model->InitParameters(tr.seed);
  AdamW optimizer(OptimizerConfigFromSpec(tr), model->layout(), &backend);

  TrainResult result;
  result.entropy_nats = data.entropy_nats;
  result.parameters = model->num_params();
  std::ostream* out = options.progress;
  if (out) {
    *out << absl::StrFormat(
                "model %s: %d layers, width %d, %d heads (%d kv), %.3fM parameters | data %s\n",
                config::FamilyName(spec.model.family), spec.model.layers, spec.model.width,
                spec.model.heads, spec.model.kv_heads, model->num_params() / 1e6, data.description)
         << std::flush;
  }

  std::vector<int32_t> inputs(int64_t{micro} * t), targets(inputs.size());
  const int64_t tokens_per_step = int64_t{tr.batch} * t;
  const float grad_scale = 1.0f / static_cast<float>(tokens_per_step);
  int64_t train_nanos = 0;
  int64_t window_start = clock.NowNanosMonotonic(), window_steps = 0;
  for (int64_t step = 0; step < tr.steps; ++step) {
    const int64_t start = clock.NowNanosMonotonic();
    model->ZeroGradients();
    double loss_sum = 0.0;
    for (int first = 0; first < tr.batch; first += micro) {
      train_sampler.FillTrain(step, first, micro, inputs.data(), targets.data());
      TY_ASSIGN_OR_RETURN(
          double loss, model->ForwardBackward(inputs.data(), targets.data(), micro, t, grad_scale));
      loss_sum += loss;
    }
    const double norm = optimizer.ClipGradients(model->grads());
    const double lr = optimizer.Step(model->params(), model->grads(), step);
    const double loss = loss_sum / static_cast<double>(tokens_per_step);
    if (!std::isfinite(loss)) {
      return absl::InternalError(
          absl::StrCat("training diverged: loss is ", loss, " at step ", step + 1));
    }
    result.train_losses.push_back(loss);
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
    if (last || (tr.eval_every > 0 && (step + 1) % tr.eval_every == 0)) {
      TY_ASSIGN_OR_RETURN(double val, Evaluate(*model, val_sampler, micro, tr.eval_batches));
      result.evals.push_back({step + 1, val});
      if (out) *out << EvalLine(result.evals.back(), data.entropy_nats) << "\n" << std::flush;
      window_start = clock.NowNanosMonotonic();
    }
  }
  result.tokens_per_second =
      train_nanos > 0 ? tr.steps * tokens_per_step / (train_nanos / 1e9) : 0.0;
  return result;
}

}  // namespace trainyard::worker
