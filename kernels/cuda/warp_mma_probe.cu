#include <cuda_bf16.h>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/warp_mma.cuh"
#include "kernels/cuda/warp_mma_probe.h"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kPitch = 24;  // bf16 per shared row: 48 bytes, 16-byte aligned

__global__ void __launch_bounds__(32) WarpMmaProbeKernel(uint32_t* frags, float* products) {
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* a = reinterpret_cast<__nv_bfloat16*>(smem);  // 16 rows
  __nv_bfloat16* bt = a + 16 * kPitch;                        // 8 rows: Bᵀ
  __nv_bfloat16* b = bt + 8 * kPitch;                         // 16 rows: B
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < 256; i += 32) {
    const int r = i / 16, c = i % 16;
    a[r * kPitch + c] = __float2bfloat16(static_cast<float>(r * 16 + c));
    if (c < 8) {
      const __nv_bfloat16 v = __float2bfloat16(static_cast<float>((r + 2 * c) % 7 - 3));
      b[r * kPitch + c] = v;
      bt[c * kPitch + r] = v;
    }
  }
  __syncthreads();
  uint32_t af[4], b_from_t[4], b_from_b[4];
  warp::LdMatrixX4(af, a + (lane % 16) * kPitch + lane / 16 * 8);
  // Matrices 0 and 1: n 0-7 × k 0-7 and k 8-15 (matrices 2 and 3 repeat them).
  warp::LdMatrixX4(b_from_t, bt + (lane % 8) * kPitch + (lane / 8) % 2 * 8);
  warp::LdMatrixX4Trans(b_from_b, b + ((lane / 8) % 2 * 8 + lane % 8) * kPitch);
  float d1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d2[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  warp::MmaBf16(d1, af, b_from_t[0], b_from_t[1]);
  warp::MmaBf16(d2, af, b_from_b[0], b_from_b[1]);
  for (int i = 0; i < 4; ++i) {
    frags[lane * 4 + i] = af[i];
    products[lane * 8 + i] = d1[i];
    products[lane * 8 + 4 + i] = d2[i];
  }
}

}  // namespace

absl::Status WarpMmaProbe(cudaStream_t stream, uint32_t* frags, float* products) {
  TY_REQUIRE(frags != nullptr && products != nullptr);
  constexpr int kBytes = (16 + 8 + 16) * kPitch * 2;
  WarpMmaProbeKernel<<<1, 32, kBytes, stream>>>(frags, products);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("WarpMmaProbeKernel");
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
