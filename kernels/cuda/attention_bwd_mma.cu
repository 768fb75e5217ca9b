// The bf16 flash-attention backward on sm_80+ tensor cores: attention_bwd.cu's two deterministic
// passes (dK/dV per key tile, dQ per query tile, every sum in one fixed order), with each warp's
// scores, probabilities, their gradients and its accumulators in registers (mma.sync m16n8k16,
// ldmatrix operands from shared memory, warp_mma.cuh) instead of round trips through shared
// memory, and the next query (or key) tile arriving by cp.async while the current one is used.
//
//   KvKernel: a block owns kRows keys of one (batch, kv head); warp w owns keys [16w, 16w + 16)
//     and, per tile of queries of each query head of the group, computes Sᵀ = K·Qᵀ and
//     dPᵀ = V·dOᵀ, Pᵀ = exp(Zᵀ − lse) and dSᵀ = Pᵀ ∘ (dPᵀ − δ)·scale (Z the scores of the
//     products S, taken through a soft cap if the block has one: ScoreRule), then dV += Pᵀ·dO and
//     dK += dSᵀ·Q, Pᵀ and dSᵀ going from accumulators straight into A fragments.
//   DqKernel: a block owns kRows queries of one (batch, head); per key tile, S = Q·Kᵀ, dP = dO·Vᵀ,
//     dS as above, dQ += dS·K.
// Gradients are written once at the end from the accumulators (with `add`, added in fp32 to the
// values there and rounded once).
//
// With atomic dQ sums (AttentionDqSum::kAtomic, FlashAttention-2's way) the DqKernel does not
// run: KvKernel also stages each tile's dSᵀ in shared memory as bf16 and adds the tile's dQ share
// (dS·K over the block's keys) into an fp32 buffer with atomics, and DqFromSumsKernel rounds the
// sums into dq. Per (query tile, key tile) pair that is five tile products instead of seven,
// for q_len·heads·d fp32 of scratch and sums whose order depends on the order blocks run in.
#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace trainyard::kernels::cuda {
namespace attention_internal {
namespace {

// Inner tile (queries of the dK/dV pass, keys of the dQ pass): 64, or 32 at head dim 128 so that
// two buffers of it fit beside the block's own rows.
template <int D>
inline constexpr int kInner = D == 128 ? 32 : 64;

// Shared memory of both kernels: the block's own two tiles of kRows rows (keys and values, or
// queries and output gradients), then two buffers of each of the two inner tiles, then two
// buffers of the inner tile's lse and delta (dK/dV pass only).
template <int D>
struct MmaBackwardSmem {
  static constexpr int kOwn = TileBytes<bf16>(kRows, D);
  static constexpr int kTile = TileBytes<bf16>(kInner<D>, D);
  static constexpr int kRows0 = 0, kRows1 = kOwn;
  static constexpr int kInner0 = 2 * kOwn;  // two buffers
  static constexpr int kInner1 = kInner0 + 2 * kTile;
  static constexpr int kLse = kInner1 + 2 * kTile;  // two buffers of kInner fp32
  static constexpr int kDelta = kLse + 2 * AlignUp(kInner<D> * 4);
  static constexpr int kBytes = kDelta + 2 * AlignUp(kInner<D> * 4);
  // With atomic dQ sums, KvKernel's dSᵀ tile (kRows keys × kInner queries, bf16) follows.
  static constexpr int kDs = kBytes;
  static constexpr int kAtomicBytes = kDs + TileBytes<bf16>(kRows, kInner<D>);
};

// A warp's 16 rows of a block's own shared tile (D columns, leading dimension Ld<bf16>(D)) as mma
// A fragments along the head dim, for the products every inner tile takes with them: held in
// registers from Load on at d 64 (16 registers each, sparing 2·D/16 of a tile's 18·D/16
// ldmatrix), read from shared memory at every use otherwise (d 128's accumulators need the
// registers, and at d 32 ptxas spills with them held).
template <int D, bool kHold = (D == 64)>
struct RowFragments {
  uint32_t f[D / 16][4];
  __device__ __forceinline__ void Load(const bf16* rows, int lane) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      warp::LdMatrixX4(f[ks], rows + (lane % 16) * Ld<bf16>(D) + ks * 16 + lane / 16 * 8);
    }
  }
  __device__ __forceinline__ void Get(uint32_t (&a)[4], int ks, int /*lane*/) const {
    a[0] = f[ks][0], a[1] = f[ks][1], a[2] = f[ks][2], a[3] = f[ks][3];
  }
};
template <int D>
struct RowFragments<D, false> {
  const bf16* rows;
  __device__ __forceinline__ void Load(const bf16* r, int /*lane*/) { rows = r; }
  __device__ __forceinline__ void Get(uint32_t (&a)[4], int ks, int lane) const {
    warp::LdMatrixX4(a, rows + (lane % 16) * Ld<bf16>(D) + ks * 16 + lane / 16 * 8);
  }
};

