"""Helpers shared by the oracle's self-tests (selftest.py, moe_selftest.py): random models, the
contract and the forward pass written out independently of torch_model, and a training loop with
the optimizer arithmetic written by hand."""

import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_example_input  # noqa: E402
import torch_model  # noqa: E402


def random_model(cfg, seed=0):
    """float64 model with random parameters (every term of the forward pass non-trivial)."""
    model = torch_model.build_model(cfg).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_contract_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.ndim >= 2:
                p.copy_(0.3 * noise)
            elif name.endswith(".w"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.2 * noise)
    return model


def random_tokens(cfg, batch, seq, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg["vocab"], (batch, seq), generator=gen)


def small_cfg(family, **overrides):
    return make_example_input.example_config(family, **overrides)


def moe_cfg(family, moe_overrides=None, **overrides):
    """small_cfg with an MoE object (make_example_input.example_moe plus `moe_overrides`)."""
    return small_cfg(family, moe=make_example_input.example_moe(**(moe_overrides or {})),
                     **overrides)


CONFIGS = {
    "gpt2_tied": small_cfg("gpt2"),
    "gpt2_untied": small_cfg("gpt2", tied_embeddings=False),
    "llama_gqa": small_cfg("llama"),
    "llama_mqa_tied": small_cfg("llama", kv_heads=1, tied_embeddings=True),
    "llama_mha": small_cfg("llama", kv_heads=4),
    "llama_window": small_cfg("llama", sliding_window=3),  # 3 of the 7 positions
    # MoE: both scores, both balance rules, with and without normalisation, shared experts and
    # capacity, MoE in every block or in the second only.
    "gpt2_moe": moe_cfg("gpt2", {"aux_loss_coeff": 0.1}),
    "gpt2_moe_capacity": moe_cfg("gpt2", {"score": "sigmoid", "normalize_top_k": False,
                                          "shared_experts": 0, "every": 2, "capacity_factor": 1.0,
                                          "aux_loss_coeff": 0.1}, tied_embeddings=False),
    "llama_moe": moe_cfg("llama", {"normalize_top_k": False, "shared_experts": 2,
                                   "capacity_factor": 1.25, "aux_loss_coeff": 0.1}),
    "llama_moe_bias": moe_cfg("llama", {"score": "sigmoid", "balance": "bias", "every": 2,
                                        "experts": 3, "top_k": 1, "ffn": 6}),
}


def params_numpy(model):
    return {n: p.detach().numpy().copy() for n, p in model.named_contract_parameters()}


def _mlp_contract(prefix, family, width, hidden):
    gpt2 = family == "gpt2"
    out = [(prefix + "fc.w", (hidden if gpt2 else 2 * hidden, width))]
    if gpt2:
        out.append((prefix + "fc.b", (hidden,)))
    out.append((prefix + "proj.w", (width, hidden)))
    if gpt2:
        out.append((prefix + "proj.b", (width,)))
    return out


def _moe_contract(prefix, cfg):
    moe, C, gpt2 = cfg["moe"], cfg["width"], cfg["family"] == "gpt2"
    E, F_, S = moe["experts"], moe["ffn"], moe["shared_experts"]
    out = [(prefix + "router.w", (E, C))]
    if moe["balance"] == "bias":
        out.append((prefix + "router.bias", (E,)))
    if S > 0:
        out += _mlp_contract(prefix + "shared.", cfg["family"], C, S * F_)
    out.append((prefix + "experts.fc.w", (E * (F_ if gpt2 else 2 * F_), C)))
    if gpt2:
        out.append((prefix + "experts.fc.b", (E * F_,)))
    out.append((prefix + "experts.proj.w", (E, C, F_)))
    if gpt2:
        out.append((prefix + "experts.proj.b", (E, C)))
    return out


def expected_contract(cfg):
    """[(name, shape)] written out from the contract description."""
    cfg = torch_model.normalize_config(cfg)
    C, H, KV, F_, V = cfg["width"], cfg["heads"], cfg["kv_heads"], cfg["ffn_hidden"], cfg["vocab"]
    D = C // H
    gpt2 = cfg["family"] == "gpt2"
    every = cfg["moe"]["every"] if cfg["moe"]["experts"] > 0 else 0
    out = [("wte", (V, C))]
    if gpt2:
        out.append(("wpe", (cfg["max_seq"], C)))
    for l in range(cfg["layers"]):
        p = "h.%d." % l
        if gpt2:
            out += [(p + "ln1.w", (C,)), (p + "ln1.b", (C,)),
                    (p + "attn.qkv.w", ((H + 2 * KV) * D, C)), (p + "attn.qkv.b", ((H + 2 * KV) * D,)),
                    (p + "attn.proj.w", (C, H * D)), (p + "attn.proj.b", (C,)),
                    (p + "ln2.w", (C,)), (p + "ln2.b", (C,))]
        else:
            out += [(p + "ln1.w", (C,)), (p + "attn.qkv.w", ((H + 2 * KV) * D, C)),
                    (p + "attn.proj.w", (C, H * D)), (p + "ln2.w", (C,))]
        if every and (l + 1) % every == 0:
            out += _moe_contract(p + "moe.", cfg)
        else:
            out += _mlp_contract(p + "mlp.", cfg["family"], C, F_)
    out.append(("lnf.w", (C,)))
    if gpt2:
        out.append(("lnf.b", (C,)))
    if not cfg["tied_embeddings"]:
        out.append(("lm_head.w", (V, C)))
    return out


