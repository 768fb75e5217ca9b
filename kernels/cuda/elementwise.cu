#include <algorithm>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_partials.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/memory_bound.cuh"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// SumOfSquares: each of at most kMaxSquareBlocks blocks covers about kThreads · 8 elements.
constexpr int64_t kSquareElementsPerBlock = kThreads * 8;
constexpr int64_t kMaxSquareBlocks = 1024;

// The pointwise operations, memory-bound: 16-byte accesses where every pointer allows them
// (memory_bound.cuh's grid-stride kernels), each element read once and written once.
// Same-index reads precede the write, so out may alias a or b.
template <typename T>
struct AddOp {
  using Elem = T;
  T* out;
  const T* a;
  const T* b;
  template <int kVec>
  __device__ __forceinline__ void Apply(int64_t i) const {
    const Vec<T, kVec> x = LoadVec<T, kVec>(a + i), y = LoadVec<T, kVec>(b + i);
    Vec<T, kVec> z;
#pragma unroll
    for (int k = 0; k < kVec; ++k) z.v[k] = FromFloat<T>(ToFloat(x.v[k]) + ToFloat(y.v[k]));
    StoreVec(out + i, z);
  }
};

// Row r, columns [j, j + kVec) of out[m, n] += bias[j, j + kVec).
template <typename T>
struct AddBiasOp {
  using Elem = T;
  T* out;
  const float* bias;
  int64_t n;
  // Grouped: row r takes bias row g, the group whose rows [offsets[g], offsets[g + 1]) hold it.
  const int64_t* offsets = nullptr;
  int groups = 0;
  __device__ __forceinline__ int64_t GroupOf(int64_t r) const {
    int lo = 0, hi = groups - 1;  // the last g with offsets[g] <= r, past empty groups
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= r) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  template <int kVec>
  __device__ __forceinline__ void Apply(int64_t r, int64_t j) const {
    T* at = out + r * n + j;
    const Vec<T, kVec> x = LoadVec<T, kVec>(at);
    const float* row = offsets != nullptr ? bias + GroupOf(r) * n : bias;
    const Vec<float, kVec> c = LoadVec<float, kVec>(row + j);
    Vec<T, kVec> y;
#pragma unroll
    for (int k = 0; k < kVec; ++k) y.v[k] = FromFloat<T>(ToFloat(x.v[k]) + c.v[k]);
    StoreVec(at, y);
  }
};

template <typename T>
struct FillOp {
  using Elem = T;
  T* out;
  float value;
  template <int kVec>
  __device__ __forceinline__ void Apply(int64_t i) const {
    Vec<T, kVec> y;
#pragma unroll
    for (int k = 0; k < kVec; ++k) y.v[k] = FromFloat<T>(value);
    StoreVec(out + i, y);
  }
};

// out = factor · in, rounded once to T (out may alias in).
template <typename T>
struct ScaleOp {
  using Elem = T;
  T* out;
  const T* in;
  float factor;
  template <int kVec>
  __device__ __forceinline__ void Apply(int64_t i) const {
    const Vec<T, kVec> x = LoadVec<T, kVec>(in + i);
    Vec<T, kVec> y;
#pragma unroll
    for (int k = 0; k < kVec; ++k) y.v[k] = FromFloat<T>(ToFloat(x.v[k]) * factor);
    StoreVec(out + i, y);
  }
};

// fp32 ↔ bf16: a unit is 8 elements, one 16-byte access of bf16 and two of fp32.
template <typename Dst, typename Src>
struct ConvertOp {
  using Elem = bf16;
  Dst* dst;
  const Src* src;
  template <int kVec>
  __device__ __forceinline__ void Apply(int64_t i) const {
    const Vec<Src, kVec> x = LoadVec<Src, kVec>(src + i);
    Vec<Dst, kVec> y;
#pragma unroll
    for (int k = 0; k < kVec; ++k) y.v[k] = FromFloat<Dst>(ToFloat(x.v[k]));
    StoreVec(dst + i, y);
  }
};

// partials[chunk, j] = Σ over the chunk's rows, in row order, of dout[r, j].
template <typename T>
__global__ void ColumnPartialsKernel(float* partials, const T* dout, int64_t m, int64_t n,
                                     int64_t rows_per_chunk) {
  const int64_t j = FirstIndex();
  if (j >= n) return;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = min(m, r0 + rows_per_chunk);
  float sum = 0.0f;
  for (int64_t r = r0; r < r1; ++r) sum += ToFloat(dout[r * n + j]);
  partials[chunk * n + j] = sum;
}

