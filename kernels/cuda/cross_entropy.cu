#include <cmath>
#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/soft_cap.h"

namespace trainyard::kernels::cuda {
namespace {

// One block per row; a row is at most a few hundred thousand logits, so each thread streams a
// few hundred of them.
constexpr int kThreads = 512;

// 16 bytes of T: the widest load a thread can issue.
template <typename T>
struct Pack {
  static constexpr int kSize = 16 / sizeof(T);
  alignas(16) T v[kSize];
};

// A row of n elements split into a scalar head (up to the first 16-byte boundary), whole packs,
// and a scalar tail. Rows start anywhere (vocab is any size), so the head is what makes the
// packed loads legal.
struct RowSplit {
  int64_t head, packs, tail_begin;
};

template <typename T>
__device__ RowSplit SplitRow(const T* row, int64_t n) {
  constexpr int k = Pack<T>::kSize;
  const int64_t misalign = static_cast<int64_t>((reinterpret_cast<uintptr_t>(row) / sizeof(T)) % k);
  const int64_t head = misalign == 0 ? 0 : (k - misalign < n ? k - misalign : n);
  const int64_t packs = (n - head) / k;
  return {head, packs, head + packs * k};
}

// Calls visit(x, count) with the block's share of the row, converted to fp32: single values
// for the head and tail, a whole pack for the body.
template <typename T, typename Visit>
__device__ void VisitRow(const T* row, int64_t n, Visit&& visit) {
  constexpr int k = Pack<T>::kSize;
  const RowSplit split = SplitRow(row, n);
  for (int64_t j = threadIdx.x; j < split.head; j += blockDim.x) {
    const float x = ToFloat(row[j]);
    visit(&x, 1);
  }
  const auto* packs = reinterpret_cast<const uint4*>(row + split.head);
  for (int64_t p = threadIdx.x; p < split.packs; p += blockDim.x) {
    Pack<T> pack;
    *reinterpret_cast<uint4*>(pack.v) = packs[p];
    float x[k];
#pragma unroll
    for (int i = 0; i < k; ++i) x[i] = ToFloat(pack.v[i]);
    visit(x, k);
  }
  for (int64_t j = split.tail_begin + threadIdx.x; j < n; j += blockDim.x) {
    const float x = ToFloat(row[j]);
    visit(&x, 1);
  }
}

// row[j] ← f(j, row[j]) for the block's share of the row, with the same packed accesses.
template <typename T, typename F>
__device__ void TransformRow(T* row, int64_t n, F&& f) {
  constexpr int k = Pack<T>::kSize;
  const RowSplit split = SplitRow(row, n);
  for (int64_t j = threadIdx.x; j < split.head; j += blockDim.x) {
    row[j] = FromFloat<T>(f(j, ToFloat(row[j])));
  }
  auto* packs = reinterpret_cast<uint4*>(row + split.head);
  for (int64_t p = threadIdx.x; p < split.packs; p += blockDim.x) {
    Pack<T> pack;
    *reinterpret_cast<uint4*>(pack.v) = packs[p];
    const int64_t j0 = split.head + p * k;
#pragma unroll
    for (int i = 0; i < k; ++i) pack.v[i] = FromFloat<T>(f(j0 + i, ToFloat(pack.v[i])));
    packs[p] = *reinterpret_cast<const uint4*>(pack.v);
  }
  for (int64_t j = split.tail_begin + threadIdx.x; j < n; j += blockDim.x) {
    row[j] = FromFloat<T>(f(j, ToFloat(row[j])));
  }
}

// Running softmax denominator: s = Σ exp(x − m) over the values seen, m their max. A state that
// has seen only −∞ is (−∞, 0); guarding it avoids exp(−∞ − (−∞)) = NaN. fmaxf skips NaN, so a
// NaN seen while m is still −∞ is kept as s = NaN (the state (−∞, NaN)), and the loss is NaN
// as the CPU reference's is.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, a.s + b.s};  // each s is 0 or NaN here
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ void Absorb(MaxSum& state, const float* x, int count) {
  float m = state.m;
  for (int i = 0; i < count; ++i) m = fmaxf(m, x[i]);
  if (m == -INFINITY) {
    for (int i = 0; i < count; ++i) {
      if (isnan(x[i])) state.s = NAN;
    }
    return;
  }
  float s = state.s * expf(state.m - m);
  for (int i = 0; i < count; ++i) s += expf(x[i] - m);
  state = {m, s};
}

// The block's combined state, returned to every thread. Call once per kernel (it leaves its
// result in `shared`, 32 entries).
__device__ MaxSum BlockMaxSum(MaxSum state, MaxSum* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, state.m, o),
                       __shfl_xor_sync(0xffffffffu, state.s, o)};
    state = Combine(state, other);
  }
  if (lane == 0) shared[warp] = state;
  __syncthreads();
  if (warp == 0) {
    state = lane < warps ? shared[lane] : MaxSum{-INFINITY, 0.0f};
    for (int o = 16; o > 0; o >>= 1) {
      const MaxSum other{__shfl_xor_sync(0xffffffffu, state.m, o),
                         __shfl_xor_sync(0xffffffffu, state.s, o)};
      state = Combine(state, other);
    }
    if (lane == 0) shared[0] = state;
  }
  __syncthreads();
  return shared[0];
}

