// Causal multi-head attention with grouped-query heads, over a packed qkv activation
// [b, t, (heads + 2·kv_heads) · d] (queries, then keys, then values; head h at offset h·d of its
// block). Query head h reads key/value head h / (heads / kv_heads).
//
// Nothing of size t × t is stored: the forward saves the log-sum-exp of each query row, and the
// backward recomputes the probabilities from it (the FlashAttention recipe, on the CPU).
#ifndef TRAINYARD_KERNELS_CPU_ATTENTION_H_
#define TRAINYARD_KERNELS_CPU_ATTENTION_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

// out: [b, t, heads · d]; lse: [b, heads, t].
void AttentionForward(float* out, float* lse, const float* qkv, int64_t b, int64_t t, int64_t heads,
                      int64_t kv_heads, int64_t d);

// dqkv (overwritten): [b, t, (heads + 2·kv_heads) · d], from dout [b, t, heads · d].
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, int64_t b, int64_t t, int64_t heads, int64_t kv_heads,
                       int64_t d);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_ATTENTION_H_