# ---- An independent loop-by-loop reference of the forward pass, in numpy float64 ---------------

def reference_forward(cfg, params, tokens):
    """Computes the forward pass straight from the model description; params maps name -> ndarray.

    Returns (logits [B,T,V], summed auxiliary loss, [(layer, counts list, dropped)] per MoE
    layer)."""
    cfg = torch_model.normalize_config(cfg)
    gpt2 = cfg["family"] == "gpt2"
    H, KV, C, L = cfg["heads"], cfg["kv_heads"], cfg["width"], cfg["layers"]
    D = C // H
    eps = cfg["norm_eps"]
    window = cfg["sliding_window"]
    B, T = tokens.shape

    def norm(x, prefix):
        out = np.empty_like(x)
        for idx in np.ndindex(*x.shape[:-1]):
            row = x[idx]
            if gpt2:
                mean = sum(row) / C
                var = sum((v - mean) ** 2 for v in row) / C
                out[idx] = (row - mean) / math.sqrt(var + eps) * params[prefix + ".w"] + \
                    params[prefix + ".b"]
            else:
                ms = sum(v * v for v in row) / C
                out[idx] = row / math.sqrt(ms + eps) * params[prefix + ".w"]
        return out

    def linear(x, prefix):
        y = x @ params[prefix + ".w"].T
        if gpt2:
            y = y + params[prefix + ".b"]
        return y

    def activation(hidden, f):
        if gpt2:
            return 0.5 * hidden * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) *
                                                 (hidden + 0.044715 * hidden ** 3)))
        gate, up = hidden[..., :f], hidden[..., f:]
        return gate / (1.0 + np.exp(-gate)) * up

    def rope(vec, pos):
        out = np.empty_like(vec)
        for i in range(D // 2):
            angle = pos * cfg["rope_theta"] ** (-2.0 * i / D)
            x1, x2 = vec[i], vec[i + D // 2]
            out[i] = x1 * math.cos(angle) - x2 * math.sin(angle)
            out[i + D // 2] = x2 * math.cos(angle) + x1 * math.sin(angle)
        return out

    def moe_layer(x, p):
        """Returns (output like x, aux loss, counts, dropped)."""
        moe = cfg["moe"]
        E, K, F_ = moe["experts"], moe["top_k"], moe["ffn"]
        fo = F_ if gpt2 else 2 * F_
        rows = x.reshape(-1, C)
        N = rows.shape[0]
        bias = params.get(p + "router.bias", np.zeros(E))
        capacity = (math.ceil(moe["capacity_factor"] * N * K / E) if moe["capacity_factor"] > 0
                    else N * K)
        taken, counts, dropped = [0] * E, [0] * E, 0
        mean_q = np.zeros(E)
        out = np.zeros_like(rows)
        for t, row in enumerate(rows):
            logits = [float(np.dot(params[p + "router.w"][e], row)) for e in range(E)]
            if moe["score"] == "softmax":
                top = max(logits)
                ex = [math.exp(v - top) for v in logits]
                g = [v / sum(ex) for v in ex]
            else:
                g = [1.0 / (1.0 + math.exp(-v)) for v in logits]
            chosen = []
            for _ in range(K):  # repeated arg-max; a strict > keeps the lower index on ties
                best = None
                for e in range(E):
                    if e not in chosen and (best is None or g[e] + bias[e] > g[best] + bias[best]):
                        best = e
                chosen.append(best)
            total = sum(g[e] for e in chosen)
            for e in chosen:
                counts[e] += 1
                if taken[e] >= capacity:
                    dropped += 1
                    continue
                taken[e] += 1
                hidden = params[p + "experts.fc.w"][e * fo:(e + 1) * fo] @ row
                if gpt2:
                    hidden = hidden + params[p + "experts.fc.b"][e * F_:(e + 1) * F_]
                y = params[p + "experts.proj.w"][e] @ activation(hidden, F_)
                if gpt2:
                    y = y + params[p + "experts.proj.b"][e]
                out[t] += (g[e] / total if moe["normalize_top_k"] else g[e]) * y
            if moe["shared_experts"] > 0:
                out[t] += linear(activation(linear(row, p + "shared.fc"),
                                            moe["shared_experts"] * F_), p + "shared.proj")
            mean_q += np.array(g) / (sum(g) if moe["score"] == "sigmoid" else 1.0) / N
        aux = 0.0
        if moe["balance"] == "aux_loss":
            aux = moe["aux_loss_coeff"] * E * sum(counts[i] / (N * K) * mean_q[i]
                                                  for i in range(E))
        return out.reshape(x.shape), aux, counts, dropped

    x = np.stack([np.stack([params["wte"][tokens[b, t]] for t in range(T)]) for b in range(B)])
    if gpt2:
        x = x + params["wpe"][:T]
    aux_total, routing = 0.0, []
    for l in range(L):
        p = "h.%d." % l
        qkv = linear(norm(x, p + "ln1"), p + "attn.qkv")
        attn = np.zeros((B, T, H * D))
        for b in range(B):
            for h in range(H):
                g = h // (H // KV)
                q = [qkv[b, t, h * D:(h + 1) * D] for t in range(T)]
                k = [qkv[b, t, (H + g) * D:(H + g + 1) * D] for t in range(T)]
                v = [qkv[b, t, (H + KV + g) * D:(H + KV + g + 1) * D] for t in range(T)]
                if not gpt2:
                    q = [rope(q[t], t) for t in range(T)]
                    k = [rope(k[t], t) for t in range(T)]
                for t in range(T):
                    # Keys t - W < j <= t with a sliding window of W, else every j <= t.
                    seen = range(max(0, t - window + 1) if window else 0, t + 1)
                    scores = [float(np.dot(q[t], k[j])) / math.sqrt(D) for j in seen]
                    top = max(scores)
                    w = [math.exp(s - top) for s in scores]
                    total = sum(w)
                    attn[b, t, h * D:(h + 1) * D] = sum(w[n] / total * v[j]
                                                        for n, j in enumerate(seen))
        x = x + linear(attn, p + "attn.proj")
        if p + "moe.router.w" in params:
            y, aux, counts, dropped = moe_layer(norm(x, p + "ln2"), p + "moe.")
            aux_total += aux
            routing.append((l, counts, dropped))
            x = x + y
        else:
            hidden = linear(norm(x, p + "ln2"), p + "mlp.fc")
            x = x + linear(activation(hidden, cfg["ffn_hidden"]), p + "mlp.proj")
    x = norm(x, "lnf")
    head = params["wte"] if cfg["tied_embeddings"] else params["lm_head.w"]
    return x @ head.T, aux_total, routing


# ---- Training with the optimizer arithmetic written out by hand --------------------------------

def manual_training(cfg, params, inputs, targets):
    """Training loop with AdamW, clipping, the schedule and the MoE bias rule written out by hand
    (float64); the forward and backward passes are the model's.

    params: {name: float64 tensor}. Returns (losses, aux_losses, final params)."""
    model = torch_model.build_model(cfg).double()
    named = model.named_contract_parameters()
    with torch.no_grad():
        for name, p in named:
            p.copy_(params[name])
    # The selection biases are in the contract but not trained.
    trained = [(n, p) for n, p in named if not n.endswith(".moe.router.bias")]
    biases = {n: p for n, p in named if n.endswith(".moe.router.bias")}
    m = {n: torch.zeros_like(p) for n, p in trained}
    v = {n: torch.zeros_like(p) for n, p in trained}
    b1, b2, eps, wd = cfg["beta1"], cfg["beta2"], cfg["eps"], cfg["weight_decay"]
    rate = torch_model.normalize_config(cfg)["moe"]["bias_update_rate"]
    losses, aux_losses = [], []
    for s in range(cfg["steps"]):
        model.zero_grad()
        result = model.objective(inputs[s], targets[s])
        result.objective.backward()
        losses.append(result.cross_entropy.item())
        aux_losses.append(result.aux_loss.item())
        grads = {n: p.grad.clone() for n, p in trained}
        if cfg["grad_clip"] > 0:
            norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            coef = min(1.0, cfg["grad_clip"] / (norm + 1e-6))
            grads = {n: g * coef for n, g in grads.items()}
        # Schedule written from the contract, independently of torch_model.lr_multiplier.
        warm, total, peak = cfg["warmup_steps"], cfg["steps"], cfg["lr"]
        lo = peak * cfg["min_lr_ratio"]
        if s < warm:
            lr = peak * (s + 1) / warm
        else:
            prog = min(1.0, max(0.0, (s - warm) / max(1, total - warm)))
            lr = {"cosine": lo + 0.5 * (peak - lo) * (1 + math.cos(math.pi * prog)),
                  "linear": peak + (lo - peak) * prog, "constant": peak}[cfg["schedule"]]
        t = s + 1
        with torch.no_grad():
            for n, p in trained:
                g = grads[n]
                if p.ndim >= 2 and not n.endswith(".b"):  # weights, not biases
                    p.mul_(1 - lr * wd)
                m[n] = b1 * m[n] + (1 - b1) * g
                v[n] = b2 * v[n] + (1 - b2) * g * g
                denom = (v[n] / (1 - b2 ** t)).sqrt() + eps
                p.sub_(lr * (m[n] / (1 - b1 ** t)) / denom)
            for layer in result.routing:
                name = "h.%d.moe.router.bias" % layer.layer
                if name not in biases:
                    continue
                loads = layer.counts.tolist()
                mean = sum(loads) / len(loads)
                for i, load in enumerate(loads):
                    step = 1.0 if mean > load else -1.0 if mean < load else 0.0
                    biases[name][i] += rate * step
    return losses, aux_losses, {n: p.detach().clone() for n, p in named}
