// The bf16 flash-attention forward on sm_80+ tensor cores, as FlashAttention-2 computes it: a
// block of kWarps warps owns kRows·kMTiles query rows of one (batch, head); each warp keeps its
// 16·kMTiles rows' query fragments, scores, probabilities and output accumulators in registers
// (mma.sync m16n8k16 with ldmatrix operands, warp_mma.cuh) and runs the online softmax there, so
// shared memory holds only the query tile and two key/value tiles, the next one arriving
// (cp.async) while the current one is used. Key tiles wholly above a causal block's diagonal are
// never loaded, nor with a sliding window those wholly before it, and a warp skips the tiles
// outside its own rows' visible keys. Grouped-query heads read their key/value head in place.
//
// Per 64-key tile a warp runs kMTiles · (D/16 · 8 + 4 · D/8) mma.sync (S = Q·Kᵀ, then O += P·V)
// and loads K and V with 2 · D/16 · 4 ldmatrix.x4, each fragment serving its kMTiles row groups:
// at one group a warp reads 512 bytes of shared memory per two mma.sync, 4 clocks of an SM's
// shared memory (128 bytes per clock) against about 2 of its tensor cores (4096 FLOPs each, an
// H100 SM peaking near 4096 per clock), so two groups (kMTiles 2, FlashAttention-2's 128-row
// blocks) halve that pressure. The block moves 2 · 64 · D · 2 bytes
// of keys and values from global memory per tile.
#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace trainyard::kernels::cuda {
namespace attention_internal {
namespace {

inline constexpr int kTileKeys = 64;  // keys per key/value tile

// Byte offsets into the kernel's dynamic shared memory: the query tile (kBlockRows rows), then
// two buffers each of keys and values (tile `it` in buffer it % 2).
template <int D, int kMTiles>
struct MmaForwardSmem {
  static constexpr int kBlockRows = kRows * kMTiles;
  static constexpr int kTile = TileBytes<bf16>(kTileKeys, D);
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + TileBytes<bf16>(kBlockRows, D);
  static constexpr int kV = kK + 2 * kTile;
  static constexpr int kBytes = kV + 2 * kTile;
};

// One warp's online softmax over a tile's query-key products s (16 rows × 64 keys as eight 16×8
// accumulators; this lane holds rows `quad` and `quad` + 8): turns them into scores in log2 units
// (`rule`), masks the keys a row does not see (`masked` tiles only: keys before first[row] or at
// or past visible[row]), turns the scores into probabilities against the new running maxima m,
// and adds this lane's share of each row's sum to l. Returns the factors by which the rows' output
// so far must be scaled.
__device__ __forceinline__ float2 SoftmaxTile(float (&s)[kTileKeys / 8][4], int64_t j0, int pair,
                                              bool masked, const int64_t (&first)[2],
                                              const int64_t (&visible)[2], ScoreRule rule,
                                              float (&m)[2], float (&l)[2]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kTileKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t j = j0 + n * 8 + 2 * pair + e % 2;
      float x = rule.Log2(s[n][e]);
      if (masked && (j < first[e / 2] || j >= visible[e / 2])) x = -INFINITY;
      s[n][e] = x;
      tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
    }
  }
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the quad's four lanes hold the row between them
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    const float m_new = fmaxf(m[h], tile_max[h]);
    // A row that has seen no key yet (a padding row past q_len, or one before its window) keeps
    // its values 0, not NaN, with 0 as reference.
    const float ref = m_new == -INFINITY ? 0.0f : m_new;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kTileKeys / 8; ++n) {
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        s[n][e] = exp2f(s[n][e] - ref);
        sum += s[n][e];
      }
    }
    alpha[h] = exp2f(m[h] - ref);
    l[h] = l[h] * alpha[h] + sum;
    m[h] = m_new;
  }
  return make_float2(alpha[0], alpha[1]);
}

// A warp's running state for kMTiles groups of 16 query rows: the rows' query fragments along the
// head dim, output accumulators, running maxima and sums.
template <int D, int kMTiles>
struct WarpRows {
  uint32_t qf[kMTiles][D / 16][4];
  float o[kMTiles][D / 8][4];
  float m[kMTiles][2], l[kMTiles][2];
};

