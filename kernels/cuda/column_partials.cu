#include <algorithm>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/column_partials.h"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMinRowsPerChunk = 32;
constexpr int64_t kMaxChunks = 256;

__global__ void AddColumnPartialsKernel(float* dst, const float* partials, int64_t chunks,
                                        int64_t c) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  float sum = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) sum += partials[k * c + j];
  dst[j] += sum;
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
  TY_REQUIRE(dst != nullptr && partials != nullptr);
  TY_REQUIRE(chunks >= 1 && c >= 1);
  AddColumnPartialsKernel<<<BlocksFor(c, kThreads), kThreads, 0, stream>>>(dst, partials, chunks,
                                                                           c);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("AddColumnPartialsKernel");
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
