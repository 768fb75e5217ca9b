// Causal multi-head attention with grouped-query heads, over a packed qkv activation
// [b, t, (heads + kv_heads) · d + kv_heads · dv] (queries, then keys, then values; query and key
// heads of d, value heads of dv: d unless value_dim is set, as multi-head latent attention's
// are). Query head h reads key/value head h / (heads / kv_heads). With a sliding window of W
// positions (window > 0) query i sees keys i − W < j <= i: its own position and the W − 1 before
// it (Mistral's and transformers' convention); 0 sees every earlier key.
//
// Nothing of size t × t is stored: the forward saves the log-sum-exp of each query row, and the
// backward recomputes the probabilities from it (the FlashAttention recipe, on the CPU).
//
// Scores are ⟨q, k⟩ times `scale` (1/√d unless set); a soft cap C > 0 turns each into
// C·tanh(s / C) before the mask and the softmax (Gemma 2's), and the backward multiplies its
// gradient by 1 − tanh², recomputed from the capped score.
#ifndef TRAINYARD_KERNELS_CPU_ATTENTION_H_
#define TRAINYARD_KERNELS_CPU_ATTENTION_H_

#include <cstdint>

namespace trainyard::kernels::cpu {

// How query-key products become scores: the factor (0 for 1/√d) and the soft cap (0 for none).
struct ScoreRule {
  float scale = 0.0f;
  float softcap = 0.0f;
};

// out: [b, t, heads · dv]; lse: [b, heads, t]. doc_start (null: none), [b, t]: the position of
// each row's document's first token (non-decreasing along a sequence, each at most its row's
// position); query i also sees no key j < doc_start[i] (block-causal attention over documents).
void AttentionForward(float* out, float* lse, const float* qkv, int64_t b, int64_t t, int64_t heads,
                      int64_t kv_heads, int64_t d, int64_t window = 0, ScoreRule rule = {},
                      const int32_t* doc_start = nullptr, int64_t value_dim = 0);

// dqkv (overwritten): shaped as qkv, from dout [b, t, heads · dv].
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, int64_t b, int64_t t, int64_t heads, int64_t kv_heads,
                       int64_t d, int64_t window = 0, ScoreRule rule = {},
                       const int32_t* doc_start = nullptr, int64_t value_dim = 0);

// Blocks of attention for context parallelism: the queries of one sequence chunk against the keys
// and values of one chunk, each block's result a partial output with its log-sum-exp, merged by
// AttentionMerge. Row i of batch entry bi starts at q + (bi·q_len + i)·q_stride (query head h at
// h·d); keys and values likewise with kv_len and kv_stride (key head g at g·d, value head g at
// g·dv, dv = value_dim or d). Query row i is at
// position i + offset counted from key row 0. A causal block sees keys j <= i + offset (a chunk
// against itself: offset 0, q_len == kv_len); another sees every key up to kv_len. A window
// W > 0 also hides keys j <= i + offset − W; documents (doc_start, [b, q_len], not null) hide
// keys j < doc_start[row] − key_position, where doc_start is the position of the row's
// document's first token and key_position that of key row 0 (both from the sequence's start;
// doc_start non-decreasing along a sequence). A row that sees no key gets lse −∞ and a zero
// output (AttentionMerge then ignores it). kv_len >= 1.
struct BlockDims {
  int64_t b, q_len, kv_len, heads, kv_heads, d;
  int64_t q_stride, kv_stride;
  bool causal;
  int64_t offset = 0;
  int64_t window = 0;
  ScoreRule rule;
  const int32_t* doc_start = nullptr;
  int64_t key_position = 0;
  int64_t value_dim = 0;  // dv; 0: d
};

// out (overwritten): [b, q_len, heads·dv]; lse: [b, heads, q_len]. Same arithmetic as
// AttentionForward, so a causal block over a whole sequence gives its result.
void AttentionBlockForward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const BlockDims& s);

// (out, lse) ← the attention over the union of both key sets, from the two partial results:
// lse' = log(e^lse + e^part_lse), out = out·e^(lse − lse') + part·e^(part_lse − lse'). A row whose
// lse is −∞ (no keys yet) takes part's row; one whose part_lse is −∞ is left as it is.
// out and part: [b, q_len, heads·d] (d: the value heads'); lse and part_lse: [b, heads, q_len].
void AttentionMerge(float* out, float* lse, const float* part, const float* part_lse, int64_t b,
                    int64_t q_len, int64_t heads, int64_t d);

// The block's share of the backward, from the merged out and lse of the whole attention:
// dq += (row stride q_stride), dk += and dv += (row stride kv_stride). dout and out:
// [b, q_len, heads·dv]. Deterministic: one task per (batch entry, kv head) owns every element it
// adds to.
void AttentionBlockBackward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            const BlockDims& s);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_ATTENTION_H_