// S = Q·Kᵀ for every row group of the warp against one key tile: each K fragment loaded once
// serves all kMTiles groups.
template <int D, int kMTiles>
__device__ __forceinline__ void TileScores(float (&s)[kMTiles][kTileKeys / 8][4],
                                           const WarpRows<D, kMTiles>& w, const bf16* k_tile,
                                           int lane) {
  constexpr int kLd = Ld<bf16>(D);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int n = 0; n < kTileKeys / 8; ++n) {
      s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
    }
  }
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < kTileKeys / 16; ++np) {  // keys 16·np.., as two 8-key B fragments
      uint32_t b[4];
      warp::LdMatrixX4(
          b, k_tile + (np * 16 + lane / 16 * 8 + lane % 8) * kLd + ks * 16 + (lane / 8) % 2 * 8);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        warp::MmaBf16(s[mt][2 * np], w.qf[mt][ks], b[0], b[1]);
        warp::MmaBf16(s[mt][2 * np + 1], w.qf[mt][ks], b[2], b[3]);
      }
    }
  }
}

// O += P·V for every row group: P's accumulators are A's layout; each V fragment loaded once
// serves all kMTiles groups.
template <int D, int kMTiles>
__device__ __forceinline__ void AddTileValues(WarpRows<D, kMTiles>& w,
                                              const float (&s)[kMTiles][kTileKeys / 8][4],
                                              const bf16* v_tile, int lane) {
  constexpr int kLd = Ld<bf16>(D);
#pragma unroll
  for (int ks = 0; ks < kTileKeys / 16; ++ks) {  // keys 16·ks..
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      a[mt][0] = PackBf16x2(s[mt][2 * ks][0], s[mt][2 * ks][1]);
      a[mt][1] = PackBf16x2(s[mt][2 * ks][2], s[mt][2 * ks][3]);
      a[mt][2] = PackBf16x2(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
      a[mt][3] = PackBf16x2(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
    }
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {  // head-dim columns 16·dn.., two 8-column fragments
      uint32_t b[4];
      warp::LdMatrixX4Trans(
          b, v_tile + (ks * 16 + (lane / 8) % 2 * 8 + lane % 8) * kLd + dn * 16 + lane / 16 * 8);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        warp::MmaBf16(w.o[mt][2 * dn], a[mt], b[0], b[1]);
        warp::MmaBf16(w.o[mt][2 * dn + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Each row's sum from the quad's four lanes, the log-sum-exp, and the normalised output of the
// warp's rows (from `first`), staged through the warp's own rows of the query tile (`staging`)
// for 16-byte stores.
template <int D, int kMTiles>
__device__ __forceinline__ void FinishRows(WarpRows<D, kMTiles>& w, bf16* out, float* lse,
                                           bf16* staging, int64_t first, int bi, int h,
                                           const BlockGeometry& geo, int lane) {
  constexpr int kLd = Ld<bf16>(D);
  const int quad = lane / 4, pair = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    float inv[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float& l = w.l[mt][hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv[hh] = l > 0.0f ? 1.0f / l : 0.0f;
      const int64_t row = first + mt * 16 + quad + 8 * hh;
      if (pair == 0 && row < geo.q_len) {
        lse[(static_cast<int64_t>(bi) * geo.heads + h) * geo.q_len + row] =
            (w.m[mt][hh] + log2f(l)) * kLn2;
      }
    }
    bf16* rows = staging + mt * 16 * kLd;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(rows + quad * kLd + n * 8 + 2 * pair) =
          PackBf16x2(w.o[mt][n][0] * inv[0], w.o[mt][n][1] * inv[0]);
      *reinterpret_cast<uint32_t*>(rows + (quad + 8) * kLd + n * 8 + 2 * pair) =
          PackBf16x2(w.o[mt][n][2] * inv[1], w.o[mt][n][3] * inv[1]);
    }
  }
  __syncwarp();
  const int64_t out_stride = static_cast<int64_t>(geo.heads) * D;
  bf16* out_rows = out + bi * geo.q_len * out_stride + static_cast<int64_t>(h) * D;
  for (int i = lane; i < kMTiles * 16 * (D / 8); i += 32) {
    const int r = i / (D / 8), c = i % (D / 8) * 8;
    if (first + r < geo.q_len) {
      *reinterpret_cast<uint4*>(out_rows + (first + r) * out_stride + c) =
          *reinterpret_cast<const uint4*>(staging + r * kLd + c);
    }
  }
}

// Grid: (query tiles of kRows·kMTiles rows, heads, batch); warp w owns the 16·kMTiles rows from
// 16·kMTiles·w. out [b, q_len, heads·D], lse [b, heads, q_len] (natural log); q, k and v at head
// 0 of row 0 (see BlockGeometry).
template <int D, int kMTiles>
__global__ void __launch_bounds__(kThreads)
    MmaForwardKernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                     BlockGeometry geo, ScoreRule rule) {
  using Smem = MmaForwardSmem<D, kMTiles>;
  constexpr int kBlockRows = Smem::kBlockRows, kWarpRows = 16 * kMTiles;
  constexpr int kLd = Ld<bf16>(D);
  constexpr int kTileElems = Smem::kTile / static_cast<int>(sizeof(bf16));
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem + Smem::kQ);
  bf16* k_tiles = reinterpret_cast<bf16*>(smem + Smem::kK);
  bf16* v_tiles = reinterpret_cast<bf16*>(smem + Smem::kV);

  // The last query tiles of a causal block see the most keys; launching them first shortens the
  // grid's tail.
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const int h = blockIdx.y, bi = blockIdx.z, group = h / (geo.heads / geo.kv_heads);
  SelectBatch(geo, bi);
  const int64_t kv_offset = bi * geo.kv_len * geo.kv_stride + static_cast<int64_t>(group) * D;
  const bf16* k_src = k + kv_offset;
  const bf16* v_src = v + kv_offset;
  const int warp_id = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane / 4, pair = lane % 4;

  // The block's first row sees the earliest key, its last row the last one: key tiles
  // [first_tile, first_tile + tiles).
  const int64_t keys =
      VisibleKeys(geo, (i0 + kBlockRows < geo.q_len ? i0 + kBlockRows : geo.q_len) - 1);
  const int64_t first_tile = FirstKey(geo, i0) / kTileKeys;
  const int64_t end_tile = (keys + kTileKeys - 1) / kTileKeys;
  const int tiles = static_cast<int>(end_tile > first_tile ? end_tile - first_tile : 0);
  LoadTileAsync<kBlockRows, D>(q_tile,
                               q + bi * geo.q_len * geo.q_stride + static_cast<int64_t>(h) * D,
                               geo.q_stride, i0, geo.q_len);
  warp::CpAsyncCommit();  // the queries, then the first key/value tile, as two groups
  LoadTileAsync<kTileKeys, D>(k_tiles, k_src, geo.kv_stride, first_tile * kTileKeys, geo.kv_len);
  LoadTileAsync<kTileKeys, D>(v_tiles, v_src, geo.kv_stride, first_tile * kTileKeys, geo.kv_len);
  warp::CpAsyncCommit();

  // The warp's first row and the keys outside which it needs no tile.
  const int64_t first = i0 + warp_id * kWarpRows;
  WarpRows<D, kMTiles> w;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    w.m[mt][0] = w.m[mt][1] = -INFINITY;
    w.l[mt][0] = w.l[mt][1] = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      w.o[mt][n][0] = w.o[mt][n][1] = w.o[mt][n][2] = w.o[mt][n][3] = 0.0f;
    }
  }
  const int64_t warp_last =
      first + kWarpRows - 1 < geo.q_len ? first + kWarpRows - 1 : geo.q_len - 1;
  const int64_t warp_keys = first >= geo.q_len ? 0 : VisibleKeys(geo, warp_last);
  const int64_t warp_first_key = FirstKey(geo, first);

  warp::CpAsyncWait<1>();
  __syncthreads();  // the queries have landed
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      warp::LdMatrixX4(w.qf[mt][ks], q_tile + (warp_id * kWarpRows + mt * 16 + lane % 16) * kLd +
                                         ks * 16 + lane / 16 * 8);
    }
  }

  for (int it = 0; it < tiles; ++it) {
    warp::CpAsyncWait<0>();
    __syncthreads();  // tile `it` has landed everywhere; every warp is done with tile it - 1
    if (it + 1 < tiles) {
      const int64_t next = (first_tile + it + 1) * kTileKeys;
      const int buffer = (it + 1) % 2;
      LoadTileAsync<kTileKeys, D>(k_tiles + buffer * kTileElems, k_src, geo.kv_stride, next,
                                  geo.kv_len);
      LoadTileAsync<kTileKeys, D>(v_tiles + buffer * kTileElems, v_src, geo.kv_stride, next,
                                  geo.kv_len);
    }
    warp::CpAsyncCommit();
    const int64_t j0 = (first_tile + it) * kTileKeys;
    // None of the warp's rows sees a key of this tile.
    if (j0 >= warp_keys || j0 + kTileKeys <= warp_first_key) continue;

    float s[kMTiles][kTileKeys / 8][4];
    TileScores<D, kMTiles>(s, w, k_tiles + (it % 2) * kTileElems, lane);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      // The keys this lane's two rows of the group see, and the range [masked_below,
      // unmasked) in which no row of the group masks any (recomputed per tile rather than held
      // in registers).
      const int64_t group_first = first + mt * 16;
      const int64_t row_first[2] = {FirstKey(geo, group_first + quad),
                                    FirstKey(geo, group_first + quad + 8)};
      const int64_t visible[2] = {VisibleKeys(geo, group_first + quad),
                                  VisibleKeys(geo, group_first + quad + 8)};
      const int64_t unmasked = group_first + 15 < geo.q_len ? VisibleKeys(geo, group_first) : 0;
      const int64_t masked_below = FirstKey(geo, group_first + 15);
      const bool masked = j0 + kTileKeys > unmasked || j0 < masked_below;
      const float2 alpha =
          SoftmaxTile(s[mt], j0, pair, masked, row_first, visible, rule, w.m[mt], w.l[mt]);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        w.o[mt][n][0] *= alpha.x, w.o[mt][n][1] *= alpha.x;
        w.o[mt][n][2] *= alpha.y, w.o[mt][n][3] *= alpha.y;
      }
    }
    AddTileValues<D, kMTiles>(w, s, v_tiles + (it % 2) * kTileElems, lane);
  }
  FinishRows<D, kMTiles>(w, out, lse, q_tile + warp_id * kWarpRows * kLd, first, bi, h, geo, lane);
}

