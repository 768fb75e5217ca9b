#include <algorithm>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_partials.h"

namespace trainyard::kernels::cuda {
namespace {

constexpr int64_t kMinRowsPerChunk = 32;
constexpr int64_t kMaxChunks = 256;
// A block adds kColumns columns (one coalesced 128-byte load per warp and chunk), its kRuns
// warps each a run of the chunks: a column's few hundred chunks are summed by eight threads with
// several loads in flight each, not by one thread one dependent load at a time.
constexpr int kColumns = 32;
constexpr int kRuns = 8;

// The block's columns [32·blockIdx.x, +32) of one [chunks, c] matrix of partials added into
// dst: warp s sums the chunks [s·per_run, (s+1)·per_run) in increasing order; then the runs'
// sums are added in increasing s.
__device__ void AddPartialsBlock(float* dst, const float* partials, int64_t chunks, int64_t c) {
  __shared__ float run_sums[kRuns][kColumns];
  const int lane = static_cast<int>(threadIdx.x) % kColumns;
  const int run = static_cast<int>(threadIdx.x) / kColumns;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + lane;
  const int64_t per_run = (chunks + kRuns - 1) / kRuns;
  const int64_t end = min(chunks, (run + 1) * per_run);
  float sum = 0.0f;
  if (j < c) {
#pragma unroll 8
    for (int64_t k = run * per_run; k < end; ++k) sum += partials[k * c + j];
  }
  run_sums[run][lane] = sum;
  __syncthreads();
  if (run != 0 || j >= c) return;
  float total = 0.0f;
  for (int r = 0; r < kRuns; ++r) total += run_sums[r][lane];
  dst[j] += total;
}

// Block (x, y): columns [32x, 32x + 32) of matrix y (0 or 1).
__global__ void __launch_bounds__(kColumns* kRuns)
    AddColumnPartialsKernel(float* dst0, const float* partials0, float* dst1,
                            const float* partials1, int64_t chunks, int64_t c) {
  AddPartialsBlock(blockIdx.y == 0 ? dst0 : dst1, blockIdx.y == 0 ? partials0 : partials1, chunks,
                   c);
}

// Block (x, g): columns [32x, 32x + 32) of group g, whose partials are the chunks
// [groups[2g], groups[2g] + groups[2g + 1]) and whose sums go to row g of dst.
__global__ void __launch_bounds__(kColumns* kRuns)
    AddGroupedColumnPartialsKernel(float* dst, const float* partials, const int64_t* groups,
                                   int64_t c) {
  const int64_t g = blockIdx.y, first = groups[2 * g], chunks = groups[2 * g + 1];
  if (chunks == 0) return;  // an empty group: nothing to add (the whole block leaves)
  AddPartialsBlock(dst + g * c, partials + first * c, chunks, c);
}

}  // namespace

RowChunks ChunkRows(int64_t rows) {
  RowChunks chunks;
  chunks.count =
      std::clamp<int64_t>((rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk, 1, kMaxChunks);
  chunks.rows_per_chunk = (std::max<int64_t>(rows, 0) + chunks.count - 1) / chunks.count;
  return chunks;
}

absl::Status AddColumnPartials(cudaStream_t stream, float* dst, const float* partials,
                               int64_t chunks, int64_t c) {
  return AddColumnPartialsPair(stream, dst, partials, nullptr, nullptr, chunks, c);
}

absl::Status AddColumnPartialsPair(cudaStream_t stream, float* dst0, const float* partials0,
                                   float* dst1, const float* partials1, int64_t chunks, int64_t c) {
  TY_REQUIRE(dst0 != nullptr && partials0 != nullptr);
  TY_REQUIRE((dst1 == nullptr) == (partials1 == nullptr));
  TY_REQUIRE(chunks >= 1 && c >= 1);
  const dim3 grid(BlocksFor(c, kColumns), dst1 != nullptr ? 2 : 1);
  AddColumnPartialsKernel<<<grid, kColumns * kRuns, 0, stream>>>(dst0, partials0, dst1, partials1,
                                                                 chunks, c);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("AddColumnPartialsKernel");
  return absl::OkStatus();
}

absl::Status AddGroupedColumnPartials(cudaStream_t stream, float* dst, const float* partials,
                                      const int64_t* groups_table, int groups, int64_t c) {
  TY_REQUIRE(dst != nullptr && partials != nullptr && groups_table != nullptr);
  TY_REQUIRE(groups >= 1 && groups <= 65535 && c >= 1);
  const dim3 grid(BlocksFor(c, kColumns), static_cast<unsigned int>(groups));
  AddGroupedColumnPartialsKernel<<<grid, kColumns * kRuns, 0, stream>>>(dst, partials, groups_table,
                                                                        c);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("AddGroupedColumnPartialsKernel");
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
