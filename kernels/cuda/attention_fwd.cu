// Flash-attention forward with the FlashAttention-2 work split, for an attention block
// (attention_block.h) and for the causal self-attention of a packed qkv (attention.h), which is
// the block of the qkv against itself: a thread block owns kRows query rows of one (batch, head)
// and walks the key/value tiles from the first up to the last that one of its rows sees (in a
// causal block, tiles wholly above the diagonal are never loaded, nor with a sliding window those
// wholly before it). Each warp keeps its 16 output
// rows in fp32 accumulators and rescales them whenever the running row maximum grows (online
// softmax), so scores exist only one tile at a time, in shared memory. This kernel runs fp32
// storage (the device's precise reference); bf16 runs attention_fwd_mma.cu's, whose scores never
// leave registers.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/attention_common.cuh"

namespace trainyard::kernels::cuda {
namespace attention_internal {
namespace {

// Byte offsets into the forward kernel's dynamic shared memory, for tiles of kKeys keys.
template <typename T, int D, int kKeys>
struct ForwardSmem {
  static constexpr int kQ = 0;                                    // kRows × D queries
  static constexpr int kK = kQ + TileBytes<T>(kRows, D);          // kKeys × D keys
  static constexpr int kV = kK + TileBytes<T>(kKeys, D);          // kKeys × D values
  static constexpr int kS = kV + TileBytes<T>(kKeys, D);          // kRows × kKeys fp32 scores
  static constexpr int kP = kS + TileBytes<float>(kRows, kKeys);  // probabilities as T (bf16)
  static constexpr int kRowFactor = kP + (kInPlaceProbs<T> ? 0 : TileBytes<T>(kRows, kKeys));
  static constexpr int kIndex = kRowFactor + AlignUp(kRows * 4);  // 16×16 row indices
  static constexpr int kBytes = kIndex + AlignUp(256 * 4);
};

// The widest key tile whose shared memory fits.
template <typename T, int D>
constexpr int ForwardKeys() {
  if (ForwardSmem<T, D, 64>::kBytes <= kMaxSmemBytes) return 64;
  if (ForwardSmem<T, D, 32>::kBytes <= kMaxSmemBytes) return 32;
  return 16;
}

// One online-softmax step for a warp row over the key tile starting at key j0, run by the lane
// pair that owns the row, each lane over half of the tile's columns (`half`). Masks the keys
// the row does not see (before `first` or at or past `visible`: FirstKey, VisibleKeys), turns the
// raw products s_row into probabilities p_row relative to the new running maximum, and updates the
// running maximum m (log2 units of the scores, `rule`) and sum l that both lanes hold. Returns the
// factor by which the output accumulated so far must be scaled. s_row and p_row may alias (each
// lane reads its columns before writing them).
template <typename T, int kKeys>
__device__ __forceinline__ float SoftmaxStep(const float* s_row, T* p_row, int half, int64_t j0,
                                             int64_t first, int64_t visible, ScoreRule rule,
                                             float& m, float& l) {
  constexpr int kHalf = kKeys / 2;
  const int c0 = half * kHalf;
  float x[kHalf];
  float tile_max = -INFINITY;
#pragma unroll
  for (int c = 0; c < kHalf; ++c) {
    const int64_t j = j0 + c0 + c;
    x[c] = j >= first && j < visible ? rule.Log2(s_row[c0 + c]) : -INFINITY;
    tile_max = fmaxf(tile_max, x[c]);
  }
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  const float m_new = fmaxf(m, tile_max);
  // A row that has seen no key yet (past q_len, or before its window) keeps its values 0, not
  // NaN, with 0 as reference.
  const float ref = m_new == -INFINITY ? 0.0f : m_new;
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kHalf; ++c) {
    const float p = exp2f(x[c] - ref);
    p_row[c0 + c] = FromFloat<T>(p);
    sum += p;
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  const float alpha = exp2f(m - ref);
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

// acc[n] row r *= factor[r] for every fragment; rows[i] is the row x[i] holds (RowsOfAcc).
template <typename T, int kFrags>
__device__ __forceinline__ void ScaleRows(typename TileMma<T>::Acc (&acc)[kFrags],
                                          const float* factor,
                                          const int (&rows)[TileMma<T>::Acc::num_elements]) {
  constexpr int kElems = TileMma<T>::Acc::num_elements;
  float f[kElems];
#pragma unroll
  for (int i = 0; i < kElems; ++i) f[i] = factor[rows[i]];
#pragma unroll
  for (int n = 0; n < kFrags; ++n) {
#pragma unroll
    for (int i = 0; i < kElems; ++i) acc[n].x[i] *= f[i];
  }
}

// Grid: (query tiles, heads, batch). out [b, q_len, heads·D], lse [b, heads, q_len] (natural
// log); q, k and v at head 0 of row 0 (see BlockGeometry).
template <typename T, int D, int kKeys>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(T* out, float* lse, const T* q, const T* k, const T* v, BlockGeometry geo,
                       ScoreRule rule) {
  using Mma = TileMma<T>;
  using Acc = typename Mma::Acc;
  using Smem = ForwardSmem<T, D, kKeys>;
  constexpr int kLdD = Ld<T>(D);
  constexpr int kLdS = Ld<float>(kKeys);
  constexpr int kLdP = kInPlaceProbs<T> ? kLdS : Ld<T>(kKeys);
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem + Smem::kQ);
  T* k_tile = reinterpret_cast<T*>(smem + Smem::kK);
  T* v_tile = reinterpret_cast<T*>(smem + Smem::kV);
  float* scores = reinterpret_cast<float*>(smem + Smem::kS);
  T* probs =
      kInPlaceProbs<T> ? reinterpret_cast<T*>(scores) : reinterpret_cast<T*>(smem + Smem::kP);
  float* row_factor = reinterpret_cast<float*>(smem + Smem::kRowFactor);
  float* index_tile = reinterpret_cast<float*>(smem + Smem::kIndex);

  // The last query tiles of a causal block see the most keys; launching them first shortens the
  // grid's tail.
  const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  const int h = blockIdx.y, bi = blockIdx.z, g = h / (geo.heads / geo.kv_heads);
  SelectBatch(geo, bi);
  const int64_t kv_offset = bi * geo.kv_len * geo.kv_stride + static_cast<int64_t>(g) * D;
  const T* k_src = k + kv_offset;
  const T* v_src = v + kv_offset;

  FillRowIndexTile(index_tile);
  LoadTile<T, kRows, D>(q_tile, q + bi * geo.q_len * geo.q_stride + static_cast<int64_t>(h) * D,
                        geo.q_stride, i0, geo.q_len);
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int acc_rows[Acc::num_elements];
  RowsOfAcc<T>(acc_rows, index_tile);
  Acc o[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) Mma::Zero(o[n]);

  // Lanes 2r and 2r + 1 run the softmax of the warp's row r.
  const int r = lane / 2, half = lane % 2;
  const int64_t row = i0 + warp * 16 + r, row_keys = VisibleKeys(geo, row);
  const int64_t row_first = FirstKey(geo, row);
  const T* q_warp = q_tile + warp * 16 * kLdD;
  float* s_warp = scores + warp * 16 * kLdS;
  T* p_warp = probs + warp * 16 * kLdP;
  float* factor_warp = row_factor + warp * 16;
  float m = -INFINITY, l = 0.0f;

  // The block's first row sees the earliest key, its last row the last one.
  const int64_t keys = VisibleKeys(geo, (i0 + kRows < geo.q_len ? i0 + kRows : geo.q_len) - 1);
  for (int64_t j0 = FirstKey(geo, i0) / kKeys * kKeys; j0 < keys; j0 += kKeys) {
    __syncthreads();  // every warp is done with the previous key/value tile
    LoadTile<T, kKeys, D>(k_tile, k_src, geo.kv_stride, j0, geo.kv_len);
    LoadTile<T, kKeys, D>(v_tile, v_src, geo.kv_stride, j0, geo.kv_len);
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kKeys / 16; ++n) {
      Acc s;
      Mma::Zero(s);
      Mma::template MulAddABt<D>(s, q_warp, kLdD, k_tile + n * 16 * kLdD, kLdD);
      Mma::Store(s_warp + n * 16, kLdS, s);
    }
    __syncwarp();
    const float alpha = SoftmaxStep<T, kKeys>(s_warp + r * kLdS, p_warp + r * kLdP, half, j0,
                                              row_first, row_keys, rule, m, l);
    if (half == 0) factor_warp[r] = alpha;
    __syncwarp();
    ScaleRows<T>(o, factor_warp, acc_rows);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      Mma::template MulAddAB<kKeys>(o[n], p_warp, kLdP, v_tile + n * 16, kLdD);
    }
  }

