#!/usr/bin/python3
"""Tests of the Hugging Face format oracle (hf_oracle.py).

selftest.py (CTest torch_oracle_selftest) runs these too; this file also runs alone. Tiny random
GPT-2 and Llama (grouped-query: 4 heads, 2 key/value heads) models are written in Hugging Face's
layout with a safetensors writer of this file's own, then hf_oracle.py's logits are compared with
torch_model.py on the same weights mapped into Trainyard's contract (which shares no code with
it), in F32, BF16, F16, a single file and shards. Then causality, RoPE at position 0, greedy
generation, and every kind of malformed input, each of which must exit 2 with one line.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_oracle  # noqa: E402

hf_oracle.load_torch()
from oracle_testutil import moe_cfg, random_model, random_tokens, small_cfg  # noqa: E402
import torch_model  # noqa: E402

torch.set_num_threads(1)
ORACLE = os.path.join(HERE, "hf_oracle.py")


# ---- writing a model directory ------------------------------------------------------------------

def encode(array, dtype):
    """Little-endian bytes of `array` in safetensors dtype F32, F16 or BF16 (BF16 through torch's
    round-to-nearest-even conversion, independent of the oracle's decoder)."""
    if dtype == "F32":
        return np.ascontiguousarray(array, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(array, dtype="<f2").tobytes()
    bf16 = torch.from_numpy(np.asarray(array, dtype=np.float32)).to(torch.bfloat16)
    return bf16.view(torch.int16).numpy().astype("<i2").tobytes()


def stored_value(array, dtype):
    """The float64 values that `array` has once stored as `dtype`."""
    if dtype == "F32":
        return np.asarray(array, np.float32).astype(np.float64)
    if dtype == "F16":
        return np.asarray(array, np.float16).astype(np.float64)
    return torch.from_numpy(np.asarray(array, np.float32)).to(torch.bfloat16).double().numpy()


def write_safetensors(path, tensors, edit_header=None, header_len=None, junk_after=None):
    """Writes [(name, dtype, array)] in order, the data contiguous, the header padded with spaces
    to a multiple of 8 bytes as the reference writer does. Corruptions for the tests:
    edit_header(header dict) changes the header before it is encoded; header_len overrides the
    length prefix; junk_after = (name, n) puts n stray bytes after that tensor's data."""
    header = {"__metadata__": {"format": "pt"}}
    chunks, size = [], 0  # in pieces: growing one bytes object copies it again for each tensor
    for name, dtype, array in tensors:
        raw = encode(array, dtype)
        header[name] = {"dtype": dtype, "shape": list(np.shape(array)),
                        "data_offsets": [size, size + len(raw)]}
        chunks.append(raw)
        size += len(raw)
        if junk_after is not None and junk_after[0] == name:
            chunks.append(b"\x00" * junk_after[1])
            size += junk_after[1]
    if edit_header is not None:
        edit_header(header)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write((len(text) if header_len is None else header_len).to_bytes(8, "little"))
        f.write(text)
        for chunk in chunks:
            f.write(chunk)


def gpt2_hf_tensors(cfg, params, prefix=""):
    """[(HF name, array)] of a contract GPT-2 (numpy params by contract name): Conv1D weights
    are the transposes of the contract's [out, in] linear weights."""
    out = [(prefix + "wte.weight", params["wte"]), (prefix + "wpe.weight", params["wpe"])]
    for i in range(cfg["layers"]):
        c, p = "h.%d." % i, prefix + "h.%d." % i
        out += [(p + "ln_1.weight", params[c + "ln1.w"]), (p + "ln_1.bias", params[c + "ln1.b"]),
                (p + "attn.c_attn.weight", params[c + "attn.qkv.w"].T),
                (p + "attn.c_attn.bias", params[c + "attn.qkv.b"]),
                (p + "attn.c_proj.weight", params[c + "attn.proj.w"].T),
                (p + "attn.c_proj.bias", params[c + "attn.proj.b"]),
                (p + "ln_2.weight", params[c + "ln2.w"]), (p + "ln_2.bias", params[c + "ln2.b"]),
                (p + "mlp.c_fc.weight", params[c + "mlp.fc.w"].T),
                (p + "mlp.c_fc.bias", params[c + "mlp.fc.b"]),
                (p + "mlp.c_proj.weight", params[c + "mlp.proj.w"].T),
                (p + "mlp.c_proj.bias", params[c + "mlp.proj.b"])]
    out += [(prefix + "ln_f.weight", params["lnf.w"]), (prefix + "ln_f.bias", params["lnf.b"])]
    if not cfg["tied_embeddings"]:
        out.append(("lm_head.weight", params["lm_head.w"]))
    return out


def gpt2_hf_config(cfg):
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "vocab_size": cfg["vocab"], "n_positions": cfg["max_seq"], "n_embd": cfg["width"],
            "n_layer": cfg["layers"], "n_head": cfg["heads"],
            "n_inner": None if cfg["ffn_hidden"] == 4 * cfg["width"] else cfg["ffn_hidden"],
            "layer_norm_epsilon": cfg["norm_eps"], "activation_function": "gelu_new",
            "tie_word_embeddings": cfg["tied_embeddings"]}


def llama_hf_tensors(cfg, params, mlp=True):
    """[(HF name, array)] of a contract Llama: the fused qkv and gate/up weights split (without
    the MLPs when not `mlp`)."""
    H, KV, F_ = cfg["heads"], cfg["kv_heads"], cfg["ffn_hidden"]
    D = cfg.get("head_dim") or cfg["width"] // H
    out = [("model.embed_tokens.weight", params["wte"])]
    for i in range(cfg["layers"]):
        c, p = "h.%d." % i, "model.layers.%d." % i
        qkv = params[c + "attn.qkv.w"]
        out += [(p + "input_layernorm.weight", params[c + "ln1.w"]),
                (p + "self_attn.q_proj.weight", qkv[:H * D]),
                (p + "self_attn.k_proj.weight", qkv[H * D:(H + KV) * D]),
                (p + "self_attn.v_proj.weight", qkv[(H + KV) * D:])]
        if cfg.get("qkv_bias"):  # Qwen2's
            b = params[c + "attn.qkv.b"]
            out += [(p + "self_attn.q_proj.bias", b[:H * D]),
                    (p + "self_attn.k_proj.bias", b[H * D:(H + KV) * D]),
                    (p + "self_attn.v_proj.bias", b[(H + KV) * D:])]
        if cfg.get("qk_norm"):  # Qwen3's
            out += [(p + "self_attn.q_norm.weight", params[c + "attn.q_norm.w"]),
                    (p + "self_attn.k_norm.weight", params[c + "attn.k_norm.w"])]
        out += [(p + "self_attn.o_proj.weight", params[c + "attn.proj.w"]),
                (p + "post_attention_layernorm.weight", params[c + "ln2.w"])]
        if mlp:
            fc = params[c + "mlp.fc.w"]
            out += [(p + "mlp.gate_proj.weight", fc[:F_]), (p + "mlp.up_proj.weight", fc[F_:]),
                    (p + "mlp.down_proj.weight", params[c + "mlp.proj.w"])]
    out.append(("model.norm.weight", params["lnf.w"]))
    if not cfg["tied_embeddings"]:
        out.append(("lm_head.weight", params["lm_head.w"]))
    return out


def olmo2_hf_tensors(cfg, params):
    """[(HF name, array)] of a contract Llama without norms before its branches (OLMo 2's layout):
    Llama's tensors less input_layernorm, the contract's attn.post_norm.w and mlp.post_norm.w as
    post_attention_layernorm and post_feedforward_layernorm."""
    view = dict(params)
    for i in range(cfg["layers"]):
        c = "h.%d." % i
        view[c + "ln1.w"], view[c + "ln2.w"] = None, params[c + "attn.post_norm.w"]
    out = [(name, array) for name, array in llama_hf_tensors(cfg, view) if array is not None]
    for i in range(cfg["layers"]):
        out.append(("model.layers.%d.post_feedforward_layernorm.weight" % i,
                    params["h.%d.mlp.post_norm.w" % i]))
    return out


def llama_hf_config(cfg):
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
            "vocab_size": cfg["vocab"], "hidden_size": cfg["width"],
            "intermediate_size": cfg["ffn_hidden"], "num_hidden_layers": cfg["layers"],
            "num_attention_heads": cfg["heads"], "num_key_value_heads": cfg["kv_heads"],
            "max_position_embeddings": cfg["max_seq"], "rms_norm_eps": cfg["norm_eps"],
            "rope_theta": cfg["rope_theta"], "tie_word_embeddings": cfg["tied_embeddings"],
            "hidden_act": "silu", "torch_dtype": "float32", "head_dim": cfg.get("head_dim")}


def gemma_hf_tensors(cfg, params):
    """[(HF name, array)] of a contract Llama in Gemma's layout: Llama's tensors with every norm
    weight w stored as w - 1 (the model multiplies by 1 + w). With post_norms (Gemma 2's and 3's
    four norms per layer) Llama's post_attention_layernorm, the MLP's input norm, is
    pre_feedforward_layernorm, and the contract's attn.post_norm.w and mlp.post_norm.w are
    post_attention_layernorm and post_feedforward_layernorm."""
    out = []
    for name, array in llama_hf_tensors(cfg, params):
        if cfg.get("post_norms"):
            name = name.replace("post_attention_layernorm", "pre_feedforward_layernorm")
        out.append((name, array - 1.0 if name.endswith("norm.weight") else array))
    if cfg.get("post_norms"):
        for i in range(cfg["layers"]):
            c, p = "h.%d." % i, "model.layers.%d." % i
            out += [(p + "post_attention_layernorm.weight", params[c + "attn.post_norm.w"] - 1.0),
                    (p + "post_feedforward_layernorm.weight",
                     params[c + "mlp.post_norm.w"] - 1.0)]
    return out


def gemma2_hf_config(cfg):
    """Gemma 2's config.json of a contract Llama with GeGLU, scaled embeddings, post_norms, tied
    embeddings and the window on the even layers (full_attention_layers the odd ones); the
    soft-caps of 0 (none) are written null."""
    config = dict(llama_hf_config(cfg), model_type="gemma2", architectures=["Gemma2ForCausalLM"],
                  hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                  query_pre_attn_scalar=cfg.get("attention_scale_dim") or cfg["head_dim"],
                  attn_logit_softcapping=cfg.get("attention_softcap") or None,
                  final_logit_softcapping=cfg.get("logit_softcap") or None,
                  sliding_window=cfg["sliding_window"])
    del config["hidden_act"]
    return config


