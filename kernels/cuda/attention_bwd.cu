// Causal flash-attention backward, FlashAttention-2 style, in three deterministic kernels:
//   1. RowDotKernel:  delta_i = rowsum(dO ∘ O) (fp32, into the caller's scratch);
//   2. KvKernel:      a block owns kRows keys of one (batch, kv head) and walks the query tiles
//                     at or below the diagonal, for every query head of the group in turn,
//                     accumulating dK = Σ dSᵀ·Q and dV = Σ Pᵀ·dO in registers;
//   3. DqKernel:      a block owns kRows queries of one (batch, head) and walks the key tiles up
//                     to the diagonal, accumulating dQ = Σ dS·K in registers.
// Both 2 and 3 recompute P = exp(scale·q·k − lse) and dP = dO·Vᵀ from the saved log-sum-exp.
// FlashAttention-2 instead adds dQ into an fp32 buffer with atomics from kernel 2, which saves
// that recomputation but makes the result depend on the order the blocks run in; here every sum
// has one fixed order, so a backward run twice gives bit-identical gradients. Likewise the key/
// value gradients of a GQA group are summed over its query heads inside one block, in head order.
#include "kernels/cuda/attention.h"
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
// (b, i, h), `rows` = b·t·heads of them in memory order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RowDotKernel(float* delta, const T* dout, const T* out, int64_t t, int heads, int d,
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
    const int64_t h = row % heads, i = row / heads % t, bi = row / heads / t;
    delta[(bi * heads + h) * t + i] = sum;
  }
}

// Grid: (key tiles, kv heads, batch). Writes the key and value slots of dqkv for the block's
// keys j: dK_j = Σ_h Σ_{i ≥ j} dS_hij · q_hi and dV_j = Σ_h Σ_{i ≥ j} P_hij · dO_hi over the query
// heads h of the group. Warp w owns keys [16w, 16w + 16) and works on Sᵀ (keys × queries), so
// everything but the shared query tile stays within the warp.
template <typename T, int D, int kQueries>
__global__ void __launch_bounds__(kThreads)
    KvKernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta, int64_t t,
             int heads, int kv_heads, float scale, float scale_log2) {
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

  // Low key tiles see the most queries and come first in the grid.
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int g = blockIdx.y, bi = blockIdx.z, group = heads / kv_heads;
  const int64_t stride = static_cast<int64_t>(heads + 2 * kv_heads) * D;
  const int64_t out_stride = static_cast<int64_t>(heads) * D;
  const T* rows_base = qkv + bi * t * stride;
  const T* dout_base = dout + bi * t * out_stride;
  LoadTile<T, kRows, D>(k_tile, rows_base + static_cast<int64_t>(heads + g) * D, stride, j0, t);
  LoadTile<T, kRows, D>(v_tile, rows_base + static_cast<int64_t>(heads + kv_heads + g) * D, stride,
                        j0, t);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Acc dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    Mma::Zero(dk[n]);
    Mma::Zero(dv[n]);
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

  for (int h = g * group; h < (g + 1) * group; ++h) {
    const float* lse_row = lse + (static_cast<int64_t>(bi) * heads + h) * t;
    const float* delta_row = delta + (static_cast<int64_t>(bi) * heads + h) * t;
    for (int64_t i0 = j0 / kQueries * kQueries; i0 < t; i0 += kQueries) {
      __syncthreads();  // every warp is done with the previous query tile
      LoadTile<T, kQueries, D>(q_tile, rows_base + static_cast<int64_t>(h) * D, stride, i0, t);
      LoadTile<T, kQueries, D>(do_tile, dout_base + static_cast<int64_t>(h) * D, out_stride, i0, t);
      LoadRowValues<kQueries>(lse_tile, lse_row, i0, t, kLog2e);
      LoadRowValues<kQueries>(delta_tile, delta_row, i0, t, 1.0f);
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
        const int64_t i = i0 + c;
        const float p =
            key <= i && i < t ? exp2f(s_warp[r * kLdS + c] * scale_log2 - lse_tile[c]) : 0.0f;
        const float ds = p * (dp_warp[r * kLdS + c] - delta_tile[c]) * scale;
        p_warp[r * kLdP + c] = FromFloat<T>(p);
        ds_warp[r * kLdP + c] = FromFloat<T>(ds);
      }
      __syncwarp();
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        Mma::template MulAddAB<kQueries>(dv[n], p_warp, kLdP, do_tile + n * 16, kLdD);
        Mma::template MulAddAB<kQueries>(dk[n], ds_warp, kLdP, q_tile + n * 16, kLdD);
      }
    }
  }

  T* dk_rows = dqkv + bi * t * stride + static_cast<int64_t>(heads + g) * D;
  T* dv_rows = dqkv + bi * t * stride + static_cast<int64_t>(heads + kv_heads + g) * D;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    StoreAccTile<T>(dk_rows + n * 16, stride, j0 + warp * 16, t, dk[n], s_warp, kLdS);
    StoreAccTile<T>(dv_rows + n * 16, stride, j0 + warp * 16, t, dv[n], s_warp, kLdS);
  }
}

