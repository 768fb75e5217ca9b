// LayerNorm and RMSNorm are memory-bound: the aim is to move each byte once.
//
// The floor, with bf16 activations (fp32 parameters and statistics are < 0.2% here): the forward
// reads x and writes y, 4 bytes an element (the fused add also reads a, b and writes the sum);
// the backward reads dy, x and dinp (it accumulates) and writes dinp, 8 bytes an element.
//   gpt2-124m, 16384 × 768:  50.3 MB + 100.7 MB = 151 MB, 38 µs at 4 TB/s
//   llama-1b,   8192 × 2048: 67.1 MB + 134.2 MB = 201 MB, 50 µs at 4 TB/s
// (bench/gpu_kernel_cases.cc counts dinp as written only: 126 MB / 31 µs and 168 MB / 42 µs.)
//
// So every kernel holds its rows in registers: a team of threads (one warp, or several) owns a
// row, each thread a few units of 16 bytes (8 bf16 or 4 fp32; single elements when c or a
// pointer does not allow 16-byte accesses), reads them once, reduces with shuffles (and shared
// memory across a team's warps), and writes once. The backward computes dinp and, in the same
// pass, each thread's share of the weight and bias gradients over the rows of its block, which
// go to scratch as one partial row per block; a second small kernel adds the partials. Rows too
// wide for the registers fall back to loop kernels that read a row once per pass.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_partials.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/memory_bound.cuh"
#include "kernels/cuda/norms.h"

namespace trainyard::kernels::cuda {
namespace {

// Blocks have at most kMaxThreads threads (so the backward may use 128 registers a thread) and
// hold as many teams as fit in kBlockThreads.
constexpr int kMaxThreads = 512;
constexpr int kBlockThreads = 256;
constexpr int64_t kMaxRowBlocks = 1 << 16;  // further rows are taken in a grid-stride loop
// Units a thread may hold: the backward keeps three tensors' units, its next row's too, and
// the parameter-gradient sums, so it holds fewer than the forward.
constexpr int kMaxForwardUnits = 3, kMaxBackwardUnits = 2;  // of 16 bytes
constexpr int kMaxForwardScalars = 4, kMaxBackwardScalars = 4;

// Arguments of the forward kernels; `a` set means the fused residual add (then `inp` is unused).
// The launchers fill ForwardArgs<void> and cast it to the storage type.
template <typename T>
struct ForwardArgs {
  T* out;
  float* mean;  // null for RMSNorm
  float* rstd;
  T* sum;
  const T* a;
  const T* b;
  const T* inp;
  const float* weight;
  const float* bias;  // may be null
  int64_t rows, c;
  float eps;
};

template <typename T>
struct BackwardArgs {
  T* dinp;
  const T* dout;
  const T* inp;
  const float* weight;
  const float* mean;  // null for RMSNorm
  const float* rstd;
  int64_t rows, c;
};

// The `size` consecutive threads of a block (a multiple of 32) that share a row. Unit i of a
// thread starts at column Column(i): a team's i-th units are contiguous, so its loads coalesce.
struct Team {
  int size;   // threads in the team
  int count;  // teams in the block
  int index;  // this thread's team
  int lane;   // this thread's place in it
  __device__ int Column(int i, int vec) const { return (lane + i * size) * vec; }
};

__device__ __forceinline__ Team ThisTeam(int size) {
  const int t = static_cast<int>(threadIdx.x);
  return {size, static_cast<int>(blockDim.x) / size, t / size, t % size};
}

// Shared memory for TeamSum: two halves of 32 warps × kMaxSums.
constexpr int kMaxSums = 2;
constexpr int kSumSlots = 2 * 32 * kMaxSums;
// Dynamic shared memory a launch of the backward gets without opting in (48 KB, static included);
// its parameter-gradient sums (up to 2 × 8192 floats) may need more.
constexpr size_t kBackwardSharedWithoutOptIn = 48 * 1024 - kSumSlots * sizeof(float);

// Sums each of v[] over the team and gives every thread of the team the sums, added in a fixed
// order: the shuffle tree within a warp, then the team's warps in order. A team wider than a
// warp goes through `slots` and synchronises the block, so every thread of the block must make
// the same sequence of calls. Successive calls use alternate halves of `slots` (`parity`), so
// one barrier a call suffices: a half is written again only after the next call's barrier,
// which each reader of its previous contents has passed.
template <int kN>
__device__ __forceinline__ void TeamSum(float (&v)[kN], const Team& team, float* slots,
                                        int& parity) {
  static_assert(kN <= kMaxSums);
#pragma unroll
  for (int n = 0; n < kN; ++n) v[n] = WarpSum(v[n]);
  if (team.size == 32) return;
  float* half = slots + parity * 32 * kMaxSums;
  parity ^= 1;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int n = 0; n < kN; ++n) half[warp * kMaxSums + n] = v[n];
  }
  __syncthreads();
  const int first = team.index * (team.size / 32);
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    v[n] = 0.0f;
    for (int w = first; w < first + team.size / 32; ++w) v[n] += half[w * kMaxSums + n];
  }
}