// c[n] (16 rows × kCols as kCols/8 accumulators) = A·Bᵀ for A the warp's 16 rows `a` and B the
// kCols rows of `b` (a shared tile with D columns, leading dimension Ld<bf16>(D)).
template <int D, int kCols>
__device__ __forceinline__ void ProductABt(float (&c)[kCols / 8][4], const RowFragments<D>& a,
                                           const bf16* b, int lane) {
  constexpr int kLd = Ld<bf16>(D);
#pragma unroll
  for (int n = 0; n < kCols / 8; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t af[4];
    a.Get(af, ks, lane);
#pragma unroll
    for (int np = 0; np < kCols / 16; ++np) {
      uint32_t bf[4];
      warp::LdMatrixX4(
          bf, b + (np * 16 + lane / 16 * 8 + lane % 8) * kLd + ks * 16 + (lane / 8) % 2 * 8);
      warp::MmaBf16(c[2 * np], af, bf[0], bf[1]);
      warp::MmaBf16(c[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 rows × D) += P·B for P the warp's 16 × kK values in accumulator layout (rounded to
// bf16 as A fragments) and B the kK rows of shared tile `b` (D columns).
template <int D, int kK>
__device__ __forceinline__ void AddProductAB(float (&acc)[D / 8][4], const float (&p)[kK / 8][4],
                                             const bf16* b, int lane) {
  constexpr int kLd = Ld<bf16>(D);
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    const uint32_t a[4] = {PackBf16x2(p[2 * ks][0], p[2 * ks][1]),
                           PackBf16x2(p[2 * ks][2], p[2 * ks][3]),
                           PackBf16x2(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                           PackBf16x2(p[2 * ks + 1][2], p[2 * ks + 1][3])};
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t bf[4];
      warp::LdMatrixX4Trans(
          bf, b + (ks * 16 + (lane / 8) % 2 * 8 + lane % 8) * kLd + dn * 16 + lane / 16 * 8);
      warp::MmaBf16(acc[2 * dn], a, bf[0], bf[1]);
      warp::MmaBf16(acc[2 * dn + 1], a, bf[2], bf[3]);
    }
  }
}

// Writes (or with `add`, adds in fp32 to) rows `row0` + quad and + 8 of a gradient (D columns
// from `dst`, rows `stride` apart) from a warp's accumulators, skipping rows at or past `limit`.
template <int D>
__device__ __forceinline__ void StoreRows(bf16* dst, int64_t stride, int64_t row0, int64_t limit,
                                          const float (&acc)[D / 8][4], bool add, int lane) {
  const int quad = lane / 4, pair = lane % 4;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int64_t row = row0 + quad + 8 * hh;
    if (row >= limit) continue;
    bf16* p = dst + row * stride + 2 * pair;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float lo = acc[n][2 * hh], hi = acc[n][2 * hh + 1];
      uint32_t* word = reinterpret_cast<uint32_t*>(p + n * 8);
      if (add) {
        const uint32_t old = *word;
        lo += __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(old)));
        hi += __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(old >> 16)));
      }
      *word = PackBf16x2(lo, hi);
    }
  }
}

