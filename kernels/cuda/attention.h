// Causal attention on the GPU, FlashAttention-2 style: one pass over key/value tiles with an
// online softmax, tiles in shared memory, nothing of size t × t in global memory; the backward
// recomputes probabilities from the saved log-sum-exp. Grouped-query attention: query head h
// reads key/value head h / (heads / kv_heads). Layout matches kernels/cpu/attention.h: packed
// qkv [b, t, (heads + 2·kv_heads)·d] (queries, then keys, then values), out [b, t, heads·d],
// lse [b, heads, t] fp32, softmax scale 1/sqrt(d). bf16 storage runs on tensor cores with fp32
// accumulation; fp32 storage runs an fp32 path (the precise reference on the device). The
// kernels are those of attention_block.h: this is the causal block of the qkv against itself.
#ifndef TRAINYARD_KERNELS_CUDA_ATTENTION_H_
#define TRAINYARD_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace trainyard::kernels::cuda {

struct AttentionDims {
  int64_t b, t, heads, kv_heads, d;
};

// Supported head dims: 16, 32, 64, 128 (others: INVALID_ARGUMENT naming the head dim).
// heads must be a multiple of kv_heads, and b and heads at most 65535. The tensors qkv, out,
// dout and dqkv start 16-byte aligned (any cudaMalloc'd or 256-byte sub-allocated buffer is).
// Asynchronous on `stream`; a non-OK status means nothing was launched or the launch failed.
[[nodiscard]] absl::Status FlashAttentionForward(cudaStream_t stream, DType dtype, void* out,
                                                 float* lse, const void* qkv,
                                                 const AttentionDims& dims);
// dqkv overwritten (key/value gradients summed over the query heads of their group,
// deterministically: the same inputs give bit-identical gradients). `scratch` holds
// FlashAttentionBackwardScratchBytes(dims, dtype) bytes (16-byte aligned); it is overwritten and
// may be reused once the stream has passed this call.
[[nodiscard]] absl::Status FlashAttentionBackward(cudaStream_t stream, DType dtype, void* dqkv,
                                                  const void* dout, const void* qkv,
                                                  const void* out, const float* lse,
                                                  const AttentionDims& dims, void* scratch,
                                                  size_t scratch_bytes);
// b·heads·t fp32 values (rowsum(dout ∘ out) per query row); dQ is accumulated on chip, so the
// scratch does not grow with the head dim or the storage type.
size_t FlashAttentionBackwardScratchBytes(const AttentionDims& dims, DType dtype);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_ATTENTION_H_