// The thread's units of the forward's input row: inp, or for the fused add a + b rounded to T,
// which is also stored into `sum`. All loads come before the stores (so they are in flight
// together although `sum` may alias `a` or `b`); each element is read and written by this thread
// only, so the aliasing is harmless.
template <typename T, int kVec, int kUnits>
__device__ __forceinline__ void LoadForwardRow(Vec<T, kVec> (&x)[kUnits], const ForwardArgs<T>& p,
                                               const Team& team, int64_t offset) {
  if (p.a == nullptr) {
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      const int col = team.Column(i, kVec);
      if (col < p.c) x[i] = LoadVec<T, kVec>(p.inp + offset + col);
    }
    return;
  }
  Vec<T, kVec> b[kUnits] = {};
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int col = team.Column(i, kVec);
    if (col >= p.c) continue;
    x[i] = LoadVec<T, kVec>(p.a + offset + col);
    b[i] = LoadVec<T, kVec>(p.b + offset + col);
  }
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int col = team.Column(i, kVec);
    if (col >= p.c) continue;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      x[i].v[k] = FromFloat<T>(ToFloat(x[i].v[k]) + ToFloat(b[i].v[k]));
    }
    StoreVec(p.sum + offset + col, x[i]);
  }
}

// y = (x − mean) · rstd · w + b for the thread's units. The parameters are read for each row
// (from L1) rather than held: registers are what limits the rows in flight.
template <typename T, int kVec, int kUnits>
__device__ __forceinline__ void StoreForwardRow(const ForwardArgs<T>& p, const Team& team,
                                                int64_t offset, const Vec<T, kVec> (&x)[kUnits],
                                                float mu, float rs) {
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int col = team.Column(i, kVec);
    if (col >= p.c) continue;
    const Vec<float, kVec> w = LoadVec<float, kVec>(p.weight + col);
    Vec<float, kVec> shift = {};
    if (p.bias != nullptr) shift = LoadVec<float, kVec>(p.bias + col);
    Vec<T, kVec> y;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      y.v[k] = FromFloat<T>((ToFloat(x[i].v[k]) - mu) * rs * w.v[k] + shift.v[k]);
    }
    StoreVec(p.out + offset + col, y);
  }
}