// The same with each chunk's rows [chunk_rows[2t], chunk_rows[2t + 1]) from a table: the chunks
// of several row ranges, each cut as ColumnPartialsKernel cuts a range alone.
template <typename T>
__global__ void GroupedColumnPartialsKernel(float* partials, const T* dout, int64_t n,
                                            const int64_t* chunk_rows) {
  const int64_t j = FirstIndex();
  if (j >= n) return;
  const int64_t t = blockIdx.y, r1 = chunk_rows[2 * t + 1];
  float sum = 0.0f;
  for (int64_t r = chunk_rows[2 * t]; r < r1; ++r) sum += ToFloat(dout[r * n + j]);
  partials[t * n + j] = sum;
}

__device__ __forceinline__ double WarpSumDouble(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The block's sum, valid in thread 0. The order of additions is fixed by the thread layout
// alone, so the bits do not depend on scheduling.
__device__ double BlockSumDouble(double v) {
  __shared__ double warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  v = WarpSumDouble(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = threadIdx.x < warps ? warp_sums[threadIdx.x] : 0.0;
  return warp == 0 ? WarpSumDouble(v) : 0.0;
}

// Ranges per launch of the sum of squares, sized so that the argument struct stays under the
// classic 4 KiB limit on kernel parameters.
constexpr int kMaxSquareRanges = 128;

// One launch's ranges: range r owns the blocks [first_block[r], first_block[r + 1]) and its
// partials sit at the same indices of the scratch.
struct SquareArgs {
  const float* x[kMaxSquareRanges];
  int64_t n[kMaxSquareRanges];
  int64_t first_block[kMaxSquareRanges + 1];
  int count;
};
static_assert(sizeof(SquareArgs) <= 4096, "kernel arguments must fit the 4 KiB parameter space");

// Pass 1: partials[block] = Σ x² over its range's elements local·kThreads + thread + k·stride,
// where local is the block's index among its range's blocks and stride their threads.
__global__ void SquarePartialsKernel(double* partials, const SquareArgs args) {
  const int64_t block = blockIdx.x;
  int lo = 0, hi = args.count - 1;  // the last range whose first block is at or before this one
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (args.first_block[mid] <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  const float* x = args.x[lo];
  const int64_t n = args.n[lo], first = args.first_block[lo];
  const int64_t stride = (args.first_block[lo + 1] - first) * blockDim.x;
  double sum = 0.0;
  for (int64_t i = (block - first) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    sum += v * v;
  }
  sum = BlockSumDouble(sum);
  if (threadIdx.x == 0) partials[block] = sum;
}

// Pass 2, a block per range: results[r] = Σ of its partials, in a fixed order.
__global__ void SumPartialsKernel(double* results, const double* partials, const SquareArgs args) {
  const int r = blockIdx.x;
  const int64_t first = args.first_block[r], count = args.first_block[r + 1] - first;
  double sum = 0.0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) sum += partials[first + k];
  sum = BlockSumDouble(sum);
  if (threadIdx.x == 0) results[r] = sum;
}

absl::Status CheckDType(DType dtype) {
  TY_REQUIRE(dtype == DType::kF32 || dtype == DType::kBF16);
  return absl::OkStatus();
}

}  // namespace

absl::Status Add(cudaStream_t stream, DType dtype, void* out, const void* a, const void* b,
                 int64_t n) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(n >= 0);
  if (n == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && a != nullptr && b != nullptr);
  const bool aligned = Aligned16(out) && Aligned16(a) && Aligned16(b);
  TY_DISPATCH_DTYPE(dtype, T, {
    const AddOp<T> op{static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b)};
    TY_RETURN_IF_ERROR(LaunchElements(stream, "AddKernel", op, n, aligned));
  });
  return absl::OkStatus();
}

absl::Status AddBias(cudaStream_t stream, DType dtype, void* out, const float* bias, int64_t m,
                     int64_t n) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(m >= 0 && n >= 1);
  if (m == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && bias != nullptr);
  const bool aligned = Aligned16(out) && Aligned16(bias);
  TY_DISPATCH_DTYPE(dtype, T, {
    const AddBiasOp<T> op{static_cast<T*>(out), bias, n};
    TY_RETURN_IF_ERROR(LaunchRows(stream, "AddBiasKernel", op, m, n, aligned));
  });
  return absl::OkStatus();
}

