"""The mixture-of-experts layer of the PyTorch oracle (used by torch_model.py; see README.md).

Differentiable parts (router, scores, weights, experts, auxiliary loss) are plain torch ops under
autograd. The discrete parts (top-k selection and capacity) are explicit Python loops so that
their order and tie-breaking are plain to read; they carry no gradient.
"""

import collections
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# What an MoE layer reports besides its output, for one forward pass:
#   layer     the block index;
#   counts    LongTensor [E]: assignments that selected each expert, counted before capacity drops;
#   dropped   int: assignments dropped by the capacity limit;
#   aux_loss  scalar tensor: this layer's L_aux (zero under balance "bias") plus its router z-loss
#             (zero unless z_loss_coeff), differentiable.
Routing = collections.namedtuple("Routing", "layer counts dropped aux_loss")


def select_experts(selection, k, groups=1, kept_groups=1, group_score="top2_sum"):
    """Indices [N, k] of each row's k largest entries of `selection` [N, E], largest first; equal
    values go to the lower expert index. With kept_groups < groups (group-limited routing) the
    experts form `groups` equal groups in index order, each scored by the sum of its two largest
    entries (group_score "top2_sum", DeepSeek-V3's) or by its largest ("max", DeepSeek-V2's), and
    only the kept_groups best groups (ties to the lower group) compete. No gradient."""
    picks = []
    for row in selection.tolist():
        eligible = range(len(row))
        if kept_groups < groups:
            size = len(row) // groups
            members = [row[g * size:(g + 1) * size] for g in range(groups)]
            best_of = 1 if group_score == "max" else 2
            score = [sum(sorted(m, reverse=True)[:best_of]) for m in members]
            best = sorted(range(groups), key=lambda g: (-score[g], g))[:kept_groups]
            eligible = [e for e in eligible if e // size in best]
        order = sorted(eligible, key=lambda e: (-row[e], e))
        picks.append(order[:k])
    return torch.tensor(picks, dtype=torch.long).reshape(len(picks), k)


def expert_capacity(capacity_factor, tokens, top_k, experts):
    """ceil(capacity_factor * tokens * top_k / experts) in float64, or None when dropless (0)."""
    if capacity_factor == 0:
        return None
    return math.ceil(capacity_factor * tokens * top_k / experts)


def apply_capacity(picks, experts, capacity):
    """(keep [N, K] bool, dropped count) for the assignments `picks` [N, K].

    Assignments are taken in token order and, within a token, in pick order; one is kept iff its
    expert has kept fewer than `capacity` before it. capacity None keeps everything."""
    keep = torch.ones(picks.shape, dtype=torch.bool)
    if capacity is None:
        return keep, 0
    taken = [0] * experts
    dropped = 0
    for t, row in enumerate(picks.tolist()):
        for j, e in enumerate(row):
            if taken[e] < capacity:
                taken[e] += 1
            else:
                keep[t, j] = False
                dropped += 1
    return keep, dropped


class Experts(nn.Module):
    """E MLPs of the family's shape with hidden size F, stored in the contract's batched layout:
    fc_w [E*Fo, C] (Fo = F, or 2F for llama: expert e's gate rows then its up rows), fc_b [E*F]
    (gpt2), proj_w [E, C, F], proj_b [E, C] (gpt2). Default init as nn.Linear's
    (uniform +-1/sqrt(fan_in)); init_parameters in torch_model replaces it."""

    def __init__(self, family, width, experts, ffn):
        super().__init__()
        self.gated = family == "llama"
        self.ffn = ffn
        self.fc_rows = 2 * ffn if self.gated else ffn
        bias = not self.gated
        self.fc_w = nn.Parameter(torch.empty(experts * self.fc_rows, width))
        self.proj_w = nn.Parameter(torch.empty(experts, width, ffn))
        self.fc_b = nn.Parameter(torch.empty(experts * ffn)) if bias else None
        self.proj_b = nn.Parameter(torch.empty(experts, width)) if bias else None
        for p, fan_in in ((self.fc_w, width), (self.fc_b, width), (self.proj_w, ffn),
                          (self.proj_b, ffn)):
            if p is not None:
                bound = 1.0 / math.sqrt(fan_in)
                nn.init.uniform_(p, -bound, bound)

    def forward(self, e, x):
        """Expert e applied to rows x [N, C]."""
        f, rows = self.ffn, self.fc_rows
        fc_b = None if self.fc_b is None else self.fc_b[e * f:(e + 1) * f]
        hidden = F.linear(x, self.fc_w[e * rows:(e + 1) * rows], fc_b)
        if self.gated:
            act = F.silu(hidden[..., :f]) * hidden[..., f:]
        else:
            act = F.gelu(hidden, approximate="tanh")
        return F.linear(act, self.proj_w[e], None if self.proj_b is None else self.proj_b[e])


class MoeLayer(nn.Module):
    """Replaces a block's MLP: y = sum_k w_k * expert_{e_k}(x) + shared(x), routed per token;
    with shared_gate the shared term is sigmoid(x . g) * shared(x) (Qwen2-MoE's shared_expert_gate).

    `moe` is the normalised cfg["moe"]; `make_mlp(hidden)` builds the family's dense MLP (used for
    the shared experts). The selection bias (balance "bias") is a buffer: in the parameter
    contract, but neither trained nor decayed; update_selection_bias moves it."""

    def __init__(self, family, width, moe, layer, make_mlp):
        super().__init__()
        self.layer = layer
        self.experts_n = moe["experts"]
        self.top_k = moe["top_k"]
        self.score = moe["score"]
        self.normalize_top_k = moe["normalize_top_k"]
        self.routed_scale = moe.get("routed_scale", 1.0)
        self.groups = moe.get("groups", 1)
        self.kept_groups = moe.get("group_top_k", 0) or self.groups
        self.group_score = moe.get("group_score", "top2_sum")
        self.balance = moe["balance"]
        self.aux_loss_coeff = moe["aux_loss_coeff"]
        self.bias_update_rate = moe["bias_update_rate"]
        self.z_loss_coeff = moe.get("z_loss_coeff", 0.0)
        self.capacity_factor = moe["capacity_factor"]
        self.router = nn.Linear(width, self.experts_n, bias=False)
        if self.balance == "bias":
            self.register_buffer("selection_bias", torch.zeros(self.experts_n))
        else:
            self.selection_bias = None
        self.experts = Experts(family, width, self.experts_n, moe["ffn"])
        shared = moe["shared_experts"] * moe["ffn"]
        self.shared = make_mlp(shared) if shared > 0 else None
        self.shared_gate = nn.Linear(width, 1, bias=False) if moe["shared_gate"] else None

    def scores(self, logits):
        if self.score == "softmax":
            return torch.softmax(logits, dim=-1)
        return torch.sigmoid(logits)

    def forward(self, x):
        """x [..., C] -> (y [..., C], Routing)."""
        rows = x.reshape(-1, x.shape[-1])
        n, e_count, k = rows.shape[0], self.experts_n, self.top_k
        logits = self.router(rows)  # [N, E]
        scores = self.scores(logits)
        selection = scores.detach()
        if self.selection_bias is not None:
            selection = selection + self.selection_bias
        picks = select_experts(selection, k, self.groups, self.kept_groups,
                               self.group_score)  # [N, K]
        weights = scores.gather(1, picks)
        if self.normalize_top_k:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights * self.routed_scale
        capacity = expert_capacity(self.capacity_factor, n, k, e_count)
        keep, dropped = apply_capacity(picks, e_count, capacity)
        # gate[t, e]: the weight token t gives expert e (zero when not picked or dropped).
        gate = torch.zeros_like(scores).scatter(1, picks, weights * keep.to(weights.dtype))
        used = torch.zeros(e_count, dtype=torch.bool)
        used[picks[keep]] = True
        out = torch.zeros_like(rows)
        for e in range(e_count):
            if used[e]:
                out = out + gate[:, e:e + 1] * self.experts(e, rows)
        if self.shared is not None:
            shared = self.shared(rows)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(rows)) * shared
            out = out + shared
        counts = torch.bincount(picks.reshape(-1), minlength=e_count)
        routing = Routing(self.layer, counts, dropped,
                          self.aux_loss(scores, counts) + self.z_loss(logits))
        return out.reshape(x.shape), routing

    def z_loss(self, logits):
        """ST-MoE's router z-loss: z_loss_coeff * mean over tokens of logsumexp(logits)^2."""
        return self.z_loss_coeff * (torch.logsumexp(logits, dim=-1) ** 2).mean()

    def aux_loss(self, scores, counts):
        """aux_loss_coeff * E * sum_i f_i * P_i; f_i = counts_i / (N*K) (a constant), P_i = mean
        over tokens of the scores (sigmoid scores normalised over all E first). Zero unless
        balance is "aux_loss"."""
        if self.balance != "aux_loss":
            return scores.new_zeros(())
        n = scores.shape[0]
        share = counts.to(scores.dtype) / (n * self.top_k)
        q = scores if self.score == "softmax" else scores / scores.sum(dim=-1, keepdim=True)
        return self.aux_loss_coeff * self.experts_n * (share * q.mean(dim=0)).sum()

    @torch.no_grad()
    def update_selection_bias(self, counts):
        """The auxiliary-loss-free rule, after an optimizer step whose batch gave `counts`:
        bias_i += bias_update_rate * sign(mean(load) - load_i). No-op without a selection bias."""
        if self.selection_bias is None:
            return
        load = counts.to(self.selection_bias.dtype)
        self.selection_bias.add_(self.bias_update_rate * torch.sign(load.mean() - load))