// Forward with rows in registers: each team normalises one row (LayerNorm: mean, then the
// biased variance about it; RMSNorm, kLayerNorm false: mean 0, no bias). Teams past the last row
// still take part in the block's barriers. At most 64 registers a thread, so that 1024 threads,
// and their loads, are resident on an SM.
template <typename T, bool kLayerNorm, int kVec, int kUnits>
__global__ void __launch_bounds__(kMaxThreads, 2)
    NormForwardKernel(const ForwardArgs<T> p, int team_size) {
  __shared__ float slots[kSumSlots];
  int parity = 0;
  const Team team = ThisTeam(team_size);
  const float n = static_cast<float>(p.c);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * team.count; first < p.rows;
       first += static_cast<int64_t>(gridDim.x) * team.count) {
    const int64_t row = first + team.index;
    const bool live = row < p.rows;
    const int64_t offset = row * p.c;
    Vec<T, kVec> x[kUnits] = {};
    if (live) LoadForwardRow(x, p, team, offset);

    float mu = 0.0f;
    if constexpr (kLayerNorm) {
      float s[1] = {0.0f};
#pragma unroll
      for (int i = 0; i < kUnits; ++i) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) s[0] += ToFloat(x[i].v[k]);  // units not held are 0
      }
      TeamSum(s, team, slots, parity);
      mu = s[0] / n;
    }
    float ss[1] = {0.0f};
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      if (!live || team.Column(i, kVec) >= p.c) continue;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float d = ToFloat(x[i].v[k]) - mu;
        ss[0] += d * d;
      }
    }
    TeamSum(ss, team, slots, parity);
    const float rs = 1.0f / sqrtf(ss[0] / n + p.eps);

    if (!live) continue;
    StoreForwardRow(p, team, offset, x, mu, rs);
    if (team.lane == 0) {
      if constexpr (kLayerNorm) p.mean[row] = mu;
      p.rstd[row] = rs;
    }
  }
}

// What the backward needs of one row, loaded a row ahead of its use so that the loads of the
// next row are in flight while the block waits on the current row's sums.
template <typename T, int kVec, int kUnits>
struct BackwardRow {
  Vec<T, kVec> x[kUnits] = {}, dy[kUnits] = {}, dinp[kUnits] = {};
  float mean = 0.0f, rstd = 0.0f;
  bool live = false;
};

template <typename T, bool kLayerNorm, int kVec, int kUnits>
__device__ __forceinline__ BackwardRow<T, kVec, kUnits> LoadBackwardRow(const BackwardArgs<T>& p,
                                                                        const Team& team,
                                                                        int64_t row, int64_t end) {
  BackwardRow<T, kVec, kUnits> r;
  r.live = row < end;
  if (!r.live) return r;
  const int64_t offset = row * p.c;
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int col = team.Column(i, kVec);
    if (col >= p.c) continue;
    r.x[i] = LoadVec<T, kVec>(p.inp + offset + col);
    r.dy[i] = LoadVec<T, kVec>(p.dout + offset + col);
    r.dinp[i] = LoadVec<T, kVec>(p.dinp + offset + col);
  }
  if constexpr (kLayerNorm) r.mean = p.mean[row];
  r.rstd = p.rstd[row];
  return r;
}

// The thread's shares of Σ g and Σ g · x̂ over the row, with x̂ = (x − mean) · rstd, g = dy · w.
// The parameters are read for each row (from L1), like the forward's.
template <typename T, int kVec, int kUnits>
__device__ __forceinline__ void RowGradientSums(float (&sums)[2], const BackwardArgs<T>& p,
                                                const Team& team,
                                                const BackwardRow<T, kVec, kUnits>& r) {
  sums[0] = sums[1] = 0.0f;
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int col = team.Column(i, kVec);
    if (!r.live || col >= p.c) continue;
    const Vec<float, kVec> w = LoadVec<float, kVec>(p.weight + col);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float xhat = (ToFloat(r.x[i].v[k]) - r.mean) * r.rstd;
      const float g = ToFloat(r.dy[i].v[k]) * w.v[k];
      sums[0] += g;
      sums[1] += g * xhat;
    }
  }
}

