// kernels/cuda/warp_mma.cuh for the CPU emulator: the same functions, the same fragment layouts.
// mma.sync and ldmatrix are warp collectives here too: each lane publishes its registers (or row
// address) through WarpExchange and reads back the ones it needs, so a lane that skips one, or a
// fragment filled by the wrong lane, shows up as a wrong result or an aborted barrier, as on the
// device. Products sum in fp32 in ascending k (the tensor cores' order and internal precision
// differ within the bf16 tolerances the tests use). cp.async lands its copies only at the wait
// that covers their group, with poison in the destination until then (emu.h: AsyncCopy16), so a
// missing or too-short wait, or a missing barrier after one, shows up as NaNs. ldmatrix rows and
// cp.async destinations must lie in shared memory.
#ifndef TRAINYARD_TOOLS_CUDA_EMU_WARP_MMA_H_
#define TRAINYARD_TOOLS_CUDA_EMU_WARP_MMA_H_

#include <cstdint>
#include <cstring>

#include "tools/cuda_emu/emu.h"

namespace trainyard::kernels::cuda::warp {
namespace emu_detail {

inline float Bf16(uint32_t reg, int half) {
  const uint32_t bits = (half == 0 ? reg & 0xffffu : reg >> 16) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline void CheckAligned16(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::Misaligned(what, p, 16);
}

// The 32 lanes' row addresses of an ldmatrix.
inline const uint16_t* const* RowAddresses(const void* row, const uint16_t* (&rows)[32]) {
  CheckAligned16(row, "ldmatrix row");
  emu::CheckShared(row, 16, "ldmatrix row");
  const uint64_t* slots = emu::WarpExchange(emu::ToSlot(row), 0xffffffffu);
  for (int i = 0; i < 32; ++i) rows[i] = emu::FromSlot<const uint16_t*>(slots[i]);
  return rows;
}

inline uint32_t Pack(uint16_t lo, uint16_t hi) { return lo | static_cast<uint32_t>(hi) << 16; }

}  // namespace emu_detail

inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  using emu_detail::Bf16;
  uint32_t all_a[32][4], all_b[32][2];
  const uint64_t* s = emu::WarpExchange(a[0] | static_cast<uint64_t>(a[1]) << 32, 0xffffffffu);
  for (int i = 0; i < 32; ++i) all_a[i][0] = static_cast<uint32_t>(s[i]), all_a[i][1] = s[i] >> 32;
  s = emu::WarpExchange(a[2] | static_cast<uint64_t>(a[3]) << 32, 0xffffffffu);
  for (int i = 0; i < 32; ++i) all_a[i][2] = static_cast<uint32_t>(s[i]), all_a[i][3] = s[i] >> 32;
  s = emu::WarpExchange(b0 | static_cast<uint64_t>(b1) << 32, 0xffffffffu);
  for (int i = 0; i < 32; ++i) all_b[i][0] = static_cast<uint32_t>(s[i]), all_b[i][1] = s[i] >> 32;
  // A(row, k): lane 4·(row % 8) + (k % 8) / 2, register row / 8 + 2·(k / 8), half k % 2.
  auto A = [&](int row, int k) {
    return Bf16(all_a[4 * (row % 8) + (k % 8) / 2][row / 8 + 2 * (k / 8)], k % 2);
  };
  // B(k, n): lane 4·n + (k % 8) / 2, register k / 8, half k % 2.
  auto B = [&](int k, int n) { return Bf16(all_b[4 * n + (k % 8) / 2][k / 8], k % 2); };
  const int lane = emu::LaneId(), g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    float sum = 0.0f;
    for (int k = 0; k < 16; ++k) sum += A(row, k) * B(k, col);
    d[e] += sum;
  }
}

inline void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  const uint16_t* rows[32];
  emu_detail::RowAddresses(row, rows);
  const int lane = emu::LaneId();
  for (int m = 0; m < 4; ++m) {
    const uint16_t* p = rows[8 * m + lane / 4];
    r[m] = emu_detail::Pack(p[2 * (lane % 4)], p[2 * (lane % 4) + 1]);
  }
}

inline void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  const uint16_t* rows[32];
  emu_detail::RowAddresses(row, rows);
  const int lane = emu::LaneId();
  for (int m = 0; m < 4; ++m) {
    r[m] = emu_detail::Pack(rows[8 * m + 2 * (lane % 4)][lane / 4],
                            rows[8 * m + 2 * (lane % 4) + 1][lane / 4]);
  }
}

inline void CpAsync16(void* dst, const void* src, bool fill) {
  emu_detail::CheckAligned16(dst, "cp.async destination");
  emu_detail::CheckAligned16(src, "cp.async source");
  emu::AsyncCopy16(dst, src, fill);
}

inline void CpAsyncCommit() { emu::AsyncCommit(); }

template <int kPending>
void CpAsyncWait() {
  emu::AsyncWait(kPending);
}

}  // namespace trainyard::kernels::cuda::warp

#endif  // TRAINYARD_TOOLS_CUDA_EMU_WARP_MMA_H_