absl::Status AddGroupedBias(cudaStream_t stream, DType dtype, void* out, const float* bias,
                            const int64_t* offsets, int groups, int64_t m, int64_t n) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(m >= 0 && n >= 1 && groups >= 1);
  if (m == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && bias != nullptr && offsets != nullptr);
  const bool aligned = Aligned16(out) && Aligned16(bias);  // rows of n floats: n % kPack == 0
  TY_DISPATCH_DTYPE(dtype, T, {
    const AddBiasOp<T> op{static_cast<T*>(out), bias, n, offsets, groups};
    TY_RETURN_IF_ERROR(LaunchRows(stream, "AddGroupedBiasKernel", op, m, n, aligned));
  });
  return absl::OkStatus();
}

absl::Status Fill(cudaStream_t stream, DType dtype, void* out, float value, int64_t n) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(n >= 0);
  if (n == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr);
  TY_DISPATCH_DTYPE(dtype, T, {
    const FillOp<T> op{static_cast<T*>(out), value};
    TY_RETURN_IF_ERROR(LaunchElements(stream, "FillKernel", op, n, Aligned16(out)));
  });
  return absl::OkStatus();
}

absl::Status Scale(cudaStream_t stream, float* x, int64_t n, float factor) {
  TY_REQUIRE(n >= 0);
  if (n == 0) return absl::OkStatus();
  TY_REQUIRE(x != nullptr);
  return LaunchElements(stream, "ScaleKernel", ScaleOp<float>{x, x, factor}, n, Aligned16(x));
}

absl::Status Scale(cudaStream_t stream, DType dtype, void* out, const void* in, int64_t n,
                   float factor) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(n >= 0);
  if (n == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && in != nullptr);
  const bool aligned = Aligned16(out) && Aligned16(in);
  TY_DISPATCH_DTYPE(dtype, T, {
    const ScaleOp<T> op{static_cast<T*>(out), static_cast<const T*>(in), factor};
    TY_RETURN_IF_ERROR(LaunchElements(stream, "ScaleActKernel", op, n, aligned));
  });
  return absl::OkStatus();
}

absl::Status Convert(cudaStream_t stream, DType dst_type, void* dst, DType src_type,
                     const void* src, int64_t n) {
  TY_RETURN_IF_ERROR(CheckDType(dst_type));
  TY_RETURN_IF_ERROR(CheckDType(src_type));
  TY_REQUIRE(n >= 0);
  if (n == 0) return absl::OkStatus();
  TY_REQUIRE(dst != nullptr && src != nullptr);
  if (dst_type == src_type) {
    if (dst == src) return absl::OkStatus();
    TY_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, n * DTypeBytes(dst_type), cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  }
  // Element sizes differ, so converting in place would overwrite unread input.
  TY_REQUIRE(dst != src);
  const bool aligned = Aligned16(dst) && Aligned16(src);
  if (dst_type == DType::kBF16) {
    const ConvertOp<bf16, float> op{static_cast<bf16*>(dst), static_cast<const float*>(src)};
    return LaunchElements(stream, "ConvertKernel", op, n, aligned);
  }
  const ConvertOp<float, bf16> op{static_cast<float*>(dst), static_cast<const bf16*>(src)};
  return LaunchElements(stream, "ConvertKernel", op, n, aligned);
}

int64_t ColumnSumScratchFloats(int64_t m, int64_t n) {
  if (m <= 0 || n <= 0) return 0;
  return ChunkRows(m).count * n;
}

absl::Status AccumulateColumnSums(cudaStream_t stream, DType dtype, float* dbias, const void* dout,
                                  int64_t m, int64_t n, float* scratch) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(m >= 0 && n >= 1);
  if (m == 0) return absl::OkStatus();
  TY_REQUIRE(dbias != nullptr && dout != nullptr && scratch != nullptr);
  const RowChunks chunks = ChunkRows(m);
  const dim3 grid(BlocksFor(n, kThreads), static_cast<unsigned int>(chunks.count));
  TY_DISPATCH_DTYPE(dtype, T, {
    ColumnPartialsKernel<T><<<grid, kThreads, 0, stream>>>(scratch, static_cast<const T*>(dout), m,
                                                           n, chunks.rows_per_chunk);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("ColumnPartialsKernel");
  });
  return AddColumnPartials(stream, dbias, scratch, chunks.count, n);
}

