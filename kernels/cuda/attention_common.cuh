// Private to the flash-attention kernels (attention_fwd.cu and attention_bwd.cu for fp32 storage,
// attention_fwd_mma.cu and attention_bwd_mma.cu for bf16): the fp32 path's warp-level 16×16 tile
// product, copies between global memory and padded shared tiles, the geometry of an attention
// block, and the launchers' argument checks.
//
// Every kernel runs kWarps warps; a block owns kRows = 16·kWarps rows of one (batch, head) —
// query rows in the forward and in the dQ pass, key rows in the dK/dV pass — and warp w owns
// rows [16w, 16w + 16) of that tile. A warp's score rows, probabilities and accumulators are its
// own, so the only block-wide barriers are around the loads of the tiles that every warp reads.
#ifndef TRAINYARD_KERNELS_CUDA_ATTENTION_COMMON_CUH_
#define TRAINYARD_KERNELS_CUDA_ATTENTION_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "common/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/warp_mma.cuh"
#include "kernels/soft_cap.h"

namespace trainyard::kernels::cuda::attention_internal {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRows = 16 * kWarps;
// Dynamic shared memory per block stays below this, so that two blocks fit on an H100 SM and
// every kernel also launches on GPUs with 99 KiB per block.
inline constexpr int kMaxSmemBytes = 99 * 1024;
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

__host__ __device__ constexpr int AlignUp(int bytes) { return (bytes + 127) / 128 * 128; }

// Leading dimension, in elements, of a shared tile with `cols` columns of U. Rows are padded by
// 16 bytes: every row stays 16-byte aligned (cp.async, ldmatrix and vector accesses need it), and
// the eight rows an ldmatrix matrix reads start in different banks.
template <typename U>
__host__ __device__ constexpr int Ld(int cols) {
  return cols + 16 / static_cast<int>(sizeof(U));
}

template <typename U>
__host__ __device__ constexpr int TileBytes(int rows, int cols) {
  return AlignUp(rows * Ld<U>(cols) * static_cast<int>(sizeof(U)));
}

// In the fp32 kernels the probabilities (and dS) overwrite the fp32 scores they come from (the
// tile kernels are written for any T; only fp32 storage instantiates them).
template <typename T>
inline constexpr bool kInPlaceProbs = std::is_same_v<T, float>;

// Warp-collective products of 16×16 tiles held in shared memory, accumulated in fp32:
//   MulAddABt<K>: c += A · Bᵀ, A = 16×K rows at a (row-major, lda), B = 16×K rows at b (ldb);
//   MulAddAB<K>:  c += A · B,  A = 16×K at a (row-major, lda),  B = K×16 at b (row-major, ldb).
// Store/Load move an accumulator to/from a row-major 16×16 fp32 tile. Pointers are 32-byte
// aligned and leading dimensions multiples of 16 bytes (Ld<> guarantees both). Acc exposes
// x[num_elements]; which element of the tile x[i] holds is the implementation's business
// (callers find out by loading a tile of row indices, see RowsOfAcc).
template <typename T>
struct TileMma;

// fp32 on CUDA cores: lane l holds rows 2·(l/4) + {0, 1} and columns 4·(l%4) + {0..3} of the
// tile (x[4i + j] is (row0 + i, col0 + j)), and reads its operands straight from shared memory
// as float4 along K. Sums run over K in ascending order, so results are deterministic.
template <>
struct TileMma<float> {
  struct Acc {
    static constexpr int num_elements = 8;
    float x[num_elements];
  };

  static __device__ __forceinline__ int Row0() { return 2 * ((threadIdx.x % 32) / 4); }
  static __device__ __forceinline__ int Col0() { return 4 * (threadIdx.x % 4); }

  static __device__ __forceinline__ void Zero(Acc& c) {
#pragma unroll
    for (int i = 0; i < Acc::num_elements; ++i) c.x[i] = 0.0f;
  }