  __syncwarp();  // factor_warp is still read by lanes of the last step
  if (half == 0) {
    factor_warp[r] = l > 0.0f ? 1.0f / l : 0.0f;
    if (row < geo.q_len) {
      lse[(static_cast<int64_t>(bi) * geo.heads + h) * geo.q_len + row] = (m + log2f(l)) * kLn2;
    }
  }
  __syncwarp();
  ScaleRows<T>(o, factor_warp, acc_rows);
  const int64_t out_stride = static_cast<int64_t>(geo.heads) * D;
  T* out_rows = out + bi * geo.q_len * out_stride + static_cast<int64_t>(h) * D;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    StoreAccTile<T>(out_rows + n * 16, out_stride, i0 + warp * 16, geo.q_len, o[n], s_warp, kLdS);
  }
}

template <typename T, int D>
absl::Status LaunchForward(cudaStream_t stream, void* out, float* lse, const void* q, const void* k,
                           const void* v, const AttentionBlockDims& dims) {
  constexpr int kKeys = ForwardKeys<T, D>();
  constexpr int kBytes = ForwardSmem<T, D, kKeys>::kBytes;
  static_assert(kBytes <= kMaxSmemBytes, "forward tiles do not fit in shared memory");
  const auto kernel = FlashForwardKernel<T, D, kKeys>;
  TY_RETURN_IF_ERROR(AllowSharedMemory(kernel, kBytes));
  const dim3 grid(BlocksFor(dims.q_len, kRows), static_cast<unsigned>(dims.heads),
                  static_cast<unsigned>(dims.b));
  kernel<<<grid, kThreads, kBytes, stream>>>(static_cast<T*>(out), lse, static_cast<const T*>(q),
                                             static_cast<const T*>(k), static_cast<const T*>(v),
                                             GeometryOf(dims), ScoreRuleOf(dims));
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("FlashForwardKernel");
  return absl::OkStatus();
}