// Grid: (query tiles, heads, batch). Writes the query slots of dqkv for the block's queries i:
// dQ_i = Σ_{j ≤ i} dS_ij · k_j. Warp w owns queries [16w, 16w + 16).
template <typename T, int D, int kKeys>
__global__ void __launch_bounds__(kThreads)
    DqKernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta, int64_t t,
             int heads, int kv_heads, float scale, float scale_log2) {
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

  // The last query tiles see the most keys; launching them first shortens the grid's tail.
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  const int h = blockIdx.y, bi = blockIdx.z, g = h / (heads / kv_heads);
  const int64_t stride = static_cast<int64_t>(heads + 2 * kv_heads) * D;
  const int64_t out_stride = static_cast<int64_t>(heads) * D;
  const T* rows_base = qkv + bi * t * stride;
  const T* k_src = rows_base + static_cast<int64_t>(heads + g) * D;
  const T* v_src = rows_base + static_cast<int64_t>(heads + kv_heads + g) * D;
  const int64_t head_row = (static_cast<int64_t>(bi) * heads + h) * t;
  LoadTile<T, kRows, D>(q_tile, rows_base + static_cast<int64_t>(h) * D, stride, i0, t);
  LoadTile<T, kRows, D>(do_tile, dout + bi * t * out_stride + static_cast<int64_t>(h) * D,
                        out_stride, i0, t);
  LoadRowValues<kRows>(lse_tile, lse + head_row, i0, t, kLog2e);
  LoadRowValues<kRows>(delta_tile, delta + head_row, i0, t, 1.0f);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Acc dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) Mma::Zero(dq[n]);
  // Lanes 2r and 2r + 1 compute row r (query `row`) of the warp's dS, half each.
  const int r = lane / 2, c0 = lane % 2 * (kKeys / 2);
  const int64_t row = i0 + warp * 16 + r;
  const T* q_warp = q_tile + warp * 16 * kLdD;
  const T* do_warp = do_tile + warp * 16 * kLdD;
  float* s_warp = scores + warp * 16 * kLdS;
  float* dp_warp = dprobs + warp * 16 * kLdS;
  T* ds_warp = dscores + warp * 16 * kLdP;

  const int64_t last_key = (i0 + kRows < t ? i0 + kRows : t) - 1;
  for (int64_t j0 = 0; j0 <= last_key; j0 += kKeys) {
    __syncthreads();  // every warp is done with the previous key/value tile
    LoadTile<T, kKeys, D>(k_tile, k_src, stride, j0, t);
    LoadTile<T, kKeys, D>(v_tile, v_src, stride, j0, t);
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
      const int64_t j = j0 + c;
      const float p =
          j <= row && row < t ? exp2f(s_warp[r * kLdS + c] * scale_log2 - row_lse) : 0.0f;
      ds_warp[r * kLdP + c] = FromFloat<T>(p * (dp_warp[r * kLdS + c] - row_delta) * scale);
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      Mma::template MulAddAB<kKeys>(dq[n], ds_warp, kLdP, k_tile + n * 16, kLdD);
    }
  }

  T* dq_rows = dqkv + bi * t * stride + static_cast<int64_t>(h) * D;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    StoreAccTile<T>(dq_rows + n * 16, stride, i0 + warp * 16, t, dq[n], s_warp, kLdS);
  }
}

