// The optimizer step's pieces: the learning-rate schedule, global-norm gradient clipping, and
// AdamW over slices of parameters (a rank's owned shards, parallel::ShardedParams::
// OptimizerSlices, or a whole model's buffer). Where parameters and moments live is the
// parameter source's business; the update's arithmetic is here. Single-threaded: called from the
// training loop between steps.
#ifndef TRAINYARD_WORKER_OPTIMIZER_H_
#define TRAINYARD_WORKER_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "worker/backend.h"
#include "worker/buffer.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker {

enum class LrSchedule { kCosine, kLinear, kConstant, kWarmupStableDecay };
// The shape of a warmup-stable-decay schedule's decay from lr to floor at progress p: lr − (lr −
// floor)·p, floor + ½(lr − floor)(1 + cos πp), or lr − (lr − floor)·√p (the "1-sqrt" cooldown
// of Hägele et al. 2024).
enum class DecayShape { kLinear, kCosine, kOneMinusSqrt };

struct OptimizerConfig {
  double lr = 3e-4;
  double min_lr_ratio = 0.1;  // the decay ends at lr · min_lr_ratio
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  LrSchedule schedule = LrSchedule::kCosine;
  // kWarmupStableDecay: the decay spans the run's last decay_steps steps (lr until then).
  int64_t decay_steps = 0;
  DecayShape decay_shape = DecayShape::kLinear;
  double weight_decay = 0.1;  // applied to tensors with two or more dims only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global-norm bound; 0 disables clipping
};

// Learning rate of optimizer step `step` (0-based): linear warmup to lr over warmup_steps, then
// the schedule's decay to lr · min_lr_ratio at total_steps. A decay over steps [start, end)
// has progress (step − start) / (end − start): lr at its first step, the floor only after its
// last. Warmup-stable-decay holds lr until total_steps − decay_steps, then decays over the rest.
double LearningRate(const OptimizerConfig& config, int64_t step);

// Global-norm clipping (PyTorch's clip_grad_norm_ rule): the factor min(1, grad_clip / (norm +
// 1e-6)) every gradient is scaled by; 1 with clipping off.
float ClipScale(const OptimizerConfig& config, double grad_norm);

// Parameters AdamW updates together with their gradients and moments: n floats each.
struct OptimizerSlice {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
  bool decay;  // weight decay applies (the slice's tensor has two or more dims)
  // The tensor the slice is part of, from element `first` on (null: not known).
  const ParamTensor* tensor = nullptr;
  int64_t first = 0;
};

// AdamW step `step` (0-based) over `slices` (those of trainable tensors), every gradient read as
// grad · clip_scale (clipping applied inside the update, without a pass of its own). Returns the
// learning rate it used.
double AdamWStep(Backend& backend, const OptimizerConfig& config, int64_t step, float clip_scale,
                 const std::vector<OptimizerSlice>& slices);

class AdamW {
 public:
  // `backend` and `layout` must outlive the optimizer.
  AdamW(const OptimizerConfig& config, const ParameterLayout& layout, Backend* backend);

  // Scales grads so that their global L2 norm is at most grad_clip (PyTorch's clip_grad_norm_
  // rule: factor min(1, clip / (norm + 1e-6))). Returns the norm before clipping.
  double ClipGradients(float* grads);

  // Applies optimizer step `step` (0-based) and returns the learning rate it used.
  double Step(float* params, const float* grads, int64_t step);

  float* first_moment() { return m_.data(); }
  float* second_moment() { return v_.data(); }

 private:
  OptimizerConfig config_;
  const ParameterLayout& layout_;
  Backend* backend_;
  Buffer<float> m_;
  Buffer<float> v_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_OPTIMIZER_H_