template <typename T>
__device__ MaxSum RowMaxSum(const T* row, int64_t vocab) {
  __shared__ MaxSum shared[32];
  MaxSum state{-INFINITY, 0.0f};
  VisitRow(row, vocab, [&](const float* x, int count) { Absorb(state, x, count); });
  return BlockMaxSum(state, shared);
}

template <typename T>
__global__ void SoftCapKernel(T* x, int64_t cols, int64_t ld, float cap) {
  const float inv = InverseCap(cap);
  TransformRow(x + blockIdx.x * ld, cols,
               [&](int64_t, float v) { return SoftCapped(v, cap, inv); });
}

template <typename T>
__global__ void SoftmaxCrossEntropyKernel(T* logits, const int32_t* targets, int64_t vocab,
                                          int64_t ld, float grad_scale, bool write_grad,
                                          float inv_cap, float* losses, float z_loss,
                                          float* lse_out) {
  T* row = logits + blockIdx.x * ld;
  const int32_t target = targets[blockIdx.x];
  const bool valid = target >= 0 && target < vocab;
  // Read before the in-place gradient pass; the reduction's barriers order it before any write.
  const float target_logit = valid ? ToFloat(row[target]) : NAN;
  const MaxSum state = RowMaxSum(row, vocab);
  const float lse = state.m + logf(state.s);
  if (threadIdx.x == 0) {
    losses[blockIdx.x] = lse - target_logit;
    if (lse_out != nullptr) lse_out[blockIdx.x] = lse;
  }
  if (!write_grad) return;
  const float scale = grad_scale * ZLossFactor(z_loss, lse);
  TransformRow(row, vocab, [&](int64_t j, float x) {
    const float p = scale * expf(x - lse);
    return ThroughCap(j == target ? p - grad_scale : p, x, inv_cap);
  });
}

template <typename T>
__global__ void ShardStatsKernel(const T* logits, const int32_t* local_targets, int64_t vocab,
                                 float* stats) {
  const T* row = logits + blockIdx.x * vocab;
  const MaxSum state = RowMaxSum(row, vocab);
  if (threadIdx.x != 0) return;
  const int32_t target = local_targets[blockIdx.x];
  float target_logit = 0.0f;  // another shard's target
  if (target >= 0) target_logit = target < vocab ? ToFloat(row[target]) : NAN;
  float* out = stats + 3 * int64_t{blockIdx.x};
  out[0] = state.m;
  out[1] = state.s;
  out[2] = target_logit;
}

template <typename T>
__global__ void ShardGradKernel(T* logits, const int32_t* local_targets, const float* lse,
                                int64_t vocab, float grad_scale, float inv_cap, float z_loss) {
  T* row = logits + blockIdx.x * vocab;
  const int32_t target = local_targets[blockIdx.x];
  const float l = lse[blockIdx.x];
  const float scale = grad_scale * ZLossFactor(z_loss, l);
  TransformRow(row, vocab, [&](int64_t j, float x) {
    const float p = scale * expf(x - l);
    return ThroughCap(j == target ? p - grad_scale : p, x, inv_cap);
  });
}

__global__ void MergeShardStatsKernel(const float* gathered, int ranks, int64_t stride,
                                      int64_t rows, float* lse, float* row_loss) {
  const int64_t r = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  double mx = -INFINITY, target = 0.0, sum = 0.0;
  for (int k = 0; k < ranks; ++k) mx = fmax(mx, double{gathered[3 * (k * stride + r)]});
  for (int k = 0; k < ranks; ++k) {
    const float* s = gathered + 3 * (k * stride + r);
    sum += double{s[1]} * exp(double{s[0]} - mx);
    target += s[2];
  }
  const double row_lse = mx + log(sum);
  lse[r] = static_cast<float>(row_lse);
  row_loss[r] = static_cast<float>(row_lse - target);
}