// dinp += (g − g_mean − x̂ · g_xhat_mean) · rstd for the thread's units of the row, and
// dy · x̂ and dy added to the thread's columns of dw_sums and (when not null) db_sums.
template <typename T, int kVec, int kUnits>
__device__ __forceinline__ void StoreBackwardRow(const BackwardArgs<T>& p, const Team& team,
                                                 int64_t row, const BackwardRow<T, kVec, kUnits>& r,
                                                 float g_mean, float g_xhat_mean, float* dw_sums,
                                                 float* db_sums) {
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int col = team.Column(i, kVec);
    if (col >= p.c) continue;
    const Vec<float, kVec> w = LoadVec<float, kVec>(p.weight + col);
    Vec<float, kVec> dw = LoadVec<float, kVec>(dw_sums + col), db = {};
    if (db_sums != nullptr) db = LoadVec<float, kVec>(db_sums + col);
    Vec<T, kVec> dx;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float xhat = (ToFloat(r.x[i].v[k]) - r.mean) * r.rstd;
      const float dy = ToFloat(r.dy[i].v[k]);
      const float g = dy * w.v[k];
      dx.v[k] = FromFloat<T>(ToFloat(r.dinp[i].v[k]) + (g - g_mean - xhat * g_xhat_mean) * r.rstd);
      dw.v[k] += dy * xhat;
      db.v[k] += dy;
    }
    StoreVec(p.dinp + row * p.c + col, dx);
    StoreVec(dw_sums + col, dw);
    if (db_sums != nullptr) StoreVec(db_sums + col, db);
  }
}

// dst[j] = Σ over the block's teams, in team order, of sums[team · c + j].
__device__ void StoreBlockPartials(float* dst, const float* sums, int teams, int64_t c) {
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    float s = 0.0f;
    for (int t = 0; t < teams; ++t) s += sums[t * c + j];
    dst[j] = s;
  }
}

// Backward with rows in registers. Block k takes rows [k·rows_per_block, (k+1)·rows_per_block),
// its teams the rows first + team.index in turn. For each row, with x̂ = (x − mean) · rstd and
// g = dy · w: dinp += (g − mean(g) − x̂ · mean(g · x̂)) · rstd (RMSNorm: without mean(g)).
// Each thread adds dy · x̂ (and dy when dbias_partials is set) over its team's rows, in row
// order, into its columns of its team's row of shared memory (dynamic: teams × c floats, twice
// with dbias_partials), where no other thread touches them; then the block adds its teams' sums
// into row k of the partials.
template <typename T, bool kLayerNorm, int kVec, int kUnits>
__global__ void __launch_bounds__(kMaxThreads)
    NormBackwardKernel(const BackwardArgs<T> p, int team_size, int64_t rows_per_block,
                       float* dweight_partials, float* dbias_partials) {
  __shared__ float slots[kSumSlots];
  extern __shared__ __align__(16) float param_sums[];  // 16-byte accesses
  int parity = 0;
  const Team team = ThisTeam(team_size);
  const float n = static_cast<float>(p.c);
  float* dw_sums = param_sums + team.index * p.c;
  float* db_sums =
      dbias_partials != nullptr ? param_sums + (team.count + team.index) * p.c : nullptr;
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int col = team.Column(i, kVec);
    if (col >= p.c) continue;
    StoreVec(dw_sums + col, Vec<float, kVec>{});
    if (db_sums != nullptr) StoreVec(db_sums + col, Vec<float, kVec>{});
  }

  const int64_t begin = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t end = min(p.rows, begin + rows_per_block);
  auto cur = LoadBackwardRow<T, kLayerNorm, kVec, kUnits>(p, team, begin + team.index, end);
  for (int64_t first = begin; first < end; first += team.count) {
    const int64_t row = first + team.index;
    const auto next = LoadBackwardRow<T, kLayerNorm, kVec, kUnits>(p, team, row + team.count, end);
    float sums[2];
    RowGradientSums(sums, p, team, cur);
    TeamSum(sums, team, slots, parity);
    const float g_mean = kLayerNorm ? sums[0] / n : 0.0f;
    if (cur.live) StoreBackwardRow(p, team, row, cur, g_mean, sums[1] / n, dw_sums, db_sums);
    cur = next;
  }

  __syncthreads();
  StoreBlockPartials(dweight_partials + blockIdx.x * p.c, param_sums, team.count, p.c);
  if (dbias_partials != nullptr) {
    StoreBlockPartials(dbias_partials + blockIdx.x * p.c, param_sums + team.count * p.c, team.count,
                       p.c);
  }
}