  static __device__ __forceinline__ float Dot4(float acc, float4 u, float4 v) {
    acc = fmaf(u.x, v.x, acc);
    acc = fmaf(u.y, v.y, acc);
    acc = fmaf(u.z, v.z, acc);
    return fmaf(u.w, v.w, acc);
  }
  static __device__ __forceinline__ float Component(float4 v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
  }
  static __device__ __forceinline__ float4 Load4(const float* p) {
    return *reinterpret_cast<const float4*>(p);
  }

  template <int K>
  static __device__ __forceinline__ void MulAddABt(Acc& c, const float* a, int lda, const float* b,
                                                   int ldb) {
    const float* a0 = a + Row0() * lda;
    const float* b0 = b + Col0() * ldb;
#pragma unroll 4
    for (int k = 0; k < K; k += 4) {
      const float4 u0 = Load4(a0 + k), u1 = Load4(a0 + lda + k);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = Load4(b0 + j * ldb + k);
        c.x[j] = Dot4(c.x[j], u0, v);
        c.x[4 + j] = Dot4(c.x[4 + j], u1, v);
      }
    }
  }

  template <int K>
  static __device__ __forceinline__ void MulAddAB(Acc& c, const float* a, int lda, const float* b,
                                                  int ldb) {
    const float* a0 = a + Row0() * lda;
    const float* b0 = b + Col0();
#pragma unroll 2
    for (int k = 0; k < K; k += 4) {
      const float4 u0 = Load4(a0 + k), u1 = Load4(a0 + lda + k);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const float4 v = Load4(b0 + (k + kk) * ldb);
        const float s0 = Component(u0, kk), s1 = Component(u1, kk);
        c.x[0] = fmaf(s0, v.x, c.x[0]);
        c.x[1] = fmaf(s0, v.y, c.x[1]);
        c.x[2] = fmaf(s0, v.z, c.x[2]);
        c.x[3] = fmaf(s0, v.w, c.x[3]);
        c.x[4] = fmaf(s1, v.x, c.x[4]);
        c.x[5] = fmaf(s1, v.y, c.x[5]);
        c.x[6] = fmaf(s1, v.z, c.x[6]);
        c.x[7] = fmaf(s1, v.w, c.x[7]);
      }
    }
  }

  static __device__ __forceinline__ void Store(float* p, int ld, const Acc& c) {
    float* row = p + Row0() * ld + Col0();
    *reinterpret_cast<float4*>(row) = make_float4(c.x[0], c.x[1], c.x[2], c.x[3]);
    *reinterpret_cast<float4*>(row + ld) = make_float4(c.x[4], c.x[5], c.x[6], c.x[7]);
  }
  static __device__ __forceinline__ void Load(Acc& c, const float* p, int ld) {
    const float* row = p + Row0() * ld + Col0();
    const float4 u = Load4(row), v = Load4(row + ld);
    c.x[0] = u.x, c.x[1] = u.y, c.x[2] = u.z, c.x[3] = u.w;
    c.x[4] = v.x, c.x[5] = v.y, c.x[6] = v.z, c.x[7] = v.w;
  }
};

// Writes 16×16 row indices (as floats) into `tile` (shared, 256 floats). Block-collective; the
// caller synchronises before RowsOfAcc reads it.
__device__ __forceinline__ void FillRowIndexTile(float* tile) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) tile[i] = static_cast<float>(i / 16);
}

// rows[i] = the tile row that x[i] of any accumulator holds: loading a tile whose entries are
// their own row indices reveals the fragment layout without depending on it, which lets a warp
// rescale accumulator rows in registers (the online softmax's correction). Sound because an
// accumulator type has one element distribution within a kernel: a loaded accumulator is a valid
// C operand of mma_sync (whatever the memory layout it was loaded with), and mma_sync's result is
// in turn a valid C operand (the c = A·B + c loop), so loaded and computed fragments agree.
template <typename T>
__device__ __forceinline__ void RowsOfAcc(int (&rows)[TileMma<T>::Acc::num_elements],
                                          const float* index_tile) {
  typename TileMma<T>::Acc idx;
  TileMma<T>::Load(idx, index_tile, 16);
#pragma unroll
  for (int i = 0; i < TileMma<T>::Acc::num_elements; ++i) rows[i] = static_cast<int>(idx.x[i]);
}

