#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_partials.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/norms.h"

namespace trainyard::kernels::cuda {
namespace {

// The per-row kernels give each row to one warp: a row of a few thousand values is read a few
// times from L1/L2, and warp shuffles reduce it without shared memory or block barriers.
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

// The row of the calling warp; every lane of a warp gets the same one.
__device__ __forceinline__ int64_t WarpRow() {
  return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
}

// Lane `lane` writes (and later reads back) exactly the elements j ≡ lane (mod 32), so the
// stored sum is visible to the reads that follow without synchronisation, and `sum` may alias
// `a` or `b`.
template <typename T>
__device__ void StoreRowSum(T* sum, const T* a, const T* b, int64_t c, int lane) {
  for (int64_t j = lane; j < c; j += 32) sum[j] = FromFloat<T>(ToFloat(a[j]) + ToFloat(b[j]));
}

// Forward for one row per warp. LayerNorm: y = (x − mean) · rstd · w + b with the biased
// variance; RMSNorm (kLayerNorm false): mean is taken as 0 and there is no bias. When `a` is
// set, x = a + b is first stored (rounded to T) into `sum` and normalised from there; otherwise
// x = inp.
template <typename T, bool kLayerNorm>
__global__ void NormForwardKernel(T* out, float* mean, float* rstd, T* sum, const T* a, const T* b,
                                  const T* inp, const float* weight, const float* bias,
                                  int64_t rows, int64_t c, float eps) {
  const int64_t row = WarpRow();
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t offset = row * c;
  if (a != nullptr) StoreRowSum(sum + offset, a + offset, b + offset, c, lane);
  const T* x = (a != nullptr ? sum : inp) + offset;
  const float n = static_cast<float>(c);

  float mu = 0.0f;
  if (kLayerNorm) {
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += 32) s += ToFloat(x[j]);
    mu = WarpSum(s) / n;
  }
  float ss = 0.0f;
  for (int64_t j = lane; j < c; j += 32) {
    const float d = ToFloat(x[j]) - mu;
    ss += d * d;
  }
  const float rs = 1.0f / sqrtf(WarpSum(ss) / n + eps);

  T* y = out + offset;
  for (int64_t j = lane; j < c; j += 32) {
    const float shift = bias != nullptr ? bias[j] : 0.0f;
    y[j] = FromFloat<T>((ToFloat(x[j]) - mu) * rs * weight[j] + shift);
  }
  if (lane == 0) {
    if (kLayerNorm) mean[row] = mu;
    rstd[row] = rs;
  }
}

// dinp += ∂/∂x for one row per warp, with x̂ = (x − mean) · rstd and g = dout · w:
// LayerNorm: (g − mean(g) − x̂ · mean(g · x̂)) · rstd; RMSNorm: (g − x̂ · mean(g · x̂)) · rstd.
template <typename T, bool kLayerNorm>
__global__ void NormBackwardInputKernel(T* dinp, const T* dout, const T* inp, const float* weight,
                                        const float* mean, const float* rstd, int64_t rows,
                                        int64_t c) {
  const int64_t row = WarpRow();
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t offset = row * c;
  const T* x = inp + offset;
  const T* dy = dout + offset;
  const float mu = kLayerNorm ? mean[row] : 0.0f;
  const float rs = rstd[row];
  const float n = static_cast<float>(c);

  float g_sum = 0.0f, g_xhat_sum = 0.0f;
  for (int64_t j = lane; j < c; j += 32) {
    const float xhat = (ToFloat(x[j]) - mu) * rs;
    const float g = ToFloat(dy[j]) * weight[j];
    g_sum += g;
    g_xhat_sum += g * xhat;
  }
  const float g_mean = kLayerNorm ? WarpSum(g_sum) / n : 0.0f;
  const float g_xhat_mean = WarpSum(g_xhat_sum) / n;

  T* dx = dinp + offset;
  for (int64_t j = lane; j < c; j += 32) {
    const float xhat = (ToFloat(x[j]) - mu) * rs;
    const float g = ToFloat(dy[j]) * weight[j];
    dx[j] = FromFloat<T>(ToFloat(dx[j]) + (g - g_mean - xhat * g_xhat_mean) * rs);
  }
}

// First pass of the weight/bias gradients: block (x, y) sums columns of tile x over the rows of
// chunk y, in row order, and stores the partial sums Σ dout · x̂ and Σ dout at [chunk, column].
// `dbias_partials` may be null (no bias).
template <typename T, bool kLayerNorm>
__global__ void NormParamPartialsKernel(float* dweight_partials, float* dbias_partials,
                                        const T* dout, const T* inp, const float* mean,
                                        const float* rstd, int64_t rows, int64_t c,
                                        int64_t rows_per_chunk) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float dw = 0.0f, db = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float dy = ToFloat(dout[r * c + j]);
    const float mu = kLayerNorm ? mean[r] : 0.0f;
    dw += dy * ((ToFloat(inp[r * c + j]) - mu) * rstd[r]);
    db += dy;
  }
  dweight_partials[chunk * c + j] = dw;
  if (dbias_partials != nullptr) dbias_partials[chunk * c + j] = db;
}

absl::Status CheckDType(DType dtype) {
  TY_REQUIRE(dtype == DType::kF32 || dtype == DType::kBF16);
  return absl::OkStatus();
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
  TY_DISPATCH_DTYPE(dtype, T, {
    NormForwardKernel<T, kLayerNorm><<<BlocksFor(rows, kRowsPerBlock), kThreads, 0, stream>>>(
        static_cast<T*>(out), mean, rstd, static_cast<T*>(sum), static_cast<const T*>(a),
        static_cast<const T*>(b), static_cast<const T*>(inp), weight, bias, rows, c, eps);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("NormForwardKernel");
  });
  return absl::OkStatus();
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
  const dim3 partial_grid(BlocksFor(c, kThreads), static_cast<unsigned int>(chunks.count));
  TY_DISPATCH_DTYPE(dtype, T, {
    NormBackwardInputKernel<T, kLayerNorm><<<BlocksFor(rows, kRowsPerBlock), kThreads, 0, stream>>>(
        static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), weight,
        mean, rstd, rows, c);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("NormBackwardInputKernel");
    NormParamPartialsKernel<T, kLayerNorm><<<partial_grid, kThreads, 0, stream>>>(
        dweight_partials, dbias_partials, static_cast<const T*>(dout), static_cast<const T*>(inp),
        mean, rstd, rows, c, chunks.rows_per_chunk);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("NormParamPartialsKernel");
  });
  TY_RETURN_IF_ERROR(AddColumnPartials(stream, dweight, dweight_partials, chunks.count, c));
  if (dbias != nullptr) {
    TY_RETURN_IF_ERROR(AddColumnPartials(stream, dbias, dbias_partials, chunks.count, c));
  }
  return absl::OkStatus();
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