std::vector<int64_t> GroupedColumnSumTable(const int64_t* offsets, int groups) {
  std::vector<int64_t> table(2 * static_cast<size_t>(groups));
  int64_t first = 0;
  for (int g = 0; g < groups; ++g) {
    const int64_t m = offsets[g + 1] - offsets[g];
    const RowChunks chunks = ChunkRows(m);
    const int64_t count = m > 0 ? chunks.count : 0;
    table[2 * g] = first;
    table[2 * g + 1] = count;
    for (int64_t c = 0; c < count; ++c) {
      table.push_back(offsets[g] + c * chunks.rows_per_chunk);
      table.push_back(offsets[g] + std::min(m, (c + 1) * chunks.rows_per_chunk));
    }
    first += count;
  }
  return table;
}

int64_t GroupedColumnSumScratchFloats(const int64_t* offsets, int groups, int64_t n) {
  int64_t floats = 0;
  for (int g = 0; g < groups; ++g) floats += ColumnSumScratchFloats(offsets[g + 1] - offsets[g], n);
  return floats;
}

absl::Status AccumulateGroupedColumnSums(cudaStream_t stream, DType dtype, float* dbias,
                                         const void* dout, const int64_t* offsets, int groups,
                                         int64_t n, const int64_t* table, float* scratch) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(offsets != nullptr && groups >= 1 && n >= 1);
  const int64_t chunks = GroupedColumnSumScratchFloats(offsets, groups, n) / n;
  if (chunks == 0) return absl::OkStatus();  // every range empty
  TY_REQUIRE(dbias != nullptr && dout != nullptr && table != nullptr && scratch != nullptr);
  TY_REQUIRE(chunks <= 65535);
  const dim3 grid(BlocksFor(n, kThreads), static_cast<unsigned int>(chunks));
  TY_DISPATCH_DTYPE(dtype, T, {
    GroupedColumnPartialsKernel<T><<<grid, kThreads, 0, stream>>>(
        scratch, static_cast<const T*>(dout), n, table + 2 * groups);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("GroupedColumnPartialsKernel");
  });
  return AddGroupedColumnPartials(stream, dbias, scratch, table, groups, n);
}

int64_t SumOfSquaresScratchDoubles(int64_t n) {
  return std::clamp<int64_t>((n + kSquareElementsPerBlock - 1) / kSquareElementsPerBlock, 1,
                             kMaxSquareBlocks);
}

int64_t SumOfSquaresScratchDoubles(const std::vector<SquaresRange>& ranges) {
  int64_t doubles = 0;
  for (const SquaresRange& r : ranges) doubles += SumOfSquaresScratchDoubles(r.n);
  return doubles;
}

absl::Status SumOfSquares(cudaStream_t stream, const float* x, int64_t n, double* result,
                          double* scratch) {
  return SumOfSquaresMulti(stream, {SquaresRange{x, n}}, result, scratch);
}

absl::Status SumOfSquaresMulti(cudaStream_t stream, const std::vector<SquaresRange>& ranges,
                               double* results, double* scratch) {
  if (ranges.empty()) return absl::OkStatus();
  TY_REQUIRE(results != nullptr && scratch != nullptr);
  for (const SquaresRange& r : ranges) TY_REQUIRE(r.n >= 0 && (r.n == 0 || r.x != nullptr));
  SquareArgs args{};
  int64_t blocks = 0;
  // Each range's block count is a function of its length alone, which fixes its summation order.
  auto launch = [&]() -> absl::Status {
    args.first_block[args.count] = blocks;
    SquarePartialsKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(scratch, args);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("SquarePartialsKernel");
    SumPartialsKernel<<<static_cast<unsigned int>(args.count), kThreads, 0, stream>>>(
        results, scratch, args);
    TY_CUDA_RETURN_IF_LAUNCH_FAILED("SumPartialsKernel");
    results += args.count;
    scratch += blocks;
    args.count = 0;
    blocks = 0;
    return absl::OkStatus();
  };
  for (const SquaresRange& r : ranges) {
    if (args.count == kMaxSquareRanges) TY_RETURN_IF_ERROR(launch());
    args.x[args.count] = r.x;
    args.n[args.count] = r.n;
    args.first_block[args.count] = blocks;
    ++args.count;
    blocks += SumOfSquaresScratchDoubles(r.n);
  }
  return launch();
}

}  // namespace trainyard::kernels::cuda
