// AttentionMerge: the one operation of attention_block.h that is not a flash-attention kernel
// (those are in attention_fwd.cu and attention_bwd.cu). One warp per (row, head) pair: every lane
// reads the pair's two log-sum-exps before lane 0 replaces one, so no lane sees a half-merged
// state, and each output element is read and written by one lane.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status.h"
#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kWarps = 4;

// `pairs` = b·q_len·heads, in out's memory order (pair p's d values start at p·d).
template <typename T>
__global__ void __launch_bounds__(32 * kWarps)
    MergeKernel(T* out, float* lse, const T* part, const float* part_lse, int64_t q_len, int heads,
                int d, int64_t pairs) {
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (pair >= pairs) return;  // uniform across the warp
  const int lane = threadIdx.x % 32;
  const int64_t h = pair % heads, row = pair / heads;  // row = bi·q_len + i
  const int64_t at = (row / q_len * heads + h) * q_len + row % q_len;
  const float l = lse[at], lp = part_lse[at];
  if (lp == -INFINITY) return;  // part saw no key: nothing to merge (uniform across the warp)
  T* y = out + pair * d;
  const T* yp = part + pair * d;
  float merged;
  if (l == -INFINITY) {  // no keys yet: part's row, whatever out held (maybe NaN)
    for (int c = lane; c < d; c += 32) y[c] = yp[c];
    merged = lp;
  } else {
    // Relative to the larger lse, so neither exponential overflows.
    const float mx = fmaxf(l, lp);
    const float e_out = expf(l - mx), e_part = expf(lp - mx), sum = e_out + e_part;
    const float w_out = e_out / sum, w_part = e_part / sum;
    for (int c = lane; c < d; c += 32) {
      y[c] = FromFloat<T>(w_out * ToFloat(y[c]) + w_part * ToFloat(yp[c]));
    }
    merged = mx + logf(sum);
  }
  __syncwarp();  // every lane has read lse[at]
  if (lane == 0) lse[at] = merged;
}

}  // namespace

absl::Status AttentionMerge(cudaStream_t stream, DType dtype, void* out, float* lse,
                            const void* part, const float* part_lse, int64_t b, int64_t q_len,
                            int64_t heads, int64_t d) {
  TY_REQUIRE(b >= 1 && q_len >= 1 && heads >= 1 && d >= 1);
  TY_REQUIRE(heads <= INT32_MAX && d <= INT32_MAX);
  TY_REQUIRE(out != nullptr && lse != nullptr && part != nullptr && part_lse != nullptr);
  const int64_t pairs = b * q_len * heads;
  TY_DISPATCH_DTYPE(dtype, T, {
    MergeKernel<T><<<BlocksFor(pairs, kWarps), 32 * kWarps, 0, stream>>>(
        static_cast<T*>(out), lse, static_cast<const T*>(part), part_lse, q_len,
        static_cast<int>(heads), static_cast<int>(d), pairs);
  });
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("MergeKernel");
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