// Copies rows [row0, row0 + kTileRows) of a global matrix (kCols elements per row, rows
// `stride` elements apart, 16-byte aligned) into a shared tile with leading dimension
// Ld<T>(kCols). Rows at or past `limit` are zero-filled: a masked probability of 0 times a zero
// row is 0, whereas times uninitialised memory it could be NaN. Block-collective.
template <typename T, int kTileRows, int kCols>
__device__ __forceinline__ void LoadTile(T* tile, const T* src, int64_t stride, int64_t row0,
                                         int64_t limit) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kChunks = kCols / kVec;
  constexpr int kLd = Ld<T>(kCols);
  for (int i = threadIdx.x; i < kTileRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks * kVec;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < limit) v = *reinterpret_cast<const uint4*>(src + (row0 + r) * stride + c);
    *reinterpret_cast<uint4*>(tile + r * kLd + c) = v;
  }
}

// Starts copying rows [row0, row0 + kTileRows) of a global matrix (D bf16 per row, rows
// `stride` elements apart) into a shared tile with leading dimension Ld<bf16>(D); rows at or past
// `limit` become zeros (a masked probability of 0 times a zero row is 0). Block-collective; the
// copies land at the next CpAsyncWait that covers the caller's next commit.
template <int kTileRows, int D>
__device__ __forceinline__ void LoadTileAsync(bf16* tile, const bf16* src, int64_t stride,
                                              int64_t row0, int64_t limit) {
  constexpr int kChunks = D / 8;
  constexpr int kLd = Ld<bf16>(D);
  for (int i = threadIdx.x; i < kTileRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks * 8;
    const bool inside = row0 + r < limit;
    warp::CpAsync16(tile + r * kLd + c, inside ? src + (row0 + r) * stride + c : src, inside);
  }
}

// dst[r] = src[row0 + r] · mul for the rows below `limit`, 0 past it. Block-collective.
template <int kTileRows>
__device__ __forceinline__ void LoadRowValues(float* dst, const float* src, int64_t row0,
                                              int64_t limit, float mul) {
  for (int r = threadIdx.x; r < kTileRows; r += kThreads) {
    dst[r] = row0 + r < limit ? src[row0 + r] * mul : 0.0f;
  }
}

// Eight consecutive fp32 values to a 16-byte aligned destination.
__device__ __forceinline__ void Store8(float* dst, const float* src) {
  *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  *reinterpret_cast<float4*>(dst + 4) = make_float4(src[4], src[5], src[6], src[7]);
}
// Two values rounded to bf16, `lo` in the low half: an mma fragment register's order.
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}

// Eight consecutive fp32 values of a 16-byte aligned source.
__device__ __forceinline__ void Load8(float* dst, const float* src) {
  const float4 a = *reinterpret_cast<const float4*>(src);
  const float4 b = *reinterpret_cast<const float4*>(src + 4);
  dst[0] = a.x, dst[1] = a.y, dst[2] = a.z, dst[3] = a.w;
  dst[4] = b.x, dst[5] = b.y, dst[6] = b.z, dst[7] = b.w;
}

// Writes a warp's 16×16 accumulator to rows [row0, row0 + 16) of a global matrix (columns from
// `dst`, rows `stride` elements apart), skipping rows at or past `limit` and converting to T;
// with `add`, the accumulator is added in fp32 to the values there (rounded once). It goes
// through `staging`, 16×16 floats of shared memory that only this warp uses (leading dimension
// `ld`). Warp-collective.
template <typename T>
__device__ __forceinline__ void StoreAccTile(T* dst, int64_t stride, int64_t row0, int64_t limit,
                                             const typename TileMma<T>::Acc& acc, float* staging,
                                             int ld, bool add = false) {
  __syncwarp();  // the staging area may still be read by lanes of the previous use
  TileMma<T>::Store(staging, ld, acc);
  __syncwarp();
  const int lane = threadIdx.x % 32, r = lane / 2, c = lane % 2 * 8;
  if (row0 + r >= limit) return;
  T* row = dst + (row0 + r) * stride + c;
  const float* values = staging + r * ld + c;
  if (!add) {
    Store8(row, values);
    return;
  }
  float sum[8];
  Load8(sum, row);
#pragma unroll
  for (int i = 0; i < 8; ++i) sum[i] += values[i];
  Store8(row, sum);
}

