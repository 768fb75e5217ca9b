// Flash-attention backward, FlashAttention-2 style, for an attention block (attention_block.h)
// and for the causal self-attention of a packed qkv (attention.h, the block of the qkv against
// itself), in three deterministic kernels:
//   1. RowDotKernel:  delta_i = rowsum(dO ∘ O) (fp32, into the caller's scratch);
//   2. KvKernel:      a block owns kRows keys of one (batch, kv head) and walks the query tiles
//                     that see them (in a causal block: at or below the diagonal; with a
//                     sliding window, inside it), for every
//                     query head of the group in turn, accumulating dK = Σ dSᵀ·Q and
//                     dV = Σ Pᵀ·dO in registers;
//   3. DqKernel:      a block owns kRows queries of one (batch, head) and walks the key tiles
//                     they see (in a causal block: up to the diagonal; with a sliding window,
//                     from its start), accumulating
//                     dQ = Σ dS·K in registers.
// Each writes its gradients once at the end, either overwriting (the packed qkv's gradient) or
// adding to what is there (a block's share: an fp32 sum rounded once).
// Both 2 and 3 recompute P = exp(z − lse) (z the score of q·k, ScoreRule) and dP = dO·Vᵀ from the
// saved log-sum-exp. FlashAttention-2 instead adds dQ into an fp32 buffer with atomics from kernel
// 2, which saves that recomputation but makes the result depend on the order the blocks run in;
// here every sum has one fixed order, so a backward run twice gives bit-identical gradients. (The
// bf16 path offers FlashAttention-2's way too, AttentionDqSum::kAtomic: attention_bwd_mma.cu.)
// Likewise the key/value gradients of a GQA group are summed over its query heads inside one block,
// in head order. Passes 2 and 3 here run fp32 storage; bf16 runs attention_bwd_mma.cu's, the same
// passes with scores in registers.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/attention_common.cuh"