// One product's probability and its gradient, in place of the product `s` and of dP: P = exp(z
// − lse) where the key is visible, with dL/ds from dP as `rule` takes it (both 0 where not; lse
// in log2 units). Both passes take them this way, each in its own orientation.
__device__ __forceinline__ void ProbAndGrad(float& s, float& dp, bool visible, float lse,
                                            float delta, const ScoreRule& rule) {
  if (visible) {
    s = rule.ProbAndGrad(s, dp, lse, delta);
  } else {
    s = 0.0f;
    dp = 0.0f;
  }
}

// A warp's Pᵀ and dSᵀ against a tile of kQ queries (i0..): its 16 keys `k_rows` and values
// `v_rows` against the shared query tile, output-gradient tile, and the tile's lse (log2 units)
// and delta: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, then Pᵀ and dSᵀ by ProbAndGrad. `key` holds this lane's two
// key rows.
template <int D, int kQ>
__device__ __forceinline__ void KvTileScores(float (&p)[kQ / 8][4], float (&ds)[kQ / 8][4],
                                             const RowFragments<D>& k_rows,
                                             const RowFragments<D>& v_rows, const bf16* q_tile,
                                             const bf16* do_tile, const float* lse_tile,
                                             const float* delta_tile, int64_t i0,
                                             const int64_t (&key)[2], const BlockGeometry& geo,
                                             const ScoreRule& rule, int lane) {
  const int pair = lane % 4;
  ProductABt<D, kQ>(p, k_rows, q_tile, lane);
  ProductABt<D, kQ>(ds, v_rows, do_tile, lane);
#pragma unroll
  for (int n = 0; n < kQ / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = n * 8 + 2 * pair + e % 2;  // query i0 + c, key key[e / 2]
      ProbAndGrad(p[n][e], ds[n][e], Sees(geo, i0 + c, key[e / 2]), lse_tile[c], delta_tile[c],
                  rule);
    }
  }
}

// Stages a warp's dSᵀ (its 16 key rows × kQ queries, accumulator layout) in rows 16·warp.. of
// the block's shared dSᵀ tile as bf16; an idle warp (`ds` null) writes zeros there.
template <int kQ>
__device__ __forceinline__ void StageDsT(bf16* ds_tile, const float (*ds)[4], int warp_id,
                                         int lane) {
  constexpr int kLdS = Ld<bf16>(kQ);
  bf16* rows = ds_tile + warp_id * 16 * kLdS;
  if (ds == nullptr) {
    for (int i = lane; i < 16 * kQ / 2; i += 32) {
      *reinterpret_cast<uint32_t*>(rows + i / (kQ / 2) * kLdS + i % (kQ / 2) * 2) = 0u;
    }
    return;
  }
  const int quad = lane / 4, pair = lane % 4;
#pragma unroll
  for (int n = 0; n < kQ / 8; ++n) {
    *reinterpret_cast<uint32_t*>(rows + quad * kLdS + n * 8 + 2 * pair) =
        PackBf16x2(ds[n][0], ds[n][1]);
    *reinterpret_cast<uint32_t*>(rows + (quad + 8) * kLdS + n * 8 + 2 * pair) =
        PackBf16x2(ds[n][2], ds[n][3]);
  }
}