// One attention block as the kernels take it (AttentionBlockDims less the head dim, which is a
// template argument): the query rows of a batch entry q_stride elements apart, its key and value
// rows kv_stride apart; out, dout, lse and delta dense. Query row i is at position i + offset
// counted from key row 0; window > 0 is a sliding window of that many positions. With documents,
// doc_start holds the query rows' document starts (a launcher's: every batch entry's; a
// kernel's, after SelectBatch: its entry's q_len), key_position the position of key row 0.
struct BlockGeometry {
  int64_t q_len, kv_len, q_stride, kv_stride;
  int heads, kv_heads;
  bool causal;
  int64_t offset, window;
  const int32_t* doc_start;
  int64_t key_position;
};

// A kernel's geometry for batch entry bi: its query rows' document starts.
__host__ __device__ __forceinline__ void SelectBatch(BlockGeometry& g, int64_t bi) {
  if (g.doc_start != nullptr) g.doc_start += bi * g.q_len;
}

// Query row i sees keys [FirstKey(g, i), VisibleKeys(g, i)): every key of a full block, those up
// to the diagonal (i + offset) of a causal one, none for the padding rows past q_len (whose tiles
// stay zero); with a window, none at or before i + offset − window; with documents, none before
// its document's start (a padding row takes the last row's, so that the bound stays monotone).
// Both bounds are non-decreasing in i, so a tile of rows [i0, i1) reads keys [FirstKey(i0),
// VisibleKeys(i1 − 1)).
__host__ __device__ __forceinline__ int64_t VisibleKeys(const BlockGeometry& g, int64_t i) {
  if (i >= g.q_len) return 0;
  const int64_t end = i + g.offset + 1;
  return g.causal && end < g.kv_len ? (end > 0 ? end : 0) : g.kv_len;
}
__host__ __device__ __forceinline__ int64_t FirstKey(const BlockGeometry& g, int64_t i) {
  int64_t first = g.window > 0 ? i + g.offset - g.window + 1 : 0;
  if (g.doc_start != nullptr) {
    const int64_t document = g.doc_start[i < g.q_len ? i : g.q_len - 1] - g.key_position;
    first = document > first ? document : first;
  }
  return first < 0 ? 0 : first < g.kv_len ? first : g.kv_len;
}
__host__ __device__ __forceinline__ bool Sees(const BlockGeometry& g, int64_t i, int64_t j) {
  return j >= FirstKey(g, i) && j < VisibleKeys(g, i);
}
// The queries that see key j: [FirstQuery(g, j), EndQuery(g, j)), both non-decreasing in j.
__host__ __device__ __forceinline__ int64_t FirstQuery(const BlockGeometry& g, int64_t j) {
  if (!g.causal) return 0;
  const int64_t first = j - g.offset;
  return first < 0 ? 0 : first < g.q_len ? first : g.q_len;
}
// With documents, the queries whose document starts at or before key j: a prefix of the rows
// (their starts do not decrease), found by bisection.
__host__ __device__ __forceinline__ int64_t EndQuery(const BlockGeometry& g, int64_t j) {
  int64_t end = g.q_len;
  if (g.window > 0) {
    end = j - g.offset + g.window;
    end = end < 0 ? 0 : end < g.q_len ? end : g.q_len;
  }
  if (g.doc_start != nullptr) {
    int64_t lo = 0, hi = end;  // rows [0, lo) start at or before j, rows [hi, end) after it
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (g.doc_start[mid] - g.key_position <= j) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    end = lo;
  }
  return end;
}

inline BlockGeometry GeometryOf(const AttentionBlockDims& dims) {
  return BlockGeometry{dims.q_len,
                       dims.kv_len,
                       dims.q_stride,
                       dims.kv_stride,
                       static_cast<int>(dims.heads),
                       static_cast<int>(dims.kv_heads),
                       dims.causal,
                       dims.offset,
                       dims.window,
                       dims.doc_start,
                       dims.key_position};
}