template <typename T>
absl::Status ForwardForHeadDim(cudaStream_t stream, void* out, float* lse, const void* q,
                               const void* k, const void* v, const AttentionBlockDims& dims) {
  switch (dims.d) {
    case 16:
      return LaunchForward<T, 16>(stream, out, lse, q, k, v, dims);
    case 32:
      return LaunchForward<T, 32>(stream, out, lse, q, k, v, dims);
    case 64:
      return LaunchForward<T, 64>(stream, out, lse, q, k, v, dims);
    case 128:
      return LaunchForward<T, 128>(stream, out, lse, q, k, v, dims);
  }
  return CheckBlockDims(dims, DType::kF32);  // names the unsupported head dim
}

// Both public forwards: checks the tensors and launches.
absl::Status Forward(cudaStream_t stream, DType dtype, void* out, float* lse, const void* q,
                     const void* k, const void* v, const AttentionBlockDims& dims, int warp_rows) {
  TY_RETURN_IF_ERROR(CheckBlockDims(dims, dtype));
  TY_REQUIRE(out != nullptr && lse != nullptr && q != nullptr && k != nullptr && v != nullptr);
  TY_REQUIRE(Aligned16(out) && Aligned16(q) && Aligned16(k) && Aligned16(v));
  TY_REQUIRE(warp_rows == 0 || warp_rows == 16 || warp_rows == 32);
  if (dtype == DType::kBF16) return LaunchMmaForward(stream, out, lse, q, k, v, dims, warp_rows);
  return ForwardForHeadDim<float>(stream, out, lse, q, k, v, dims);
}

}  // namespace
}  // namespace attention_internal

absl::Status AttentionBlockForward(cudaStream_t stream, DType dtype, void* out, float* lse,
                                   const void* q, const void* k, const void* v,
                                   const AttentionBlockDims& dims) {
  return attention_internal::Forward(stream, dtype, out, lse, q, k, v, dims, /*warp_rows=*/0);
}

absl::Status FlashAttentionForward(cudaStream_t stream, DType dtype, void* out, float* lse,
                                   const void* qkv, const AttentionDims& dims, int warp_rows) {
  namespace ai = attention_internal;
  TY_RETURN_IF_ERROR(ai::CheckAttentionDims(dims));
  TY_REQUIRE(qkv != nullptr);
  return ai::Forward(
      stream, dtype, out, lse, qkv, ai::ElementsPast(qkv, ai::PackedKeys(dims), dtype),
      ai::ElementsPast(qkv, ai::PackedValues(dims), dtype), ai::PackedQkvBlock(dims), warp_rows);
}

}  // namespace trainyard::kernels::cuda
