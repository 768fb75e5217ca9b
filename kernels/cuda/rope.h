// Rotary position embedding applied in place to the query and key heads of a packed qkv
// activation [b, t, (heads + 2·kv_heads)·d] — the post-processing of the QKV projection's output
// (values are untouched). Semantics match kernels/cpu/rope.h (rotate-half pairing i, i + r/2 over
// the first r = freq.rotary_dim (or d) dimensions, the rest passing through; angle
// p · inv_freq(i) of kernels/rope_frequencies.h, p = first_position + the row's index within its
// sequence, so that a chunk of a longer sequence keeps its positions; cosine and sine times
// freq.magnitude). Angles, their sines and cosines are computed in fp64 on the device from the
// position, as the CPU reference computes them, so long sequences keep fp32 accuracy.
#ifndef TRAINYARD_KERNELS_CUDA_ROPE_H_
#define TRAINYARD_KERNELS_CUDA_ROPE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "kernels/rope_frequencies.h"

namespace trainyard::kernels::cuda {

// INVALID_ARGUMENT for a bad shape, theta <= 0, a scaling with factor < 1 or
// high_freq_factor <= low_freq_factor, an odd rotary_dim or one above d, LongRoPE factors for
// other than rotary_dim / 2 pairs, magnitude <= 0, or first_position < 0.
[[nodiscard]] absl::Status RopeForward(cudaStream_t stream, DType dtype, void* qkv, int64_t b,
                                       int64_t t, int64_t heads, int64_t kv_heads, int64_t d,
                                       const RopeFrequencies& freq, int64_t first_position);
// The transpose rotation, in place on the gradient of the rotated qkv.
[[nodiscard]] absl::Status RopeBackward(cudaStream_t stream, DType dtype, void* dqkv, int64_t b,
                                        int64_t t, int64_t heads, int64_t kv_heads, int64_t d,
                                        const RopeFrequencies& freq, int64_t first_position);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_ROPE_H_