// The causal self-attention of a packed qkv [b, t, (heads + 2·kv_heads)·d] as a block: queries,
// keys and values are column ranges of the same rows.
inline AttentionBlockDims PackedQkvBlock(const AttentionDims& dims) {
  const int64_t row = (dims.heads + 2 * dims.kv_heads) * dims.d;
  return AttentionBlockDims{.b = dims.b,
                            .q_len = dims.t,
                            .kv_len = dims.t,
                            .heads = dims.heads,
                            .kv_heads = dims.kv_heads,
                            .d = dims.d,
                            .q_stride = row,
                            .kv_stride = row,
                            .causal = true,
                            .window = dims.window,
                            .scale = dims.scale,
                            .softcap = dims.softcap,
                            .doc_start = dims.doc_start};
}
// Column offsets of the keys and values in a packed qkv row.
inline int64_t PackedKeys(const AttentionDims& dims) { return dims.heads * dims.d; }
inline int64_t PackedValues(const AttentionDims& dims) {
  return (dims.heads + dims.kv_heads) * dims.d;
}

// `p` advanced by `elements` elements of `dtype`.
template <typename V>
V* ElementsPast(V* p, int64_t elements, DType dtype) {
  using Byte = std::conditional_t<std::is_const_v<V>, const char, char>;
  return reinterpret_cast<Byte*>(p) + elements * DTypeBytes(dtype);
}

