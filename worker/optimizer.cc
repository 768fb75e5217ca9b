#include "worker/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace trainyard::worker {

namespace {

// The learning rate `progress` (in [0, 1]) through a decay of this shape from lr to floor.
double Decayed(DecayShape shape, double lr, double floor, double progress) {
  switch (shape) {
    case DecayShape::kLinear:
      return lr + (floor - lr) * progress;
    case DecayShape::kCosine:
      return floor + 0.5 * (lr - floor) * (1.0 + std::cos(std::numbers::pi * progress));
    case DecayShape::kOneMinusSqrt:
      return lr + (floor - lr) * std::sqrt(progress);
  }
  return lr;
}

}  // namespace

double LearningRate(const OptimizerConfig& c, int64_t step) {
  if (step < c.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  }
  if (c.schedule == LrSchedule::kConstant) return c.lr;
  const bool wsd = c.schedule == LrSchedule::kWarmupStableDecay;
  const int64_t start =
      wsd ? std::max(c.warmup_steps, c.total_steps - c.decay_steps) : c.warmup_steps;
  if (step < start) return c.lr;  // the stable phase
  const double span = static_cast<double>(std::max<int64_t>(1, c.total_steps - start));
  const double progress = std::clamp(static_cast<double>(step - start) / span, 0.0, 1.0);
  const double floor = c.lr * c.min_lr_ratio;
  const DecayShape shape = wsd                                 ? c.decay_shape
                           : c.schedule == LrSchedule::kLinear ? DecayShape::kLinear
                                                               : DecayShape::kCosine;
  return Decayed(shape, c.lr, floor, progress);
}

float ClipScale(const OptimizerConfig& c, double grad_norm) {
  if (c.grad_clip <= 0.0) return 1.0f;
  const double factor = c.grad_clip / (grad_norm + 1e-6);
  return factor < 1.0 ? static_cast<float>(factor) : 1.0f;
}

double AdamWStep(Backend& backend, const OptimizerConfig& c, int64_t step, float clip_scale,
                 const std::vector<OptimizerSlice>& slices) {
  const double lr = LearningRate(c, step);
  std::vector<Backend::AdamWTensor> update;
  update.reserve(slices.size());
  for (const OptimizerSlice& s : slices) {
    if (s.tensor != nullptr && !s.tensor->trainable) continue;
    update.push_back(
        {s.param, s.grad, s.m, s.v, s.n, s.decay ? static_cast<float>(c.weight_decay) : 0.0f});
  }
  backend.AdamWMulti(update, AdamWParams{static_cast<float>(lr), static_cast<float>(c.beta1),
                                         static_cast<float>(c.beta2), static_cast<float>(c.eps),
                                         0.0f, step + 1, clip_scale});
  return lr;
}

AdamW::AdamW(const OptimizerConfig& config, const ParameterLayout& layout, Backend* backend)
    : config_(config), layout_(layout), backend_(backend) {
  m_ = backend_->AllocFloat(layout_.total());
  v_ = backend_->AllocFloat(layout_.total());
}

double AdamW::ClipGradients(float* grads) {
  const double norm = std::sqrt(backend_->SumOfSquares(grads, layout_.total()));
  const float scale = ClipScale(config_, norm);
  if (scale < 1.0f) backend_->Scale(grads, layout_.total(), scale);
  return norm;
}

double AdamW::Step(float* params, const float* grads, int64_t step) {
  std::vector<OptimizerSlice> slices;
  for (const ParamTensor& t : layout_.tensors()) {
    slices.push_back({params + t.offset, grads + t.offset, m_.data() + t.offset,
                      v_.data() + t.offset, t.numel, t.decay, &t, 0});
  }
  return AdamWStep(*backend_, config_, step, 1.0f, slices);
}

}  // namespace trainyard::worker