// Adds a query tile's dQ share from the block's keys, dS·K, into the fp32 sums: `sums` at query
// row 0 of the tile's head (rows `stride` apart), queries i0.. (rows at or past q_len skipped).
// dS comes from the block's shared dSᵀ tile (kRows keys × kQ queries) and K from its key tile.
// Warp w takes 16 of the tile's query rows and D / kSplit of the head's columns.
// Block-collective in that every warp takes a share; the tiles must be complete.
template <int D, int kQ>
__device__ __forceinline__ void AddDqShare(float* sums, int64_t stride, int64_t i0, int64_t q_len,
                                           const bf16* ds_tile, const bf16* k_tile, int warp_id,
                                           int lane) {
  constexpr int kRowGroups = kQ / 16;
  static_assert(kWarps % kRowGroups == 0, "the warps split the query rows evenly");
  constexpr int kSplit = kWarps / kRowGroups, kCols = D / kSplit;
  static_assert(kCols % 16 == 0, "each warp takes whole 16-column fragments");
  constexpr int kLdS = Ld<bf16>(kQ), kLd = Ld<bf16>(D);
  const int m0 = warp_id % kRowGroups * 16, c0 = warp_id / kRowGroups * kCols;
  float acc[kCols / 8][4];
#pragma unroll
  for (int n = 0; n < kCols / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < kRows / 16; ++ks) {  // keys 16·ks..: dS as A fragments, transposed
    uint32_t a[4];
    warp::LdMatrixX4Trans(
        a, ds_tile + (ks * 16 + lane / 16 * 8 + lane % 8) * kLdS + m0 + (lane / 8) % 2 * 8);
#pragma unroll
    for (int dn = 0; dn < kCols / 16; ++dn) {
      uint32_t b[4];
      warp::LdMatrixX4Trans(b, k_tile + (ks * 16 + (lane / 8) % 2 * 8 + lane % 8) * kLd + c0 +
                                   dn * 16 + lane / 16 * 8);
      warp::MmaBf16(acc[2 * dn], a, b[0], b[1]);
      warp::MmaBf16(acc[2 * dn + 1], a, b[2], b[3]);
    }
  }
  const int quad = lane / 4, pair = lane % 4;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int64_t row = i0 + m0 + quad + 8 * hh;
    if (row >= q_len) continue;
    float* p = sums + row * stride + c0 + 2 * pair;  // 8-byte aligned: every term is even
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
      // One atomic per column pair (sm_90's vector atomics halve the atomic traffic's requests).
      atomicAdd(reinterpret_cast<float2*>(p + n * 8),
                make_float2(acc[n][2 * hh], acc[n][2 * hh + 1]));
#else
      atomicAdd(p + n * 8, acc[n][2 * hh]);
      atomicAdd(p + n * 8 + 1, acc[n][2 * hh + 1]);
#endif
    }
  }
}