// Raises the kernel's dynamic shared memory limit (needed above 48 KiB). Called before every
// launch rather than once, so that it holds on whichever device is current.
template <typename Kernel>
absl::Status AllowSharedMemory(Kernel* kernel, int bytes) {
  static_assert(std::is_function_v<Kernel>);
  TY_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  return absl::OkStatus();
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline absl::Status CheckScoreRule(float scale, float softcap) {
  TY_REQUIRE(scale >= 0.0f && std::isfinite(scale));
  TY_REQUIRE(softcap >= 0.0f && std::isfinite(softcap));
  return absl::OkStatus();
}

// The checks both launchers share: a supported head dim, positive sizes, whole GQA groups, and
// grid limits (heads and batch are grid dimensions y and z).
inline absl::Status CheckAttentionDims(const AttentionDims& dims) {
  if (dims.d != 16 && dims.d != 32 && dims.d != 64 && dims.d != 128) {
    return absl::InvalidArgumentError("flash attention: unsupported head dim " +
                                      std::to_string(dims.d) + " (supported: 16, 32, 64, 128)");
  }
  TY_REQUIRE(dims.b >= 1 && dims.t >= 1 && dims.heads >= 1 && dims.kv_heads >= 1);
  TY_REQUIRE(dims.heads % dims.kv_heads == 0 && dims.window >= 0);
  TY_REQUIRE(dims.heads <= 65535 && dims.b <= 65535);
  return CheckScoreRule(dims.scale, dims.softcap);
}

// The checks every block launcher shares (see attention_block.h); the tensors' own checks are
// the launchers'.
inline absl::Status CheckBlockDims(const AttentionBlockDims& dims, DType dtype) {
  if (dims.d != 16 && dims.d != 32 && dims.d != 64 && dims.d != 128) {
    return absl::InvalidArgumentError("attention block: unsupported head dim " +
                                      std::to_string(dims.d) + " (supported: 16, 32, 64, 128)");
  }
  TY_REQUIRE(dims.b >= 1 && dims.q_len >= 1 && dims.kv_len >= 1 && dims.heads >= 1 &&
             dims.kv_heads >= 1);
  TY_REQUIRE(dims.heads % dims.kv_heads == 0);
  TY_REQUIRE(dims.heads <= 65535 && dims.b <= 65535);
  TY_REQUIRE(!dims.causal || (dims.q_len == dims.kv_len && dims.offset == 0));
  TY_REQUIRE(dims.offset >= 0 && dims.window >= 0);
  TY_REQUIRE(dims.q_stride >= dims.heads * dims.d && dims.kv_stride >= dims.kv_heads * dims.d);
  // Rows are copied in 16-byte vectors.
  TY_REQUIRE(dims.q_stride * DTypeBytes(dtype) % 16 == 0 &&
             dims.kv_stride * DTypeBytes(dtype) % 16 == 0);
  return CheckScoreRule(dims.scale, dims.softcap);
}

// The factor scores are multiplied by: the block's own, or 1/√d.
inline float SoftmaxScale(const AttentionBlockDims& dims) {
  return dims.scale > 0.0f ? dims.scale : 1.0f / std::sqrt(static_cast<float>(dims.d));
}

// How the kernels turn a query-key product s into a score z and take z's gradient back to s,
// as kernels/cpu/attention.h does (kernels/soft_cap.h): z = s·scale, or under a soft cap C
// (Gemma 2's), z = C·tanh(s·scale / C). The online softmax and the saved lse are in log2 units.
// Without a cap, each kernel's arithmetic is what it was before caps: one branch, uniform over
// the grid, per score.
struct ScoreRule {
  float scale;       // SoftmaxScale
  float scale_log2;  // scale·log2(e)
  float cap;         // 0: none
  float inv_cap;     // 1 / cap; 0 for none

  // z·log2(e).
  __device__ __forceinline__ float Log2(float s) const {
    if (cap == 0.0f) return s * scale_log2;
    return SoftCapped(s * scale, cap, inv_cap) * kLog2e;
  }
  // For a key the query sees: returns P = exp(z − lse) (lse in log2 units) and puts dL/ds =
  // P ∘ (dP − δ), taken back through the cap, times scale, in dp's place.
  __device__ __forceinline__ float ProbAndGrad(float s, float& dp, float lse, float delta) const {
    if (cap == 0.0f) {
      const float p = exp2f(s * scale_log2 - lse);
      dp = p * (dp - delta) * scale;
      return p;
    }
    const float z = SoftCapped(s * scale, cap, inv_cap);
    const float p = exp2f(z * kLog2e - lse);
    dp = ThroughCap(p * (dp - delta), z, inv_cap) * scale;
    return p;
  }
};

inline ScoreRule ScoreRuleOf(const AttentionBlockDims& dims) {
  const float scale = SoftmaxScale(dims);
  return ScoreRule{.scale = scale,
                   .scale_log2 = scale * kLog2e,
                   .cap = dims.softcap,
                   .inv_cap = InverseCap(dims.softcap)};
}

// The bf16 forward and backward of an attention block with scores in registers
// (attention_fwd_mma.cu, attention_bwd_mma.cu); the caller has checked the block's dims and
// tensors (and, for the backward, computed delta = rowsum(dO ∘ O) per query row). The fp32 ones
// are attention_fwd.cu's and attention_bwd.cu's. With `dq_sums` (b·q_len·heads·d fp32 of
// scratch), the backward sums dQ with atomics (AttentionDqSum::kAtomic); null, deterministically.
// warp_rows: 16 or 32 query rows per warp, 0 for DefaultForwardWarpRows(dims.d).
[[nodiscard]] absl::Status LaunchMmaForward(cudaStream_t stream, void* out, float* lse,
                                            const void* q, const void* k, const void* v,
                                            const AttentionBlockDims& dims, int warp_rows);
// Two row groups per warp where their query fragments, scores and output accumulators fit in
// registers beside each other (FlashAttention-2's 128-row forward blocks), one at d 128.
inline int DefaultForwardWarpRows(int64_t d) { return d <= 64 ? 32 : 16; }
struct MmaBackwardOperands {
  bf16 *dq, *dk, *dv;
  const bf16 *dout, *q, *k, *v;
  const float *lse, *delta;
};
[[nodiscard]] absl::Status LaunchMmaBackward(cudaStream_t stream, const MmaBackwardOperands& x,
                                             const AttentionBlockDims& dims, bool add,
                                             float* dq_sums);

}  // namespace trainyard::kernels::cuda::attention_internal

#endif  // TRAINYARD_KERNELS_CUDA_ATTENTION_COMMON_CUH_
