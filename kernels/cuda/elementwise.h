// Small memory-bound operations on the GPU: adds, bias, fill, scale, type conversion, and a
// deterministic sum of squares. Storage `dtype` where a tensor is an activation; fp32 where it is
// a parameter or gradient.
#ifndef TRAINYARD_KERNELS_CUDA_ELEMENTWISE_H_
#define TRAINYARD_KERNELS_CUDA_ELEMENTWISE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace trainyard::kernels::cuda {

// out = a + b (out may alias a or b).
[[nodiscard]] absl::Status Add(cudaStream_t stream, DType dtype, void* out, const void* a,
                               const void* b, int64_t n);
// out[m, n] += bias[n] (bias fp32).
[[nodiscard]] absl::Status AddBias(cudaStream_t stream, DType dtype, void* out, const float* bias,
                                   int64_t m, int64_t n);
// out[r, :] += bias[g, :] for the rows r of group g, [offsets[g], offsets[g + 1]) (offsets in
// device memory, groups + 1 of them from 0 to m; a group may be empty): a mixture of experts'
// biases over its experts' rows (bias fp32, [groups, n]).
[[nodiscard]] absl::Status AddGroupedBias(cudaStream_t stream, DType dtype, void* out,
                                          const float* bias, const int64_t* offsets, int groups,
                                          int64_t m, int64_t n);
[[nodiscard]] absl::Status Fill(cudaStream_t stream, DType dtype, void* out, float value,
                                int64_t n);
// x *= factor (fp32).
[[nodiscard]] absl::Status Scale(cudaStream_t stream, float* x, int64_t n, float factor);
// out = factor · in in storage `dtype`, rounded once (out may alias in): an activation scaled by
// one of Granite's multipliers.
[[nodiscard]] absl::Status Scale(cudaStream_t stream, DType dtype, void* out, const void* in,
                                 int64_t n, float factor);
// dst (dst_type) = src (src_type), rounding to nearest even when narrowing to bf16. dst and src
// must not overlap, except as the same buffer of the same type (nothing to do).
[[nodiscard]] absl::Status Convert(cudaStream_t stream, DType dst_type, void* dst, DType src_type,
                                   const void* src, int64_t n);
// dbias[n] += Σ over rows of dout[m, n] (deterministic, fp32 accumulation); scratch holds
// ColumnSumScratchFloats(m, n) floats.
[[nodiscard]] absl::Status AccumulateColumnSums(cudaStream_t stream, DType dtype, float* dbias,
                                                const void* dout, int64_t m, int64_t n,
                                                float* scratch);
int64_t ColumnSumScratchFloats(int64_t m, int64_t n);
// The same for consecutive row ranges of dout, each into its own row of dbias [groups, n]:
// dbias[g, :] += Σ dout[r, :] over r in [offsets[g], offsets[g + 1]) (a mixture of experts' bias
// gradients, expert by expert; a range may be empty), in two launches, each range with the bits
// AccumulateColumnSums gives it alone. `table` is GroupedColumnSumTable(offsets, groups) in
// device memory (uploaded by the caller in stream order); scratch holds
// GroupedColumnSumScratchFloats(offsets, groups, n) floats.
[[nodiscard]] absl::Status AccumulateGroupedColumnSums(cudaStream_t stream, DType dtype,
                                                       float* dbias, const void* dout,
                                                       const int64_t* offsets, int groups,
                                                       int64_t n, const int64_t* table,
                                                       float* scratch);
// The host side of that table: each group's first chunk and chunk count, then each chunk's first
// and end row (the chunking AccumulateColumnSums makes of each range alone).
std::vector<int64_t> GroupedColumnSumTable(const int64_t* offsets, int groups);
int64_t GroupedColumnSumScratchFloats(const int64_t* offsets, int groups, int64_t n);
// *result (device, fp64) = Σ x² in a fixed order (the same bits every run); scratch holds
// SumOfSquaresScratchDoubles(n) doubles.
[[nodiscard]] absl::Status SumOfSquares(cudaStream_t stream, const float* x, int64_t n,
                                        double* result, double* scratch);
int64_t SumOfSquaresScratchDoubles(int64_t n);

// results[i] (device, fp64) = Σ x² over ranges[i], each with the bits SumOfSquares gives that
// range alone, in two launches for up to 128 ranges (a model's gradients are hundreds of small
// tensors: one pair of launches per tensor left the device mostly waiting on them). Ranges may
// be empty (their result is 0); scratch holds SumOfSquaresScratchDoubles(ranges) doubles.
struct SquaresRange {
  const float* x;
  int64_t n;
};
[[nodiscard]] absl::Status SumOfSquaresMulti(cudaStream_t stream,
                                             const std::vector<SquaresRange>& ranges,
                                             double* results, double* scratch);
int64_t SumOfSquaresScratchDoubles(const std::vector<SquaresRange>& ranges);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_ELEMENTWISE_H_
