"""Independent PyTorch implementation of Trainyard's two model families.

This module is the numerical reference for the C++ engine (through run_oracle.py) and the peer in
the CPU benchmark (through bench/torch_cpu_train.py). It is built only from torch modules and
autograd; nothing here mirrors the engine's hand-written backward pass.

Parameter names, shapes and order are the contract with the C++ engine:

  GPT-2:  wte [V,C]; wpe [max_seq,C]; per layer l:
          h.{l}.ln1.w [C], h.{l}.ln1.b [C], h.{l}.attn.qkv.w [(H+2KV)*D, C], h.{l}.attn.qkv.b,
          h.{l}.attn.proj.w [C, H*D], h.{l}.attn.proj.b [C], h.{l}.ln2.w, h.{l}.ln2.b,
          h.{l}.mlp.fc.w [F,C], h.{l}.mlp.fc.b [F], h.{l}.mlp.proj.w [C,F], h.{l}.mlp.proj.b [C];
          lnf.w, lnf.b; lm_head.w [V,C] only when embeddings are untied.
  Llama:  wte [V,C]; per layer l: h.{l}.ln1.w, h.{l}.attn.qkv.w (and h.{l}.attn.qkv.b with
          qkv_bias, Qwen2's layout; h.{l}.attn.q_norm.w [D], h.{l}.attn.k_norm.w [D] with
          qk_norm, Qwen3's; [H*D] and [KV*D] with qk_norm_span "projection", OLMoE's),
          h.{l}.attn.proj.w, h.{l}.ln2.w (ln1.w and ln2.w absent with pre_norms false),
          h.{l}.mlp.fc.w [2F,C] (gate rows first, then up rows), h.{l}.mlp.proj.w [C,F];
          lnf.w; lm_head.w [V,C] unless tied.
  MoE:    in block l >= moe.dense_first with (l+1) % moe.every == 0 the four (gpt2) or two
          (llama) mlp.* tensors are replaced by h.{l}.moe.router.w [E,C], h.{l}.moe.router.bias [E] (balance "bias"
          only; not trained), h.{l}.moe.experts.fc.w [E*Fo,C] (Fo = F, or 2F for llama: each
          expert's gate rows then up rows), h.{l}.moe.experts.fc.b [E*F] (gpt2),
          h.{l}.moe.experts.proj.w [E,C,F], h.{l}.moe.experts.proj.b [E,C] (gpt2), and with
          S shared experts h.{l}.moe.shared.{fc.w, fc.b, proj.w, proj.b} of a dense MLP of hidden
          S*F (fc.b and proj.b gpt2 only), and with moe.shared_gate (llama) their gate
          h.{l}.moe.shared_gate.w [1,C].
  Latent attention (llama, "latent_attention": {q_rank Q, kv_rank K, value_dim Dv, norm_eps
          (the latents' norms', 1e-6)}; R =
          rope_dim, N = D - R): h.{l}.attn.qkv.w is replaced by h.{l}.attn.q_a.w [Q,C],
          h.{l}.attn.q_a_norm.w [Q], h.{l}.attn.q_b.w [H*D,Q] (or with Q = 0 h.{l}.attn.q.w
          [H*D,C]), h.{l}.attn.kv_a.w [K+R,C] (the latent, then the shared rotary key),
          h.{l}.attn.kv_a_norm.w [K], h.{l}.attn.kv_b.w [H*(N+Dv),K] (each head's key part, then
          its value); a query head is its R rotary dimensions, then its N others; h.{l}.attn.proj.w
          is [C,H*Dv].

Linear weights are [out, in]. Parameter files are raw little-endian arrays named
`<dir>/<name>.<ext>`; `params.txt` lists `name d0 d1 ...` one parameter per line.
"""

import collections
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_moe

FAMILIES = ("gpt2", "llama")

# Keys of a model config and how missing optional ones are filled in (mirrors the C++ defaults).
_REQUIRED_KEYS = ("family", "layers", "width", "heads", "vocab", "max_seq")

# The "moe" object's keys and defaults (mirrors config::MoeConfig). experts 0 means dense.
MOE_DEFAULTS = {
    "experts": 0, "top_k": 1, "shared_experts": 0, "shared_gate": False, "every": 1,
    "dense_first": 0, "ffn": 0, "score": "softmax", "normalize_top_k": False, "routed_scale": 1.0, "groups": 1, "group_top_k": 0,
    "group_score": "top2_sum",
    "balance": "aux_loss", "aux_loss_coeff": 0.01,
    "bias_update_rate": 0.001, "z_loss_coeff": 0.0, "capacity_factor": 0.0,
}
_MOE_CHOICES = {"score": ("softmax", "sigmoid"), "balance": ("aux_loss", "bias"),
                "group_score": ("top2_sum", "max")}
# (key, lower bound, whether the bound itself is allowed) for the real-valued keys.
_MOE_REALS = (("aux_loss_coeff", 0.0, True), ("bias_update_rate", 0.0, False),
              ("capacity_factor", 0.0, True), ("routed_scale", 0.0, False),
              ("z_loss_coeff", 0.0, True))


class ConfigError(ValueError):
    """A model or training config that cannot describe a valid run."""