namespace trainyard::kernels::cuda {
namespace attention_internal {
namespace {

// Byte offsets into KvKernel's shared memory: the block's keys and values, then per step a tile
// of kQueries queries with their output gradients, lse and delta, and the transposed scores.
template <typename T, int D, int kQueries>
struct KvSmem {
  static constexpr int kK = 0;                                // kRows × D
  static constexpr int kV = kK + TileBytes<T>(kRows, D);      // kRows × D
  static constexpr int kQ = kV + TileBytes<T>(kRows, D);      // kQueries × D
  static constexpr int kDO = kQ + TileBytes<T>(kQueries, D);  // kQueries × D
  static constexpr int kS = kDO + TileBytes<T>(kQueries, D);  // Sᵀ fp32, kRows × kQueries
  static constexpr int kDP = kS + TileBytes<float>(kRows, kQueries);  // dPᵀ fp32
  static constexpr int kP = kDP + TileBytes<float>(kRows, kQueries);  // Pᵀ as T (bf16)
  static constexpr int kDS = kP + (kInPlaceProbs<T> ? 0 : TileBytes<T>(kRows, kQueries));  // dSᵀ
  static constexpr int kLse = kDS + (kInPlaceProbs<T> ? 0 : TileBytes<T>(kRows, kQueries));
  static constexpr int kDelta = kLse + AlignUp(kQueries * 4);
  static constexpr int kBytes = kDelta + AlignUp(kQueries * 4);
};

// Byte offsets into DqKernel's shared memory: the block's queries, output gradients, lse and
// delta, then per step a tile of kKeys keys and values, and the scores.
template <typename T, int D, int kKeys>
struct DqSmem {
  static constexpr int kQ = 0;                                      // kRows × D
  static constexpr int kDO = kQ + TileBytes<T>(kRows, D);           // kRows × D
  static constexpr int kK = kDO + TileBytes<T>(kRows, D);           // kKeys × D
  static constexpr int kV = kK + TileBytes<T>(kKeys, D);            // kKeys × D
  static constexpr int kS = kV + TileBytes<T>(kKeys, D);            // S fp32, kRows × kKeys
  static constexpr int kDP = kS + TileBytes<float>(kRows, kKeys);   // dP fp32
  static constexpr int kDS = kDP + TileBytes<float>(kRows, kKeys);  // dS as T (bf16)
  static constexpr int kLse = kDS + (kInPlaceProbs<T> ? 0 : TileBytes<T>(kRows, kKeys));
  static constexpr int kDelta = kLse + AlignUp(kRows * 4);
  static constexpr int kBytes = kDelta + AlignUp(kRows * 4);
};

// The widest inner tiles whose shared memory fits.
template <typename T, int D>
constexpr int KvQueries() {
  if (KvSmem<T, D, 64>::kBytes <= kMaxSmemBytes) return 64;
  if (KvSmem<T, D, 32>::kBytes <= kMaxSmemBytes) return 32;
  return 16;
}
template <typename T, int D>
constexpr int DqKeys() {
  if (DqSmem<T, D, 64>::kBytes <= kMaxSmemBytes) return 64;
  if (DqSmem<T, D, 32>::kBytes <= kMaxSmemBytes) return 32;
  return 16;
}

// delta[b, h, i] = Σ_c dout[b, i, h·d + c] · out[b, i, h·d + c] in fp32; one warp per
// (b, i, h), `rows` = b·q_len·heads of them in memory order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RowDotKernel(float* delta, const T* dout, const T* out, int64_t q_len, int heads, int d,
                 int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows) return;  // uniform across the warp
  const int lane = threadIdx.x % 32;
  const T* dy = dout + row * d;
  const T* y = out + row * d;
  float sum = 0.0f;
  for (int c = lane; c < d; c += 32) sum += ToFloat(dy[c]) * ToFloat(y[c]);
  sum = WarpSum(sum);
  if (lane == 0) {
    const int64_t h = row % heads, i = row / heads % q_len, bi = row / heads / q_len;
    delta[(bi * heads + h) * q_len + i] = sum;
  }
}

// Grid: (key tiles, kv heads, batch). Writes (or with `add`, adds to) the key and value
// gradients of the block's keys j: dK_j = Σ_h Σ_i dS_hij · q_hi and dV_j = Σ_h Σ_i P_hij · dO_hi
// over the query heads h of the group and the queries i that see key j. Warp w owns keys
// [16w, 16w + 16) and works on Sᵀ (keys × queries), so everything but the shared query tile stays
// within the warp.
template <typename T, int D, int kQueries>
__global__ void __launch_bounds__(kThreads)
    KvKernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const float* lse,
             const float* delta, BlockGeometry geo, bool add, ScoreRule rule) {
  using Mma = TileMma<T>;
  using Acc = typename Mma::Acc;
  using Smem = KvSmem<T, D, kQueries>;
  constexpr int kLdD = Ld<T>(D);
  constexpr int kLdS = Ld<float>(kQueries);
  constexpr int kLdP = kInPlaceProbs<T> ? kLdS : Ld<T>(kQueries);
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_tile = reinterpret_cast<T*>(smem + Smem::kK);
  T* v_tile = reinterpret_cast<T*>(smem + Smem::kV);
  T* q_tile = reinterpret_cast<T*>(smem + Smem::kQ);
  T* do_tile = reinterpret_cast<T*>(smem + Smem::kDO);
  float* scores = reinterpret_cast<float*>(smem + Smem::kS);
  float* dprobs = reinterpret_cast<float*>(smem + Smem::kDP);
  T* probs =
      kInPlaceProbs<T> ? reinterpret_cast<T*>(scores) : reinterpret_cast<T*>(smem + Smem::kP);
  T* dscores =
      kInPlaceProbs<T> ? reinterpret_cast<T*>(dprobs) : reinterpret_cast<T*>(smem + Smem::kDS);
  float* lse_tile = reinterpret_cast<float*>(smem + Smem::kLse);
  float* delta_tile = reinterpret_cast<float*>(smem + Smem::kDelta);

  // Low key tiles of a causal block see the most queries and come first in the grid.
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int g = blockIdx.y, bi = blockIdx.z, group = geo.heads / geo.kv_heads;
  SelectBatch(geo, bi);
  const int64_t out_stride = static_cast<int64_t>(geo.heads) * D;
  const int64_t kv_offset = bi * geo.kv_len * geo.kv_stride + static_cast<int64_t>(g) * D;
  const T* q_base = q + bi * geo.q_len * geo.q_stride;
  const T* dout_base = dout + bi * geo.q_len * out_stride;
  LoadTile<T, kRows, D>(k_tile, k + kv_offset, geo.kv_stride, j0, geo.kv_len);
  LoadTile<T, kRows, D>(v_tile, v + kv_offset, geo.kv_stride, j0, geo.kv_len);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Acc dk_acc[D / 16], dv_acc[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    Mma::Zero(dk_acc[n]);
    Mma::Zero(dv_acc[n]);
  }
  // Lanes 2r and 2r + 1 compute row r (key `key`) of the warp's Pᵀ and dSᵀ, half each.
  const int r = lane / 2, c0 = lane % 2 * (kQueries / 2);
  const int64_t key = j0 + warp * 16 + r;
  const T* k_warp = k_tile + warp * 16 * kLdD;
  const T* v_warp = v_tile + warp * 16 * kLdD;
  float* s_warp = scores + warp * 16 * kLdS;
  float* dp_warp = dprobs + warp * 16 * kLdS;
  T* p_warp = probs + warp * 16 * kLdP;
  T* ds_warp = dscores + warp * 16 * kLdP;

  // In a causal block no query before the block's first key sees it; with a sliding window none
  // after the window of its last key.
  const int64_t first_query = FirstQuery(geo, j0) / kQueries * kQueries;
  const int64_t end_query = EndQuery(geo, (j0 + kRows < geo.kv_len ? j0 + kRows : geo.kv_len) - 1);
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const float* lse_row = lse + (static_cast<int64_t>(bi) * geo.heads + h) * geo.q_len;
    const float* delta_row = delta + (static_cast<int64_t>(bi) * geo.heads + h) * geo.q_len;
    for (int64_t i0 = first_query; i0 < end_query; i0 += kQueries) {
      __syncthreads();  // every warp is done with the previous query tile
      LoadTile<T, kQueries, D>(q_tile, q_base + static_cast<int64_t>(h) * D, geo.q_stride, i0,
                               geo.q_len);
      LoadTile<T, kQueries, D>(do_tile, dout_base + static_cast<int64_t>(h) * D, out_stride, i0,
                               geo.q_len);
      LoadRowValues<kQueries>(lse_tile, lse_row, i0, geo.q_len, kLog2e);
      LoadRowValues<kQueries>(delta_tile, delta_row, i0, geo.q_len, 1.0f);
      __syncthreads();
#pragma unroll
      for (int n = 0; n < kQueries / 16; ++n) {
        Acc a;
        Mma::Zero(a);
        Mma::template MulAddABt<D>(a, k_warp, kLdD, q_tile + n * 16 * kLdD, kLdD);
        Mma::Store(s_warp + n * 16, kLdS, a);
        Mma::Zero(a);
        Mma::template MulAddABt<D>(a, v_warp, kLdD, do_tile + n * 16 * kLdD, kLdD);
        Mma::Store(dp_warp + n * 16, kLdS, a);
      }
      __syncwarp();
#pragma unroll
      for (int c = c0; c < c0 + kQueries / 2; ++c) {
        float p = 0.0f, ds = 0.0f;
        if (Sees(geo, i0 + c, key)) {
          ds = dp_warp[r * kLdS + c];
          p = rule.ProbAndGrad(s_warp[r * kLdS + c], ds, lse_tile[c], delta_tile[c]);
        }
        p_warp[r * kLdP + c] = FromFloat<T>(p);
        ds_warp[r * kLdP + c] = FromFloat<T>(ds);
      }
      __syncwarp();
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        Mma::template MulAddAB<kQueries>(dv_acc[n], p_warp, kLdP, do_tile + n * 16, kLdD);
        Mma::template MulAddAB<kQueries>(dk_acc[n], ds_warp, kLdP, q_tile + n * 16, kLdD);
      }
    }
  }