// Rows map to grid.x; targets are int32, so vocab must fit one.
absl::Status CheckShape(int64_t rows, int64_t vocab) {
  TY_REQUIRE(rows > 0 && rows <= INT32_MAX);
  TY_REQUIRE(vocab > 0 && vocab <= INT32_MAX);
  return absl::OkStatus();
}

}  // namespace

absl::Status SoftCap(cudaStream_t stream, DType dtype, void* x, int64_t rows, int64_t cols,
                     int64_t ld, float cap) {
  TY_RETURN_IF_ERROR(CheckShape(rows, cols));
  TY_REQUIRE(ld >= cols && x != nullptr);
  TY_REQUIRE(cap > 0.0f && std::isfinite(cap));
  TY_DISPATCH_DTYPE(dtype, T, {
    SoftCapKernel<T><<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(static_cast<T*>(x),
                                                                               cols, ld, cap);
  });
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("SoftCapKernel");
  return absl::OkStatus();
}

absl::Status SoftmaxCrossEntropy(cudaStream_t stream, DType dtype, void* logits,
                                 const int32_t* targets, int64_t rows, int64_t vocab, int64_t ld,
                                 float grad_scale, bool write_grad, float* losses, float softcap,
                                 float z_loss, float* lse) {
  TY_RETURN_IF_ERROR(CheckShape(rows, vocab));
  TY_REQUIRE(ld >= vocab);
  TY_REQUIRE(logits != nullptr && targets != nullptr && losses != nullptr);
  TY_REQUIRE(softcap >= 0.0f && std::isfinite(softcap));
  TY_REQUIRE(z_loss >= 0.0f && std::isfinite(z_loss));
  const float inv_cap = InverseCap(softcap);
  TY_DISPATCH_DTYPE(dtype, T, {
    SoftmaxCrossEntropyKernel<T><<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(
        static_cast<T*>(logits), targets, vocab, ld, grad_scale, write_grad, inv_cap, losses,
        z_loss, lse);
  });
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("SoftmaxCrossEntropyKernel");
  return absl::OkStatus();
}

absl::Status CrossEntropyShardStats(cudaStream_t stream, DType dtype, const void* logits,
                                    const int32_t* local_targets, int64_t rows, int64_t vocab,
                                    float* stats) {
  TY_RETURN_IF_ERROR(CheckShape(rows, vocab));
  TY_REQUIRE(logits != nullptr && local_targets != nullptr && stats != nullptr);
  TY_DISPATCH_DTYPE(dtype, T, {
    ShardStatsKernel<T><<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(logits), local_targets, vocab, stats);
  });
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("ShardStatsKernel");
  return absl::OkStatus();
}

absl::Status CrossEntropyShardGrad(cudaStream_t stream, DType dtype, void* logits,
                                   const int32_t* local_targets, const float* lse, int64_t rows,
                                   int64_t vocab, float grad_scale, float softcap, float z_loss) {
  TY_RETURN_IF_ERROR(CheckShape(rows, vocab));
  TY_REQUIRE(logits != nullptr && local_targets != nullptr && lse != nullptr);
  TY_REQUIRE(softcap >= 0.0f && std::isfinite(softcap));
  TY_REQUIRE(z_loss >= 0.0f && std::isfinite(z_loss));
  const float inv_cap = InverseCap(softcap);
  TY_DISPATCH_DTYPE(dtype, T, {
    ShardGradKernel<T><<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(
        static_cast<T*>(logits), local_targets, lse, vocab, grad_scale, inv_cap, z_loss);
  });
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("ShardGradKernel");
  return absl::OkStatus();
}

absl::Status CrossEntropyMergeShardStats(cudaStream_t stream, const float* gathered, int ranks,
                                         int64_t stride, int64_t rows, float* lse,
                                         float* row_loss) {
  TY_REQUIRE(ranks > 0 && rows > 0 && stride >= rows);
  TY_REQUIRE(gathered != nullptr && lse != nullptr && row_loss != nullptr);
  constexpr int kRowsPerBlock = 128;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  TY_REQUIRE(blocks <= INT32_MAX);
  MergeShardStatsKernel<<<static_cast<unsigned int>(blocks), kRowsPerBlock, 0, stream>>>(
      gathered, ranks, stride, rows, lse, row_loss);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("MergeShardStatsKernel");
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
