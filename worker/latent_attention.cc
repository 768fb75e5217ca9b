#include "worker/latent_attention.h"

#include "common/status.h"

namespace trainyard::worker {
namespace {

// The scratch's parts, each [rows, cols] contiguous, in order: the forward uses the first three.
// The gradients at the normed latents and at the shared rotary key follow each other (c_normed,
// rot_sum, q_normed): a tensor-parallel group sums them as one span.
struct Scratch {
  Act *q, *kv, *latent;                 // q's and kv_b's outputs, kv_a's (gradients backward)
  Act *c, *c_normed;                    // the kv latent's gradient before and after its norm
  Act *rot_sum, *rot_part;              // the key heads' rotary gradients, summed and one
  Act *q_normed, *q_latent, *dx_other;  // the query latent's gradients; x's from the other path
  Scratch(Backend& be, const LatentShape& s, Act* base) {
    int64_t at = 0;
    auto take = [&](int64_t cols) {
      Act* p = be.At(base, at);
      at += s.rows * cols;
      return p;
    };
    q = take(s.q_width());
    kv = take(s.kv_width());
    latent = take(s.latent_width());
    c = take(s.kv_rank);
    c_normed = take(s.kv_rank);
    rot_sum = take(s.rope);
    q_normed = take(s.q_rank);
    rot_part = take(s.rope);
    q_latent = take(s.q_rank);
    dx_other = take(s.width);
  }
};

}  // namespace

void LatentForward(Backend& be, const LatentShape& s, const LatentWeights& w, const Act* x,
                   const LatentSaved& saved, Act* scratch, Act* qkv, LatentOutput output) {
  const Scratch t(be, s, scratch);
  const int64_t n = s.rows, d = s.head_dim, row = s.qkv_row();
  if (s.q_rank > 0) {
    be.Linear(saved.q_latent, x, w.q_a, nullptr, n, s.q_rank, s.width);
    be.RmsNorm(saved.q_normed, saved.q_rstd, saved.q_latent, w.q_a_norm, n, s.q_rank, s.eps);
    be.Linear(t.q, saved.q_normed, w.q_b, nullptr, n, s.q_width(), s.q_rank);
  } else {
    be.Linear(t.q, x, w.q, nullptr, n, s.q_width(), s.width);
  }
  be.Linear(t.latent, x, w.kv_a, nullptr, n, s.latent_width(), s.width);
  be.CopyRows(saved.kv_latent, s.kv_rank, t.latent, s.latent_width(), n, s.kv_rank);
  be.RmsNorm(saved.kv_normed, saved.kv_rstd, saved.kv_latent, w.kv_a_norm, n, s.kv_rank, s.eps);
  // The packed row: queries, keys (the shared rotary key, then the head's own part), values.
  be.CopyRows(qkv, row, t.q, s.q_width(), n, s.q_width());
  const int64_t keys = s.q_width(), values = 2 * s.q_width(), per_head = s.nope() + s.value_dim;
  if (output == LatentOutput::kLatentsOnly) {
    be.CopyRows(be.At(qkv, keys), row, be.At(t.latent, s.kv_rank), s.latent_width(), n, s.rope);
    return;
  }
  be.Linear(t.kv, saved.kv_normed, w.kv_b, nullptr, n, s.kv_width(), s.kv_rank);
  for (int64_t h = 0; h < s.heads; ++h) {
    Act* key = be.At(qkv, keys + h * d);
    const Act* head = be.At(t.kv, h * per_head);
    be.CopyRows(key, row, be.At(t.latent, s.kv_rank), s.latent_width(), n, s.rope);
    be.CopyRows(be.At(key, s.rope), row, head, s.kv_width(), n, s.nope());
    be.CopyRows(be.At(qkv, values + h * s.value_dim), row, be.At(head, s.nope()), s.kv_width(), n,
                s.value_dim);
  }
}

absl::Status LatentBackward(Backend& be, const LatentShape& s, const LatentWeights& w,
                            const LatentGrads& grads, const Act* x, const LatentSaved& saved,
                            const Act* dqkv, Act* scratch, Act* dx, const LatentGroup& group) {
  const Scratch t(be, s, scratch);
  const int64_t n = s.rows, d = s.head_dim, row = s.qkv_row();
  const int64_t keys = s.q_width(), values = 2 * s.q_width(), per_head = s.nope() + s.value_dim;
  // Unpack: the queries', each head's key and value parts into kv_b's layout, and the rotary
  // key's gradient summed over the heads that share it.
  be.CopyRows(t.q, s.q_width(), dqkv, row, n, s.q_width());
  for (int64_t h = 0; h < s.heads; ++h) {
    const Act* key = be.At(dqkv, keys + h * d);
    Act* head = be.At(t.kv, h * per_head);
    be.CopyRows(h == 0 ? t.rot_sum : t.rot_part, s.rope, key, row, n, s.rope);
    if (h > 0) be.Add(t.rot_sum, t.rot_sum, t.rot_part, n * s.rope);
    be.CopyRows(head, s.kv_width(), be.At(key, s.rope), row, n, s.nope());
    be.CopyRows(be.At(head, s.nope()), s.kv_width(), be.At(dqkv, values + h * s.value_dim), row, n,
                s.value_dim);
  }
  // The gradients at the normed latents and the rotary key, from this rank's heads: summed over
  // the group, every rank has them whole, and from there on the same gradients for the latents'
  // weights and norms (held whole by every rank) and the input's share through them, which one
  // rank adds to its part of x's gradient.
  be.LinearBackward(t.c_normed, grads.kv_b, nullptr, t.kv, saved.kv_normed, w.kv_b, n, s.kv_width(),
                    s.kv_rank);
  if (s.q_rank > 0) {
    be.LinearBackward(t.q_normed, grads.q_b, nullptr, t.q, saved.q_normed, w.q_b, n, s.q_width(),
                      s.q_rank);
  }
  if (group.sum) TY_RETURN_IF_ERROR(group.sum(t.c_normed, n * (s.kv_rank + s.rope + s.q_rank)));
  // The key/value path: the latent's norm, kv_a.
  be.Fill(t.c, 0.0f, n * s.kv_rank);
  be.RmsNormBackward(t.c, grads.kv_a_norm, t.c_normed, saved.kv_latent, w.kv_a_norm, saved.kv_rstd,
                     n, s.kv_rank);
  be.CopyRows(t.latent, s.latent_width(), t.c, s.kv_rank, n, s.kv_rank);
  be.CopyRows(be.At(t.latent, s.kv_rank), s.latent_width(), t.rot_sum, s.rope, n, s.rope);
  be.LinearBackward(group.first ? t.dx_other : nullptr, grads.kv_a, nullptr, t.latent, x, w.kv_a, n,
                    s.latent_width(), s.width);
  // The query path into dx: through its latent (whole, on one rank), or from this rank's heads.
  if (s.q_rank > 0) {
    be.Fill(t.q_latent, 0.0f, n * s.q_rank);
    be.RmsNormBackward(t.q_latent, grads.q_a_norm, t.q_normed, saved.q_latent, w.q_a_norm,
                       saved.q_rstd, n, s.q_rank);
    be.LinearBackward(group.first ? dx : nullptr, grads.q_a, nullptr, t.q_latent, x, w.q_a, n,
                      s.q_rank, s.width);
    if (!group.first) be.Fill(dx, 0.0f, n * s.width);
  } else {
    be.LinearBackward(dx, grads.q, nullptr, t.q, x, w.q, n, s.q_width(), s.width);
  }
  if (group.first) be.Add(dx, dx, t.dx_other, n * s.width);
  return absl::OkStatus();
}

}  // namespace trainyard::worker
