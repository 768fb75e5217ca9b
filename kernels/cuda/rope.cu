#include <algorithm>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/rope.h"
#include "kernels/rope_frequencies.h"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned int kMaxBlocks = 1u << 16;  // grid-stride loop below

// One thread per (row, pair index i): it computes the angle once and rotates pair i of every
// query and key head of the row. The angle p · inv_freq(i) is formed and its sine and cosine
// taken in fp64, as the CPU reference does: at p ≈ 2000 an fp32 angle would be off by ~1e-4 rad.
// `direction` is +1 (forward) or −1 (backward: the inverse rotation).
template <typename T>
__global__ void RopeKernel(T* qkv, int64_t rows, int64_t t, int64_t first_position,
                           int64_t rotated_heads, int64_t row_width, int64_t d,
                           RopeFrequencies freq, double direction) {
  const int64_t half = RopeRotaryDim(freq, d) / 2;
  const int64_t n = rows * half;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / half, i = idx - row * half;
    const int64_t p = first_position + row % t;
    const double angle = static_cast<double>(p) * RopeInvFreq(freq, i, 2 * half);
    double s, c;
    sincos(angle, &s, &c);
    const float cs = static_cast<float>(freq.magnitude * c);
    const float sn = static_cast<float>(direction * freq.magnitude * s);
    T* x = qkv + row * row_width + i;
    for (int64_t h = 0; h < rotated_heads; ++h, x += d) {
      const float x1 = ToFloat(x[0]), x2 = ToFloat(x[half]);
      x[0] = FromFloat<T>(x1 * cs - x2 * sn);
      x[half] = FromFloat<T>(x2 * cs + x1 * sn);
    }
  }
}

absl::Status Rope(cudaStream_t stream, DType dtype, void* qkv, int64_t b, int64_t t, int64_t heads,
                  int64_t kv_heads, int64_t d, const RopeFrequencies& freq, int64_t first_position,
                  double direction) {
  TY_REQUIRE(dtype == DType::kF32 || dtype == DType::kBF16);
  TY_REQUIRE(b >= 0 && t >= 1);
  TY_REQUIRE(heads >= 1 && kv_heads >= 1);
  TY_REQUIRE(d >= 2 && d % 2 == 0);
  TY_REQUIRE(freq.theta > 0.0);
  TY_REQUIRE(freq.factor == 0.0 ||
             (freq.factor >= 1.0 && freq.low_freq_factor > 0.0 &&
              freq.high_freq_factor > freq.low_freq_factor && freq.original_max_seq > 0.0));
  const int64_t rotary_dim = RopeRotaryDim(freq, d);
  TY_REQUIRE(rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= d);
  TY_REQUIRE(freq.pairs == 0 || freq.pairs == rotary_dim / 2);
  TY_REQUIRE(freq.pairs <= kMaxRopePairs && freq.magnitude > 0.0);
  TY_REQUIRE(first_position >= 0);
  if (b == 0) return absl::OkStatus();
  TY_REQUIRE(qkv != nullptr);
  const int64_t rows = b * t;
  const int64_t row_width = (heads + 2 * kv_heads) * d;
  const unsigned int blocks = std::min(BlocksFor(rows * (rotary_dim / 2), kThreads), kMaxBlocks);
  TY_DISPATCH_DTYPE(dtype, T, {
    RopeKernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(qkv), rows, t, first_position,
                                                   heads + kv_heads, row_width, d, freq, direction);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("RopeKernel");
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status RopeForward(cudaStream_t stream, DType dtype, void* qkv, int64_t b, int64_t t,
                         int64_t heads, int64_t kv_heads, int64_t d, const RopeFrequencies& freq,
                         int64_t first_position) {
  return Rope(stream, dtype, qkv, b, t, heads, kv_heads, d, freq, first_position, 1.0);
}

absl::Status RopeBackward(cudaStream_t stream, DType dtype, void* dqkv, int64_t b, int64_t t,
                          int64_t heads, int64_t kv_heads, int64_t d, const RopeFrequencies& freq,
                          int64_t first_position) {
  return Rope(stream, dtype, dqkv, b, t, heads, kv_heads, d, freq, first_position, -1.0);
}

}  // namespace trainyard::kernels::cuda