// Grid: (key tiles, kv heads, batch). See the file comment; lse in natural log, delta = rowsum(dO
// ∘ O), both [b, heads, q_len]. With kAtomicDq, dq_sums [b, q_len, heads·D] (zeroed) receives
// the dQ shares.
template <int D, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads)
    MmaKvKernel(bf16* dk, bf16* dv, float* dq_sums, const bf16* dout, const bf16* q, const bf16* k,
                const bf16* v, const float* lse, const float* delta, BlockGeometry geo, bool add,
                ScoreRule rule) {
  using Smem = MmaBackwardSmem<D>;
  constexpr int kQ = kInner<D>;
  constexpr int kLd = Ld<bf16>(D);
  constexpr int kTileElems = Smem::kTile / static_cast<int>(sizeof(bf16));
  constexpr int kRowVals = AlignUp(kQ * 4) / 4;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_tile = reinterpret_cast<bf16*>(smem + Smem::kRows0);
  bf16* v_tile = reinterpret_cast<bf16*>(smem + Smem::kRows1);
  bf16* q_tiles = reinterpret_cast<bf16*>(smem + Smem::kInner0);
  bf16* do_tiles = reinterpret_cast<bf16*>(smem + Smem::kInner1);
  float* lse_tiles = reinterpret_cast<float*>(smem + Smem::kLse);
  float* delta_tiles = reinterpret_cast<float*>(smem + Smem::kDelta);
  bf16* ds_tile = reinterpret_cast<bf16*>(smem + Smem::kDs);  // kAtomicDq only

  // Low key tiles of a causal block see the most queries and come first in the grid.
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int g = blockIdx.y, bi = blockIdx.z, group = geo.heads / geo.kv_heads;
  SelectBatch(geo, bi);
  const int64_t out_stride = static_cast<int64_t>(geo.heads) * D;
  const int64_t kv_offset = bi * geo.kv_len * geo.kv_stride + static_cast<int64_t>(g) * D;
  const bf16* q_base = q + bi * geo.q_len * geo.q_stride;
  const bf16* dout_base = dout + bi * geo.q_len * out_stride;
  // In a causal block no query before the block's first key sees it; with a sliding window none
  // after the window of its last key.
  const int64_t first_query = FirstQuery(geo, j0) / kQ * kQ;
  const int64_t end_query = EndQuery(geo, (j0 + kRows < geo.kv_len ? j0 + kRows : geo.kv_len) - 1);
  const int per_head =
      static_cast<int>(end_query > first_query ? (end_query - first_query + kQ - 1) / kQ : 0);
  const int tiles = per_head * group;
  // Tile `it`: query head g·group + it / per_head, queries from first_query + kQ·(it % per_head).
  auto load = [&](int it) {
    const int h = g * group + it / per_head, buffer = it % 2;
    const int64_t i0 = first_query + static_cast<int64_t>(it % per_head) * kQ;
    LoadTileAsync<kQ, D>(q_tiles + buffer * kTileElems, q_base + static_cast<int64_t>(h) * D,
                         geo.q_stride, i0, geo.q_len);
    LoadTileAsync<kQ, D>(do_tiles + buffer * kTileElems, dout_base + static_cast<int64_t>(h) * D,
                         out_stride, i0, geo.q_len);
    const int64_t head_row = (static_cast<int64_t>(bi) * geo.heads + h) * geo.q_len;
    LoadRowValues<kQ>(lse_tiles + buffer * kRowVals, lse + head_row, i0, geo.q_len, kLog2e);
    LoadRowValues<kQ>(delta_tiles + buffer * kRowVals, delta + head_row, i0, geo.q_len, 1.0f);
  };
  LoadTileAsync<kRows, D>(k_tile, k + kv_offset, geo.kv_stride, j0, geo.kv_len);
  LoadTileAsync<kRows, D>(v_tile, v + kv_offset, geo.kv_stride, j0, geo.kv_len);
  if (tiles > 0) load(0);  // none when no query sees the block's keys
  warp::CpAsyncCommit();

  const int warp_id = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane / 4;
  const int64_t first_key = j0 + warp_id * 16;
  const int64_t key[2] = {first_key + quad, first_key + quad + 8};
  // The queries that see one of the warp's keys: [warp_first_query, warp_end_query).
  const int64_t warp_last_key = first_key + 15 < geo.kv_len ? first_key + 15 : geo.kv_len - 1;
  const int64_t warp_first_query = FirstQuery(geo, first_key);
  const int64_t warp_end_query = EndQuery(geo, warp_last_key);
  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;
  }
  warp::CpAsyncWait<0>();
  __syncthreads();                 // the block's keys and values have landed
  RowFragments<D> k_rows, v_rows;  // the warp's keys and values, the A operands of every tile
  k_rows.Load(k_tile + warp_id * 16 * kLd, lane);
  v_rows.Load(v_tile + warp_id * 16 * kLd, lane);

  for (int it = 0; it < tiles; ++it) {
    warp::CpAsyncWait<0>();
    __syncthreads();  // tile `it` (and its lse and delta) has landed; tile it - 1 is done with
    if (it + 1 < tiles) load(it + 1);
    warp::CpAsyncCommit();
    const int64_t i0 = first_query + static_cast<int64_t>(it % per_head) * kQ;
    // Nothing to do for keys past the end, or queries that all come before or after those that
    // see the warp's keys (but zeros for the dSᵀ tile and a share of the tile's dQ, with atomic
    // sums).
    const bool idle =
        first_key >= geo.kv_len || i0 + kQ <= warp_first_query || i0 >= warp_end_query;
    if (!kAtomicDq && idle) continue;
    if (!idle) {
      const int buffer = it % 2;
      const bf16* q_tile = q_tiles + buffer * kTileElems;
      const bf16* do_tile = do_tiles + buffer * kTileElems;
      float p[kQ / 8][4], ds[kQ / 8][4];
      KvTileScores<D, kQ>(p, ds, k_rows, v_rows, q_tile, do_tile, lse_tiles + buffer * kRowVals,
                          delta_tiles + buffer * kRowVals, i0, key, geo, rule, lane);
      AddProductAB<D, kQ>(dv_acc, p, do_tile, lane);
      AddProductAB<D, kQ>(dk_acc, ds, q_tile, lane);
      if constexpr (kAtomicDq) StageDsT<kQ>(ds_tile, ds, warp_id, lane);
    } else {
      StageDsT<kQ>(ds_tile, nullptr, warp_id, lane);
    }
    if constexpr (kAtomicDq) {
      __syncthreads();  // the dSᵀ tile is complete
      AddDqShare<D, kQ>(dq_sums + bi * geo.q_len * out_stride +
                            static_cast<int64_t>(g * group + it / per_head) * D,
                        out_stride, i0, geo.q_len, ds_tile, k_tile, warp_id, lane);
    }
  }
  StoreRows<D>(dk + kv_offset, geo.kv_stride, first_key, geo.kv_len, dk_acc, add, lane);
  StoreRows<D>(dv + kv_offset, geo.kv_stride, first_key, geo.kv_len, dv_acc, add, lane);
}