def normalize_config(cfg):
    """Returns a copy of `cfg` with optional model keys filled in, after validating it.

    Required: family, layers, width, heads, vocab, max_seq (and ffn_hidden for llama).
    Defaults: kv_heads = heads; head_dim = width / heads (llama may set another; 0 means the
    default); sliding_window = 0 (none; llama may set one); full_attention_layers = [] (the
    blocks without the window); rope_local_theta = 0 (with a window: the RoPE base of the
    blocks that use it); post_norms = false (llama: norms of the attention's and the MLP's
    outputs); pre_norms = true (false, with post_norms: no norms before the branches, OLMo 2's);
    activation = swiglu (llama; geglu
    is Gemma's) or gelu (gpt2); scale_embeddings = false (llama may set it: Gemma's sqrt(width));
    attention_scale_dim = 0 (scores scaled by attention_scale_dim^-0.5 instead of head_dim^-0.5,
    Gemma's query_pre_attn_scalar; 0 means head_dim); attention_softcap = 0 (none; else the scaled
    scores s become C*tanh(s/C) before the mask and softmax, Gemma 2's attn_logit_softcapping);
    logit_softcap = 0 (none; else the logits z become C*tanh(z/C), Gemma 2's
    final_logit_softcapping); z_loss_coeff = 0 (none; else the training objective adds
    z_loss_coeff times the mean over positions of the squared log-sum-exp of the logits, PaLM's
    z-loss); embedding_multiplier = residual_multiplier = logits_scaling = 1
    and attention_multiplier = 0 (llama may set them, Granite's: the embeddings times the first,
    each branch's output times the second as it joins the residual stream, the scores times the
    attention's in place of head_dim^-0.5, the logits divided by the last);
    ffn_hidden = 4*width (gpt2); tied_embeddings = (family == gpt2);
    norm_eps = 1e-5; rope_theta = 10000; rope_dim = 0 (RoPE turns the first rope_dim dimensions
    of each head, 0: all of them); nope_layers = [] (llama: the blocks RoPE leaves unturned,
    SmolLM3's NoPE layers); rope_scaling = None (or LongRoPE's, _normalize_longrope);
    document_token = -1 (none; else attention stays within documents, each beginning at an
    occurrence of this token: block-causal attention);
    moe = MOE_DEFAULTS (dense), missing moe keys from
    MOE_DEFAULTS. Other keys (training keys) are kept untouched.
    Raises ConfigError naming the offending key.
    """
    if not isinstance(cfg, dict):
        raise ConfigError("config must be a JSON object")
    out = dict(cfg)
    for key in _REQUIRED_KEYS:
        if key not in out:
            raise ConfigError("config is missing the key '%s'" % key)
    family = out["family"]
    if family not in FAMILIES:
        raise ConfigError("family: unknown model family %r (expected gpt2 or llama)" % (family,))
    out.setdefault("kv_heads", out["heads"])
    if "ffn_hidden" not in out:
        if family == "llama":
            raise ConfigError("config is missing the key 'ffn_hidden' (required for llama)")
        out["ffn_hidden"] = 4 * int(out["width"])
    out.setdefault("tied_embeddings", family == "gpt2")
    out.setdefault("qkv_bias", False)
    out.setdefault("qk_norm", False)
    out.setdefault("qk_norm_span", "head")
    out.setdefault("sliding_window", 0)
    out.setdefault("full_attention_layers", [])
    out.setdefault("rope_local_theta", 0.0)
    out.setdefault("nope_layers", [])
    out.setdefault("post_norms", False)
    out.setdefault("pre_norms", True)
    out.setdefault("activation", "swiglu" if family == "llama" else "gelu")
    out.setdefault("scale_embeddings", False)
    out.setdefault("attention_scale_dim", 0)
    out.setdefault("attention_softcap", 0.0)
    out.setdefault("logit_softcap", 0.0)
    out.setdefault("z_loss_coeff", 0.0)
    out.setdefault("embedding_multiplier", 1.0)
    out.setdefault("residual_multiplier", 1.0)
    out.setdefault("attention_multiplier", 0.0)
    out.setdefault("logits_scaling", 1.0)
    out.setdefault("document_token", -1)
    out.setdefault("norm_eps", 1e-5)
    out.setdefault("rope_theta", 10000.0)
    for key in ("layers", "width", "heads", "kv_heads", "ffn_hidden", "vocab", "max_seq"):
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError("%s: must be an integer, got %r" % (key, value))
        minimum = 2 if key == "vocab" else 1
        if value < minimum:
            raise ConfigError("%s: must be at least %d, got %d" % (key, minimum, value))
    if not isinstance(out["tied_embeddings"], bool):
        raise ConfigError("tied_embeddings: must be true or false")
    for key in ("qkv_bias", "qk_norm"):
        if not isinstance(out[key], bool) or (out[key] and family != "llama"):
            raise ConfigError("%s: true or false, and true only for the llama family" % key)
    if out["qk_norm_span"] not in ("head", "projection") or (
            out["qk_norm_span"] == "projection" and not out["qk_norm"]):
        raise ConfigError("qk_norm_span: head or projection, and projection only with qk_norm")
    if out["activation"] not in (("swiglu", "geglu") if family == "llama" else ("gelu",)):
        raise ConfigError("activation: swiglu or geglu for the llama family, gelu for gpt2, got %r"
                          % (out["activation"],))
    if not isinstance(out["scale_embeddings"], bool) or (out["scale_embeddings"]
                                                         and family != "llama"):
        raise ConfigError("scale_embeddings: true or false, and true only for the llama family")
    window = out["sliding_window"]
    if isinstance(window, bool) or not isinstance(window, int) or window < 0 or (
            window and family != "llama"):
        raise ConfigError("sliding_window: an integer >= 0 (0: none), nonzero only for the llama "
                          "family, got %r" % (window,))
    full = out["full_attention_layers"]
    if not isinstance(full, list) or (full and not window) or any(
            isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < out["layers"]
            for l in full) or sorted(set(full)) != full:
        raise ConfigError("full_attention_layers: increasing layer indices below layers, only "
                          "with a sliding_window, got %r" % (full,))
    nope = out["nope_layers"]
    if not isinstance(nope, list) or (nope and family != "llama") or any(
            isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < out["layers"]
            for l in nope) or sorted(set(nope)) != nope:
        raise ConfigError("nope_layers: increasing layer indices below layers, llama family "
                          "only, got %r" % (nope,))
    local = out["rope_local_theta"]
    if isinstance(local, bool) or not isinstance(local, (int, float)) or local < 0 or (
            local and not window):
        raise ConfigError("rope_local_theta: a number >= 0 (0: none), nonzero only with a "
                          "sliding_window, got %r" % (local,))
    out["rope_local_theta"] = float(local)
    if not isinstance(out["post_norms"], bool) or (out["post_norms"] and family != "llama"):
        raise ConfigError("post_norms: true or false, and true only for the llama family")
    if not isinstance(out["pre_norms"], bool) or (not out["pre_norms"] and not out["post_norms"]):
        raise ConfigError("pre_norms: true or false, and false only with post_norms")
    scale_dim = out["attention_scale_dim"]
    if isinstance(scale_dim, bool) or not isinstance(scale_dim, int) or scale_dim < 0:
        raise ConfigError("attention_scale_dim: an integer >= 0 (0: head_dim), got %r"
                          % (scale_dim,))
    for key in ("attention_softcap", "logit_softcap", "z_loss_coeff"):
        value = out[key]
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < 0):
            raise ConfigError("%s: a finite number >= 0 (0: none), got %r" % (key, value))
        out[key] = float(value)
    # Granite's multipliers (llama only): 1 each, the attention's 0 (head_dim^-0.5), for none.
    for key, none in (("embedding_multiplier", 1.0), ("residual_multiplier", 1.0),
                      ("attention_multiplier", 0.0), ("logits_scaling", 1.0)):
        value = out[key]
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < 0 or (value == 0 and none)
                or (value != none and family != "llama")):
            raise ConfigError("%s: a positive finite number, other than %g only for the llama "
                              "family, got %r" % (key, none, value))
        out[key] = float(value)
    token = out["document_token"]
    if isinstance(token, bool) or not isinstance(token, int) or not -1 <= token < out["vocab"]:
        raise ConfigError("document_token: a token id below vocab (-1: none), got %r" % (token,))
    for key in ("norm_eps", "rope_theta"):
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError("%s: must be a positive number, got %r" % (key, value))
        out[key] = float(value)
    head_dim = out.get("head_dim", 0)
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 0:
        raise ConfigError("head_dim: must be an integer >= 0 (0: width / heads), got %r"
                          % (head_dim,))
    if head_dim and family != "llama" and head_dim * out["heads"] != out["width"]:
        raise ConfigError("head_dim: is for the llama family (gpt2's is width / heads)")
    if not head_dim and out["width"] % out["heads"] != 0:
        raise ConfigError("heads: width %d is not divisible by heads %d" % (out["width"], out["heads"]))
    out["head_dim"] = head_dim or out["width"] // out["heads"]
    if out["heads"] % out["kv_heads"] != 0:
        raise ConfigError(
            "kv_heads: heads %d is not divisible by kv_heads %d" % (out["heads"], out["kv_heads"]))
    if family == "llama" and out["head_dim"] % 2 != 0:
        raise ConfigError("%s: RoPE needs an even head dimension, got %d"
                          % ("head_dim" if head_dim else "heads", out["head_dim"]))
    out["rope_dim"] = _normalize_rope_dim(out.get("rope_dim", 0), out["head_dim"], family)
    out["rope_scaling"] = _normalize_longrope(out.get("rope_scaling"),
                                              out["rope_dim"] or out["head_dim"])
    out["moe"] = _normalize_moe(out.get("moe"), out["layers"])
    out["latent_attention"] = _normalize_latent(out.get("latent_attention"), out)
    return out