def phi3_hf_tensors(cfg, params):
    """[(HF name, array)] of a contract Llama in Phi-3's layout: Llama's tensors, with each
    block's q, k and v projections stacked in self_attn.qkv_proj and gate and up in
    mlp.gate_up_proj."""
    out, pending = [], {}
    for name, array in llama_hf_tensors(cfg, params):
        prefix, _, leaf = name.rpartition(".self_attn.")
        if leaf in ("q_proj.weight", "k_proj.weight", "v_proj.weight"):
            pending[leaf] = array
            if len(pending) == 3:
                stacked = [pending[k + "_proj.weight"] for k in ("q", "k", "v")]
                out.append((prefix + ".self_attn.qkv_proj.weight", np.concatenate(stacked)))
                pending = {}
            continue
        prefix, _, leaf = name.rpartition(".mlp.")
        if leaf in ("gate_proj.weight", "up_proj.weight"):
            pending[leaf] = array
            if len(pending) == 2:
                out.append((prefix + ".mlp.gate_up_proj.weight", np.concatenate(
                    [pending["gate_proj.weight"], pending["up_proj.weight"]])))
                pending = {}
            continue
        out.append((name, array))
    return out


def paired_hf_tensors(cfg, params, interleave=True, tensors=None):
    """[(HF name, array)] of a contract Llama for RoPE in neighbouring pairs (GLM's, ERNIE 4.5's,
    Helium's): Llama's tensors (or `tensors`, names in Llama's layout) with each head's first
    rope_dim rows of q and k (weights and biases) interleaved, the contract's rotate-half pair
    (i, i + R/2) stored as the neighbours (2i, 2i + 1); as they are without `interleave`."""
    D = cfg.get("head_dim") or cfg["width"] // cfg["heads"]
    R = cfg.get("rope_dim") or D

    def interleaved(rows):
        out = rows.copy()
        for base in range(0, rows.shape[0], D):
            out[base:base + R:2] = rows[base:base + R // 2]
            out[base + 1:base + R:2] = rows[base + R // 2:base + R]
        return out

    turned = ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")
    return [(name, interleaved(array) if interleave and name.endswith(turned) else array)
            for name, array in (llama_hf_tensors(cfg, params) if tensors is None else tensors)]


def glm_hf_tensors(cfg, params, interleave=True):
    """[(HF name, array)] of a contract Llama in GLM's layout: paired_hf_tensors' with gate and up
    stacked in mlp.gate_up_proj. With post_norms (GLM-4's), the contract's attn.post_norm.w and
    mlp.post_norm.w are post_self_attn_layernorm and post_mlp_layernorm."""
    out, gate = [], None
    for name, array in paired_hf_tensors(cfg, params, interleave):
        if name.endswith("mlp.gate_proj.weight"):
            gate = array
        elif name.endswith("mlp.up_proj.weight"):
            out.append((name.replace("up_proj", "gate_up_proj"), np.concatenate([gate, array])))
        else:
            out.append((name, array))
    if cfg.get("post_norms"):
        for i in range(cfg["layers"]):
            c, p = "h.%d." % i, "model.layers.%d." % i
            out += [(p + "post_self_attn_layernorm.weight", params[c + "attn.post_norm.w"]),
                    (p + "post_mlp_layernorm.weight", params[c + "mlp.post_norm.w"])]
    return out


def mixtral_hf_tensors(cfg, params):
    """[(HF name, array)] of a contract Llama MoE of Mixtral's shape: Llama's attention, the
    router as block_sparse_moe.gate, expert j's gate and up rows of the experts' fc as its w1 and
    w3, and its [C, F] slab of the experts' proj as its w2."""
    E, F_ = cfg["moe"]["experts"], cfg["moe"]["ffn"]

    def experts(c, p, fc, proj):
        out = [(p + "gate.weight", params[c + "router.w"])]
        for j in range(E):
            e = p + "experts.%d." % j
            out += [(e + "w1.weight", fc[2 * j * F_:(2 * j + 1) * F_]),
                    (e + "w2.weight", proj[j]),
                    (e + "w3.weight", fc[(2 * j + 1) * F_:(2 * j + 2) * F_])]
        return out

    return sparse_hf_tensors(cfg, params, experts)


def sparse_hf_tensors(cfg, params, experts):
    """[(HF name, array)] of a contract Llama MoE with every block sparse: Llama's attention, then
    each block's experts(contract prefix, block_sparse_moe prefix, experts' fc, experts' proj)."""
    out = []
    for name, array in llama_hf_tensors(cfg, params, mlp=False):
        out.append((name, array))
        if name.endswith("post_attention_layernorm.weight"):
            i = int(name.split(".")[2])
            c, p = "h.%d.moe." % i, "model.layers.%d.block_sparse_moe." % i
            out += experts(c, p, params[c + "experts.fc.w"], params[c + "experts.proj.w"])
    return out


def mixtral_hf_config(cfg):
    config = llama_hf_config(cfg)
    config.update({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                   "intermediate_size": cfg["moe"]["ffn"],
                   "num_local_experts": cfg["moe"]["experts"],
                   "num_experts_per_tok": cfg["moe"]["top_k"], "sliding_window": None})
    return config


def qwen3_moe_hf_tensors(cfg, params):
    """[(HF name, array)] of a contract Llama MoE of Qwen3-MoE's shape: Qwen3's attention, and in
    an MoE block the router as mlp.gate and expert j's gate and up rows of the experts' fc and its
    [C, F] slab of the experts' proj as mlp.experts.j.gate_proj, up_proj, down_proj; the other
    blocks keep Llama's MLP."""
    E, F_ = cfg["moe"]["experts"], cfg["moe"]["ffn"]
    F_dense = cfg["ffn_hidden"]
    normalized = torch_model.normalize_config(cfg)
    out = []
    for name, array in llama_hf_tensors(cfg, params, mlp=False):
        out.append((name, array))
        if not name.endswith("post_attention_layernorm.weight"):
            continue
        i = int(name.split(".")[2])
        p = "model.layers.%d.mlp." % i
        if not torch_model.is_moe_layer(normalized, i):
            fc = params["h.%d.mlp.fc.w" % i]
            out += [(p + "gate_proj.weight", fc[:F_dense]), (p + "up_proj.weight", fc[F_dense:]),
                    (p + "down_proj.weight", params["h.%d.mlp.proj.w" % i])]
            continue
        c = "h.%d.moe." % i
        fc, proj = params[c + "experts.fc.w"], params[c + "experts.proj.w"]
        out.append((p + "gate.weight", params[c + "router.w"]))
        for j in range(E):
            e = p + "experts.%d." % j
            out += [(e + "gate_proj.weight", fc[2 * j * F_:(2 * j + 1) * F_]),
                    (e + "up_proj.weight", fc[(2 * j + 1) * F_:(2 * j + 2) * F_]),
                    (e + "down_proj.weight", proj[j])]
    return out


def shared_expert_hf_tensors(cfg, params, shared, gate=False, router_bias=False):
    """qwen3_moe_hf_tensors' tensors and, after each MoE block's router, with `router_bias` its
    selection bias as mlp.gate.e_score_correction_bias, the shared experts' fc rows (gate, then
    up) and proj as mlp.<shared>.gate_proj, up_proj, down_proj, and with `gate` their gate as
    mlp.shared_expert_gate."""
    S = cfg["moe"]["shared_experts"] * cfg["moe"]["ffn"]
    out = []
    for name, array in qwen3_moe_hf_tensors(cfg, params):
        out.append((name, array))
        if not name.endswith(".mlp.gate.weight"):
            continue
        i = int(name.split(".")[2])
        c, p = "h.%d.moe." % i, "model.layers.%d.mlp." % i
        if router_bias:
            out.append((p + "gate.e_score_correction_bias", params[c + "router.bias"]))
        fc = params[c + "shared.fc.w"]
        out += [(p + shared + ".gate_proj.weight", fc[:S]),
                (p + shared + ".up_proj.weight", fc[S:]),
                (p + shared + ".down_proj.weight", params[c + "shared.proj.w"])]
        if gate:
            out.append((p + "shared_expert_gate.weight", params[c + "shared_gate.w"]))
    return out


def glm4_moe_hf_tensors(cfg, params, mtp_layer=False):
    """[(HF name, array)] of a contract Llama MoE of GLM-4.5's shape: Qwen3-MoE's tensors (Llama's
    MLP in the blocks below moe.dense_first), the routers' selection biases and the ungated shared
    experts mlp.shared_experts. With `mtp_layer`, a multi-token prediction layer's tensors after
    the model's layers, as GLM-4.5's checkpoints hold one."""
    out = shared_expert_hf_tensors(cfg, params, "shared_experts", router_bias=True)
    if mtp_layer:
        C, L = cfg["width"], cfg["layers"]
        out += [("model.layers.%d.eh_proj.weight" % L, np.ones((C, 2 * C))),
                ("model.layers.%d.enorm.weight" % L, np.ones(C))]
    return out


def deepseek_v3_hf_tensors(cfg, params):
    """[(HF name, array)] of a contract Llama with latent attention in DeepSeek-V3's (and V2's)
    layout: the blocks' other tensors as GLM-4.5's (without the selection bias for V2's softmax
    routing; Llama's, dense); each query head's contract rows
    [rope | nope] stored [nope | rope] and every rope part (the query heads' and the shared key's,
    last in kv_a_proj_with_mqa) in neighbouring pairs, contract row i as row 2i and row R/2 + i as
    row 2i + 1 (rope_interleave)."""
    c = torch_model.normalize_config(cfg)
    latent, H, R, K = c["latent_attention"], c["heads"], c["rope_dim"], c["latent_attention"]["kv_rank"]

    def pairs(rows):
        return np.stack([rows[:R // 2], rows[R // 2:]], axis=1).reshape(rows.shape)

    def heads(w):
        return np.concatenate([np.concatenate([h[R:], pairs(h[:R])]) for h in np.split(w, H)])

    view = dict(params)
    for i in range(c["layers"]):
        view["h.%d.attn.qkv.w" % i] = np.zeros((1, 1))
    moe = cfg.get("moe")
    base = (shared_expert_hf_tensors(cfg, view, "shared_experts",
                                     router_bias=moe["balance"] == "bias")
            if moe else llama_hf_tensors(cfg, view))
    out = [(name, array) for name, array in base if ".self_attn." not in name]
    for i in range(c["layers"]):
        w, a = "h.%d.attn." % i, "model.layers.%d.self_attn." % i
        if latent["q_rank"]:
            out += [(a + "q_a_proj.weight", params[w + "q_a.w"]),
                    (a + "q_a_layernorm.weight", params[w + "q_a_norm.w"]),
                    (a + "q_b_proj.weight", heads(params[w + "q_b.w"]))]
        else:
            out.append((a + "q_proj.weight", heads(params[w + "q.w"])))
        kv_a = params[w + "kv_a.w"]
        out += [(a + "kv_a_proj_with_mqa.weight", np.concatenate([kv_a[:K], pairs(kv_a[K:])])),
                (a + "kv_a_layernorm.weight", params[w + "kv_a_norm.w"]),
                (a + "kv_b_proj.weight", params[w + "kv_b.w"]),
                (a + "o_proj.weight", params[w + "proj.w"])]
    return out


def deepseek_v3_hf_config(cfg):
    """config.json of DeepSeek-V3 for a contract Llama with latent attention (and GLM-4.5's
    experts, or null ones)."""
    c = torch_model.normalize_config(cfg)
    latent, moe = c["latent_attention"], cfg.get("moe")
    config = dict(llama_hf_config(cfg), model_type="deepseek_v3",
                  architectures=["DeepseekV3ForCausalLM"], head_dim=c["rope_dim"],
                  qk_rope_head_dim=c["rope_dim"], qk_nope_head_dim=c["head_dim"] - c["rope_dim"],
                  v_head_dim=latent["value_dim"], kv_lora_rank=latent["kv_rank"],
                  q_lora_rank=latent["q_rank"] or None, n_routed_experts=None)
    if moe:
        config.update(moe_intermediate_size=moe["ffn"], n_routed_experts=moe["experts"],
                      num_experts_per_tok=moe["top_k"], n_shared_experts=moe["shared_experts"],
                      first_k_dense_replace=moe["dense_first"],
                      routed_scaling_factor=moe["routed_scale"], norm_topk_prob=True,
                      n_group=1, topk_group=1, num_nextn_predict_layers=0)
    return config


def ernie_moe_hf_tensors(cfg, params, mtp=False):
    """[(HF name, array)] of a contract Llama MoE of ERNIE 4.5's MoE shape: GLM-4.5's tensors with
    the q and k rows interleaved for RoPE in neighbouring pairs, and the selection bias [1, E] as
    mlp.moe_statics.e_score_correction_bias. With `mtp`, multi-token prediction tensors as the
    published checkpoints hold them."""
    out = []
    for name, array in paired_hf_tensors(cfg, params, tensors=glm4_moe_hf_tensors(cfg, params)):
        if name.endswith("mlp.gate.e_score_correction_bias"):
            name, array = name.replace("gate.", "moe_statics."), array[None, :]
        out.append((name, array))
    if mtp:
        C = cfg["width"]
        out += [("model.mtp_linear_proj.0.weight", np.ones((C, 2 * C))),
                ("model.mtp_hidden_norm.0.weight", np.ones(C))]
    return out


def qwen2_moe_hf_tensors(cfg, params):
    """[(HF name, array)] of a contract Llama MoE of Qwen2-MoE's shape: Qwen3-MoE's tensors (with
    Qwen2's biases on q, k and v) and the shared experts mlp.shared_expert, gated by
    mlp.shared_expert_gate."""
    return shared_expert_hf_tensors(cfg, params, "shared_expert", gate=True)


def contract_params(model):
    return {n: p.detach().numpy().copy() for n, p in model.named_contract_parameters()}


# ---- the tests ----------------------------------------------------------------------------------

class HfOracleTest(unittest.TestCase):
    BATCH, SEQ = 2, 7

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hf_oracle_selftest_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write_model(self, label, hf_config, tensors, dtype="F32", shards=1, **corruption):
        """A model directory with config.json and `tensors` [(name, array)] as one
        model.safetensors, or split round-robin into `shards` files with an index."""
        model_dir = os.path.join(self.tmp, label)
        os.makedirs(model_dir)
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(hf_config, f)
        typed = [(name, dtype, array) for name, array in tensors]
        if shards == 1:
            write_safetensors(os.path.join(model_dir, "model.safetensors"), typed, **corruption)
            return model_dir
        weight_map = {}
        for s in range(shards):
            shard = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
            write_safetensors(os.path.join(model_dir, shard), typed[s::shards])
            weight_map.update({name: shard for name, _, _ in typed[s::shards]})
        with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
        return model_dir

    def run_oracle(self, model_dir, tokens, *extra):
        """(CompletedProcess, OUT_DIR) of hf_oracle.py on int64 tokens [B, T]."""
        tokens_path = model_dir + ".tokens.i32"
        np.asarray(tokens, "<i4").tofile(tokens_path)
        out_dir = model_dir + ".out"
        proc = subprocess.run(
            [sys.executable, ORACLE, model_dir, tokens_path, out_dir, "--batch",
             str(tokens.shape[0]), "--seq", str(tokens.shape[1])] + list(extra),
            capture_output=True, text=True, check=False)
        return proc, out_dir

    def oracle_logits(self, model_dir, tokens, vocab):
        proc, out_dir = self.run_oracle(model_dir, tokens)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, "")
        path = os.path.join(out_dir, "logits.f64")
        self.assertEqual(os.path.getsize(path), 8 * tokens.size * vocab)
        return np.fromfile(path, "<f8").reshape(tokens.shape + (vocab,))

    def check_against_torch_model(self, label, cfg, to_hf, hf_config, dtype="F32", shards=1,
                                  norms_from_half=False):
        """hf_oracle's logits on the HF layout equal torch_model's on the contract layout, with
        the weights rounded to `dtype` on both sides. With `norms_from_half` the norms' weights
        are kept at 0.5 or more, where Gemma's stored w - 1 is exact in `dtype` F32. Returns
        (model_dir, tokens, logits); the weights as written stay in self.written_params."""
        model = random_model(cfg, seed=len(label))
        params = {n: stored_value(v, dtype) for n, v in contract_params(model).items()}
        if norms_from_half:
            params = {n: np.maximum(v, 0.5) if n.endswith(("norm.w", "ln1.w", "ln2.w", "lnf.w"))
                      else v for n, v in params.items()}
        self.written_params = params
        with torch.no_grad():
            for name, p in model.named_contract_parameters():
                p.copy_(torch.from_numpy(params[name]))
        model_dir = self.write_model(label, hf_config, to_hf(params), dtype, shards)
        tokens = random_tokens(cfg, self.BATCH, self.SEQ, seed=len(label)).numpy()
        got = self.oracle_logits(model_dir, tokens, cfg["vocab"])
        with torch.no_grad():
            want = model(torch.from_numpy(tokens)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11, err_msg=label)
        self.assertGreater(np.abs(want).max(), 0.1)  # a non-trivial comparison
        return model_dir, tokens, got

    def test_gpt2_tied_matches_torch_model(self):
        cfg = small_cfg("gpt2")  # n_inner 4*n_embd, written as null
        self.check_against_torch_model("gpt2", cfg, lambda p: gpt2_hf_tensors(cfg, p),
                                       gpt2_hf_config(cfg))

    def test_gpt2_untied_prefixed_bf16_with_mask_buffers(self):
        # transformer.* names, BF16 weights and the legacy attn.bias / attn.masked_bias buffers
        # of old checkpoints (not weights; ignored), n_inner given explicitly.
        cfg = small_cfg("gpt2", tied_embeddings=False, ffn_hidden=24)
        T = cfg["max_seq"]

        def to_hf(params):
            tensors = gpt2_hf_tensors(cfg, params, prefix="transformer.")
            for i in range(cfg["layers"]):
                tensors += [("transformer.h.%d.attn.bias" % i, np.tril(np.ones((1, 1, T, T)))),
                            ("transformer.h.%d.attn.masked_bias" % i, np.array(-1e4))]
            return tensors

        self.check_against_torch_model("gpt2_bf16", cfg, to_hf, gpt2_hf_config(cfg), "BF16")

    def test_llama_gqa_sharded_matches_torch_model(self):
        cfg = small_cfg("llama")
        self.assertEqual((cfg["heads"], cfg["kv_heads"]), (4, 2))
        self.check_against_torch_model("llama", cfg, lambda p: llama_hf_tensors(cfg, p),
                                       llama_hf_config(cfg), shards=3)

    def test_llama_tied_f16_matches_torch_model(self):
        cfg = small_cfg("llama", tied_embeddings=True, rope_theta=500.0)
        self.check_against_torch_model("llama_f16", cfg, lambda p: llama_hf_tensors(cfg, p),
                                       llama_hf_config(cfg), "F16")

    def test_granite_matches_torch_model(self):
        # Granite's four multipliers; then transformers' defaults (every one 1, the scores'
        # factor too, where torch_model's attention_multiplier 1 says the same).
        cfg = small_cfg("llama", tied_embeddings=True, embedding_multiplier=6.0,
                        residual_multiplier=0.5, attention_multiplier=0.0625, logits_scaling=2.0)
        hf = dict(llama_hf_config(cfg), model_type="granite", architectures=["GraniteForCausalLM"],
                  embedding_multiplier=6.0, residual_multiplier=0.5, attention_multiplier=0.0625,
                  logits_scaling=2.0)
        self.check_against_torch_model("granite", cfg, lambda p: llama_hf_tensors(cfg, p), hf)
        plain = small_cfg("llama", attention_multiplier=1.0)
        hf = dict(llama_hf_config(plain), model_type="granite")
        self.check_against_torch_model("granite_defaults", plain,
                                       lambda p: llama_hf_tensors(plain, p), hf)

    def test_smollm3_matches_torch_model(self):
        # The second of the layers without RoPE (no_rope_layers), tied by SmolLM3's default.
        cfg = small_cfg("llama", tied_embeddings=True, nope_layers=[1])
        hf = dict(llama_hf_config(cfg), model_type="smollm3",
                  architectures=["SmolLM3ForCausalLM"],
                  no_rope_layers=[1 if i != 1 else 0 for i in range(cfg["layers"])])
        del hf["tie_word_embeddings"]
        self.check_against_torch_model("smollm3", cfg, lambda p: llama_hf_tensors(cfg, p), hf)

    def test_qwen2_matches_torch_model(self):
        # Llama with random biases on q, k and v; no attention_bias key, no sliding window.
        cfg = small_cfg("llama", qkv_bias=True, tied_embeddings=True)
        config = dict(llama_hf_config(cfg), model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                      use_sliding_window=False, sliding_window=4096)
        model_dir, tokens, got = self.check_against_torch_model(
            "qwen2", cfg, lambda p: llama_hf_tensors(cfg, p), config)
        # The biases matter: without them (read as Llama's tensors) the file is refused, and
        # zeroed they give other logits.
        params = contract_params(random_model(cfg, seed=len("qwen2")))  # the same weights
        for name in params:
            if name.endswith("attn.qkv.b"):
                params[name] = np.zeros_like(params[name])
        zeroed = self.write_model("qwen2_zero_bias", config, llama_hf_tensors(cfg, params))
        self.assertGreater(np.abs(self.oracle_logits(zeroed, tokens, cfg["vocab"]) - got).max(),
                           1e-3)
        llama_dir = self.write_model("qwen2_as_llama", llama_hf_config(cfg),
                                     llama_hf_tensors(cfg, params))
        proc, _ = self.run_oracle(llama_dir, tokens)
        self.assertEqual(proc.returncode, 2)
        # With use_sliding_window the window applies from layer max_window_layers on (28 by
        # default, absent here: in neither of these two layers), so these are the zeroed model's.
        sliding = dict(config, use_sliding_window=True)
        np.testing.assert_array_equal(
            self.oracle_logits(self.write_model("qwen2_sliding", sliding,
                                                llama_hf_tensors(cfg, params)), tokens,
                               cfg["vocab"]),
            self.oracle_logits(zeroed, tokens, cfg["vocab"]))

    def test_mistral_and_qwen2_sliding_windows_match_torch_model(self):
        # A window of 3 of the 7 positions in every layer: Mistral's sliding_window, and Qwen2's
        # with use_sliding_window from layer 0.
        cfg = small_cfg("llama", sliding_window=3)
        mistral = dict(llama_hf_config(cfg), model_type="mistral",
                       architectures=["MistralForCausalLM"], sliding_window=3)
        _, tokens, got = self.check_against_torch_model(
            "mistral_window", cfg, lambda p: llama_hf_tensors(cfg, p), mistral)
        # The window matters: without it the logits differ.
        unwindowed = dict(mistral, sliding_window=None)
        params = contract_params(random_model(cfg, seed=len("mistral_window")))
        full = self.write_model("mistral_full", unwindowed, llama_hf_tensors(cfg, params))
        self.assertGreater(np.abs(self.oracle_logits(full, tokens, cfg["vocab"]) - got).max(),
                           1e-3)
        # Phi-3: Mistral's model with q, k, v stacked in qkv_proj and gate, up in gate_up_proj.
        phi3 = dict(mistral, model_type="phi3", architectures=["Phi3ForCausalLM"])
        self.check_against_torch_model("phi3_window", cfg, lambda p: phi3_hf_tensors(cfg, p), phi3)
        # A partial_rotary_factor that turns an odd number of a head's 4 dimensions.
        odd = dict(phi3, partial_rotary_factor=0.25)
        proc, _ = self.run_oracle(self.write_model("phi3_odd", odd, phi3_hf_tensors(cfg, params)),
                                  tokens)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("partial_rotary_factor", proc.stderr)
        cfg = small_cfg("llama", sliding_window=3, qkv_bias=True)
        qwen2 = dict(llama_hf_config(cfg), model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                     use_sliding_window=True, sliding_window=3, max_window_layers=0)
        self.check_against_torch_model("qwen2_window", cfg, lambda p: llama_hf_tensors(cfg, p),
                                       qwen2)

    def test_ministral_matches_torch_model(self):
        # Ministral: the window of 3 in the second layer only (layer_types); without the list and
        # without sliding_window, transformers' 4096 in every layer (none of the 7 positions
        # hidden, so the logits of a window-less model).
        cfg = small_cfg("llama", sliding_window=3, full_attention_layers=[0])
        config = dict(llama_hf_config(cfg), model_type="ministral",
                      architectures=["MinistralForCausalLM"], sliding_window=3,
                      layer_types=["full_attention", "sliding_attention"])
        _, tokens, got = self.check_against_torch_model(
            "ministral", cfg, lambda p: llama_hf_tensors(cfg, p), config)
        bare = self.write_model("ministral_bare", {k: v for k, v in config.items()
                                                   if k not in ("sliding_window", "layer_types")},
                                llama_hf_tensors(cfg, self.written_params))
        plain = random_model(dict(cfg, sliding_window=0, full_attention_layers=[]))
        with torch.no_grad():
            for name, p in plain.named_contract_parameters():
                p.copy_(torch.from_numpy(self.written_params[name]))
            want = plain(torch.from_numpy(tokens)).numpy()
        np.testing.assert_allclose(self.oracle_logits(bare, tokens, cfg["vocab"]), want, rtol=0,
                                   atol=1e-5)
        self.assertGreater(np.abs(want - got).max(), 1e-4)

    def test_phi3_partial_longrope_matches_torch_model(self):
        # Phi-4 mini's RoPE, small: half of each head of 8 turns (partial_rotary_factor 0.5), with
        # LongRoPE's long factors (7 positions past an original context of 4) or its short ones
        # (an original context of 16), and the attention factor given or, without one,
        # sqrt(1 + ln 3 / ln 4) for max_position_embeddings 12 over 4.
        short, long = [1.0, 1.5], [2.0, 9.0]
        for label, original, given in (("long", 4, 1.3), ("short", 16, 1.3),
                                       ("default_factor", 4, None)):
            factor = given or math.sqrt(1 + math.log(12 / 4) / math.log(4))
            cfg = small_cfg("llama", heads=2, kv_heads=1, rope_dim=4,
                            rope_scaling={"type": "longrope", "short_factor": short,
                                          "long_factor": long, "original_max_seq": original,
                                          "attention_factor": factor})
            scaling = {"type": "longrope", "short_factor": short, "long_factor": long}
            if given:
                scaling["attention_factor"] = given
            phi3 = dict(llama_hf_config(cfg), model_type="phi3", architectures=["Phi3ForCausalLM"],
                        partial_rotary_factor=0.5, original_max_position_embeddings=original,
                        rope_scaling=scaling)
            self.check_against_torch_model("phi3_longrope_" + label, cfg,
                                           lambda p, cfg=cfg: phi3_hf_tensors(cfg, p), phi3)
        # Factors for other than the rotated pairs are refused.
        bad = dict(phi3, rope_scaling=dict(scaling, long_factor=[2.0]))
        proc, _ = self.run_oracle(self.write_model("phi3_bad_factors", bad, []),
                                  np.zeros((1, 2), np.int64))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("long_factor must be 2 positive numbers", proc.stderr)

    def test_qwen3_matches_torch_model(self):
        # Llama with heads of 6 over a width of 16 (4 heads: the attention is 24 wide) and random
        # query and key norms; attention_bias false, no sliding window.
        cfg = small_cfg("llama", qk_norm=True, head_dim=6, tied_embeddings=True)
        config = dict(llama_hf_config(cfg), model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                      attention_bias=False, use_sliding_window=False, sliding_window=None)
        model_dir, tokens, got = self.check_against_torch_model(
            "qwen3", cfg, lambda p: llama_hf_tensors(cfg, p), config)
        # The norms matter: read as Llama's tensors the file is refused, and with unit weights
        # they give other logits.
        params = contract_params(random_model(cfg, seed=len("qwen3")))  # the same weights
        for name in params:
            if name.endswith(("attn.q_norm.w", "attn.k_norm.w")):
                params[name] = np.ones_like(params[name])
        unit = self.write_model("qwen3_unit_norms", config, llama_hf_tensors(cfg, params))
        self.assertGreater(np.abs(self.oracle_logits(unit, tokens, cfg["vocab"]) - got).max(),
                           1e-3)
        llama_dir = self.write_model("qwen3_as_llama", llama_hf_config(cfg),
                                     llama_hf_tensors(cfg, params))
        proc, _ = self.run_oracle(llama_dir, tokens)
        self.assertEqual(proc.returncode, 2)

    def test_gemma_matches_torch_model(self):
        # Llama with GeGLU, embeddings times sqrt(width), one key/value head of 6 and each norm
        # stored less one; hidden_act "gelu" as Gemma's first configs wrote it (the tanh
        # approximation).
        cfg = small_cfg("llama", activation="geglu", scale_embeddings=True, head_dim=6,
                        kv_heads=1, tied_embeddings=True)
        config = dict(llama_hf_config(cfg), model_type="gemma", architectures=["GemmaForCausalLM"],
                      hidden_act="gelu", attention_bias=False)
        del config["tie_word_embeddings"]  # Gemma's default: tied

        def to_hf(params):
            return gemma_hf_tensors(cfg, params)

        model_dir, tokens, got = self.check_against_torch_model("gemma", cfg, to_hf, config,
                                                                norms_from_half=True)
        # Read as Llama's model (SiLU, unscaled embeddings, the stored weights as the norms'), the
        # same file gives other logits; an exact GELU is refused.
        llama_dir = self.write_model("gemma_as_llama", dict(config, model_type="llama",
                                                            hidden_act="silu",
                                                            tie_word_embeddings=True),
                                     to_hf(contract_params(random_model(cfg, seed=len("gemma")))))
        self.assertGreater(np.abs(self.oracle_logits(llama_dir, tokens, cfg["vocab"]) - got).max(),
                           1e-2)
        exact = self.write_model("gemma_exact_gelu", dict(config, hidden_activation="gelu"),
                                 to_hf(contract_params(random_model(cfg, seed=1))))
        proc, _ = self.run_oracle(exact, tokens)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("hidden_activation", proc.stderr)

    def test_gemma3_matches_torch_model(self):
        # Gemma's model with query and key norms, norms of the attention's and the MLP's outputs,
        # and local blocks: layer 0 with a window of 3 and RoPE base 500, layer 1 (every second:
        # sliding_window_pattern 2) global; the scores scaled by query_pre_attn_scalar 6^-0.5.
        cfg = small_cfg("llama", activation="geglu", scale_embeddings=True, qk_norm=True,
                        post_norms=True, head_dim=6, kv_heads=1, tied_embeddings=True,
                        sliding_window=3, full_attention_layers=[1], rope_local_theta=500.0)
        config = dict(llama_hf_config(cfg), model_type="gemma3_text",
                      architectures=["Gemma3ForCausalLM"], hidden_activation="gelu_pytorch_tanh",
                      query_pre_attn_scalar=6, sliding_window=3, sliding_window_pattern=2,
                      rope_local_base_freq=500.0, attention_bias=False)
        del config["hidden_act"]

        def to_hf(params):
            return gemma_hf_tensors(cfg, params)

        model_dir, tokens, got = self.check_against_torch_model("gemma3", cfg, to_hf, config,
                                                                norms_from_half=True)
        # The same layer pattern through layer_types; another pattern gives other logits.
        params = self.written_params
        typed = self.write_model("gemma3_types", dict(
            config, layer_types=["sliding_attention", "full_attention"]), to_hf(params))
        np.testing.assert_allclose(self.oracle_logits(typed, tokens, cfg["vocab"]), got,
                                   rtol=1e-11, atol=1e-11)
        swapped = self.write_model("gemma3_swapped", dict(
            config, layer_types=["full_attention", "sliding_attention"]), to_hf(params))
        self.assertGreater(
            np.abs(self.oracle_logits(swapped, tokens, cfg["vocab"]) - got).max(), 1e-3)
        # final_logit_softcapping and attn_logit_softcapping apply as torch_model's
        # logit_softcap and attention_softcap do (with query_pre_attn_scalar 8, not head_dim):
        # the logits within the cap, and those of the model with the caps.
        capped_cfg = dict(cfg, logit_softcap=2.0, attention_softcap=1.0, attention_scale_dim=8)
        capped_config = dict(config, final_logit_softcapping=2.0, attn_logit_softcapping=1.0,
                             query_pre_attn_scalar=8)
        _, capped_tokens, capped = self.check_against_torch_model(
            "gemma3_capped", capped_cfg, lambda p: gemma_hf_tensors(capped_cfg, p),
            capped_config, norms_from_half=True)
        self.assertLessEqual(np.abs(capped).max(), 2.0)
        uncapped = self.write_model("gemma3_uncapped", dict(capped_config,
                                                            final_logit_softcapping=None),
                                    gemma_hf_tensors(capped_cfg, self.written_params))
        self.assertGreater(np.abs(self.oracle_logits(uncapped, capped_tokens, cfg["vocab"])).max(),
                           2.5)  # the cap bites

    def test_glm4_matches_torch_model(self):
        # GLM-4: biases on q, k and v, half of each head of 8 turned in neighbouring pairs, and
        # the four norms per layer; then GLM's (no norms after the branches) with attention_bias
        # left to its default (true) and heads of 128 wide unless head_dim says otherwise.
        cfg = small_cfg("llama", heads=2, kv_heads=1, rope_dim=4, qkv_bias=True, post_norms=True)
        config = dict(llama_hf_config(cfg), model_type="glm4", architectures=["Glm4ForCausalLM"],
                      partial_rotary_factor=0.5, attention_bias=True, head_dim=8)
        _, tokens, got = self.check_against_torch_model(
            "glm4", cfg, lambda p: glm_hf_tensors(cfg, p), config)
        # Stored in the contract's order instead, the same weights give other logits.
        halves = self.write_model("glm4_halves", config,
                                  glm_hf_tensors(cfg, self.written_params, interleave=False))
        other = self.oracle_logits(halves, tokens, cfg["vocab"])
        self.assertGreater(np.abs(other - got).max(), 1e-4)

        plain = small_cfg("llama", heads=2, kv_heads=1, rope_dim=4, qkv_bias=True)
        config = dict(llama_hf_config(plain), model_type="glm", architectures=["GlmForCausalLM"],
                      partial_rotary_factor=0.5, head_dim=8)
        self.check_against_torch_model("glm", plain, lambda p: glm_hf_tensors(plain, p), config)
        # Scaled RoPE is refused rather than guessed.
        with self.assertRaises(hf_oracle.InputError):
            hf_oracle.Glm(hf_oracle.Config(dict(config, rope_scaling={"rope_type": "linear",
                                                                      "factor": 2.0}), "c"))

    def test_ernie45_matches_torch_model(self):
        # ERNIE 4.5: Llama's tensors with the whole of each head turned in neighbouring pairs, its
        # defaults (rope_theta 500000, tied embeddings) left out of the config.
        cfg = small_cfg("llama", heads=2, kv_heads=1, rope_theta=500000.0, tied_embeddings=True)
        config = dict(llama_hf_config(cfg), model_type="ernie4_5",
                      architectures=["Ernie4_5ForCausalLM"], use_bias=False, head_dim=8)
        del config["rope_theta"], config["tie_word_embeddings"]

        self.check_against_torch_model("ernie4_5", cfg, lambda p: paired_hf_tensors(cfg, p),
                                       config)
        with self.assertRaises(hf_oracle.InputError):
            hf_oracle.Ernie45(hf_oracle.Config(dict(config, use_bias=True), "c"))

    def test_ernie45_moe_matches_torch_model(self):
        # ERNIE 4.5's MoE: ERNIE's attention (the whole of each head turned in neighbouring
        # pairs), the first block dense, the second routed: softmax probabilities picked with a
        # selection bias (random here) and normalised, two shared experts; multi-token prediction
        # tensors the causal LM leaves alone; ERNIE's defaults left out of the config.
        cfg = moe_cfg("llama", {"shared_experts": 2, "score": "softmax", "normalize_top_k": True,
                                "balance": "bias", "dense_first": 1, "every": 1, "top_k": 2},
                      heads=2, kv_heads=1, rope_theta=500000.0, tied_embeddings=True,
                      norm_eps=1e-5)
        config = dict(llama_hf_config(cfg), model_type="ernie4_5_moe",
                      architectures=["Ernie4_5_MoeForCausalLM"], use_bias=False, head_dim=8,
                      moe_intermediate_size=cfg["moe"]["ffn"],
                      moe_num_experts=cfg["moe"]["experts"], moe_k=2, moe_num_shared_experts=2)
        for key in ("rope_theta", "tie_word_embeddings", "rms_norm_eps"):
            del config[key]
        model_dir, _, _ = self.check_against_torch_model(
            "ernie4_5_moe", cfg, lambda p: ernie_moe_hf_tensors(cfg, p, mtp=True), config)
        # Routed from the first block on, the same file misses the first block's experts.
        with self.assertRaises(hf_oracle.InputError):
            hf_oracle.load_weights(hf_oracle.Ernie45Moe(hf_oracle.Config(
                dict(config, moe_layer_start_index=0), "c")), model_dir)

    def test_helium_matches_torch_model(self):
        # Helium: Llama's tensors with q, k and v biases (attention_bias true), the whole of each
        # head turned in neighbouring pairs, its defaults (rope_theta 100000, rms_norm_eps 1e-8)
        # left out of the config.
        cfg = small_cfg("llama", heads=2, kv_heads=1, qkv_bias=True, rope_theta=100000.0,
                        norm_eps=1e-8)
        config = dict(llama_hf_config(cfg), model_type="helium",
                      architectures=["HeliumForCausalLM"], attention_bias=True, head_dim=8)
        del config["rope_theta"], config["rms_norm_eps"]

        self.check_against_torch_model("helium", cfg, lambda p: paired_hf_tensors(cfg, p),
                                       config)

    def test_seed_oss_matches_torch_model(self):
        # Seed-OSS: Qwen2's tensors, attention_bias left to its default (true), o_proj unbiased,
        # the training-time dropout probabilities beside them.
        cfg = small_cfg("llama", qkv_bias=True)
        config = dict(llama_hf_config(cfg), model_type="seed_oss",
                      architectures=["SeedOssForCausalLM"], attention_out_bias=False,
                      attention_dropout=0.1, residual_dropout=0.1)
        self.check_against_torch_model("seed_oss", cfg, lambda p: llama_hf_tensors(cfg, p),
                                       config)
        for bad in ({"attention_out_bias": True}, {"mlp_bias": True}):
            with self.assertRaises(hf_oracle.InputError):
                hf_oracle.SeedOss(hf_oracle.Config(dict(config, **bad), "c"))

    def test_gemma2_matches_torch_model(self):
        # Gemma 2: Gemma's model with the four norms per layer, the window of 3 on layers 0 and 2
        # (the even ones, without layer_types), scores scaled by query_pre_attn_scalar 10^-0.5
        # (not head_dim 6) and both soft-caps small enough to bite.
        cfg = small_cfg("llama", layers=3, activation="geglu", scale_embeddings=True,
                        post_norms=True, head_dim=6, tied_embeddings=True, sliding_window=3,
                        full_attention_layers=[1], attention_scale_dim=10,
                        attention_softcap=1.5, logit_softcap=3.0)
        config = gemma2_hf_config(cfg)
        self.assertEqual((config["query_pre_attn_scalar"], config["attn_logit_softcapping"],
                          config["final_logit_softcapping"]), (10, 1.5, 3.0))

        def to_hf(params):
            return gemma_hf_tensors(cfg, params)

        model_dir, tokens, got = self.check_against_torch_model("gemma2", cfg, to_hf, config,
                                                                norms_from_half=True)
        self.assertLessEqual(np.abs(got).max(), 3.0)
        params = self.written_params
        # The same pattern through layer_types; each of the other settings changes the logits.
        typed = self.write_model("gemma2_types", dict(config, layer_types=[
            "sliding_attention", "full_attention", "sliding_attention"]), to_hf(params))
        np.testing.assert_allclose(self.oracle_logits(typed, tokens, cfg["vocab"]), got,
                                   rtol=1e-11, atol=1e-11)
        changes = {"swapped": {"layer_types": ["full_attention", "sliding_attention",
                                               "full_attention"]},
                   "scalar": {"query_pre_attn_scalar": 6},
                   "attn_uncapped": {"attn_logit_softcapping": None},
                   "final_uncapped": {"final_logit_softcapping": None}}
        for label, change in changes.items():
            with self.subTest(label):
                other = self.write_model("gemma2_" + label, dict(config, **change), to_hf(params))
                self.assertGreater(
                    np.abs(self.oracle_logits(other, tokens, cfg["vocab"]) - got).max(), 1e-3)
        # Without the keys, Gemma2Config's defaults: query_pre_attn_scalar 256, caps 50 and 30.
        defaults_cfg = dict(cfg, attention_scale_dim=256, attention_softcap=50.0,
                            logit_softcap=30.0)
        defaults = {k: v for k, v in gemma2_hf_config(defaults_cfg).items()
                    if k not in ("query_pre_attn_scalar", "attn_logit_softcapping",
                                 "final_logit_softcapping", "tie_word_embeddings", "head_dim")}
        defaults["head_dim"] = 6
        self.check_against_torch_model("gemma2_defaults", defaults_cfg,
                                       lambda p: gemma_hf_tensors(defaults_cfg, p), defaults,
                                       norms_from_half=True)
        # Bad values name their key.
        bad = {"attn_logit_softcapping": 0, "final_logit_softcapping": -1.0,
               "query_pre_attn_scalar": 0, "hidden_activation": "gelu",
               "layer_types": ["full_attention"], "sliding_window": None}
        for key, value in bad.items():
            with self.subTest(key):
                self.check_rejected(self.run_oracle(self.write_model(
                    "gemma2_bad_" + key, dict(config, **{key: value}), to_hf(params)),
                    tokens)[0], [key])

    def test_mixtral_matches_torch_model(self):
        # Mixtral's routing is the contract's softmax top-k renormalised, without shared experts,
        # in every block; sharded, so the experts' tensors travel through the index too.
        cfg = moe_cfg("llama", {"shared_experts": 0, "normalize_top_k": True, "score": "softmax",
                                "every": 1, "top_k": 2})
        self.check_against_torch_model("mixtral", cfg, lambda p: mixtral_hf_tensors(cfg, p),
                                       mixtral_hf_config(cfg), shards=2)
        bad = dict(mixtral_hf_config(cfg), num_experts_per_tok=5)
        model_dir = self.write_model("mixtral_bad", bad,
                                     mixtral_hf_tensors(cfg, contract_params(random_model(cfg))))
        proc, _ = self.run_oracle(model_dir, random_tokens(cfg, 1, 3).numpy())
        self.assertEqual(proc.returncode, 2)
        self.assertIn("num_experts_per_tok 5 exceeds num_local_experts 4", proc.stderr)

    def test_granitemoe_matches_torch_model(self):
        # GraniteMoE: Mixtral's routing (the top k's softmax over their scores alone is the full
        # softmax renormalised) with Granite's multipliers, each kind of expert weight stacked.
        granite = {"embedding_multiplier": 6.0, "residual_multiplier": 0.5,
                   "attention_multiplier": 0.0625, "logits_scaling": 2.0}
        cfg = moe_cfg("llama", {"shared_experts": 0, "normalize_top_k": True, "score": "softmax",
                                "every": 1, "top_k": 2}, **granite)
        E, F_ = cfg["moe"]["experts"], cfg["moe"]["ffn"]

        def to_hf(params):
            return sparse_hf_tensors(cfg, params, lambda c, p, fc, proj: [
                (p + "router.layer.weight", params[c + "router.w"]),
                (p + "input_linear.weight", fc.reshape(E, 2 * F_, fc.shape[-1])),
                (p + "output_linear.weight", proj)])

        hf = dict(mixtral_hf_config(cfg), model_type="granitemoe",
                  architectures=["GraniteMoeForCausalLM"], **granite)
        self.check_against_torch_model("granitemoe", cfg, to_hf, hf)

    def test_qwen3_moe_matches_torch_model(self):
        # Qwen3-MoE: Qwen3's attention (wide heads, query and key norms), MoE in every second
        # block with the top-k not renormalised, Llama's MLP in the others.
        cfg = moe_cfg("llama", {"shared_experts": 0, "normalize_top_k": False,
                                "score": "softmax", "every": 2, "top_k": 2},
                      qk_norm=True, head_dim=6)
        config = dict(llama_hf_config(cfg), model_type="qwen3_moe",
                      architectures=["Qwen3MoeForCausalLM"], attention_bias=False,
                      use_sliding_window=False, sliding_window=None,
                      moe_intermediate_size=cfg["moe"]["ffn"],
                      num_experts=cfg["moe"]["experts"], num_experts_per_tok=2,
                      decoder_sparse_step=2, mlp_only_layers=[], norm_topk_prob=False)
        self.check_against_torch_model("qwen3_moe", cfg, lambda p: qwen3_moe_hf_tensors(cfg, p),
                                       config)
        bad = dict(config, mlp_only_layers=[0])
        model_dir = self.write_model("qwen3_moe_bad", bad, qwen3_moe_hf_tensors(
            cfg, contract_params(random_model(cfg))))
        proc, _ = self.run_oracle(model_dir, random_tokens(cfg, 1, 3).numpy())
        self.assertEqual(proc.returncode, 2)
        self.assertIn("mlp_only_layers must be empty", proc.stderr)

    def test_qwen2_moe_matches_torch_model(self):
        # Qwen2-MoE: Qwen2's attention (q, k and v biases), MoE in every second block with the
        # top-k not renormalised, two shared experts' worth of a shared expert gated per token.
        cfg = moe_cfg("llama", {"shared_experts": 2, "shared_gate": True, "normalize_top_k": False,
                                "score": "softmax", "every": 2, "top_k": 2}, qkv_bias=True)
        config = dict(llama_hf_config(cfg), model_type="qwen2_moe",
                      architectures=["Qwen2MoeForCausalLM"], use_sliding_window=False,
                      sliding_window=None, moe_intermediate_size=cfg["moe"]["ffn"],
                      shared_expert_intermediate_size=2 * cfg["moe"]["ffn"],
                      num_experts=cfg["moe"]["experts"], num_experts_per_tok=2,
                      decoder_sparse_step=2, mlp_only_layers=[], norm_topk_prob=False)
        self.check_against_torch_model("qwen2_moe", cfg, lambda p: qwen2_moe_hf_tensors(cfg, p),
                                       config)
        for key, value, why in (("use_sliding_window", True, "use_sliding_window must be false"),
                                ("qkv_bias", False, "qkv_bias must be true")):
            with self.subTest(key):
                model_dir = self.write_model("qwen2_moe_bad_" + key, dict(config, **{key: value}),
                                             qwen2_moe_hf_tensors(cfg, contract_params(
                                                 random_model(cfg))))
                proc, _ = self.run_oracle(model_dir, random_tokens(cfg, 1, 3).numpy())
                self.assertEqual(proc.returncode, 2)
                self.assertIn(why, proc.stderr)

    def test_glm4_moe_matches_torch_model(self):
        # GLM-4.5: biases on q, k and v with each query and key head normed, half of each head of
        # 8 turned in rotate-half pairs, the first block dense, the second routed: normalised
        # sigmoid scores picked with a selection bias (random here, so that it moves picks) and
        # weighted times 2.5, one shared expert; a multi-token prediction layer after the model,
        # which the causal LM leaves alone.
        cfg = moe_cfg("llama", {"shared_experts": 1, "score": "sigmoid", "normalize_top_k": True,
                                "balance": "bias", "dense_first": 1, "routed_scale": 2.5,
                                "every": 1, "top_k": 2},
                      heads=2, kv_heads=1, rope_dim=4, qkv_bias=True, qk_norm=True)
        config = dict(llama_hf_config(cfg), model_type="glm4_moe",
                      architectures=["Glm4MoeForCausalLM"], partial_rotary_factor=0.5,
                      attention_bias=True, use_qk_norm=True, head_dim=8,
                      moe_intermediate_size=cfg["moe"]["ffn"], n_routed_experts=cfg["moe"]["experts"],
                      num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                      routed_scaling_factor=2.5, norm_topk_prob=True, n_group=1, topk_group=1,
                      num_nextn_predict_layers=1)
        _, tokens, got = self.check_against_torch_model(
            "glm4_moe", cfg, lambda p: glm4_moe_hf_tensors(cfg, p, mtp_layer=True), config)
        # Without the scale the same weights give other logits.
        unscaled = self.write_model("glm4_moe_unscaled", dict(config, routed_scaling_factor=1.0),
                                    glm4_moe_hf_tensors(cfg, self.written_params))
        self.assertGreater(np.abs(self.oracle_logits(unscaled, tokens, cfg["vocab"]) - got).max(),
                           1e-3)

    def test_deepseek_v3_matches_torch_model(self):
        # DeepSeek-V3's latent attention (heads of 12: 4 turned, 8 not; value heads of 6; a query
        # latent of 6 and a key/value latent of 5, normed with 1e-6 beside the model's 1e-5)
        # over GLM-4.5's routing past a dense first block; and without the query latent, dense
        # (null experts), under YaRN whose mscale_all_dim scales the scores (the contract's
        # attention_multiplier).
        latent = {"q_rank": 6, "kv_rank": 5, "value_dim": 6, "norm_eps": 1e-6}
        cfg = moe_cfg("llama", {"shared_experts": 1, "score": "sigmoid", "normalize_top_k": True,
                                "balance": "bias", "dense_first": 1, "routed_scale": 2.5,
                                "every": 1, "top_k": 2},
                      heads=2, kv_heads=2, head_dim=12, rope_dim=4, latent_attention=latent)
        self.check_against_torch_model("deepseek_v3", cfg, lambda p: deepseek_v3_hf_tensors(cfg, p),
                                       deepseek_v3_hf_config(cfg))
        factor, all_dim = 4.0, 0.7
        mscale = 0.1 * all_dim * math.log(factor) + 1
        dense = small_cfg("llama", heads=2, kv_heads=2, head_dim=12, rope_dim=4, max_seq=32,
                          latent_attention=dict(latent, q_rank=0),
                          attention_multiplier=mscale * mscale / math.sqrt(12),
                          rope_scaling={"type": "yarn", "factor": factor, "original_max_seq": 8,
                                        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True,
                                        "attention_factor": 1.0})
        config = dict(deepseek_v3_hf_config(dense), max_position_embeddings=32,
                      rope_scaling={"rope_type": "yarn", "factor": factor,
                                    "original_max_position_embeddings": 8, "mscale": all_dim,
                                    "mscale_all_dim": all_dim})
        self.check_against_torch_model("deepseek_v3_dense_yarn", dense,
                                       lambda p: deepseek_v3_hf_tensors(dense, p), config)

    def test_deepseek_v2_matches_torch_model(self):
        # DeepSeek-V2's softmax routing (the picks' probabilities unnormalised, times 1.5) past a
        # dense first block, under the same latent attention, without the query latent.
        latent = {"q_rank": 0, "kv_rank": 5, "value_dim": 6, "norm_eps": 1e-6}
        cfg = moe_cfg("llama", {"shared_experts": 1, "normalize_top_k": False, "dense_first": 1,
                                "routed_scale": 1.5, "every": 1, "top_k": 2},
                      heads=2, kv_heads=2, head_dim=12, rope_dim=4, latent_attention=latent)
        config = dict(deepseek_v3_hf_config(cfg), model_type="deepseek_v2",
                      architectures=["DeepseekV2ForCausalLM"], scoring_func="softmax",
                      topk_method="greedy", norm_topk_prob=False)
        del config["n_group"], config["topk_group"]
        _, tokens, got = self.check_against_torch_model(
            "deepseek_v2", cfg, lambda p: deepseek_v3_hf_tensors(cfg, p), config)
        # Group-limited routing keeping every group is the same routing.
        grouped = self.write_model("deepseek_v2_groups",
                                   dict(config, topk_method="group_limited_greedy", n_group=2,
                                        topk_group=2),
                                   deepseek_v3_hf_tensors(cfg, self.written_params))
        np.testing.assert_allclose(self.oracle_logits(grouped, tokens, cfg["vocab"]), got,
                                   rtol=1e-12, atol=1e-12)

    def test_glm4_moe_group_limited_routing_matches_torch_model(self):
        # DeepSeek-V3's group-limited routing as GLM-4.5's config gives it: six experts in three
        # groups of two, each token's two picks from the two groups of highest score (the sum of
        # their two best biased scores). Without the limit the same weights give other logits;
        # groups that do not split the experts, or leave too few of them, are refused.
        cfg = moe_cfg("llama", {"experts": 6, "shared_experts": 1, "score": "sigmoid",
                                "normalize_top_k": True, "balance": "bias", "dense_first": 1,
                                "every": 1, "top_k": 2, "groups": 3, "group_top_k": 2},
                      heads=2, kv_heads=1, qk_norm=True)
        config = dict(llama_hf_config(cfg), model_type="glm4_moe",
                      architectures=["Glm4MoeForCausalLM"], partial_rotary_factor=1.0,
                      use_qk_norm=True, head_dim=8, moe_intermediate_size=cfg["moe"]["ffn"],
                      n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=1,
                      first_k_dense_replace=1, norm_topk_prob=True, n_group=3, topk_group=2)
        _, tokens, got = self.check_against_torch_model(
            "glm4_moe_grouped", cfg, lambda p: glm4_moe_hf_tensors(cfg, p), config)
        every_group = self.write_model("glm4_moe_every_group", dict(config, topk_group=3),
                                       glm4_moe_hf_tensors(cfg, self.written_params))
        self.assertGreater(
            np.abs(self.oracle_logits(every_group, tokens, cfg["vocab"]) - got).max(), 1e-3)
        for change in ({"n_group": 4}, {"n_group": 6}, {"topk_group": 4}, {"topk_group": 0},
                       {"n_group": 3, "topk_group": 1, "num_experts_per_tok": 3}):
            with self.subTest(change), self.assertRaises(hf_oracle.InputError):
                hf_oracle.Glm4Moe(hf_oracle.Config(dict(config, **change), "c"))

    def test_dots1_matches_torch_model(self):
        # dots.llm1: Qwen3's attention over DeepSeek-V3's experts: the first block dense, the
        # second routed (normalised sigmoid scores picked with a selection bias from two of three
        # expert groups, times 2.5, two shared experts) and attending within a window of 3 (from
        # max_window_layers 1 on). The counts have no defaults.
        cfg = moe_cfg("llama", {"experts": 6, "shared_experts": 2, "score": "sigmoid",
                                "normalize_top_k": True, "balance": "bias", "dense_first": 1,
                                "routed_scale": 2.5, "every": 1, "top_k": 2, "groups": 3,
                                "group_top_k": 2},
                      qk_norm=True, sliding_window=3, full_attention_layers=[0])
        config = dict(llama_hf_config(cfg), model_type="dots1",
                      architectures=["Dots1ForCausalLM"], moe_intermediate_size=cfg["moe"]["ffn"],
                      n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=2,
                      first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                      n_group=3, topk_group=2, sliding_window=3, max_window_layers=1)
        _, tokens, got = self.check_against_torch_model(
            "dots1", cfg, lambda p: glm4_moe_hf_tensors(cfg, p), config)
        unwindowed = self.write_model("dots1_no_window", dict(config, sliding_window=None),
                                      glm4_moe_hf_tensors(cfg, self.written_params))
        self.assertGreater(
            np.abs(self.oracle_logits(unwindowed, tokens, cfg["vocab"]) - got).max(), 1e-4)
        for key in ("n_routed_experts", "num_experts_per_tok", "n_shared_experts"):
            with self.subTest(key), self.assertRaises(hf_oracle.InputError):
                hf_oracle.Dots1(hf_oracle.Config(
                    {k: v for k, v in config.items() if k != key}, "c"))

    def test_olmoe_matches_torch_model(self):
        # OLMoE: an RMSNorm over each token's whole q and one over its whole k (grouped-query
        # heads: k's is narrower), and Qwen3-MoE's experts in every block, top-2 unnormalised.
        cfg = moe_cfg("llama", {"shared_experts": 0, "normalize_top_k": False,
                                "score": "softmax", "every": 1, "top_k": 2},
                      qk_norm=True, qk_norm_span="projection")
        self.assertLess(cfg["kv_heads"], cfg["heads"])
        config = dict(llama_hf_config(cfg), model_type="olmoe",
                      architectures=["OlmoeForCausalLM"], intermediate_size=cfg["moe"]["ffn"],
                      num_experts=cfg["moe"]["experts"], num_experts_per_tok=2,
                      norm_topk_prob=False, clip_qkv=None)
        self.check_against_torch_model("olmoe", cfg, lambda p: qwen3_moe_hf_tensors(cfg, p),
                                       config)
        model_dir = self.write_model("olmoe_bad", dict(config, clip_qkv=8.0), qwen3_moe_hf_tensors(
            cfg, contract_params(random_model(cfg))))
        proc, _ = self.run_oracle(model_dir, random_tokens(cfg, 1, 3).numpy())
        self.assertEqual(proc.returncode, 2)
        self.assertIn("clip_qkv must be null", proc.stderr)

    def test_olmo2_matches_torch_model(self):
        # OLMo 2: no norms before the attention and the MLP, each one's output normed before it
        # joins the residual stream, and OLMoE's norms over the whole q and k (grouped-query
        # heads: k's is narrower).
        cfg = small_cfg("llama", qk_norm=True, qk_norm_span="projection", post_norms=True,
                        pre_norms=False)
        self.assertLess(cfg["kv_heads"], cfg["heads"])
        config = dict(llama_hf_config(cfg), model_type="olmo2",
                      architectures=["Olmo2ForCausalLM"], head_dim=None)
        self.check_against_torch_model("olmo2", cfg, lambda p: olmo2_hf_tensors(cfg, p), config)
        model_dir = self.write_model("olmo2_bad", dict(config, clip_qkv=8.0), olmo2_hf_tensors(
            cfg, contract_params(random_model(cfg))))
        proc, _ = self.run_oracle(model_dir, random_tokens(cfg, 1, 3).numpy())
        self.assertEqual(proc.returncode, 2)
        self.assertIn("clip_qkv must be null", proc.stderr)

    def test_olmo3_matches_torch_model(self):
        # OLMo 3: OLMo 2's blocks, the first layer attending within a window of 3 (layer_types),
        # YaRN turning the full-attention layer only (factor 3 over an original context of 4,
        # max_position_embeddings 12 being 3 times it, with its own attention factor), the
        # windowed one unscaled at rope_theta: the contract's rope_local_theta.
        yarn = {"type": "yarn", "factor": 3.0, "original_max_seq": 4, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": True, "attention_factor": 1.2}
        cfg = small_cfg("llama", qk_norm=True, qk_norm_span="projection", post_norms=True,
                        pre_norms=False, sliding_window=3, full_attention_layers=[1],
                        rope_local_theta=10000.0, rope_scaling=yarn)
        self.assertEqual(cfg["max_seq"], 12)
        config = dict(llama_hf_config(cfg), model_type="olmo3",
                      architectures=["Olmo3ForCausalLM"], head_dim=None, sliding_window=3,
                      layer_types=["sliding_attention", "full_attention"],
                      rope_scaling={"rope_type": "yarn", "factor": 3.0,
                                    "original_max_position_embeddings": 4,
                                    "attention_factor": 1.2})
        _, tokens, got = self.check_against_torch_model(
            "olmo3", cfg, lambda p: olmo2_hf_tensors(cfg, p), config)
        # With YaRN in the windowed layer too, torch_model's logits differ.
        scaled_local = random_model(dict(cfg, rope_local_theta=0.0))
        with torch.no_grad():
            for name, p in scaled_local.named_contract_parameters():
                p.copy_(torch.from_numpy(self.written_params[name]))
            other = scaled_local(torch.from_numpy(tokens)).numpy()
        self.assertGreater(np.abs(other - got).max(), 1e-4)

    def test_exaone4_matches_torch_model(self):
        # EXAONE 4.0: OLMo 2's blocks with a norm over each query and key head; the first layer
        # attends within a window of 3 and turns with RoPE, the second attends everywhere without
        # RoPE. Said with layer_types, or with sliding_window_pattern 2 in their place.
        cfg = small_cfg("llama", qk_norm=True, post_norms=True, pre_norms=False, sliding_window=3,
                        full_attention_layers=[1], nope_layers=[1])
        config = dict(llama_hf_config(cfg), model_type="exaone4",
                      architectures=["Exaone4ForCausalLM"], sliding_window=3,
                      layer_types=["sliding_attention", "full_attention"])
        _, tokens, got = self.check_against_torch_model(
            "exaone4", cfg, lambda p: olmo2_hf_tensors(cfg, p), config)
        tensors = olmo2_hf_tensors(cfg, self.written_params)
        by_pattern = self.write_model("exaone4_pattern", dict(
            {k: v for k, v in config.items() if k != "layer_types"}, sliding_window_pattern=2),
            tensors)
        np.testing.assert_array_equal(self.oracle_logits(by_pattern, tokens, cfg["vocab"]), got)
        # A null window: every layer attends everywhere, with RoPE.
        unwindowed = self.write_model("exaone4_no_window", dict(config, sliding_window=None),
                                      tensors)
        plain = random_model(dict(cfg, sliding_window=0, full_attention_layers=[],
                                  nope_layers=[]))
        with torch.no_grad():
            for name, p in plain.named_contract_parameters():
                p.copy_(torch.from_numpy(self.written_params[name]))
            want = plain(torch.from_numpy(tokens)).numpy()
        np.testing.assert_allclose(self.oracle_logits(unwindowed, tokens, cfg["vocab"]), want,
                                   rtol=0, atol=1e-5)
        self.assertGreater(np.abs(want - got).max(), 1e-4)

    def test_causal_and_finite(self):
        for family in ("gpt2", "llama"):
            with self.subTest(family):
                cfg = small_cfg(family)
                to_hf = gpt2_hf_tensors if family == "gpt2" else llama_hf_tensors
                params = contract_params(random_model(cfg, seed=5))
                model_dir = self.write_model("causal_" + family, (
                    gpt2_hf_config if family == "gpt2" else llama_hf_config)(cfg),
                    to_hf(cfg, params))
                tokens = random_tokens(cfg, 1, self.SEQ, seed=6).numpy()
                before = self.oracle_logits(model_dir, tokens, cfg["vocab"])
                self.assertTrue(np.isfinite(before).all())
                changed = tokens.copy()
                changed[0, 4] = (changed[0, 4] + 1) % cfg["vocab"]
                after = self.oracle_logits(model_dir, changed, cfg["vocab"])
                np.testing.assert_allclose(after[:, :4], before[:, :4], rtol=0, atol=1e-13)
                self.assertGreater(np.abs(after[:, 4:] - before[:, 4:]).min(), 0.0)
                self.assertGreater(np.abs(after[:, 4] - before[:, 4]).max(), 1e-3)

    def test_rope_leaves_position_zero_alone(self):
        D, T = 8, 5
        cos, sin = hf_oracle.rope_tables(T, D, 10000.0)
        q = np.random.default_rng(0).normal(size=(2, 3, T, D))
        rotated = hf_oracle.apply_rope(torch.from_numpy(q), cos, sin).numpy()
        np.testing.assert_array_equal(rotated[..., 0, :], q[..., 0, :])
        # Position p turns the pair (i, i + D/2) by p * theta^(-2i/D), written out directly.
        p, i = 3, 1
        angle = p * 10000.0 ** (-2.0 * i / D)
        x1, x2 = q[..., p, i], q[..., p, i + D // 2]
        np.testing.assert_allclose(rotated[..., p, i], x1 * np.cos(angle) - x2 * np.sin(angle),
                                   rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(rotated[..., p, i + D // 2],
                                   x2 * np.cos(angle) + x1 * np.sin(angle), rtol=1e-14,
                                   atol=1e-15)

    def test_linear_rope_scaling_divides_every_frequency(self):
        # transformers' rope_type "linear": position p with factor f turns as position p / f.
        D, T, factor = 8, 9, 4.0
        cos, sin = hf_oracle.rope_tables(T, D, 10000.0, factor)
        angles = (np.arange(T)[:, None] / factor) * 10000.0 ** (-np.arange(0, D, 2) / D)[None, :]
        np.testing.assert_allclose(cos.numpy(), np.cos(np.concatenate([angles, angles], 1)),
                                   rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(sin.numpy(), np.sin(np.concatenate([angles, angles], 1)),
                                   rtol=1e-14, atol=1e-15)

    def test_greedy_generation_matches_torch_model(self):
        cfg = small_cfg("llama")
        model = random_model(cfg, seed=8)
        params = {n: stored_value(v, "F32") for n, v in contract_params(model).items()}
        with torch.no_grad():
            for name, p in model.named_contract_parameters():
                p.copy_(torch.from_numpy(params[name]))
        model_dir = self.write_model("generate", llama_hf_config(cfg),
                                     llama_hf_tensors(cfg, params))
        tokens = random_tokens(cfg, 2, 5, seed=9).numpy()
        count = cfg["max_seq"] - 5  # the longest allowed
        proc, out_dir = self.run_oracle(model_dir, tokens, "--generate", str(count))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(out_dir, "generated.txt")) as f:
            got = [[int(v) for v in line.split()] for line in f]
        seq = torch.from_numpy(tokens)
        with torch.no_grad():
            for _ in range(count):
                seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
        self.assertEqual(got, seq[:, 5:].tolist())
        proc, _ = self.run_oracle(model_dir, tokens, "--generate", str(count + 1))
        self.assertEqual(proc.returncode, 2, proc.stderr)

    def test_greedy_ties_go_to_lowest_id(self):
        class Flat:  # every id scores the same, except ids 3 and 5 which tie above the rest
            def forward(self, weights, tokens):
                logits = torch.zeros(tuple(tokens.shape) + (7,), dtype=torch.float64)
                logits[..., 3] = logits[..., 5] = 1.0
                return logits

        tokens = torch.zeros((2, 3), dtype=torch.int64)
        model = Flat()
        new = hf_oracle.greedy_generate(model, None, tokens, 2, model.forward(None, tokens))
        self.assertEqual(new.tolist(), [[3, 3], [3, 3]])

    def test_bad_inputs_exit_2_with_one_line(self):
        cfg = small_cfg("gpt2")
        params = contract_params(random_model(cfg, seed=10))
        good = gpt2_hf_tensors(cfg, params)
        C = cfg["width"]

        def overlap(header):
            header["h.0.ln_1.bias"]["data_offsets"] = header["h.0.ln_1.weight"]["data_offsets"]

        def past_end(header):
            begin, end = header["ln_f.bias"]["data_offsets"]  # the last tensor
            header["ln_f.bias"]["data_offsets"] = [begin + 4, end + 4]

        def unknown_dtype(header):
            header["h.1.ln_2.weight"]["dtype"] = "F8_E9"

        def truncate(model_dir, size):
            path = os.path.join(model_dir, "model.safetensors")
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) - 3 if size is None else size)

        def replace_with_text_header(model_dir):
            with open(os.path.join(model_dir, "model.safetensors"), "wb") as f:
                f.write((8).to_bytes(8, "little") + b"not json")

        without = [t for t in good if t[0] != "h.1.mlp.c_fc.bias"]
        extra = good + [("h.0.attn.rotary.weight", np.ones(C))]
        transposed = [(n, a.T if n == "h.0.attn.c_attn.weight" else a) for n, a in good]
        # label: (tensors, write_safetensors corruption, file edit, what the line must name)
        cases = {
            "truncated": (good, {}, lambda d: truncate(d, None), ["model.safetensors"]),
            "shorter_than_length": (good, {}, lambda d: truncate(d, 5), ["truncated"]),
            "header_over_100mb": (good, {"header_len": 100_000_001}, None, ["100000000"]),
            "header_past_end": (good, {"header_len": 1 << 20}, None, ["truncated"]),
            "header_not_json": (good, {}, replace_with_text_header, ["not valid JSON"]),
            "overlap": (good, {"edit_header": overlap}, None, ["overlap", "h.0.ln_1.bias"]),
            "past_end": (good, {"edit_header": past_end}, None, ["ln_f.bias", "outside"]),
            "gap": (good, {"junk_after": ("wpe.weight", 4)}, None, ["belong to no tensor"]),
            "unknown_dtype": (good, {"edit_header": unknown_dtype}, None,
                              ["F8_E9", "h.1.ln_2.weight"]),
            "missing": (without, {}, None, ["missing", "h.1.mlp.c_fc.bias"]),
            "extra": (extra, {}, None, ["h.0.attn.rotary.weight"]),
            "wrong_shape": (transposed, {}, None, ["h.0.attn.c_attn.weight", "[16, 48]"]),
            "model_type": (good, {}, lambda d: self.edit_config(d, model_type="bert"),
                           ["model_type"]),
            "inner_activation": (good, {}, lambda d: self.edit_config(
                d, activation_function="relu"), ["activation_function"]),
        }
        tokens = random_tokens(cfg, 2, 5, seed=11).numpy()
        for label, (tensors, corruption, edit, needles) in cases.items():
            with self.subTest(label):
                model_dir = self.write_model("bad_" + label, gpt2_hf_config(cfg), tensors,
                                             **corruption)
                if edit is not None:
                    edit(model_dir)
                self.check_rejected(self.run_oracle(model_dir, tokens)[0], needles)
        # Token ids and the positions limit.
        model_dir = self.write_model("bad_tokens", gpt2_hf_config(cfg), good)
        self.check_rejected(self.run_oracle(model_dir, np.full((2, 5), cfg["vocab"]))[0],
                            ["token ids"])
        self.check_rejected(self.run_oracle(model_dir, tokens, "--generate", "8")[0],
                            ["positions"])

    def edit_config(self, model_dir, **changes):
        path = os.path.join(model_dir, "config.json")
        with open(path) as f:
            config = json.load(f)
        config.update(changes)
        with open(path, "w") as f:
            json.dump(config, f)

    def check_rejected(self, proc, needles):
        self.assertEqual(proc.returncode, 2, proc.stderr)
        lines = proc.stderr.splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertTrue(lines[0].startswith("hf_oracle: "), proc.stderr)
        for needle in needles:
            self.assertIn(needle, lines[0])


if __name__ == "__main__":
    unittest.main(verbosity=2)