// The loop kernels, for rows too wide for the registers: a block per row, which it reads once
// per pass (the re-reads mostly hit L2). Thread t handles the elements j ≡ t (mod blockDim.x),
// so the stored sum it reads back is its own, and `sum` may alias `a` or `b`.
template <typename T, bool kLayerNorm>
__global__ void __launch_bounds__(kMaxThreads) NormForwardLoopKernel(const ForwardArgs<T> p) {
  __shared__ float scratch[32];
  const int64_t c = p.c;
  const float n = static_cast<float>(c);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t offset = row * c;
    if (p.a != nullptr) {
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        p.sum[offset + j] = FromFloat<T>(ToFloat(p.a[offset + j]) + ToFloat(p.b[offset + j]));
      }
    }
    const T* x = (p.a != nullptr ? p.sum : p.inp) + offset;
    float mu = 0.0f;
    if constexpr (kLayerNorm) {
      float s = 0.0f;
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += ToFloat(x[j]);
      mu = BlockSum(s, scratch) / n;
    }
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float d = ToFloat(x[j]) - mu;
      ss += d * d;
    }
    const float rs = 1.0f / sqrtf(BlockSum(ss, scratch) / n + p.eps);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float shift = p.bias != nullptr ? p.bias[j] : 0.0f;
      p.out[offset + j] = FromFloat<T>((ToFloat(x[j]) - mu) * rs * p.weight[j] + shift);
    }
    if (threadIdx.x == 0) {
      if constexpr (kLayerNorm) p.mean[row] = mu;
      p.rstd[row] = rs;
    }
  }
}

// dinp of the loop backward (formula as NormBackwardKernel).
template <typename T, bool kLayerNorm>
__global__ void __launch_bounds__(kMaxThreads)
    NormBackwardInputLoopKernel(const BackwardArgs<T> p) {
  __shared__ float scratch[32];
  const int64_t c = p.c;
  const float n = static_cast<float>(c);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t offset = row * c;
    const float mu = kLayerNorm ? p.mean[row] : 0.0f;
    const float rs = p.rstd[row];
    float g_sum = 0.0f, g_xhat_sum = 0.0f;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float xhat = (ToFloat(p.inp[offset + j]) - mu) * rs;
      const float g = ToFloat(p.dout[offset + j]) * p.weight[j];
      g_sum += g;
      g_xhat_sum += g * xhat;
    }
    const float g_mean = kLayerNorm ? BlockSum(g_sum, scratch) / n : 0.0f;
    const float g_xhat_mean = BlockSum(g_xhat_sum, scratch) / n;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float xhat = (ToFloat(p.inp[offset + j]) - mu) * rs;
      const float g = ToFloat(p.dout[offset + j]) * p.weight[j];
      p.dinp[offset + j] =
          FromFloat<T>(ToFloat(p.dinp[offset + j]) + (g - g_mean - xhat * g_xhat_mean) * rs);
    }
  }
}

// Parameter-gradient partials of the loop backward: block (x, y) sums columns of tile x over
// the rows of chunk y in row order into row y of the partials.
template <typename T, bool kLayerNorm>
__global__ void __launch_bounds__(kMaxThreads)
    NormParamPartialsLoopKernel(const BackwardArgs<T> p, int64_t rows_per_chunk,
                                float* dweight_partials, float* dbias_partials) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= p.c) return;
  const int64_t chunk = blockIdx.y;
  const int64_t end = min(p.rows, (chunk + 1) * rows_per_chunk);
  float dw = 0.0f, db = 0.0f;
  for (int64_t r = chunk * rows_per_chunk; r < end; ++r) {
    const float dy = ToFloat(p.dout[r * p.c + j]);
    const float mu = kLayerNorm ? p.mean[r] : 0.0f;
    dw += dy * ((ToFloat(p.inp[r * p.c + j]) - mu) * p.rstd[r]);
    db += dy;
  }
  dweight_partials[chunk * p.c + j] = dw;
  if (dbias_partials != nullptr) dbias_partials[chunk * p.c + j] = db;
}

absl::Status CheckDType(DType dtype) {
  TY_REQUIRE(dtype == DType::kF32 || dtype == DType::kBF16);
  return absl::OkStatus();
}

