// Token + position embedding on the GPU, forward and a deterministic backward (no atomics: the
// gradient of each vocabulary row sums its positions in position order). A token id of −1 marks
// a token owned by another tensor-parallel rank: its row gets no token embedding and no
// gradient. Semantics match kernels/cpu/embedding.h; tables and gradients fp32, out/dout `dtype`.
#ifndef TRAINYARD_KERNELS_CUDA_EMBEDDING_H_
#define TRAINYARD_KERNELS_CUDA_EMBEDDING_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace trainyard::kernels::cuda {

// out[b·t, c] = scale · wte[token] + wpe[position] (wpe may be null).
[[nodiscard]] absl::Status EmbeddingForward(cudaStream_t stream, DType dtype, void* out,
                                            const int32_t* tokens, const float* wte,
                                            const float* wpe, int64_t b, int64_t t, int64_t c,
                                            float scale);
// dwte[vocab, c] += per-token sums of scale · dout rows; dwpe[t, c] += per-position sums over the
// batch (dwpe may be null). `scratch` holds EmbeddingBackwardScratchBytes(b·t, vocab) bytes, any
// alignment; INVALID_ARGUMENT when scratch_bytes is smaller. Tokens are not visible to the
// host: one outside [0, vocab) gets no token gradient, like −1.
[[nodiscard]] absl::Status EmbeddingBackward(cudaStream_t stream, DType dtype, float* dwte,
                                             float* dwpe, const void* dout, const int32_t* tokens,
                                             int64_t b, int64_t t, int64_t c, int64_t vocab,
                                             float scale, void* scratch, size_t scratch_bytes);
// Depends only on the two counts (and the device's sort configuration); 0 when the arguments
// are out of range or the CUDA runtime cannot answer (no usable device).
size_t EmbeddingBackwardScratchBytes(int64_t tokens, int64_t vocab);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_EMBEDDING_H_
