// Deterministic column reductions over a [rows, c] matrix, shared by the kernels that produce
// parameter gradients (norm weights and biases, linear biases). Atomics would make the sum depend
// on scheduling; instead the rows are cut into a fixed number of chunks (a function of `rows`
// only), a first kernel writes one partial sum per (chunk, column) into scratch, and
// AddColumnPartials adds the chunks' partials in a fixed order. The same shape therefore gives the
// same bits on every run.
#ifndef TRAINYARD_KERNELS_CUDA_COLUMN_PARTIALS_H_
#define TRAINYARD_KERNELS_CUDA_COLUMN_PARTIALS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace trainyard::kernels::cuda {

struct RowChunks {
  int64_t count = 1;           // number of chunks, at least 1
  int64_t rows_per_chunk = 0;  // chunk k covers rows [k·rows_per_chunk, (k+1)·rows_per_chunk)
};

// At least 32 rows per chunk (so each partial sum amortises its store) and at most 256 chunks
// (so that scratch stays a small multiple of c).
RowChunks ChunkRows(int64_t rows);

// dst[j] += Σ_{k < chunks} partials[k·c + j]. The order of the additions is fixed by `chunks`
// alone: eight runs of consecutive chunks, each summed in increasing k, then the runs' sums in
// increasing order. Device pointers; enqueued on `stream`.
[[nodiscard]] absl::Status AddColumnPartials(cudaStream_t stream, float* dst, const float* partials,
                                             int64_t chunks, int64_t c);

// The same for two [chunks, c] matrices at once (a weight's and a bias's partials), in one
// launch; dst1 and partials1 may both be null.
[[nodiscard]] absl::Status AddColumnPartialsPair(cudaStream_t stream, float* dst0,
                                                 const float* partials0, float* dst1,
                                                 const float* partials1, int64_t chunks, int64_t c);

// The same for groups of chunks, each into its own row of dst [groups, c]: group g's partials
// are the rows [groups_table[2g], + groups_table[2g + 1]) of `partials` (device memory; a group
// of no chunks adds nothing), each group summed as AddColumnPartials sums its chunks alone.
[[nodiscard]] absl::Status AddGroupedColumnPartials(cudaStream_t stream, float* dst,
                                                    const float* partials,
                                                    const int64_t* groups_table, int groups,
                                                    int64_t c);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_COLUMN_PARTIALS_H_