#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    StoreAccTile<T>(dk + kv_offset + n * 16, geo.kv_stride, j0 + warp * 16, geo.kv_len, dk_acc[n],
                    s_warp, kLdS, add);
    StoreAccTile<T>(dv + kv_offset + n * 16, geo.kv_stride, j0 + warp * 16, geo.kv_len, dv_acc[n],
                    s_warp, kLdS, add);
  }
}

// Grid: (query tiles, heads, batch). Writes (or with `add`, adds to) the query gradients of the
// block's queries i: dQ_i = Σ_j dS_ij · k_j over the keys j that query i sees. Warp w owns
// queries [16w, 16w + 16).
template <typename T, int D, int kKeys>
__global__ void __launch_bounds__(kThreads)
    DqKernel(T* dq, const T* dout, const T* q, const T* k, const T* v, const float* lse,
             const float* delta, BlockGeometry geo, bool add, ScoreRule rule) {
  using Mma = TileMma<T>;
  using Acc = typename Mma::Acc;
  using Smem = DqSmem<T, D, kKeys>;
  constexpr int kLdD = Ld<T>(D);
  constexpr int kLdS = Ld<float>(kKeys);
  constexpr int kLdP = kInPlaceProbs<T> ? kLdS : Ld<T>(kKeys);
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem + Smem::kQ);
  T* do_tile = reinterpret_cast<T*>(smem + Smem::kDO);
  T* k_tile = reinterpret_cast<T*>(smem + Smem::kK);
  T* v_tile = reinterpret_cast<T*>(smem + Smem::kV);
  float* scores = reinterpret_cast<float*>(smem + Smem::kS);
  float* dprobs = reinterpret_cast<float*>(smem + Smem::kDP);
  T* dscores =
      kInPlaceProbs<T> ? reinterpret_cast<T*>(dprobs) : reinterpret_cast<T*>(smem + Smem::kDS);
  float* lse_tile = reinterpret_cast<float*>(smem + Smem::kLse);
  float* delta_tile = reinterpret_cast<float*>(smem + Smem::kDelta);

  // The last query tiles of a causal block see the most keys; launching them first shortens the
  // grid's tail.
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  const int h = blockIdx.y, bi = blockIdx.z, g = h / (geo.heads / geo.kv_heads);
  SelectBatch(geo, bi);
  const int64_t out_stride = static_cast<int64_t>(geo.heads) * D;
  const int64_t q_offset = bi * geo.q_len * geo.q_stride + static_cast<int64_t>(h) * D;
  const int64_t kv_offset = bi * geo.kv_len * geo.kv_stride + static_cast<int64_t>(g) * D;
  const T* k_src = k + kv_offset;
  const T* v_src = v + kv_offset;
  const int64_t head_row = (static_cast<int64_t>(bi) * geo.heads + h) * geo.q_len;
  LoadTile<T, kRows, D>(q_tile, q + q_offset, geo.q_stride, i0, geo.q_len);
  LoadTile<T, kRows, D>(do_tile, dout + bi * geo.q_len * out_stride + static_cast<int64_t>(h) * D,
                        out_stride, i0, geo.q_len);
  LoadRowValues<kRows>(lse_tile, lse + head_row, i0, geo.q_len, kLog2e);
  LoadRowValues<kRows>(delta_tile, delta + head_row, i0, geo.q_len, 1.0f);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Acc dq_acc[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) Mma::Zero(dq_acc[n]);
  // Lanes 2r and 2r + 1 compute row r (query `row`) of the warp's dS, half each.
  const int r = lane / 2, c0 = lane % 2 * (kKeys / 2);
  const int64_t row = i0 + warp * 16 + r, row_keys = VisibleKeys(geo, row);
  const int64_t row_first = FirstKey(geo, row);
  const T* q_warp = q_tile + warp * 16 * kLdD;
  const T* do_warp = do_tile + warp * 16 * kLdD;
  float* s_warp = scores + warp * 16 * kLdS;
  float* dp_warp = dprobs + warp * 16 * kLdS;
  T* ds_warp = dscores + warp * 16 * kLdP;

  // The block's first row sees the earliest key, its last row the last one.
  const int64_t keys = VisibleKeys(geo, (i0 + kRows < geo.q_len ? i0 + kRows : geo.q_len) - 1);
  for (int64_t j0 = FirstKey(geo, i0) / kKeys * kKeys; j0 < keys; j0 += kKeys) {
    __syncthreads();  // every warp is done with the previous key/value tile
    LoadTile<T, kKeys, D>(k_tile, k_src, geo.kv_stride, j0, geo.kv_len);
    LoadTile<T, kKeys, D>(v_tile, v_src, geo.kv_stride, j0, geo.kv_len);
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kKeys / 16; ++n) {
      Acc a;
      Mma::Zero(a);
      Mma::template MulAddABt<D>(a, q_warp, kLdD, k_tile + n * 16 * kLdD, kLdD);
      Mma::Store(s_warp + n * 16, kLdS, a);
      Mma::Zero(a);
      Mma::template MulAddABt<D>(a, do_warp, kLdD, v_tile + n * 16 * kLdD, kLdD);
      Mma::Store(dp_warp + n * 16, kLdS, a);
    }
    __syncwarp();
    const float row_lse = lse_tile[warp * 16 + r], row_delta = delta_tile[warp * 16 + r];
