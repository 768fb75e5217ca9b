// nvcuda::wmma for the CPU emulator, for 16×16×16 tiles. Every lane holds the whole tile
// (num_elements = 256, x[16·row + col]) and computes the whole product, so the operations need
// no exchange between lanes; code that, as the WMMA contract requires, treats the element
// layout as opaque behaves as with any real layout. The product sums in fp32 in ascending k,
// not in the tensor cores' order.
#ifndef TRAINYARD_TOOLS_CUDA_EMU_WMMA_H_
#define TRAINYARD_TOOLS_CUDA_EMU_WMMA_H_

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
// What the WMMA API requires of every tile pointer and leading dimension.
template <typename T>
void CheckTile(const T* p, unsigned ld) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || ld * sizeof(T) % 16 != 0) {
    std::fprintf(stderr,
                 "cuda_emu: wmma tile at %p with ld %u: needs 32-byte alignment and a "
                 "leading dimension of a multiple of 16 bytes\n",
                 static_cast<const void*>(p), ld);
    std::abort();
  }
}
inline float F(float x) { return x; }
inline float F(__nv_bfloat16 x) {  // exact: a bf16 is the top half of an fp32
  uint16_t h;
  std::memcpy(&h, &x, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "only 16x16x16 tiles are emulated");
  static constexpr int num_elements = 256;
  T x[num_elements];
};

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float v) {
  for (T& e : f.x) e = static_cast<T>(v);
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ld) {
  constexpr bool kCol = std::is_same_v<Layout, col_major>;
  detail::CheckTile(p, ld);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) f.x[16 * r + c] = kCol ? p[c * ld + r] : p[r * ld + c];
  }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ld, layout_t layout) {
  detail::CheckTile(p, ld);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      f.x[16 * r + c] = layout == mem_col_major ? p[c * ld + r] : p[r * ld + c];
    }
  }
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ld, layout_t layout) {
  detail::CheckTile(p, ld);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      (layout == mem_col_major ? p[c * ld + r] : p[r * ld + c]) = f.x[16 * r + c];
    }
  }
}

template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  // Operands converted once (every lane computes the whole tile, so this loop is the hot one).
  float fa[256], fb[256], out[256];
  for (int i = 0; i < 256; ++i) fa[i] = detail::F(a.x[i]), fb[i] = detail::F(b.x[i]);
  for (int m = 0; m < 16; ++m) {
    float row[16];
    for (int n = 0; n < 16; ++n) row[n] = c.x[16 * m + n];
    for (int k = 0; k < 16; ++k) {
      const float s = fa[16 * m + k];
      const float* b_row = fb + 16 * k;
      for (int n = 0; n < 16; ++n) row[n] = std::fma(s, b_row[n], row[n]);
    }
    for (int n = 0; n < 16; ++n) out[16 * m + n] = row[n];
  }
  for (int i = 0; i < 256; ++i) d.x[i] = out[i];
}

}  // namespace nvcuda::wmma

#endif  // TRAINYARD_TOOLS_CUDA_EMU_WMMA_H_