// Grid: (query tiles, heads, batch). dQ_i = Σ_j dS_ij · k_j over the keys query i sees.
template <int D>
__global__ void __launch_bounds__(kThreads)
    MmaDqKernel(bf16* dq, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                const float* lse, const float* delta, BlockGeometry geo, bool add, ScoreRule rule) {
  using Smem = MmaBackwardSmem<D>;
  constexpr int kK = kInner<D>;
  constexpr int kLd = Ld<bf16>(D);
  constexpr int kTileElems = Smem::kTile / static_cast<int>(sizeof(bf16));
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem + Smem::kRows0);
  bf16* do_tile = reinterpret_cast<bf16*>(smem + Smem::kRows1);
  bf16* k_tiles = reinterpret_cast<bf16*>(smem + Smem::kInner0);
  bf16* v_tiles = reinterpret_cast<bf16*>(smem + Smem::kInner1);

  // The last query tiles of a causal block see the most keys; launching them first shortens the
  // grid's tail.
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  const int h = blockIdx.y, bi = blockIdx.z, g = h / (geo.heads / geo.kv_heads);
  SelectBatch(geo, bi);
  const int64_t out_stride = static_cast<int64_t>(geo.heads) * D;
  const int64_t q_offset = bi * geo.q_len * geo.q_stride + static_cast<int64_t>(h) * D;
  const int64_t kv_offset = bi * geo.kv_len * geo.kv_stride + static_cast<int64_t>(g) * D;
  const bf16* k_src = k + kv_offset;
  const bf16* v_src = v + kv_offset;
  // Key tiles [first_tile, first_tile + tiles): from the first row's earliest key to the last
  // row's last.
  const int64_t keys = VisibleKeys(geo, (i0 + kRows < geo.q_len ? i0 + kRows : geo.q_len) - 1);
  const int64_t first_tile = FirstKey(geo, i0) / kK, end_tile = (keys + kK - 1) / kK;
  const int tiles = static_cast<int>(end_tile > first_tile ? end_tile - first_tile : 0);
  LoadTileAsync<kRows, D>(q_tile, q + q_offset, geo.q_stride, i0, geo.q_len);
  const bf16* dout_rows = dout + bi * geo.q_len * out_stride + static_cast<int64_t>(h) * D;
  LoadTileAsync<kRows, D>(do_tile, dout_rows, out_stride, i0, geo.q_len);
  LoadTileAsync<kK, D>(k_tiles, k_src, geo.kv_stride, first_tile * kK, geo.kv_len);
  LoadTileAsync<kK, D>(v_tiles, v_src, geo.kv_stride, first_tile * kK, geo.kv_len);
  warp::CpAsyncCommit();

  const int warp_id = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane / 4, pair = lane % 4;
  const int64_t first = i0 + warp_id * 16;
  const int64_t row[2] = {first + quad, first + quad + 8};
  const int64_t visible[2] = {VisibleKeys(geo, row[0]), VisibleKeys(geo, row[1])};
  const int64_t row_first[2] = {FirstKey(geo, row[0]), FirstKey(geo, row[1])};
  const int64_t warp_last = first + 15 < geo.q_len ? first + 15 : geo.q_len - 1;
  const int64_t warp_keys = first >= geo.q_len ? 0 : VisibleKeys(geo, warp_last);
  const int64_t warp_first_key = FirstKey(geo, first);
  const int64_t head_row = (static_cast<int64_t>(bi) * geo.heads + h) * geo.q_len;
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const bool inside = row[hh] < geo.q_len;
    row_lse[hh] = inside ? lse[head_row + row[hh]] * kLog2e : 0.0f;
    row_delta[hh] = inside ? delta[head_row + row[hh]] : 0.0f;
  }
  float dq_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.0f;
  }
  warp::CpAsyncWait<0>();
  __syncthreads();                  // the block's queries and output gradients have landed
  RowFragments<D> q_rows, do_rows;  // the warp's rows of both, the A operands of every tile
  q_rows.Load(q_tile + warp_id * 16 * kLd, lane);
  do_rows.Load(do_tile + warp_id * 16 * kLd, lane);

  for (int it = 0; it < tiles; ++it) {
    warp::CpAsyncWait<0>();
    __syncthreads();  // tile `it` has landed everywhere; every warp is done with tile it - 1
    if (it + 1 < tiles) {
      const int64_t next = (first_tile + it + 1) * kK;
      const int buffer = (it + 1) % 2;
      LoadTileAsync<kK, D>(k_tiles + buffer * kTileElems, k_src, geo.kv_stride, next, geo.kv_len);
      LoadTileAsync<kK, D>(v_tiles + buffer * kTileElems, v_src, geo.kv_stride, next, geo.kv_len);
    }
    warp::CpAsyncCommit();
    const int64_t j0 = (first_tile + it) * kK;
    // None of the warp's rows sees a key of this tile.
    if (j0 >= warp_keys || j0 + kK <= warp_first_key) continue;
    const bf16* k_tile = k_tiles + (it % 2) * kTileElems;
    const bf16* v_tile = v_tiles + (it % 2) * kTileElems;

    float s[kK / 8][4], dp[kK / 8][4];
    ProductABt<D, kK>(s, q_rows, k_tile, lane);
    ProductABt<D, kK>(dp, do_rows, v_tile, lane);
#pragma unroll
    for (int n = 0; n < kK / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = j0 + n * 8 + 2 * pair + e % 2;
        const int hh = e / 2;
        ProbAndGrad(s[n][e], dp[n][e], j >= row_first[hh] && j < visible[hh], row_lse[hh],
                    row_delta[hh], rule);
      }
    }
    AddProductAB<D, kK>(dq_acc, dp, k_tile, lane);
  }
  StoreRows<D>(dq + q_offset, geo.q_stride, first, geo.q_len, dq_acc, add, lane);
}