#pragma unroll
    for (int c = c0; c < c0 + kKeys / 2; ++c) {
      const bool seen = j0 + c >= row_first && j0 + c < row_keys;
      float ds = 0.0f;
      if (seen) {
        ds = dp_warp[r * kLdS + c];
        rule.ProbAndGrad(s_warp[r * kLdS + c], ds, row_lse, row_delta);
      }
      ds_warp[r * kLdP + c] = FromFloat<T>(ds);
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      Mma::template MulAddAB<kKeys>(dq_acc[n], ds_warp, kLdP, k_tile + n * 16, kLdD);
    }
  }

#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    StoreAccTile<T>(dq + q_offset + n * 16, geo.q_stride, i0 + warp * 16, geo.q_len, dq_acc[n],
                    s_warp, kLdS, add);
  }
}

// The operands of one backward (see AttentionBlockBackward), typed.
template <typename T>
struct BackwardOperands {
  T *dq, *dk, *dv;
  const T *dout, *q, *k, *v, *out;
  const float* lse;
  float* delta;
};

template <typename T, int D>
absl::Status LaunchTileBackward(cudaStream_t stream, const BackwardOperands<T>& x,
                                const AttentionBlockDims& dims, bool add);

template <typename T, int D>
absl::Status LaunchBackward(cudaStream_t stream, const BackwardOperands<T>& x,
                            const AttentionBlockDims& dims, bool add, float* dq_sums) {
  const BlockGeometry geo = GeometryOf(dims);
  const dim3 threads(kThreads);
  const int64_t rows = dims.b * dims.q_len * dims.heads;
  RowDotKernel<T><<<BlocksFor(rows, kWarps), threads, 0, stream>>>(x.delta, x.dout, x.out,
                                                                   dims.q_len, geo.heads, D, rows);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("RowDotKernel");
  if constexpr (std::is_same_v<T, bf16>) {
    return LaunchMmaBackward(stream, {x.dq, x.dk, x.dv, x.dout, x.q, x.k, x.v, x.lse, x.delta},
                             dims, add, dq_sums);
  } else {
    return LaunchTileBackward<T, D>(stream, x, dims, add);
  }
}

