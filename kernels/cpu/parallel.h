// Small helpers shared by the CPU reference kernels.
//
// Determinism contract: every CPU kernel gives bitwise-identical results for the same inputs and
// the same thread count. Reductions across rows (bias, norm-weight and embedding gradients) are
// split over column blocks and walk rows in order, so they do not even depend on the thread count.
#ifndef TRAINYARD_KERNELS_CPU_PARALLEL_H_
#define TRAINYARD_KERNELS_CPU_PARALLEL_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

// Column block width for column-parallel reductions: 16 floats = one 64-byte cache line.
inline constexpr int64_t kColumnBlock = 16;

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_PARALLEL_H_