// dq (rows `q_stride` apart, query head h at h·width / heads) = the fp32 sums [rows, width],
// rounded once; with `add`, the sums are first added to what dq holds. Eight columns per thread
// (width and q_stride multiples of 8).
__global__ void DqFromSumsKernel(bf16* dq, const float* sums, int64_t q_stride, int64_t rows,
                                 int64_t width, bool add) {
  const int64_t chunks = width / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * chunks) return;
  const int64_t row = i / chunks, c = i % chunks * 8;
  float v[8];
  Load8(v, sums + row * width + c);
  uint4* out = reinterpret_cast<uint4*>(dq + row * q_stride + c);
  uint32_t words[4];
  if (add) {
    const uint4 old = *out;
    const uint32_t old_words[4] = {old.x, old.y, old.z, old.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      v[2 * w] += __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(old_words[w])));
      v[2 * w + 1] +=
          __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(old_words[w] >> 16)));
    }
  }
#pragma unroll
  for (int w = 0; w < 4; ++w) words[w] = PackBf16x2(v[2 * w], v[2 * w + 1]);
  *out = make_uint4(words[0], words[1], words[2], words[3]);
}

// The dK/dV pass (with kAtomicDq, also adding the dQ shares into dq_sums).
template <int D, bool kAtomicDq>
absl::Status LaunchKv(cudaStream_t stream, const MmaBackwardOperands& x,
                      const AttentionBlockDims& dims, bool add, float* dq_sums) {
  const BlockGeometry geo = GeometryOf(dims);
  using Smem = MmaBackwardSmem<D>;
  constexpr int kBytes = kAtomicDq ? Smem::kAtomicBytes : Smem::kBytes;
  static_assert(kBytes <= kMaxSmemBytes, "backward tiles do not fit in shared memory");
  const auto kernel = MmaKvKernel<D, kAtomicDq>;
  TY_RETURN_IF_ERROR(AllowSharedMemory(kernel, kBytes));
  const dim3 grid(BlocksFor(dims.kv_len, kRows), static_cast<unsigned>(geo.kv_heads),
                  static_cast<unsigned>(dims.b));
  kernel<<<grid, kThreads, kBytes, stream>>>(x.dk, x.dv, dq_sums, x.dout, x.q, x.k, x.v, x.lse,
                                             x.delta, geo, add, ScoreRuleOf(dims));
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("MmaKvKernel");
  return absl::OkStatus();
}