// The fp32 passes 2 and 3.
template <typename T, int D>
absl::Status LaunchTileBackward(cudaStream_t stream, const BackwardOperands<T>& x,
                                const AttentionBlockDims& dims, bool add) {
  const BlockGeometry geo = GeometryOf(dims);
  const ScoreRule rule = ScoreRuleOf(dims);
  const dim3 threads(kThreads);
  constexpr int kQueries = KvQueries<T, D>();
  constexpr int kKvBytes = KvSmem<T, D, kQueries>::kBytes;
  static_assert(kKvBytes <= kMaxSmemBytes, "dK/dV tiles do not fit in shared memory");
  TY_RETURN_IF_ERROR(AllowSharedMemory(KvKernel<T, D, kQueries>, kKvBytes));
  const dim3 kv_grid(BlocksFor(dims.kv_len, kRows), static_cast<unsigned>(geo.kv_heads),
                     static_cast<unsigned>(dims.b));
  KvKernel<T, D, kQueries><<<kv_grid, threads, kKvBytes, stream>>>(
      x.dk, x.dv, x.dout, x.q, x.k, x.v, x.lse, x.delta, geo, add, rule);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("KvKernel");

  constexpr int kKeys = DqKeys<T, D>();
  constexpr int kDqBytes = DqSmem<T, D, kKeys>::kBytes;
  static_assert(kDqBytes <= kMaxSmemBytes, "dQ tiles do not fit in shared memory");
  TY_RETURN_IF_ERROR(AllowSharedMemory(DqKernel<T, D, kKeys>, kDqBytes));
  const dim3 dq_grid(BlocksFor(dims.q_len, kRows), static_cast<unsigned>(geo.heads),
                     static_cast<unsigned>(dims.b));
  DqKernel<T, D, kKeys><<<dq_grid, threads, kDqBytes, stream>>>(x.dq, x.dout, x.q, x.k, x.v, x.lse,
                                                                x.delta, geo, add, rule);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("DqKernel");
  return absl::OkStatus();
}

