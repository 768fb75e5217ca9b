#include "worker/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace trainyard::worker {

double LearningRate(const OptimizerConfig& c, int64_t step) {
  if (step < c.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, c.total_steps - c.warmup_steps));
  const double progress = std::clamp(static_cast<double>(step - c.warmup_steps) / span, 0.0, 1.0);
  const double floor = c.lr * c.min_lr_ratio;
  switch (c.schedule) {
    case LrSchedule::kCosine:
      return floor + 0.5 * (c.lr - floor) * (1.0 + std::cos(std::numbers::pi * progress));
    case LrSchedule::kLinear:
      return c.lr + (floor - c.lr) * progress;
    case LrSchedule::kConstant:
      return c.lr;
  }
  return c.lr;
}

AdamW::AdamW(const OptimizerConfig& config, const ParameterLayout& layout, Backend* backend)
    : config_(config), layout_(layout), backend_(backend) {
  m_ = backend_->AllocFloat(layout_.total());
  v_ = backend_->AllocFloat(layout_.total());
}

double AdamW::ClipGradients(float* grads) {
  const double norm = std::sqrt(backend_->SumOfSquares(grads, layout_.total()));
  if (config_.grad_clip > 0.0) {
    const double factor = config_.grad_clip / (norm + 1e-6);
    if (factor < 1.0) backend_->Scale(grads, layout_.total(), static_cast<float>(factor));
  }
  return norm;
}

double AdamW::Step(float* params, const float* grads, int64_t step) {
  const double lr = LearningRate(config_, step);
  for (const ParamTensor& t : layout_.tensors()) {
    const AdamWParams p{static_cast<float>(lr),
                        static_cast<float>(config_.beta1),
                        static_cast<float>(config_.beta2),
                        static_cast<float>(config_.eps),
                        t.decay ? static_cast<float>(config_.weight_decay) : 0.0f,
                        step + 1};
    backend_->AdamW(params + t.offset, grads + t.offset, m_.data() + t.offset, v_.data() + t.offset,
                    t.numel, p);
  }
  return lr;
}

}  // namespace trainyard::worker