// The atomic-dQ backward: the sums zeroed, the dK/dV pass adding dQ shares, dq from the sums.
template <int D>
absl::Status LaunchAtomicFor(cudaStream_t stream, const MmaBackwardOperands& x,
                             const AttentionBlockDims& dims, bool add, float* dq_sums) {
  const int64_t rows = dims.b * dims.q_len, width = dims.heads * D;
  TY_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(dq_sums, 0, static_cast<size_t>(rows * width) * sizeof(float), stream));
  TY_RETURN_IF_ERROR((LaunchKv<D, true>(stream, x, dims, add, dq_sums)));
  constexpr int kConvertThreads = 256;
  DqFromSumsKernel<<<BlocksFor(rows * (width / 8), kConvertThreads), kConvertThreads, 0, stream>>>(
      x.dq, dq_sums, dims.q_stride, rows, width, add);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("DqFromSumsKernel");
  return absl::OkStatus();
}

template <int D>
absl::Status LaunchFor(cudaStream_t stream, const MmaBackwardOperands& x,
                       const AttentionBlockDims& dims, bool add, float* dq_sums) {
  if (dq_sums != nullptr) return LaunchAtomicFor<D>(stream, x, dims, add, dq_sums);
  TY_RETURN_IF_ERROR((LaunchKv<D, false>(stream, x, dims, add, nullptr)));
  const BlockGeometry geo = GeometryOf(dims);
  constexpr int kBytes = MmaBackwardSmem<D>::kBytes;

  TY_RETURN_IF_ERROR(AllowSharedMemory(MmaDqKernel<D>, kBytes));
  const dim3 dq_grid(BlocksFor(dims.q_len, kRows), static_cast<unsigned>(geo.heads),
                     static_cast<unsigned>(dims.b));
  MmaDqKernel<D><<<dq_grid, kThreads, kBytes, stream>>>(x.dq, x.dout, x.q, x.k, x.v, x.lse, x.delta,
                                                        geo, add, ScoreRuleOf(dims));
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("MmaDqKernel");
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchMmaBackward(cudaStream_t stream, const MmaBackwardOperands& x,
                               const AttentionBlockDims& dims, bool add, float* dq_sums) {
  switch (dims.d) {
    case 16:
      return LaunchFor<16>(stream, x, dims, add, dq_sums);
    case 32:
      return LaunchFor<32>(stream, x, dims, add, dq_sums);
    case 64:
      return LaunchFor<64>(stream, x, dims, add, dq_sums);
    case 128:
      return LaunchFor<128>(stream, x, dims, add, dq_sums);
  }
  return CheckBlockDims(dims, DType::kBF16);  // names the unsupported head dim
}

}  // namespace attention_internal
}  // namespace trainyard::kernels::cuda
