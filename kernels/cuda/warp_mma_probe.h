// The tensor-core primitives of warp_mma.cuh on known operands: what the device (or the CPU
// emulator) gives each lane, so that a test can hold both to the PTX ISA's fragment layouts
// before any kernel built on them is trusted (tests/gpu/warp_mma_test.cc).
#ifndef TRAINYARD_KERNELS_CUDA_WARP_MMA_PROBE_H_
#define TRAINYARD_KERNELS_CUDA_WARP_MMA_PROBE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace trainyard::kernels::cuda {

// One warp loads A (16×16, A(r, c) = 16r + c) and B (16×8, B(k, n) = (k + 2n) mod 7 − 3), both
// exact in bf16, from shared memory as the attention kernels do: A with ldmatrix, B once as
// rows of Bᵀ with ldmatrix and once as rows of B with ldmatrix.trans, and multiplies them with
// mma.sync. Device pointers: `frags` (32 × 4) gets each lane's four A registers; `products`
// (32 × 8) each lane's four accumulators of A·B from zero, then of A·B from one (the
// transposed load).
[[nodiscard]] absl::Status WarpMmaProbe(cudaStream_t stream, uint32_t* frags, float* products);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_WARP_MMA_PROBE_H_