template <int D, int kMTiles>
absl::Status LaunchMmaForwardFor(cudaStream_t stream, void* out, float* lse, const void* q,
                                 const void* k, const void* v, const AttentionBlockDims& dims) {
  using Smem = MmaForwardSmem<D, kMTiles>;
  static_assert(Smem::kBytes <= kMaxSmemBytes, "forward tiles do not fit in shared memory");
  const auto kernel = MmaForwardKernel<D, kMTiles>;
  TY_RETURN_IF_ERROR(AllowSharedMemory(kernel, Smem::kBytes));
  const dim3 grid(BlocksFor(dims.q_len, Smem::kBlockRows), static_cast<unsigned>(dims.heads),
                  static_cast<unsigned>(dims.b));
  kernel<<<grid, kThreads, Smem::kBytes, stream>>>(
      static_cast<bf16*>(out), lse, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
      static_cast<const bf16*>(v), GeometryOf(dims), ScoreRuleOf(dims));
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("MmaForwardKernel");
  return absl::OkStatus();
}

template <int D>
absl::Status LaunchMmaForwardRows(cudaStream_t stream, void* out, float* lse, const void* q,
                                  const void* k, const void* v, const AttentionBlockDims& dims,
                                  int warp_rows) {
  if (warp_rows == 16) return LaunchMmaForwardFor<D, 1>(stream, out, lse, q, k, v, dims);
  if constexpr (MmaForwardSmem<D, 2>::kBytes <= kMaxSmemBytes) {
    return LaunchMmaForwardFor<D, 2>(stream, out, lse, q, k, v, dims);
  } else {
    return absl::InvalidArgumentError("attention forward: 32 query rows per warp at head dim " +
                                      std::to_string(D) + " do not fit in shared memory");
  }
}

}  // namespace

absl::Status LaunchMmaForward(cudaStream_t stream, void* out, float* lse, const void* q,
                              const void* k, const void* v, const AttentionBlockDims& dims,
                              int warp_rows) {
  if (warp_rows == 0) warp_rows = DefaultForwardWarpRows(dims.d);
  switch (dims.d) {
    case 16:
      return LaunchMmaForwardRows<16>(stream, out, lse, q, k, v, dims, warp_rows);
    case 32:
      return LaunchMmaForwardRows<32>(stream, out, lse, q, k, v, dims, warp_rows);
    case 64:
      return LaunchMmaForwardRows<64>(stream, out, lse, q, k, v, dims, warp_rows);
    case 128:
      return LaunchMmaForwardRows<128>(stream, out, lse, q, k, v, dims, warp_rows);
  }
  return CheckBlockDims(dims, DType::kBF16);  // names the unsupported head dim
}

}  // namespace attention_internal
}  // namespace trainyard::kernels::cuda
