// Mixture-of-experts data movement on the CPU: tokens to their experts' rows and back, and the
// router's fp32 linear layer's backward. Deterministic: every output row is one thread's, its
// terms added in a fixed order.
#ifndef TRAINYARD_KERNELS_CPU_MOE_H_
#define TRAINYARD_KERNELS_CPU_MOE_H_

#include <cstdint>

#include "kernels/glu.h"

namespace trainyard::kernels::cpu {

// The routed experts' MLPs as one grouped pass: expert j on rows [offsets[j], offsets[j + 1]) of
// every row-major operand, its weights j strides into each array (fc [fc_out, width] with fc_out =
// ffn, or 2·ffn gated; proj [width, ffn]; biases fc_out and width; a null bias is none). Work is
// split into tasks of one expert's row block (forward, input gradients) or one expert's block of
// weight-gradient rows, run on the threads one task at a time with single-threaded GEMMs: for the
// small GEMMs that routing leaves each expert, one parallel region instead of one threaded GEMM
// per expert and layer. A task's result does not depend on which thread runs it.
struct ExpertMlpShape {
  const int64_t* offsets;  // experts + 1 row offsets
  int64_t experts, width, ffn;
  bool gated;                     // a gated unit over fc's [gate, up] halves; else GELU
  GluGate gate = GluGate::kSilu;  // the gated unit's: SwiGLU or GeGLU
};
struct ExpertMlpWeights {
  const float *fc_w, *fc_b, *proj_w, *proj_b;
};
struct ExpertMlpGrads {
  float *fc_w, *fc_b, *proj_w, *proj_b;  // accumulated; a null pointer is skipped
};

// hidden = in · fc_wᵀ + fc_b, act = gelu(hidden) (or the gated unit), out = act · proj_wᵀ + proj_b.
void ExpertMlpForward(const ExpertMlpShape& s, const ExpertMlpWeights& w, const float* in,
                      float* hidden, float* act, float* out);

// The backward of ExpertMlpForward: weight gradients accumulated, din overwritten; dact and
// dhidden are scratch of act's and hidden's size.
void ExpertMlpBackward(const ExpertMlpShape& s, const ExpertMlpWeights& w, const ExpertMlpGrads& g,
                       const float* dout, const float* in, const float* hidden, const float* act,
                       float* dact, float* dhidden, float* din);

// out row r = scale[r] · inp row rows[r], `count` rows of `cols` (rows null: row r; scale null:
// 1).
void GatherRows(float* out, const float* inp, const int32_t* rows, const float* scale,
                int64_t count, int64_t cols);

// out row t (overwritten, or accumulated) = Σ_j weights[t·k + j] · inp row slots[t·k + j] for
// j < k in order, skipping slots −1 (weights null: 1).
void CombineRows(float* out, const float* inp, const int32_t* slots, const float* weights,
                 int64_t rows, int64_t k, int64_t cols, bool accumulate);

// out[r] = ⟨a row a_rows[r], b row r⟩ for r < count.
void RowDots(float* out, const float* a, const int32_t* a_rows, const float* b, int64_t count,
             int64_t cols);

// The shared experts' gate (config::MoeConfig::shared_gate): gate[r] = sigmoid(logits[r]) and
// x row r ×= gate[r], `rows` rows of `cols` (gate may be logits).
void SigmoidGateRows(float* gate, const float* logits, float* x, int64_t rows, int64_t cols);

// Its backward, from the gated MLP's hidden activation `act` and its gradient `dact` through the
// gated output (each row r of it gate[r] times the ungated one's): the gate logits' gradient
// dlogits[r] = (1 − gate[r]) · ⟨act row r, dact row r⟩, which is gate[r]·(1 − gate[r]) times
// ⟨∂loss/∂(gated output) row r, ungated output row r⟩ for an MLP without an output bias.
void SigmoidGateBackward(float* dlogits, const float* gate, const float* act, const float* dact,
                         int64_t rows, int64_t cols);

// The backward of out = inp · weightᵀ with both gradients accumulated: dinp[m, k] += dout ·
// weight, dweight[n, k] += doutᵀ · inp (either skipped when null).
void LinearBackwardAccumulate(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, int64_t m, int64_t n, int64_t k);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_MOE_H_