// How the register kernels lay rows out: `team` threads a row, `teams` rows a block, each
// thread `units` units of `vec` elements. units 0: too wide, use the loop kernels.
struct RowLayout {
  int vec = 1;
  int units = 0;
  int team = 32;
  int teams = 1;
  int threads() const { return team * teams; }
};

// A row of c elements in units of `vec`, at most `max_units` a thread: the fewest warps that
// hold it, then the fewest units a thread that cover it.
RowLayout ChooseLayout(int64_t c, int vec, int max_units) {
  RowLayout layout;
  layout.vec = vec;
  const int64_t units = c / vec;
  const int64_t warps = (units + 32 * max_units - 1) / (32 * max_units);
  if (32 * warps > kMaxThreads) return layout;
  layout.team = static_cast<int>(32 * warps);
  layout.units = static_cast<int>((units + layout.team - 1) / layout.team);
  layout.teams = std::max(1, kBlockThreads / layout.team);
  return layout;
}

// 16-byte units when c is a multiple of them and every row pointer (and the fp32 parameters,
// loaded in units of the same count) is 16-byte aligned; single elements otherwise.
template <typename T>
RowLayout LayoutFor(int64_t c, bool forward, std::initializer_list<const void*> pointers) {
  constexpr int kPack = 16 / sizeof(T);
  bool aligned = c % kPack == 0;
  for (const void* ptr : pointers) aligned = aligned && Aligned16(ptr);
  if (aligned) return ChooseLayout(c, kPack, forward ? kMaxForwardUnits : kMaxBackwardUnits);
  return ChooseLayout(c, 1, forward ? kMaxForwardScalars : kMaxBackwardScalars);
}

// The compile-time shape of a register kernel (CUDA code here is C++17: no template lambdas).
template <int kVecT, int kUnitsT>
struct Tile {
  static constexpr int kVec = kVecT, kUnits = kUnitsT;
};

// Calls launch(Tile<kVec, units>{}) for 1 ≤ units ≤ kMaxUnits: the compile-time shape of the
// register kernel to launch.
template <int kVec, int kMaxUnits, int kUnits = 1, typename Launch>
absl::Status WithTile(int units, Launch&& launch) {
  if constexpr (kUnits > kMaxUnits) {
    return absl::InternalError("no norm kernel for this row layout");
  } else {
    if (units == kUnits) return launch(Tile<kVec, kUnits>{});
    return WithTile<kVec, kMaxUnits, kUnits + 1>(units, std::forward<Launch>(launch));
  }
}

template <typename T, bool kForward, typename Launch>
absl::Status WithLayoutTile(const RowLayout& layout, Launch&& launch) {
  constexpr int kPack = 16 / sizeof(T);
  if (layout.vec == kPack) {
    constexpr int kMax = kForward ? kMaxForwardUnits : kMaxBackwardUnits;
    return WithTile<kPack, kMax>(layout.units, std::forward<Launch>(launch));
  }
  constexpr int kMax = kForward ? kMaxForwardScalars : kMaxBackwardScalars;
  return WithTile<1, kMax>(layout.units, std::forward<Launch>(launch));
}

template <typename T, bool kLayerNorm>
absl::Status LaunchForward(cudaStream_t stream, const ForwardArgs<void>& u) {
  const ForwardArgs<T> args{static_cast<T*>(u.out),
                            u.mean,
                            u.rstd,
                            static_cast<T*>(u.sum),
                            static_cast<const T*>(u.a),
                            static_cast<const T*>(u.b),
                            static_cast<const T*>(u.inp),
                            u.weight,
                            u.bias,
                            u.rows,
                            u.c,
                            u.eps};
  const RowLayout layout =
      LayoutFor<T>(args.c, /*forward=*/true,
                   {args.out, args.sum, args.a, args.b, args.inp, args.weight, args.bias});
  if (layout.units == 0) {
    const auto blocks = static_cast<unsigned int>(std::min(args.rows, kMaxRowBlocks));
    NormForwardLoopKernel<T, kLayerNorm><<<blocks, kMaxThreads, 0, stream>>>(args);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("NormForwardLoopKernel");
    return absl::OkStatus();
  }
  const int64_t row_groups = (args.rows + layout.teams - 1) / layout.teams;
  const auto blocks = static_cast<unsigned int>(std::min(row_groups, kMaxRowBlocks));
  return WithLayoutTile<T, /*kForward=*/true>(layout, [&](auto tile) -> absl::Status {
    constexpr int kVec = decltype(tile)::kVec, kUnits = decltype(tile)::kUnits;
    NormForwardKernel<T, kLayerNorm, kVec, kUnits>
        <<<blocks, layout.threads(), 0, stream>>>(args, layout.team);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("NormForwardKernel");
    return absl::OkStatus();
  });
}

