// Blocks of attention for context parallelism (ring attention) on the GPU: the queries of one
// sequence chunk against the keys and values of one chunk, each block's result a partial output
// with its log-sum-exp, merged by AttentionMerge; the backward from the merged output and
// log-sum-exp. Semantics match kernels/cpu/attention.h (AttentionBlockForward, AttentionMerge,
// AttentionBlockBackward); storage is fp32 or bf16 (dtype), arithmetic and accumulation fp32,
// log-sum-exps fp32.
//
// These are the flash-attention kernels of attention.h (attention_fwd.cu, attention_bwd.cu):
// FlashAttentionForward/Backward are the causal block of a packed qkv against itself, so both
// share one implementation (tensor cores for bf16, an fp32 path for fp32, deterministic sums).
#ifndef TRAINYARD_KERNELS_CUDA_ATTENTION_BLOCK_H_
#define TRAINYARD_KERNELS_CUDA_ATTENTION_BLOCK_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace trainyard::kernels::cuda {

// Row i of batch entry bi of the queries starts at q + (bi·q_len + i)·q_stride (query head h at
// h·d); keys and values likewise with kv_len and kv_stride (kv head g at g·d). Query head h reads
// kv head h / (heads / kv_heads). Query row i is at position i + offset counted from key row 0.
// Causal: key j is visible to query i iff j <= i (a chunk against itself: q_len == kv_len,
// offset 0); otherwise every key is visible. A sliding window W > 0 also hides keys
// j <= i + offset − W; a query row that sees no key gets lse −∞ and a zero output row.
struct AttentionBlockDims {
  int64_t b, q_len, kv_len, heads, kv_heads, d;
  int64_t q_stride, kv_stride;  // elements
  bool causal;
  int64_t offset = 0;
  int64_t window = 0;
  float scale = 0.0f;    // as AttentionDims'
  float softcap = 0.0f;  // as AttentionDims' (0: none)
  // Documents (device memory, [b, q_len]; null: none): each query row's document's first
  // position and key_position that of key row 0, both from the sequence's start; query row i
  // sees no key j < doc_start[i] − key_position (kernels/cpu/attention.h's BlockDims).
  const int32_t* doc_start = nullptr;
  int64_t key_position = 0;
};

// Every launcher returns INVALID_ARGUMENT, launching nothing, for: a head dim other than 16, 32,
// 64, 128 (the message names it); a size below 1; heads not a multiple of kv_heads; b or heads
// above 65535; a causal block with q_len != kv_len or an offset; a negative offset or window;
// q_stride < heads·d or kv_stride < kv_heads·d; a stride that is not a multiple of 16 bytes; a null
// or not 16-byte aligned tensor (lse and part_lse need only fp32 alignment). Asynchronous on
// `stream`; a non-OK status means nothing was launched or the launch failed.

// out (overwritten): [b, q_len, heads·d] rows contiguous; lse (overwritten): [b, heads, q_len],
// natural log. Online softmax over key tiles, scale dims.scale (0: 1/sqrt(d)).
[[nodiscard]] absl::Status AttentionBlockForward(cudaStream_t stream, DType dtype, void* out,
                                                 float* lse, const void* q, const void* k,
                                                 const void* v, const AttentionBlockDims& dims);

// (out, lse) ← the attention over the union of both key sets: lse' = log(e^lse + e^part_lse),
// out = out·e^(lse − lse') + part·e^(part_lse − lse'). A row whose lse is −∞ takes part's row
// (copied, whatever out held); one whose part_lse is −∞ is left as it is. out and part:
// [b, q_len, heads·d]; lse and part_lse: [b, heads, q_len]. Any d >= 1; no alignment needed.
[[nodiscard]] absl::Status AttentionMerge(cudaStream_t stream, DType dtype, void* out, float* lse,
                                          const void* part, const float* part_lse, int64_t b,
                                          int64_t q_len, int64_t heads, int64_t d);

// The block's share of the backward from the merged out and lse of the whole attention
// (P = exp(S − lse), dS = P ∘ (dP − rowsum(dout ∘ out))·scale): dq += (row stride q_stride),
// dk += and dv += (row stride kv_stride); each sum is formed in fp32 and added to the existing
// value once (one rounding for bf16). dout and out: [b, q_len, heads·d]. Deterministic: the same
// inputs give bit-identical results (no atomics; every sum has one fixed order). `scratch` holds
// AttentionBlockBackwardScratchBytes(dims) bytes (16-byte aligned); it is overwritten and may be
// reused once the stream has passed this call. dq may share a buffer with dk and dv (disjoint
// columns, as in a packed qkv gradient) but no gradient may overlap an input.
[[nodiscard]] absl::Status AttentionBlockBackward(cudaStream_t stream, DType dtype, void* dq,
                                                  void* dk, void* dv, const void* dout,
                                                  const void* q, const void* k, const void* v,
                                                  const void* out, const float* lse,
                                                  const AttentionBlockDims& dims, void* scratch,
                                                  size_t scratch_bytes);
// b·heads·q_len fp32 values (rowsum(dout ∘ out) per query row).
size_t AttentionBlockBackwardScratchBytes(const AttentionBlockDims& dims);

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_ATTENTION_BLOCK_H_