template <typename T, int D>
absl::Status LaunchBackward(cudaStream_t stream, T* dqkv, const T* dout, const T* qkv, const T* out,
                            const float* lse, float* delta, const AttentionDims& dims) {
  const int heads = static_cast<int>(dims.heads), kv_heads = static_cast<int>(dims.kv_heads);
  const float scale = SoftmaxScale(D), scale_log2 = scale * kLog2e;
  const dim3 threads(kThreads);

  const int64_t rows = dims.b * dims.t * dims.heads;
  RowDotKernel<T>
      <<<BlocksFor(rows, kWarps), threads, 0, stream>>>(delta, dout, out, dims.t, heads, D, rows);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("RowDotKernel");

  constexpr int kQueries = KvQueries<T, D>();
  constexpr int kKvBytes = KvSmem<T, D, kQueries>::kBytes;
  static_assert(kKvBytes <= kMaxSmemBytes, "dK/dV tiles do not fit in shared memory");
  TY_RETURN_IF_ERROR(AllowSharedMemory(KvKernel<T, D, kQueries>, kKvBytes));
  const dim3 kv_grid(BlocksFor(dims.t, kRows), static_cast<unsigned>(kv_heads),
                     static_cast<unsigned>(dims.b));
  KvKernel<T, D, kQueries><<<kv_grid, threads, kKvBytes, stream>>>(
      dqkv, dout, qkv, lse, delta, dims.t, heads, kv_heads, scale, scale_log2);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("KvKernel");

  constexpr int kKeys = DqKeys<T, D>();
  constexpr int kDqBytes = DqSmem<T, D, kKeys>::kBytes;
  static_assert(kDqBytes <= kMaxSmemBytes, "dQ tiles do not fit in shared memory");
  TY_RETURN_IF_ERROR(AllowSharedMemory(DqKernel<T, D, kKeys>, kDqBytes));
  const dim3 dq_grid(BlocksFor(dims.t, kRows), static_cast<unsigned>(heads),
                     static_cast<unsigned>(dims.b));
  DqKernel<T, D, kKeys><<<dq_grid, threads, kDqBytes, stream>>>(dqkv, dout, qkv, lse, delta, dims.t,
                                                                heads, kv_heads, scale, scale_log2);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("DqKernel");
  return absl::OkStatus();
}

template <typename T>
absl::Status BackwardForHeadDim(cudaStream_t stream, void* dqkv, const void* dout, const void* qkv,
                                const void* out, const float* lse, float* delta,
                                const AttentionDims& dims) {
  T* dx = static_cast<T*>(dqkv);
  const T* dy = static_cast<const T*>(dout);
  const T* x = static_cast<const T*>(qkv);
  const T* y = static_cast<const T*>(out);
  switch (dims.d) {
    case 16:
      return LaunchBackward<T, 16>(stream, dx, dy, x, y, lse, delta, dims);
    case 32:
      return LaunchBackward<T, 32>(stream, dx, dy, x, y, lse, delta, dims);
    case 64:
      return LaunchBackward<T, 64>(stream, dx, dy, x, y, lse, delta, dims);
    case 128:
      return LaunchBackward<T, 128>(stream, dx, dy, x, y, lse, delta, dims);
  }
  return CheckAttentionDims(dims);  // names the unsupported head dim
}

}  // namespace
}  // namespace attention_internal

size_t FlashAttentionBackwardScratchBytes(const AttentionDims& dims, DType dtype) {
  // delta: one fp32 per (batch, head, row), whatever the storage type.
  if (dims.b <= 0 || dims.t <= 0 || dims.heads <= 0) return 0;
  return static_cast<size_t>(dims.b) * static_cast<size_t>(dims.heads) *
         static_cast<size_t>(dims.t) * sizeof(float);
}

absl::Status FlashAttentionBackward(cudaStream_t stream, DType dtype, void* dqkv, const void* dout,
                                    const void* qkv, const void* out, const float* lse,
                                    const AttentionDims& dims, void* scratch,
                                    size_t scratch_bytes) {
  namespace ai = attention_internal;
  TY_RETURN_IF_ERROR(ai::CheckAttentionDims(dims));
  TY_REQUIRE(dqkv != nullptr && dout != nullptr && qkv != nullptr && out != nullptr &&
             lse != nullptr && scratch != nullptr);
  TY_REQUIRE(ai::Aligned16(dqkv) && ai::Aligned16(dout) && ai::Aligned16(qkv) &&
             ai::Aligned16(out) && ai::Aligned16(scratch));
  TY_REQUIRE(scratch_bytes >= FlashAttentionBackwardScratchBytes(dims, dtype));
  float* delta = static_cast<float*>(scratch);
  if (dtype == DType::kBF16) {
    return ai::BackwardForHeadDim<bf16>(stream, dqkv, dout, qkv, out, lse, delta, dims);
  }
  return ai::BackwardForHeadDim<float>(stream, dqkv, dout, qkv, out, lse, delta, dims);
}

}  // namespace trainyard::kernels::cuda
