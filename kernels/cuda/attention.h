// Causal attention on the GPU, FlashAttention-2 style: one pass over key/value tiles with an
// online softmax, tiles in shared memory, nothing of size t × t in global memory; the backward
// recomputes probabilities from the saved log-sum-exp. Grouped-query attention: query head h
// reads key/value head h / (heads / kv_heads). Layout matches kernels/cpu/attention.h: packed
// qkv [b, t, (heads + 2·kv_heads)·d] (queries, then keys, then values), out [b, t, heads·d],
// lse [b, heads, t] fp32, softmax scale 1/sqrt(d) or dims.scale. bf16 storage runs on tensor cores
// with fp32 accumulation; fp32 storage runs an fp32 path (the precise reference on the device). The
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
  // A sliding window of this many positions: query i sees keys i − window < j <= i (0: every
  // earlier key).
  int64_t window = 0;
  // Scores are ⟨q, k⟩·scale (0: 1/√d); a soft cap C > 0 (Gemma 2's) turns each score z into
  // C·tanh(z / C) before the softmax, and the backward takes the scores' gradient back through
  // it (1 − tanh², recomputed), as kernels/cpu/attention.h does. Negative or non-finite scale or
  // softcap: INVALID_ARGUMENT.
  float scale = 0.0f;
  float softcap = 0.0f;
  // Documents (device memory, [b, t]; null: none): the position of each row's document's first
  // token, non-decreasing along a sequence and at most the row's own; query i also sees no key
  // j < doc_start[i], as kernels/cpu/attention.h's.
  const int32_t* doc_start = nullptr;
};

// How the bf16 backward sums the query gradient over key tiles.
enum class AttentionDqSum {
  // A pass of its own per query tile with every sum in one fixed order: a backward run twice
  // gives bit-identical gradients. The default.
  kDeterministic,
  // FlashAttention-2's way: the key/value pass adds each tile pair's share into an fp32 buffer
  // with atomics, sparing the dQ pass its recomputation of P and dP (five tile products per pair
  // of query and key tiles instead of seven) for b·t·heads·d more fp32 of scratch. The order of
  // the sums, and so the last bits of dq, depends on the order blocks run in. fp32 storage is
  // deterministic either way.
  kAtomic,
};

// Supported head dims: 16, 32, 64, 128 (others: INVALID_ARGUMENT naming the head dim).
// heads must be a multiple of kv_heads, and b and heads at most 65535. The tensors qkv, out,
// dout and dqkv start 16-byte aligned (any cudaMalloc'd or 256-byte sub-allocated buffer is).
// Asynchronous on `stream`; a non-OK status means nothing was launched or the launch failed.
// `warp_rows`: the query rows each warp of the bf16 forward owns, 32 (two 16-row groups sharing
// every key and value fragment a warp loads, in 128-row blocks) or 16 (64-row blocks); 0 takes
// the default for the head dim (32 up to d 64, 16 at d 128, where 32 rows do not fit in shared
// memory: INVALID_ARGUMENT). Either gives the same results to rounding; the choice is there so
// that the kernel benchmark can measure both. fp32 storage ignores it; any other value is
// INVALID_ARGUMENT.
[[nodiscard]] absl::Status FlashAttentionForward(cudaStream_t stream, DType dtype, void* out,
                                                 float* lse, const void* qkv,
                                                 const AttentionDims& dims, int warp_rows = 0);
// dqkv overwritten (key/value gradients summed over the query heads of their group in head
// order; dq summed as `dq_sum` says). `scratch` holds FlashAttentionBackwardScratchBytes(dims,
// dtype, dq_sum) bytes (16-byte aligned); it is overwritten and may be reused once the stream has
// passed this call.
[[nodiscard]] absl::Status FlashAttentionBackward(
    cudaStream_t stream, DType dtype, void* dqkv, const void* dout, const void* qkv,
    const void* out, const float* lse, const AttentionDims& dims, void* scratch,
    size_t scratch_bytes, AttentionDqSum dq_sum = AttentionDqSum::kDeterministic);
// b·heads·t fp32 values (rowsum(dout ∘ out) per query row); with atomic dQ sums in bf16, then
// b·t·heads·d fp32 sums (at a 256-byte boundary). A deterministic dQ is accumulated on chip, so
// its scratch does not grow with the head dim.
size_t FlashAttentionBackwardScratchBytes(const AttentionDims& dims, DType dtype,
                                          AttentionDqSum dq_sum = AttentionDqSum::kDeterministic);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_ATTENTION_H_