template <typename T>
absl::Status BackwardForHeadDim(cudaStream_t stream, void* dq, void* dk, void* dv, const void* dout,
                                const void* q, const void* k, const void* v, const void* out,
                                const float* lse, float* delta, const AttentionBlockDims& dims,
                                bool add, float* dq_sums) {
  const BackwardOperands<T> x{static_cast<T*>(dq),
                              static_cast<T*>(dk),
                              static_cast<T*>(dv),
                              static_cast<const T*>(dout),
                              static_cast<const T*>(q),
                              static_cast<const T*>(k),
                              static_cast<const T*>(v),
                              static_cast<const T*>(out),
                              lse,
                              delta};
  switch (dims.d) {
    case 16:
      return LaunchBackward<T, 16>(stream, x, dims, add, dq_sums);
    case 32:
      return LaunchBackward<T, 32>(stream, x, dims, add, dq_sums);
    case 64:
      return LaunchBackward<T, 64>(stream, x, dims, add, dq_sums);
    case 128:
      return LaunchBackward<T, 128>(stream, x, dims, add, dq_sums);
  }
  return CheckBlockDims(dims, DType::kF32);  // names the unsupported head dim
}

// Where the atomic dQ sums start in the scratch: past the deltas, at a 256-byte boundary.
size_t DqSumsOffset(const AttentionBlockDims& dims) {
  return (AttentionBlockBackwardScratchBytes(dims) + 255) / 256 * 256;
}

// The scratch of a backward summing dQ as `dq_sum` says.
size_t BackwardScratchBytes(const AttentionBlockDims& dims, DType dtype, AttentionDqSum dq_sum) {
  if (dq_sum == AttentionDqSum::kDeterministic || dtype != DType::kBF16) {
    return AttentionBlockBackwardScratchBytes(dims);
  }
  if (dims.b <= 0 || dims.q_len <= 0 || dims.heads <= 0 || dims.d <= 0) return 0;
  return DqSumsOffset(dims) +
         static_cast<size_t>(dims.b * dims.q_len * dims.heads * dims.d) * sizeof(float);
}

