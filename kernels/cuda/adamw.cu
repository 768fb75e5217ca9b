#include <cmath>
#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Elements per block: each thread updates kChunk / kThreads of them, strided for coalescing.
constexpr int64_t kChunk = 4096;
// Tensors per launch, sized so that the argument struct stays under the classic 4 KiB limit on
// kernel parameters.
constexpr int kMaxTensors = 48;

struct DeviceTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
  float decay;  // 1 − lr·weight_decay, computed on the host as the CPU reference does
  bf16* copy;   // null, or where the updated parameter goes in bf16
};

// One launch's worth of tensors. Tensor i owns blocks [first_block[i], first_block[i + 1]).
struct LaunchArgs {
  DeviceTensor tensors[kMaxTensors];
  int64_t first_block[kMaxTensors + 1];
  int count;
  float beta1, beta2, eps;
  float step_size;     // lr / (1 − β1ᵗ)
  float inv_sqrt_bc2;  // 1 / √(1 − β2ᵗ)
  float grad_scale;
};
static_assert(sizeof(LaunchArgs) <= 4096, "kernel arguments must fit the 4 KiB parameter space");

__global__ void MultiTensorAdamWKernel(const LaunchArgs args) {
  const int64_t block = blockIdx.x;
  int i = 0;
  while (i + 1 < args.count && args.first_block[i + 1] <= block) ++i;
  const DeviceTensor& t = args.tensors[i];
  const int64_t begin = (block - args.first_block[i]) * kChunk;
  const int64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const float g = t.grad[j] * args.grad_scale;
    const float m = args.beta1 * t.m[j] + (1.0f - args.beta1) * g;
    const float v = args.beta2 * t.v[j] + (1.0f - args.beta2) * g * g;
    t.m[j] = m;
    t.v[j] = v;
    const float p =
        t.param[j] * t.decay - args.step_size * m / (sqrtf(v) * args.inv_sqrt_bc2 + args.eps);
    t.param[j] = p;
    if (t.copy != nullptr) t.copy[j] = FromFloat<bf16>(p);
  }
}

absl::Status CheckArguments(const std::vector<AdamWTensor>& tensors, const AdamWHyper& hyper) {
  TY_REQUIRE(hyper.step >= 1);
  TY_REQUIRE(hyper.beta1 >= 0.0f && hyper.beta1 < 1.0f);
  TY_REQUIRE(hyper.beta2 >= 0.0f && hyper.beta2 < 1.0f);
  TY_REQUIRE(hyper.eps >= 0.0f);
  for (const AdamWTensor& t : tensors) {
    TY_REQUIRE(t.n >= 0);
    TY_REQUIRE(t.n == 0 ||
               (t.param != nullptr && t.grad != nullptr && t.m != nullptr && t.v != nullptr));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MultiTensorAdamW(cudaStream_t stream, const std::vector<AdamWTensor>& tensors,
                              const AdamWHyper& hyper) {
  TY_RETURN_IF_ERROR(CheckArguments(tensors, hyper));
  // Bias corrections exactly as kernels/cpu/adamw.cc computes them (double, then float).
  const double bc1 =
      1.0 - std::pow(static_cast<double>(hyper.beta1), static_cast<double>(hyper.step));
  const double bc2 =
      1.0 - std::pow(static_cast<double>(hyper.beta2), static_cast<double>(hyper.step));
  LaunchArgs args{};
  args.beta1 = hyper.beta1;
  args.beta2 = hyper.beta2;
  args.eps = hyper.eps;
  args.step_size = static_cast<float>(hyper.lr / bc1);
  args.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  args.grad_scale = hyper.grad_scale;

  int64_t blocks = 0;
  auto launch = [&]() -> absl::Status {
    if (args.count == 0) return absl::OkStatus();
    args.first_block[args.count] = blocks;
    MultiTensorAdamWKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(args);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("MultiTensorAdamWKernel");
    args.count = 0;
    blocks = 0;
    return absl::OkStatus();
  };
  for (const AdamWTensor& t : tensors) {
    if (t.n == 0) continue;
    const int64_t tensor_blocks = (t.n + kChunk - 1) / kChunk;
    // grid.x is limited to 2³¹ − 1 blocks; a tensor never comes near it (2⁴³ elements).
    TY_REQUIRE(tensor_blocks < INT32_MAX);
    if (args.count == kMaxTensors || blocks + tensor_blocks >= INT32_MAX) {
      TY_RETURN_IF_ERROR(launch());
    }
    const float decay = 1.0f - hyper.lr * t.weight_decay;
    args.tensors[args.count] = {
        t.param, t.grad, t.m, t.v, t.n, decay, static_cast<bf16*>(t.bf16_copy)};
    args.first_block[args.count] = blocks;
    ++args.count;
    blocks += tensor_blocks;
  }
  return launch();
}

}  // namespace trainyard::kernels::cuda