def _normalize_latent(latent, cfg):
    """Multi-head latent attention's {q_rank, kv_rank, value_dim, norm_eps} (None: ordinary
    attention): the llama family, one key/value head per query head, and a rotary part of each
    head below it."""
    if latent is None:
        return None
    if not isinstance(latent, dict) or set(latent) - {"q_rank", "kv_rank", "value_dim", "norm_eps"}:
        raise ConfigError("latent_attention: an object of q_rank, kv_rank, value_dim and norm_eps")
    out = {"q_rank": latent.get("q_rank", 0), "kv_rank": latent.get("kv_rank", 0),
           "value_dim": latent.get("value_dim", cfg["head_dim"] - cfg["rope_dim"]),
           "norm_eps": latent.get("norm_eps", 1e-6)}
    eps = out["norm_eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
        raise ConfigError("latent_attention.norm_eps: a positive number, got %r" % (eps,))
    for key, least in (("q_rank", 0), ("kv_rank", 1), ("value_dim", 1)):
        if isinstance(out[key], bool) or not isinstance(out[key], int) or out[key] < least:
            raise ConfigError("latent_attention.%s: an integer >= %d, got %r" % (key, least, out[key]))
    if cfg["family"] != "llama" or cfg["kv_heads"] != cfg["heads"] or not (
            0 < cfg["rope_dim"] < cfg["head_dim"]) or cfg["qkv_bias"] or cfg["qk_norm"]:
        raise ConfigError("latent_attention: llama, kv_heads == heads, 0 < rope_dim < head_dim, "
                          "no qkv_bias or qk_norm")
    return out


def _normalize_rope_dim(rope_dim, head_dim, family):
    """The dimensions of each head RoPE turns (0: all head_dim of them), even and at most head_dim;
    kept as given, so that a normalised config normalises to itself."""
    if (isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim < 0
            or rope_dim % 2 or rope_dim > head_dim or (rope_dim and family != "llama")):
        raise ConfigError("rope_dim: an even integer from 0 (all) to head_dim %d, llama family "
                          "only, got %r" % (head_dim, rope_dim))
    return rope_dim


def _normalize_yarn(scaling):
    """YaRN's {"type": "yarn", "factor": at least 1, "original_max_seq": a positive integer,
    "beta_fast" >= "beta_slow" > 0, "truncate": a bool, "attention_factor": a positive number}."""
    for key in ("factor", "beta_fast", "beta_slow", "attention_factor"):
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError("rope_scaling.%s: a positive number" % key)
    original = scaling.get("original_max_seq")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ConfigError("rope_scaling.original_max_seq: a positive integer")
    if not scaling["factor"] >= 1 or not scaling["beta_fast"] >= scaling["beta_slow"]:
        raise ConfigError("rope_scaling: factor at least 1, beta_fast at least beta_slow")
    if not isinstance(scaling.get("truncate"), bool):
        raise ConfigError("rope_scaling.truncate: true or false")
    return dict(scaling, factor=float(scaling["factor"]),
                attention_factor=float(scaling["attention_factor"]))


def _normalize_longrope(scaling, rope_dim):
    """None, or LongRoPE's {"type": "longrope", "short_factor", "long_factor": rope_dim / 2
    positive numbers each, "original_max_seq": a positive integer, "attention_factor": a positive
    number}, or YaRN's (_normalize_yarn)."""
    if scaling is None:
        return None
    if isinstance(scaling, dict) and scaling.get("type") == "yarn":
        return _normalize_yarn(scaling)
    if not isinstance(scaling, dict) or scaling.get("type") != "longrope":
        raise ConfigError("rope_scaling: only {\"type\": \"longrope\" or \"yarn\", ...} is "
                          "modelled here")
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        if (not isinstance(factors, list) or len(factors) != rope_dim // 2
                or not all(isinstance(f, (int, float)) and f > 0 for f in factors)):
            raise ConfigError("rope_scaling.%s: %d positive numbers" % (key, rope_dim // 2))
    original = scaling.get("original_max_seq")
    factor = scaling.get("attention_factor")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ConfigError("rope_scaling.original_max_seq: a positive integer")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ConfigError("rope_scaling.attention_factor: a positive number")
    return dict(scaling, attention_factor=float(factor))


def _normalize_moe(moe, layers):
    """The "moe" object with defaults filled in; validated unless experts is 0 (dense)."""
    if moe is None:
        return dict(MOE_DEFAULTS)
    if not isinstance(moe, dict):
        raise ConfigError("moe: must be an object")
    unknown = sorted(set(moe) - set(MOE_DEFAULTS))
    if unknown:
        raise ConfigError("moe.%s: unknown key" % unknown[0])
    out = dict(MOE_DEFAULTS)
    out.update(moe)
    for key in ("experts", "top_k", "shared_experts", "every", "dense_first", "ffn", "groups",
                "group_top_k"):
        if isinstance(out[key], bool) or not isinstance(out[key], int):
            raise ConfigError("moe.%s: must be an integer, got %r" % (key, out[key]))
    if out["experts"] == 0:
        return out
    if out["experts"] < 0:
        raise ConfigError("moe.experts: must be at least 0, got %d" % out["experts"])
    limits = (("top_k", 1, out["experts"]), ("every", 1, layers), ("ffn", 1, None),
              ("shared_experts", 0, None))
    for key, low, high in limits:
        if out[key] < low or (high is not None and out[key] > high):
            raise ConfigError("moe.%s: must be %s, got %d" % (
                key, "at least %d" % low if high is None else "between %d and %d" % (low, high),
                out[key]))
    if out["dense_first"] < 0 or not any(_moe_block(out, l) for l in range(layers)):
        raise ConfigError("moe.dense_first: must be at least 0 and leave an MoE block, got %d"
                          % out["dense_first"])
    _check_moe_groups(out)
    for key, choices in _MOE_CHOICES.items():
        if out[key] not in choices:
            raise ConfigError("moe.%s: must be one of %s, got %r"
                              % (key, ", ".join(choices), out[key]))
    for key in ("normalize_top_k", "shared_gate"):
        if not isinstance(out[key], bool):
            raise ConfigError("moe.%s: must be true or false" % key)
    if out["shared_gate"] and out["shared_experts"] == 0:
        raise ConfigError("moe.shared_gate: gates the shared experts, and moe.shared_experts is 0")
    for key, low, inclusive in _MOE_REALS:
        value = out[key]
        ok = (not isinstance(value, bool) and isinstance(value, (int, float))
              and math.isfinite(value) and (value >= low if inclusive else value > low))
        if not ok:
            raise ConfigError("moe.%s: must be a finite number %s %g, got %r"
                              % (key, ">=" if inclusive else ">", low, value))
        out[key] = float(value)
    return out


def _check_moe_groups(moe):
    """Group-limited routing: groups of at least two experts, 0 (every group) to groups kept,
    and room for top_k picks in the kept groups."""
    experts, groups = moe["experts"], moe["groups"]
    if groups < 1 or experts % groups or (groups > 1 and experts // groups < 2):
        raise ConfigError("moe.groups: must divide experts %d into groups of at least two, got %d"
                          % (experts, groups))
    kept = moe["group_top_k"] or groups
    if not 0 <= moe["group_top_k"] <= groups or kept * (experts // groups) < moe["top_k"]:
        raise ConfigError("moe.group_top_k: must be 0 to groups %d with room for top_k %d, got %d"
                          % (groups, moe["top_k"], moe["group_top_k"]))


def _moe_block(moe, layer):
    return layer >= moe["dense_first"] and (layer + 1) % moe["every"] == 0


def is_moe_layer(cfg, layer):
    """Whether block `layer` (0-based) of the normalised `cfg` has an MoE layer for its MLP."""
    return cfg["moe"]["experts"] > 0 and _moe_block(cfg["moe"], layer)


class RMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2, -1) + eps) * w (torch 1.13 has no nn.RMSNorm)."""

    def __init__(self, width, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def rope_cos_sin(seq_len, head_dim, theta, dtype, device=None, longrope=None):
    """cos/sin tables [seq_len, head_dim/2] for the half-split RoPE convention.

    freq_i = theta^(-2i/D) for i in [0, D/2); angle = pos * freq_i. Computed in float64 and cast.
    D is the rotated part of a head (rope_dim). With LongRoPE, freq_i is divided by its short
    factor, or its long one when the sequence is longer than original_max_seq, and both tables
    are multiplied by attention_factor.
    """
    half = head_dim // 2
    i = torch.arange(half, dtype=torch.float64, device=device)
    freq = torch.pow(torch.tensor(float(theta), dtype=torch.float64, device=device),
                     -2.0 * i / head_dim)
    magnitude = 1.0
    if longrope is not None and longrope["type"] == "yarn":
        # YaRN: the pairs that turn more than beta_fast times over the original context keep
        # their rate, those turning fewer than beta_slow times go factor times slower, and the
        # rate moves linearly in the pair's index between the two (whole pairs when truncated).
        n, two_pi = longrope["original_max_seq"], 2 * math.pi
        turns_index = [head_dim * math.log(n / (two_pi * longrope[b])) / (2 * math.log(theta))
                       for b in ("beta_fast", "beta_slow")]
        low, high = turns_index
        if longrope["truncate"]:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0.0), min(high, head_dim - 1.0)
        if low == high:
            high += 0.001
        ramp = torch.clamp((i - low) / (high - low), 0.0, 1.0)
        freq = (1 - ramp) * freq + ramp * freq / longrope["factor"]
        magnitude = longrope["attention_factor"]
    elif longrope is not None:
        long = seq_len > longrope["original_max_seq"]
        factors = longrope["long_factor" if long else "short_factor"]
        freq = freq / torch.tensor(factors, dtype=torch.float64, device=device)
        magnitude = longrope["attention_factor"]
    pos = torch.arange(seq_len, dtype=torch.float64, device=device)
    angle = pos[:, None] * freq[None, :]
    return (magnitude * torch.cos(angle)).to(dtype), (magnitude * torch.sin(angle)).to(dtype)


def softcap(x, cap):
    """cap * tanh(x / cap): x squashed into (-cap, cap), near x where |x| << cap."""
    return cap * torch.tanh(x / cap)


def apply_rope(x, cos, sin):
    """Rotates x [B, T, heads, D] with tables [T, R/2] (R = D, or rope_dim): out[i] =
    x1*cos - x2*sin, out[i + R/2] = x2*cos + x1*sin, where x1 = x[i], x2 = x[i + R/2]; the
    dimensions from R on pass through."""
    half = cos.shape[-1]
    x1, x2, kept = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, kept), dim=-1)


class Attention(nn.Module):
    """Causal grouped-query self-attention; query head h reads key/value head h // (H / KV)."""

    def __init__(self, cfg, layer=0):
        super().__init__()
        self.heads = cfg["heads"]
        self.kv_heads = cfg["kv_heads"]
        self.head_dim = cfg["head_dim"]
        # Scores times scale_dim^-0.5 (Gemma's query_pre_attn_scalar; by default head_dim), then
        # soft-capped to (-softcap, softcap) when softcap > 0 (Gemma 2's).
        self.scale = 1.0 / math.sqrt(cfg["attention_scale_dim"] or self.head_dim)
        if cfg["attention_multiplier"]:  # Granite's: the scale itself
            self.scale = cfg["attention_multiplier"]
        self.softcap = cfg["attention_softcap"]
        # SmolLM3's NoPE blocks leave queries and keys unturned.
        self.rope = cfg["family"] == "llama" and layer not in cfg["nope_layers"]
        self.rope_theta = cfg["rope_theta"]
        self.rope_dim = cfg["rope_dim"] or self.head_dim
        self.longrope = cfg["rope_scaling"]
        # 0: every earlier position (no window, or one of full_attention_layers)
        self.window = 0 if layer in cfg["full_attention_layers"] else cfg["sliding_window"]
        if self.window and cfg["rope_local_theta"]:  # a local block's own base (Gemma 3's)
            self.rope_theta = cfg["rope_local_theta"]
            self.longrope = None
        bias = cfg["family"] == "gpt2"
        qkv_out = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.qkv = nn.Linear(cfg["width"], qkv_out, bias=bias or cfg["qkv_bias"])
        self.proj = nn.Linear(self.heads * self.head_dim, cfg["width"], bias=bias)
        # Qwen3's norms of each query and key head, before RoPE (one weight for all query heads,
        # one for all key heads), or OLMoE's over each token's whole q and whole k.
        self.whole_norms = cfg["qk_norm_span"] == "projection"
        q_width = self.heads * self.head_dim if self.whole_norms else self.head_dim
        k_width = self.kv_heads * self.head_dim if self.whole_norms else self.head_dim
        self.q_norm = RMSNorm(q_width, cfg["norm_eps"]) if cfg["qk_norm"] else None
        self.k_norm = RMSNorm(k_width, cfg["norm_eps"]) if cfg["qk_norm"] else None
        self._rope_cache = {}

    def _rope_tables(self, seq_len, dtype, device):
        key = (seq_len, dtype, device)
        if key not in self._rope_cache:
            self._rope_cache[key] = rope_cos_sin(seq_len, self.rope_dim, self.rope_theta, dtype,
                                                 device, self.longrope)
        return self._rope_cache[key]

    def forward(self, x, other_document=None):
        """other_document: None, or [B, T, T] bool, True where key j lies in another document than
        query i."""
        b, t, _ = x.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        qkv = self.qkv(x)
        q = qkv[..., : h * d].reshape(b, t, h, d)
        k = qkv[..., h * d: (h + kv) * d].reshape(b, t, kv, d)
        v = qkv[..., (h + kv) * d:].reshape(b, t, kv, d)
        if self.q_norm is not None and self.whole_norms:
            q = self.q_norm(q.reshape(b, t, h * d)).reshape(b, t, h, d)
            k = self.k_norm(k.reshape(b, t, kv * d)).reshape(b, t, kv, d)
        elif self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            cos, sin = self._rope_tables(t, x.dtype, x.device)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        q = q.transpose(1, 2)  # [B, H, T, D]
        k = k.transpose(1, 2)  # [B, KV, T, D]
        v = v.transpose(1, 2)
        if kv != h:
            k = k.repeat_interleave(h // kv, dim=1)
            v = v.repeat_interleave(h // kv, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if self.softcap:
            scores = softcap(scores, self.softcap)
        hidden = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(diagonal=1)
        if self.window:  # query i sees keys i - window < j <= i
            hidden = hidden | torch.ones_like(hidden).tril(diagonal=-self.window)
        if other_document is not None:
            hidden = hidden | other_document[:, None]
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        y = torch.matmul(probs, v)  # [B, H, T, D]
        y = y.transpose(1, 2).reshape(b, t, h * d)
        return self.proj(y)


class LatentAttention(Attention):
    """Multi-head latent attention (DeepSeek-V2's and V3's): queries from a normed latent of
    q_rank (or the input), keys and values decompressed per head from a normed latent of kv_rank,
    beside one rotary key of rope_dim that every head shares; value heads of value_dim. Written
    as DeepSeek's reference splits it (rotary and other parts apart, the shared key expanded),
    not as the engine packs it."""

    def __init__(self, cfg, layer=0):
        super().__init__(cfg, layer)
        latent = cfg["latent_attention"]
        h, d, c, eps = self.heads, self.head_dim, cfg["width"], latent["norm_eps"]
        self.rot, self.q_rank, self.kv_rank = cfg["rope_dim"], latent["q_rank"], latent["kv_rank"]
        self.value_dim = latent["value_dim"]
        del self.qkv
        if self.q_rank:
            self.q_a = nn.Linear(c, self.q_rank, bias=False)
            self.q_a_norm = RMSNorm(self.q_rank, eps)
            self.q_b = nn.Linear(self.q_rank, h * d, bias=False)
        else:
            self.q = nn.Linear(c, h * d, bias=False)
        self.kv_a = nn.Linear(c, self.kv_rank + self.rot, bias=False)
        self.kv_a_norm = RMSNorm(self.kv_rank, eps)
        self.kv_b = nn.Linear(self.kv_rank, h * (d - self.rot + self.value_dim), bias=False)
        self.proj = nn.Linear(h * self.value_dim, c, bias=False)

    def forward(self, x, other_document=None):
        b, t, _ = x.shape
        h, d, r, dv = self.heads, self.head_dim, self.rot, self.value_dim
        q = self.q_b(self.q_a_norm(self.q_a(x))) if self.q_rank else self.q(x)
        q = q.reshape(b, t, h, d)
        q_rot, q_rest = q[..., :r], q[..., r:]
        latent, k_rot = torch.split(self.kv_a(x), [self.kv_rank, r], dim=-1)
        kv = self.kv_b(self.kv_a_norm(latent)).reshape(b, t, h, d - r + dv)
        k_rest, v = torch.split(kv, [d - r, dv], dim=-1)
        k_rot = k_rot.reshape(b, t, 1, r)
        if self.rope:
            cos, sin = self._rope_tables(t, x.dtype, x.device)
            q_rot = apply_rope(q_rot, cos, sin)
            k_rot = apply_rope(k_rot, cos, sin)
        q = torch.cat((q_rot, q_rest), dim=-1).transpose(1, 2)  # [B, H, T, D]
        k = torch.cat((k_rot.expand(b, t, h, r), k_rest), dim=-1).transpose(1, 2)
        v = v.transpose(1, 2)  # [B, H, T, Dv]
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if self.softcap:
            scores = softcap(scores, self.softcap)
        hidden = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(diagonal=1)
        if self.window:
            hidden = hidden | torch.ones_like(hidden).tril(diagonal=-self.window)
        if other_document is not None:
            hidden = hidden | other_document[:, None]
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        y = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, h * dv)
        return self.proj(y)

    def contract(self, p):
        """[(contract name, parameter)] of the projections, in the engine's order."""
        if self.q_rank:
            out = [(p + "attn.q_a.w", self.q_a.weight), (p + "attn.q_a_norm.w", self.q_a_norm.weight),
                   (p + "attn.q_b.w", self.q_b.weight)]
        else:
            out = [(p + "attn.q.w", self.q.weight)]
        return out + [(p + "attn.kv_a.w", self.kv_a.weight),
                      (p + "attn.kv_a_norm.w", self.kv_a_norm.weight),
                      (p + "attn.kv_b.w", self.kv_b.weight)]


class Mlp(nn.Module):
    """GPT-2: proj(gelu_tanh(fc(x))). Llama: g, u = split(fc(x)); proj(silu(g) * u), or with
    activation geglu (Gemma's) proj(gelu_tanh(g) * u). Hidden size `hidden`, by default
    cfg["ffn_hidden"]."""

    def __init__(self, cfg, hidden=None):
        super().__init__()
        self.gated = cfg["family"] == "llama"
        self.geglu = cfg.get("activation") == "geglu"
        c, f = cfg["width"], cfg["ffn_hidden"] if hidden is None else hidden
        self.ffn = f
        self.fc = nn.Linear(c, 2 * f if self.gated else f, bias=not self.gated)
        self.proj = nn.Linear(f, c, bias=not self.gated)

    def forward(self, x):
        hidden = self.fc(x)
        if self.gated:
            gate, up = hidden[..., : self.ffn], hidden[..., self.ffn:]
            if self.geglu:
                return self.proj(F.gelu(gate, approximate="tanh") * up)
            return self.proj(F.silu(gate) * up)
        return self.proj(F.gelu(hidden, approximate="tanh"))


def _make_norm(cfg):
    if cfg["family"] == "gpt2":
        return nn.LayerNorm(cfg["width"], eps=cfg["norm_eps"])
    return RMSNorm(cfg["width"], cfg["norm_eps"])


class Block(nn.Module):
    """Pre-norm residual block: x += attn(norm1(x)); x += mlp(norm2(x)), where the MLP of an MoE
    block (is_moe_layer) is an MoeLayer (`moe`; `mlp` is then None). Without pre_norms norm1 and
    norm2 are the identity."""

    def __init__(self, cfg, layer):
        super().__init__()
        self.ln1 = _make_norm(cfg) if cfg["pre_norms"] else nn.Identity()
        self.attn = (LatentAttention(cfg, layer) if cfg["latent_attention"]
                     else Attention(cfg, layer))
        self.ln2 = _make_norm(cfg) if cfg["pre_norms"] else nn.Identity()
        # post_norms (Gemma 2's and 3's): the attention's and the MLP's outputs normed too.
        self.attn_post = _make_norm(cfg) if cfg["post_norms"] else None
        self.mlp_post = _make_norm(cfg) if cfg["post_norms"] else None
        self.residual_multiplier = cfg["residual_multiplier"]
        if is_moe_layer(cfg, layer):
            self.mlp = None
            self.moe = torch_moe.MoeLayer(cfg["family"], cfg["width"], cfg["moe"], layer,
                                          lambda hidden: Mlp(cfg, hidden))
        else:
            self.mlp = Mlp(cfg)
            self.moe = None

    def forward(self, x, other_document=None):
        """x -> (x, Routing of the MoE layer or None); other_document as Attention's."""
        multiplier = self.residual_multiplier

        def post(norm, y):  # Granite's residual_multiplier after any post-norm
            return (y if norm is None else norm(y)) * multiplier

        x = x + post(self.attn_post, self.attn(self.ln1(x), other_document))
        if self.moe is None:
            return x + post(self.mlp_post, self.mlp(self.ln2(x))), None
        y, routing = self.moe(self.ln2(x))
        return x + post(self.mlp_post, y), routing


# The training objective of one batch: objective = cross_entropy + z_loss (the logits' z-loss, a
# zero tensor without one) + aux_loss (the sum of the MoE layers' L_aux, a zero tensor without
# any); routing holds each MoE layer's Routing in order.
TrainingLoss = collections.namedtuple("TrainingLoss",
                                      "objective cross_entropy z_loss aux_loss logits routing")


class Transformer(nn.Module):
    """Decoder-only transformer. forward(tokens [B,T] int64) -> logits [B,T,V]."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = normalize_config(cfg)
        cfg = self.cfg
        self.wte = nn.Embedding(cfg["vocab"], cfg["width"])
        self.wpe = nn.Embedding(cfg["max_seq"], cfg["width"]) if cfg["family"] == "gpt2" else None
        self.h = nn.ModuleList([Block(cfg, l) for l in range(cfg["layers"])])
        self.lnf = _make_norm(cfg)
        self.lm_head = (None if cfg["tied_embeddings"]
                        else nn.Linear(cfg["width"], cfg["vocab"], bias=False))

    def forward(self, tokens):
        return self.forward_with_routing(tokens)[0]

    def forward_with_routing(self, tokens):
        """tokens [B,T] -> (logits [B,T,V], [Routing of each MoE layer, in layer order])."""
        t = tokens.shape[1]
        if t > self.cfg["max_seq"]:
            raise ValueError("sequence length %d exceeds max_seq %d" % (t, self.cfg["max_seq"]))
        x = self.wte(tokens)
        if self.cfg["scale_embeddings"]:  # Gemma's: the lookup times sqrt(width); the head unscaled
            x = x * math.sqrt(self.cfg["width"])
        x = x * self.cfg["embedding_multiplier"]  # Granite's (1 unless set)
        if self.wpe is not None:
            x = x + self.wpe.weight[:t]
        other_document = None
        if self.cfg["document_token"] >= 0:
            # Document d of a row runs from the token's d-th occurrence up to its next (those
            # before the first are document 0): ids from a running count of occurrences.
            document = torch.cumsum((tokens == self.cfg["document_token"]).long(), dim=1)
            other_document = document[:, :, None] != document[:, None, :]
        routing = []
        for block in self.h:
            x, layer_routing = block(x, other_document)
            if layer_routing is not None:
                routing.append(layer_routing)
        x = self.lnf(x)
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, head) / self.cfg["logits_scaling"]  # Granite's (1 unless set)
        if self.cfg["logit_softcap"]:  # Gemma 2's final_logit_softcapping
            logits = softcap(logits, self.cfg["logit_softcap"])
        return logits, routing

    def loss(self, tokens, targets):
        """Mean cross-entropy over all B*T positions; returns (loss, logits). For a model with MoE
        layers this is not the training objective (see objective)."""
        result = self.objective(tokens, targets)
        return result.cross_entropy, result.logits

    def objective(self, tokens, targets):
        """The training objective of one batch, as a TrainingLoss."""
        logits, routing = self.forward_with_routing(tokens)
        flat = logits.reshape(-1, logits.shape[-1])
        ce = F.cross_entropy(flat, targets.reshape(-1))
        z_loss = self.cfg["z_loss_coeff"] * torch.logsumexp(flat, dim=-1).square().mean()
        aux = logits.new_zeros(())
        for layer in routing:
            aux = aux + layer.aux_loss
        return TrainingLoss(ce + z_loss + aux, ce, z_loss, aux, logits, routing)

    def update_selection_biases(self, routing):
        """Applies the bias rule of every MoE layer with balance "bias" to the loads in `routing`
        (from forward_with_routing of the step just taken); others are left alone."""
        for layer in routing:
            self.h[layer.layer].moe.update_selection_bias(layer.counts)

    def named_contract_parameters(self):
        """[(contract name, tensor)] in the contract order (see the module docstring). Every tensor
        is an nn.Parameter except the MoE selection biases, which are buffers."""
        out = [("wte", self.wte.weight)]
        gpt2 = self.cfg["family"] == "gpt2"
        if gpt2:
            out.append(("wpe", self.wpe.weight))
        for l, block in enumerate(self.h):
            p = "h.%d." % l
            if self.cfg["pre_norms"]:
                out.append((p + "ln1.w", block.ln1.weight))
            if gpt2:
                out.append((p + "ln1.b", block.ln1.bias))
            if isinstance(block.attn, LatentAttention):
                out += block.attn.contract(p)
            else:
                out.append((p + "attn.qkv.w", block.attn.qkv.weight))
            if not isinstance(block.attn, LatentAttention) and block.attn.qkv.bias is not None:
                out.append((p + "attn.qkv.b", block.attn.qkv.bias))
            if block.attn.q_norm is not None:
                out += [(p + "attn.q_norm.w", block.attn.q_norm.weight),
                        (p + "attn.k_norm.w", block.attn.k_norm.weight)]
            out.append((p + "attn.proj.w", block.attn.proj.weight))
            if gpt2:
                out.append((p + "attn.proj.b", block.attn.proj.bias))
            if block.attn_post is not None:
                out.append((p + "attn.post_norm.w", block.attn_post.weight))
            if self.cfg["pre_norms"]:
                out.append((p + "ln2.w", block.ln2.weight))
            if gpt2:
                out.append((p + "ln2.b", block.ln2.bias))
            if block.mlp_post is not None:
                out.append((p + "mlp.post_norm.w", block.mlp_post.weight))
            if block.moe is None:
                out += _mlp_contract(p + "mlp.", block.mlp)
            else:
                out += _moe_contract(p + "moe.", block.moe)
        out.append(("lnf.w", self.lnf.weight))
        if gpt2:
            out.append(("lnf.b", self.lnf.bias))
        if self.lm_head is not None:
            out.append(("lm_head.w", self.lm_head.weight))
        return out

    def named_trainable_parameters(self):
        """The contract parameters that are trained (all but the MoE selection biases), in
        contract order: the ones AdamW updates, clipping measures and grads/ holds."""
        return [(n, p) for n, p in self.named_contract_parameters() if is_trainable(n)]


def is_trainable(name):
    """False only for the MoE selection bias, which the bias rule moves instead of AdamW."""
    return not name.endswith(".moe.router.bias")


def _mlp_contract(prefix, mlp):
    out = [(prefix + "fc.w", mlp.fc.weight)]
    if mlp.fc.bias is not None:
        out.append((prefix + "fc.b", mlp.fc.bias))
    out.append((prefix + "proj.w", mlp.proj.weight))
    if mlp.proj.bias is not None:
        out.append((prefix + "proj.b", mlp.proj.bias))
    return out


def _moe_contract(prefix, moe):
    """The router (and its selection bias), the shared experts, then the routed experts (the
    engine keeps these last, as a parameter group of their own)."""
    out = [(prefix + "router.w", moe.router.weight)]
    if moe.selection_bias is not None:
        out.append((prefix + "router.bias", moe.selection_bias))
    if moe.shared is not None:
        out += _mlp_contract(prefix + "shared.", moe.shared)
    if moe.shared_gate is not None:
        out.append((prefix + "shared_gate.w", moe.shared_gate.weight))
    experts = moe.experts
    out.append((prefix + "experts.fc.w", experts.fc_w))
    if experts.fc_b is not None:
        out.append((prefix + "experts.fc.b", experts.fc_b))
    out.append((prefix + "experts.proj.w", experts.proj_w))
    if experts.proj_b is not None:
        out.append((prefix + "experts.proj.b", experts.proj_b))
    return out


def build_model(cfg):
    """Builds the model described by `cfg` (see normalize_config) with torch's default init."""
    return Transformer(cfg)


def parameter_count(model):
    """Trained parameters (the MoE selection biases are not counted, as in the C++ count)."""
    return sum(p.numel() for _, p in model.named_trainable_parameters())


def init_parameters(model, seed=0, std=0.02):
    """GPT-2 style init: normal(0, std) for embeddings and linear weights (router and expert fc
    included; output projections, the experts' too, scaled by 1/sqrt(2*layers)), ones for norm
    weights, zeros for biases and MoE selection biases. Deterministic in seed."""
    gen = torch.Generator().manual_seed(seed)
    proj_std = std / math.sqrt(2 * model.cfg["layers"])
    with torch.no_grad():
        for name, p in model.named_contract_parameters():
            if name.endswith(".b") or not is_trainable(name):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                s = proj_std if name.endswith("proj.w") else std
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * s)


def decay_groups(model, weight_decay):
    """AdamW parameter groups of the trained parameters: weights (ndim >= 2) decay; norms and
    biases (including the [E, C] moe.experts.proj.b) do not (contract order)."""
    named = list(model.named_trainable_parameters())

    def decays(name, p):
        return p.ndim >= 2 and not name.endswith(".b")

    return [
        {"params": [p for n, p in named if decays(n, p)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0},
    ]


def lr_multiplier(step, cfg):
    """Factor on the peak lr at step s = 0, 1, ...: linear warmup over warmup_steps, then
    cosine/linear decay to min_lr_ratio over the remaining steps, or constant."""
    warmup = int(cfg.get("warmup_steps", 0))
    steps = int(cfg["steps"])
    schedule = cfg.get("schedule", "cosine")
    if schedule not in ("cosine", "linear", "constant"):
        raise ConfigError("schedule: unknown schedule %r (expected cosine, linear or constant)"
                          % (schedule,))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    progress = min(1.0, max(0.0, progress))
    ratio = float(cfg.get("min_lr_ratio", 0.0))
    if schedule == "cosine":
        return ratio + 0.5 * (1.0 - ratio) * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 + (ratio - 1.0) * progress
    return 1.0


def make_optimizer(model, cfg):
    """AdamW + LambdaLR exactly as the training contract states."""
    opt = torch.optim.AdamW(decay_groups(model, float(cfg["weight_decay"])), lr=float(cfg["lr"]),
                            betas=(float(cfg["beta1"]), float(cfg["beta2"])),
                            eps=float(cfg["eps"]))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(s, cfg))
    return opt, sched


# ---- Parameter files ------------------------------------------------------------------------

_NP_DTYPES = {"f32": np.dtype("<f4"), "f64": np.dtype("<f8")}


def read_params_txt(path):
    """Parses params.txt into [(name, shape tuple)]. Raises ValueError on a malformed line."""
    entries = []
    with open(path, "r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                shape = tuple(int(x) for x in fields[1:])
            except ValueError:
                raise ValueError("%s:%d: dimensions must be integers: %r" % (path, lineno, line.strip()))
            if not shape or any(d < 1 for d in shape):
                raise ValueError("%s:%d: bad shape for %s" % (path, lineno, fields[0]))
            entries.append((fields[0], shape))
    return entries


def write_params_txt(model, path):
    with open(path, "w", encoding="utf-8") as f:
        for name, p in model.named_contract_parameters():
            f.write(" ".join([name] + [str(d) for d in p.shape]) + "\n")


def check_params_txt(model, entries):
    """Raises ValueError unless `entries` lists exactly the model's parameters in order."""
    expected = [(n, tuple(p.shape)) for n, p in model.named_contract_parameters()]
    if entries == expected:
        return
    for i, (want, got) in enumerate(zip(expected, entries)):
        if want != got:
            raise ValueError("params.txt line %d: expected %s %s, got %s %s"
                             % (i + 1, want[0], list(want[1]), got[0], list(got[1])))
    raise ValueError("params.txt lists %d parameters, the model has %d"
                     % (len(entries), len(expected)))


def read_array(path, shape, ext):
    """Reads a raw little-endian array of `shape`; raises ValueError on a size mismatch."""
    dtype = _NP_DTYPES[ext]
    want = int(np.prod(shape))
    data = np.fromfile(path, dtype=dtype)
    if data.size != want or os.path.getsize(path) != want * dtype.itemsize:
        raise ValueError("%s: expected %d %s values (shape %s), file has %d bytes"
                         % (path, want, ext, list(shape), os.path.getsize(path)))
    return data.reshape(shape)


def write_array(path, tensor, ext):
    arr = tensor.detach().cpu().numpy().astype(_NP_DTYPES[ext], copy=False)
    np.ascontiguousarray(arr).tofile(path)


def load_params(model, directory, ext="f32"):
    """Copies `<directory>/<name>.<ext>` into each contract parameter (converted to its dtype)."""
    with torch.no_grad():
        for name, p in model.named_contract_parameters():
            path = os.path.join(directory, name + "." + ext)
            if not os.path.exists(path):
                raise FileNotFoundError("missing parameter file %s" % path)
            arr = read_array(path, tuple(p.shape), ext)
            p.copy_(torch.from_numpy(arr.astype(np.float64)).to(p.dtype))


def save_params(model, directory, ext="f32"):
    """Writes each contract parameter to `<directory>/<name>.<ext>`."""
    os.makedirs(directory, exist_ok=True)
    for name, p in model.named_contract_parameters():
        write_array(os.path.join(directory, name + "." + ext), p, ext)


def save_grads(model, directory, ext="f64"):
    """Writes each trained parameter's .grad (zeros where None) to `<directory>/<name>.<ext>`;
    the MoE selection biases, which have no gradient, get no file."""
    os.makedirs(directory, exist_ok=True)
    for name, p in model.named_trainable_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        write_array(os.path.join(directory, name + "." + ext), g, ext)