// Both public backwards: checks the tensors and launches; `add` chooses += over =.
absl::Status Backward(cudaStream_t stream, DType dtype, void* dq, void* dk, void* dv,
                      const void* dout, const void* q, const void* k, const void* v,
                      const void* out, const float* lse, const AttentionBlockDims& dims,
                      void* scratch, size_t scratch_bytes, bool add, AttentionDqSum dq_sum) {
  TY_RETURN_IF_ERROR(CheckBlockDims(dims, dtype));
  TY_REQUIRE(dq != nullptr && dk != nullptr && dv != nullptr && dout != nullptr && q != nullptr &&
             k != nullptr && v != nullptr && out != nullptr && lse != nullptr &&
             scratch != nullptr);
  TY_REQUIRE(Aligned16(dq) && Aligned16(dk) && Aligned16(dv) && Aligned16(dout) && Aligned16(q) &&
             Aligned16(k) && Aligned16(v) && Aligned16(out) && Aligned16(scratch));
  TY_REQUIRE(scratch_bytes >= BackwardScratchBytes(dims, dtype, dq_sum));
  float* delta = static_cast<float*>(scratch);
  if (dtype == DType::kBF16) {
    float* dq_sums =
        dq_sum == AttentionDqSum::kAtomic
            ? reinterpret_cast<float*>(static_cast<char*>(scratch) + DqSumsOffset(dims))
            : nullptr;
    return BackwardForHeadDim<bf16>(stream, dq, dk, dv, dout, q, k, v, out, lse, delta, dims, add,
                                    dq_sums);
  }
  return BackwardForHeadDim<float>(stream, dq, dk, dv, dout, q, k, v, out, lse, delta, dims, add,
                                   nullptr);
}

}  // namespace
}  // namespace attention_internal

size_t AttentionBlockBackwardScratchBytes(const AttentionBlockDims& dims) {
  // delta: one fp32 per (batch, head, query row), whatever the storage type.
  if (dims.b <= 0 || dims.q_len <= 0 || dims.heads <= 0) return 0;
  return static_cast<size_t>(dims.b) * static_cast<size_t>(dims.heads) *
         static_cast<size_t>(dims.q_len) * sizeof(float);
}

absl::Status AttentionBlockBackward(cudaStream_t stream, DType dtype, void* dq, void* dk, void* dv,
                                    const void* dout, const void* q, const void* k, const void* v,
                                    const void* out, const float* lse,
                                    const AttentionBlockDims& dims, void* scratch,
                                    size_t scratch_bytes) {
  return attention_internal::Backward(stream, dtype, dq, dk, dv, dout, q, k, v, out, lse, dims,
                                      scratch, scratch_bytes, /*add=*/true,
                                      AttentionDqSum::kDeterministic);
}

size_t FlashAttentionBackwardScratchBytes(const AttentionDims& dims, DType dtype,
                                          AttentionDqSum dq_sum) {
  if (dims.b <= 0 || dims.t <= 0 || dims.heads <= 0) return 0;
  return attention_internal::BackwardScratchBytes(attention_internal::PackedQkvBlock(dims), dtype,
                                                  dq_sum);
}

absl::Status FlashAttentionBackward(cudaStream_t stream, DType dtype, void* dqkv, const void* dout,
                                    const void* qkv, const void* out, const float* lse,
                                    const AttentionDims& dims, void* scratch, size_t scratch_bytes,
                                    AttentionDqSum dq_sum) {
  namespace ai = attention_internal;
  TY_RETURN_IF_ERROR(ai::CheckAttentionDims(dims));
  TY_REQUIRE(dqkv != nullptr && qkv != nullptr);
  const int64_t keys = ai::PackedKeys(dims), values = ai::PackedValues(dims);
  return ai::Backward(stream, dtype, dqkv, ai::ElementsPast(dqkv, keys, dtype),
                      ai::ElementsPast(dqkv, values, dtype), dout, qkv,
                      ai::ElementsPast(qkv, keys, dtype), ai::ElementsPast(qkv, values, dtype), out,
                      lse, ai::PackedQkvBlock(dims), scratch, scratch_bytes, /*add=*/false, dq_sum);
}

}  // namespace trainyard::kernels::cuda