// Shared by the four forward launchers; `a` and `b` set means the fused residual add.
template <bool kLayerNorm>
absl::Status NormForward(cudaStream_t stream, DType dtype, void* sum, void* out, float* mean,
                         float* rstd, const void* a, const void* b, const void* inp,
                         const float* weight, const float* bias, int64_t rows, int64_t c,
                         float eps) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(rows >= 0 && c >= 1);
  TY_REQUIRE(eps >= 0.0f);
  TY_REQUIRE(out != nullptr && rstd != nullptr && weight != nullptr);
  TY_REQUIRE(!kLayerNorm || mean != nullptr);
  const bool fused = a != nullptr || b != nullptr || sum != nullptr;
  TY_REQUIRE(fused ? (a != nullptr && b != nullptr && sum != nullptr) : inp != nullptr);
  if (rows == 0) return absl::OkStatus();
  const ForwardArgs<void> args{out, mean, rstd, sum, a, b, inp, weight, bias, rows, c, eps};
  TY_DISPATCH_DTYPE(dtype, T, { return LaunchForward<T, kLayerNorm>(stream, args); });
}

template <typename T, bool kLayerNorm>
absl::Status LaunchBackward(cudaStream_t stream, const BackwardArgs<void>& u, RowChunks chunks,
                            float* dweight_partials, float* dbias_partials) {
  const BackwardArgs<T> args{static_cast<T*>(u.dinp),
                             static_cast<const T*>(u.dout),
                             static_cast<const T*>(u.inp),
                             u.weight,
                             u.mean,
                             u.rstd,
                             u.rows,
                             u.c};
  const RowLayout layout =
      LayoutFor<T>(args.c, /*forward=*/false, {args.dinp, args.dout, args.inp, args.weight});
  const auto blocks = static_cast<unsigned int>(chunks.count);
  if (layout.units == 0) {
    const auto row_blocks = static_cast<unsigned int>(std::min(args.rows, kMaxRowBlocks));
    NormBackwardInputLoopKernel<T, kLayerNorm><<<row_blocks, kMaxThreads, 0, stream>>>(args);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("NormBackwardInputLoopKernel");
    const dim3 grid(BlocksFor(args.c, kMaxThreads), blocks);
    NormParamPartialsLoopKernel<T, kLayerNorm><<<grid, kMaxThreads, 0, stream>>>(
        args, chunks.rows_per_chunk, dweight_partials, dbias_partials);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("NormParamPartialsLoopKernel");
    return absl::OkStatus();
  }
  const int sums = dbias_partials != nullptr ? 2 : 1;
  const size_t shared_bytes = sums * layout.teams * args.c * sizeof(float);
  return WithLayoutTile<T, /*kForward=*/false>(layout, [&](auto tile) -> absl::Status {
    constexpr int kVec = decltype(tile)::kVec, kUnits = decltype(tile)::kUnits;
    if (shared_bytes > kBackwardSharedWithoutOptIn) {
      TY_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(NormBackwardKernel<T, kLayerNorm, kVec, kUnits>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(shared_bytes)));
    }
    NormBackwardKernel<T, kLayerNorm, kVec, kUnits>
        <<<blocks, layout.threads(), shared_bytes, stream>>>(
            args, layout.team, chunks.rows_per_chunk, dweight_partials, dbias_partials);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("NormBackwardKernel");
    return absl::OkStatus();
  });
}

