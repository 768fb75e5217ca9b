// Warp-level tensor-core primitives of sm_80 and later, as the PTX instructions they are:
// mma.sync m16n8k16 (bf16 in, fp32 accumulate), ldmatrix (four 8×8 b16 matrices, plain and
// transposed) and cp.async (16-byte global-to-shared copies that complete in groups). The CPU
// emulator substitutes tools/cuda_emu/warp_mma.h, with the same functions and fragment layouts.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), for lane l, g = l / 4,
// t = l % 4, each 32-bit register holding two bf16 with the lower column (or row) in the low half:
//   A (16×16, row-major): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..),
//                         a[3] = (g+8, 2t+8..)
//   B (16×8, k × n):      b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8..2t+9, n g)
//   C/D (16×8, fp32):     c[0], c[1] = (g, 2t), (g, 2t+1); c[2], c[3] = (g+8, 2t), (g+8, 2t+1)
#ifndef TRAINYARD_KERNELS_CUDA_WARP_MMA_CUH_
#define TRAINYARD_KERNELS_CUDA_WARP_MMA_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace trainyard::kernels::cuda::warp {

// d += a · b for one 16×8×16 tile. Warp-collective.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8×8 matrices of 16-bit values from shared memory: lanes 8i..8i+7 give the addresses of
// rows 0..7 of matrix i (16 bytes each, 16-byte aligned); r[i] receives, in lane l, elements
// (l / 4, 2·(l % 4)) and (l / 4, 2·(l % 4) + 1) of matrix i. Warp-collective.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// As LdMatrixX4, each matrix transposed: r[i] receives, in lane l, elements (2·(l % 4), l / 4)
// and (2·(l % 4) + 1, l / 4) of matrix i as stored.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// Starts copying 16 bytes from global `src` to shared `dst` (both 16-byte aligned); with `fill`
// false, writes 16 zero bytes instead (src is not read but must be a valid address). The copy is
// complete after CpAsyncCommit and a CpAsyncWait that covers its group.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool fill) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
               "r"(bytes));
}

// Closes the group of the cp.async copies this thread started since the last commit.
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's committed groups are still in flight. Shared
// memory changed behind the compiler's back: nothing read from it may be kept across the wait.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace trainyard::kernels::cuda::warp

#endif  // TRAINYARD_KERNELS_CUDA_WARP_MMA_CUH_