// Shared by both backward launchers; dbias null means no bias gradient (always for RMSNorm).
template <bool kLayerNorm>
absl::Status NormBackward(cudaStream_t stream, DType dtype, void* dinp, float* dweight,
                          float* dbias, const void* dout, const void* inp, const float* weight,
                          const float* mean, const float* rstd, int64_t rows, int64_t c,
                          float* scratch) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(rows >= 0 && c >= 1);
  TY_REQUIRE(dinp != nullptr && dweight != nullptr && dout != nullptr && inp != nullptr);
  TY_REQUIRE(weight != nullptr && rstd != nullptr && scratch != nullptr);
  TY_REQUIRE(!kLayerNorm || mean != nullptr);
  if (rows == 0) return absl::OkStatus();
  const RowChunks chunks = ChunkRows(rows);
  float* dweight_partials = scratch;
  float* dbias_partials = dbias != nullptr ? scratch + chunks.count * c : nullptr;
  const BackwardArgs<void> args{dinp, dout, inp, weight, mean, rstd, rows, c};
  TY_DISPATCH_DTYPE(dtype, T, {
    TY_RETURN_IF_ERROR(
        (LaunchBackward<T, kLayerNorm>(stream, args, chunks, dweight_partials, dbias_partials)));
  });
  return AddColumnPartialsPair(stream, dweight, dweight_partials, dbias, dbias_partials,
                               chunks.count, c);
}

}  // namespace

absl::Status LayerNormForward(cudaStream_t stream, DType dtype, void* out, float* mean, float* rstd,
                              const void* inp, const float* weight, const float* bias, int64_t rows,
                              int64_t c, float eps) {
  return NormForward<true>(stream, dtype, nullptr, out, mean, rstd, nullptr, nullptr, inp, weight,
                           bias, rows, c, eps);
}

absl::Status AddLayerNormForward(cudaStream_t stream, DType dtype, void* sum, void* out,
                                 float* mean, float* rstd, const void* a, const void* b,
                                 const float* weight, const float* bias, int64_t rows, int64_t c,
                                 float eps) {
  TY_REQUIRE(sum != nullptr && a != nullptr && b != nullptr);
  return NormForward<true>(stream, dtype, sum, out, mean, rstd, a, b, nullptr, weight, bias, rows,
                           c, eps);
}

absl::Status LayerNormBackward(cudaStream_t stream, DType dtype, void* dinp, float* dweight,
                               float* dbias, const void* dout, const void* inp, const float* weight,
                               const float* mean, const float* rstd, int64_t rows, int64_t c,
                               float* scratch) {
  return NormBackward<true>(stream, dtype, dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                            rows, c, scratch);
}

absl::Status RmsNormForward(cudaStream_t stream, DType dtype, void* out, float* rstd,
                            const void* inp, const float* weight, int64_t rows, int64_t c,
                            float eps) {
  return NormForward<false>(stream, dtype, nullptr, out, nullptr, rstd, nullptr, nullptr, inp,
                            weight, nullptr, rows, c, eps);
}

absl::Status AddRmsNormForward(cudaStream_t stream, DType dtype, void* sum, void* out, float* rstd,
                               const void* a, const void* b, const float* weight, int64_t rows,
                               int64_t c, float eps) {
  TY_REQUIRE(sum != nullptr && a != nullptr && b != nullptr);
  return NormForward<false>(stream, dtype, sum, out, nullptr, rstd, a, b, nullptr, weight, nullptr,
                            rows, c, eps);
}

absl::Status RmsNormBackward(cudaStream_t stream, DType dtype, void* dinp, float* dweight,
                             const void* dout, const void* inp, const float* weight,
                             const float* rstd, int64_t rows, int64_t c, float* scratch) {
  return NormBackward<false>(stream, dtype, dinp, dweight, nullptr, dout, inp, weight, nullptr,
                             rstd, rows, c, scratch);
}

int64_t NormBackwardScratchFloats(int64_t rows, int64_t c) {
  if (rows <= 0 || c <= 0) return 0;
  return 2 * ChunkRows(rows).count * c;
}

}  // namespace trainyard::kernels::cuda
