#!/usr/bin/python3
"""Logits of a model directory in Hugging Face's format, computed with Hugging Face's conventions.

Usage: hf_oracle.py MODEL_DIR TOKENS_FILE OUT_DIR --batch B --seq T [--generate N]

MODEL_DIR: config.json (model_type "gpt2", "llama", "gemma", "gemma2", "gemma3_text", "mistral",
"ministral",
"phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "mixtral", "olmo2", "olmo3", "olmoe", "exaone4",
"smollm3", "granite", "granitemoe", "glm", "glm4", "glm4_moe", "dots1", "minimax_m2", "ernie4_5",
"ernie4_5_moe", "helium", "seed_oss", "deepseek_v2", "deepseek_v3" or "kimi_k2") and
model.safetensors, or model.safetensors.index.json (its weight_map names each tensor's shard) with
the shards.
TOKENS_FILE: int32 little-endian token ids [B, T], no header.
OUT_DIR (created): logits.f64, float64 little-endian [B, T, vocab_size] for the prompt; with
--generate N also generated.txt, one line per row with the N greedily chosen new ids (argmax, the
lowest id on ties, the whole forward pass recomputed for every new token).

This is an oracle independent of Trainyard's parameter contract (torch_model.py): it reads the
tensor names, layouts and config keys of transformers' GPT2LMHeadModel, LlamaForCausalLM,
GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, MistralForCausalLM, Phi3ForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM and SmolLM3ForCausalLM,
written from their
documented conventions; it needs neither transformers nor safetensors: it reads the files with its
own parser (numpy) and computes the forward passes in PyTorch, in float64. See README.md for the conventions.

Exit status: 0 on success, 2 on bad input (one line on stderr, "hf_oracle: " first), 1 on an
internal error.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

# PyTorch, imported by load_torch() only once the input has been read and found good: importing
# it takes seconds, refusing a bad file milliseconds.
torch = None


def load_torch():
    global torch
    import torch  # noqa: F811
    return torch

# The safetensors format: an 8-byte little-endian header length N, N bytes of JSON, then the data
# buffer that every tensor's data_offsets index. The reference implementation's limit on N:
MAX_HEADER_BYTES = 100_000_000
# Every dtype the format defines, with its size in bytes; only DECODABLE ones can hold weights.
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
DECODABLE = ("F32", "BF16", "F16")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class InputError(Exception):
    """Bad input; the message is the one line printed after "hf_oracle: "."""


# ---- safetensors ---------------------------------------------------------------------------------

class SafetensorsFile:
    """A validated safetensors file. tensors maps name -> (dtype, shape tuple, begin, end), the
    offsets relative to the data buffer, which starts at data_start."""

    def __init__(self, path, tensors, data_start, metadata):
        self.path = path
        self.tensors = tensors
        self.data_start = data_start
        self.metadata = metadata

    def read(self, name):
        """The tensor as a float64 array; raises InputError for a dtype that holds no weights."""
        dtype, shape, begin, end = self.tensors[name]
        if dtype not in DECODABLE:
            raise InputError("%s: tensor %r has dtype %s; weights must be one of %s"
                             % (self.path, name, dtype, ", ".join(DECODABLE)))
        with open(self.path, "rb") as f:
            f.seek(self.data_start + begin)
            raw = f.read(end - begin)
        if len(raw) != end - begin:  # the file changed since it was opened
            raise InputError("%s: tensor %r: short read" % (self.path, name))
        if dtype == "F32":
            values = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F16":
            values = np.frombuffer(raw, dtype="<f2")
        else:  # BF16 is the high half of an IEEE float32.
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        return values.astype(np.float64).reshape(shape)


def _json_object_without_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError("duplicate key %r" % key)
        out[key] = value
    return out


def _reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def parse_json(text):
    """json.loads, but a duplicate key or NaN/Infinity is an error (ValueError)."""
    return json.loads(text, object_pairs_hook=_json_object_without_duplicates,
                      parse_constant=_reject_constant)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _check_tensor_entry(path, name, info, buffer_len):
    """(dtype, shape, begin, end) of one header entry, or InputError."""
    where = "%s: tensor %r" % (path, name)
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise InputError("%s: entry must be an object with exactly the keys dtype, shape and "
                         "data_offsets" % where)
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise InputError("%s: unknown dtype %r" % (where, dtype))
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise InputError("%s: shape must be a list of non-negative integers, got %r"
                         % (where, shape))
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(v) for v in offsets)):
        raise InputError("%s: data_offsets must be two integers, got %r" % (where, offsets))
    begin, end = offsets
    if not 0 <= begin <= end <= buffer_len:
        raise InputError("%s: data_offsets [%d, %d] lie outside the %d-byte data buffer"
                         % (where, begin, end, buffer_len))
    want = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != want:
        raise InputError("%s: data_offsets [%d, %d] hold %d bytes, but %s %s needs %d"
                         % (where, begin, end, end - begin, dtype, shape, want))
    return dtype, tuple(shape), begin, end


def _check_tiling(path, tensors, buffer_len):
    """The tensors' byte ranges must tile the data buffer: no overlap, no gap, nothing after."""
    expected = 0
    previous = None
    for name, (_, _, begin, end) in sorted(tensors.items(), key=lambda kv: kv[1][2:]):
        if begin < expected:
            raise InputError("%s: tensors %r and %r overlap (bytes [%d, %d) and [%d, %d))"
                             % (path, previous[0], name, previous[1], previous[2], begin, end))
        if begin > expected:
            raise InputError("%s: bytes [%d, %d) of the data buffer belong to no tensor (before "
                             "tensor %r)" % (path, expected, begin, name))
        expected = end
        previous = (name, begin, end)
    if expected != buffer_len:
        raise InputError("%s: bytes [%d, %d) of the data buffer belong to no tensor"
                         % (path, expected, buffer_len))


def open_safetensors(path):
    """Reads and validates the header of the safetensors file at `path`; InputError if it is
    not a well-formed file (the data itself is read later, by SafetensorsFile.read)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise InputError("%s: truncated: %d bytes, shorter than the 8-byte header length"
                                 % (path, size))
            header_len = int.from_bytes(prefix, "little")
            if header_len > MAX_HEADER_BYTES:
                raise InputError("%s: header length %d exceeds the limit of %d bytes"
                                 % (path, header_len, MAX_HEADER_BYTES))
            if header_len > size - 8:
                raise InputError("%s: truncated: header length %d but only %d bytes follow"
                                 % (path, header_len, size - 8))
            raw = f.read(header_len)
    except OSError as e:
        raise InputError("%s: %s" % (path, e.strerror or e))
    try:
        header = parse_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError("%s: header is not valid JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise InputError("%s: header must be a JSON object" % path)
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InputError("%s: __metadata__ must map strings to strings" % path)
    buffer_len = size - 8 - header_len
    tensors = {name: _check_tensor_entry(path, name, info, buffer_len)
               for name, info in header.items()}
    _check_tiling(path, tensors, buffer_len)
    return SafetensorsFile(path, tensors, 8 + header_len, metadata)


def load_checkpoint(model_dir):
    """{tensor name: SafetensorsFile holding it} from model.safetensors (preferred, as
    transformers does) or from the index and its shards. Returns (mapping, the file to name when
    a tensor is missing)."""
    single = os.path.join(model_dir, SINGLE_FILE)
    if os.path.exists(single):
        st = open_safetensors(single)
        return {name: st for name in st.tensors}, single
    index_path = os.path.join(model_dir, INDEX_FILE)
    if not os.path.exists(index_path):
        raise InputError("%s: holds neither %s nor %s" % (model_dir, SINGLE_FILE, INDEX_FILE))
    try:
        with open(index_path, "rb") as f:
            index = parse_json(f.read().decode("utf-8"))
    except OSError as e:
        raise InputError("%s: %s" % (index_path, e.strerror or e))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError("%s: not valid JSON: %s" % (index_path, e))
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise InputError("%s: must be an object with a weight_map object" % index_path)
    shards = {}
    for name, shard in weight_map.items():
        if (not isinstance(shard, str) or shard in ("", ".", "..")
                or os.path.basename(shard) != shard):
            raise InputError("%s: weight_map[%r] must be a file name in the model directory, "
                             "got %r" % (index_path, name, shard))
        if shard not in shards:
            shards[shard] = open_safetensors(os.path.join(model_dir, shard))
        if name not in shards[shard].tensors:
            raise InputError("%s: tensor %r is missing (the index puts it in %s)"
                             % (shards[shard].path, name, shard))
    for shard, st in sorted(shards.items()):
        for name in st.tensors:
            if weight_map.get(name) != shard:
                raise InputError("%s: tensor %r is not in %s's weight_map for this shard"
                                 % (st.path, name, INDEX_FILE))
    return {name: shards[shard] for name, shard in weight_map.items()}, index_path


# ---- config.json ---------------------------------------------------------------------------------

_REQUIRED = object()


class Config:
    """Typed access to config.json; every accessor raises InputError naming the key."""

    def __init__(self, raw, path):
        self.raw = raw
        self.path = path

    def _get(self, key, default):
        value = self.raw.get(key, default)
        if value is _REQUIRED:
            raise InputError("%s: missing the key %r" % (self.path, key))
        return value

    def int(self, key, default=_REQUIRED, minimum=1):
        value = self._get(key, default)
        if not _is_int(value) or value < minimum:
            raise InputError("%s: %s must be an integer >= %d, got %r"
                             % (self.path, key, minimum, value))
        return value

    def optional_positive(self, key, default):
        """A positive number, or None where the value is null."""
        return None if self._get(key, default) is None else self.positive(key, default)

    def positive(self, key, default):
        value = self._get(key, default)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise InputError("%s: %s must be a positive number, got %r" % (self.path, key, value))
        return float(value)

    def bool(self, key, default):
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise InputError("%s: %s must be true or false, got %r" % (self.path, key, value))
        return value

    def require(self, key, default, allowed, why):
        """The value of `key` (default `default`), which must be one of `allowed`."""
        value = self._get(key, default)
        if not any(value == a and type(value) is type(a) for a in allowed):
            raise InputError("%s: %s = %s is not supported (%s)"
                             % (self.path, key, json.dumps(value), why))
        return value


def read_config(model_dir):
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, "rb") as f:
            raw = parse_json(f.read().decode("utf-8"))
    except OSError as e:
        raise InputError("%s: %s" % (path, e.strerror or e))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError("%s: not valid JSON: %s" % (path, e))
    if not isinstance(raw, dict):
        raise InputError("%s: must be a JSON object" % path)
    model_type = raw.get("model_type")
    if model_type not in MODELS:
        raise InputError("%s: model_type %s is not supported (gpt2, llama, gemma, gemma2, "
                         "gemma3_text, mistral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, mixtral, "
                         "olmo2, olmo3, olmoe, "
                         "smollm3, granite, granitemoe, glm, glm4, ernie4_5, helium, "
                         "seed_oss, deepseek_v2, deepseek_v3 or kimi_k2)"
                         % (path, json.dumps(model_type)))
    return MODELS[model_type](Config(raw, path))


# ---- the models ---------------------------------------------------------------------------------

# The forward passes run in PyTorch (Debian's python3-torch) in float64, written out operation by
# operation from the conventions rather than through torch.nn's modules.

def layer_norm(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def rms_norm(x, weight, eps):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    """x * sigmoid(x), the sigmoid as exp(-log(1 + exp(-x))) so that no exp overflows."""
    return x * torch.exp(-torch.logaddexp(torch.zeros_like(x), -x))


def causal_attention(q, k, v, window=None, scale=None, softcap=None):
    """softmax(q k^T / sqrt(D)) v over positions <= the query's; q, k, v [B, H, T, D]. With a
    sliding window W, query i sees only keys j > i - W (transformers' sliding-window mask).
    `scale` replaces 1 / sqrt(D) (Gemma's query_pre_attn_scalar^-0.5); with `softcap` C the
    scaled scores s become C tanh(s / C) before the mask (Gemma 2's attn_logit_softcapping)."""
    t, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-1, -2)
    scores = scores / math.sqrt(d) if scale is None else scores * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    i = torch.arange(t).unsqueeze(1)
    j = torch.arange(t).unsqueeze(0)
    hidden = j > i
    if window is not None:
        hidden = hidden | (j <= i - window)
    scores = scores.masked_fill(hidden, float("-inf"))
    scores = scores - scores.max(dim=-1, keepdim=True).values
    probs = torch.exp(scores)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs @ v


def split_heads(x, heads):
    """[B, T, heads*D] -> [B, heads, T, D]; head h is columns h*D .. h*D+D-1."""
    b, t, width = x.shape
    return x.reshape(b, t, heads, width // heads).permute(0, 2, 1, 3)


def merge_heads(x):
    """[B, H, T, D] -> [B, T, H*D]."""
    b, h, t, d = x.shape
    return x.permute(0, 2, 1, 3).reshape(b, t, h * d)


def llama3_inv_freq(inv_freq, scaling):
    """transformers' rope_type "llama3": wavelengths 2*pi / inv_freq longer than
    original_max_position_embeddings / low_freq_factor are divided by factor, those shorter than
    original / high_freq_factor kept, and those between blended linearly in original / wavelength
    between low_freq_factor and high_freq_factor."""
    factor, low, high, original = scaling
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def rope_tables(seq_len, head_dim, theta, scaling=None):
    """cos, sin [seq_len, head_dim]: inv_freq = 1 / theta^(arange(0, D, 2) / D) (scaled as Llama
    3 scales it when `scaling` is (factor, low_freq_factor, high_freq_factor, original), or
    divided by the factor when it is a number: transformers' rope_type "linear"), the angles
    pos * inv_freq concatenated with themselves (transformers' LlamaRotaryEmbedding). head_dim is
    the rotated part of a head (Phi-3's partial_rotary_factor of it). A LongRope `scaling` divides
    pair i's inv_freq by its short factor, or by its long one when the pass covers more than
    original_max_position_embeddings positions, and multiplies cos and sin by attention_factor."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    magnitude = 1.0
    if isinstance(scaling, LongRope):
        factors = scaling.long if seq_len > scaling.original else scaling.short
        inv_freq = inv_freq / torch.tensor(factors, dtype=torch.float64)
        magnitude = scaling.attention_factor
    elif isinstance(scaling, Yarn):
        inv_freq = scaling.inv_freq(inv_freq, head_dim)
        magnitude = scaling.attention_factor
    elif isinstance(scaling, float):
        inv_freq = inv_freq / scaling
    elif scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return torch.cos(emb) * magnitude, torch.sin(emb) * magnitude


class LongRope:
    """transformers' rope_type "longrope" (Phi-3's older "su"): per-pair factors short and long,
    the context original they switch at (the config's original_max_position_embeddings beside
    rope_scaling, else rope_scaling's, else max_position_embeddings), and attention_factor (else
    sqrt(1 + ln factor / ln original) when factor exceeds 1, else 1, with factor =
    max_position_embeddings / original when the context is beside rope_scaling, else
    rope_scaling's factor or that ratio)."""

    def __init__(self, cfg, scaling, rotary_dim):
        sub = Config(scaling, cfg.path + ": rope_scaling")
        pairs = rotary_dim // 2
        for key in ("short_factor", "long_factor"):
            factors = scaling.get(key)
            if (not isinstance(factors, list) or len(factors) != pairs
                    or not all(isinstance(f, (int, float)) and f > 0 for f in factors)):
                raise InputError("%s: rope_scaling: %s must be %d positive numbers"
                                 % (cfg.path, key, pairs))
        self.short = [float(f) for f in scaling["short_factor"]]
        self.long = [float(f) for f in scaling["long_factor"]]
        max_positions = cfg.int("max_position_embeddings")
        if cfg.raw.get("original_max_position_embeddings") is not None:
            # Phi-3's place: it wins, and the extension is max_position_embeddings over it.
            self.original = cfg.int("original_max_position_embeddings")
            factor = max_positions / self.original
        else:
            self.original = sub.int("original_max_position_embeddings", max_positions)
            factor = sub.positive("factor", max_positions / self.original)
        default = (math.sqrt(1 + math.log(factor) / math.log(self.original)) if factor > 1
                   else 1.0)
        self.attention_factor = sub.positive("attention_factor", default)


class Yarn:
    """transformers' rope_type "yarn": the context original (rope_scaling's
    original_max_position_embeddings, else max_position_embeddings) and the factor (then
    max_position_embeddings over that context, as recent transformers take it, else rope_scaling's
    factor); pair i of D / 2 keeps inv_freq below index low, is divided by the factor above index
    high, and blends linearly between, where index(turns) = D ln(original / (2 pi turns)) /
    (2 ln theta), low = index(beta_fast), high = index(beta_slow) (floored and ceiled unless
    truncate is false, then clamped to [0, D - 1]); cos and sin times attention_factor (else
    (0.1 mscale ln factor + 1) / (0.1 mscale_all_dim ln factor + 1) when both are set, else
    0.1 ln factor + 1, 1 for a factor of at most 1)."""

    def __init__(self, cfg, scaling, theta):
        sub = Config(scaling, cfg.path + ": rope_scaling")
        max_positions = cfg.int("max_position_embeddings")
        self.factor = sub.positive("factor", _REQUIRED)
        if scaling.get("original_max_position_embeddings") is not None:
            self.original = sub.int("original_max_position_embeddings")
            self.factor = max_positions / self.original
        else:
            self.original = max_positions
        self.theta = theta
        self.beta_fast = float(scaling.get("beta_fast") or 32)
        self.beta_slow = float(scaling.get("beta_slow") or 1)
        self.truncate = scaling.get("truncate", True)

        def mscale(weight):
            return 0.1 * weight * math.log(self.factor) + 1 if self.factor > 1 else 1.0
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            default = mscale(scaling["mscale"]) / mscale(scaling["mscale_all_dim"])
        else:
            default = mscale(1.0)
        self.attention_factor = sub.positive("attention_factor", default)

    def inv_freq(self, inv_freq, dim):
        def index(turns):
            return dim * math.log(self.original / (2 * math.pi * turns)) / (2 * math.log(self.theta))
        low, high = index(self.beta_fast), index(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        return inv_freq / self.factor * ramp + inv_freq * (1 - ramp)


def partial_rotary_dim(cfg, head_dim, default):
    """The dimensions of each head RoPE turns: int(head_dim * partial_rotary_factor), the factor
    `default` when the config has none (Phi-3's 1.0, GLM's 0.5)."""
    factor = cfg.raw.get("partial_rotary_factor", default)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise InputError("%s: partial_rotary_factor must be a number in (0, 1]" % cfg.path)
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise InputError("%s: partial_rotary_factor %r turns %d dimensions (RoPE needs an "
                         "even number)" % (cfg.path, factor, dim))
    return dim


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    """x [..., T, D] rotated by position: x*cos + rotate_half(x)*sin over the tables' first R
    dimensions (all D, or Phi-3's partial rotation), the rest passed through."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    turned, kept = x[..., :r], x[..., r:]
    return torch.cat([turned * cos + rotate_half(turned) * sin, kept], dim=-1)


def apply_rope_pairs(x, cos, sin):
    """GLM's and ERNIE 4.5's RoPE: over the tables' first R dimensions, pair i is dimensions 2i
    and 2i + 1, turned by the angle of frequency i (transformers repeats each of the first half of
    the tables' angles twice); the rest pass through."""
    r = cos.shape[-1]
    cos = cos[..., :r // 2].repeat_interleave(2, dim=-1)
    sin = sin[..., :r // 2].repeat_interleave(2, dim=-1)
    turned, kept = x[..., :r], x[..., r:]
    pairs = torch.stack((-turned[..., 1::2], turned[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat([turned * cos + pairs * sin, kept], dim=-1)


class Gpt2:
    """GPT2LMHeadModel. Conv1D weights are stored [in, out] (y = x W + b)."""

    def __init__(self, cfg):
        self.vocab = cfg.int("vocab_size")
        self.positions = cfg.int("n_positions")
        self.width = cfg.int("n_embd")
        self.layers = cfg.int("n_layer")
        self.heads = cfg.int("n_head")
        inner = cfg.raw.get("n_inner")
        self.inner = 4 * self.width if inner is None else cfg.int("n_inner")
        self.eps = cfg.positive("layer_norm_epsilon", 1e-5)
        self.tied = cfg.bool("tie_word_embeddings", True)
        cfg.require("activation_function", "gelu_new", ("gelu_new", "gelu_pytorch_tanh"),
                    "only the tanh approximation of GELU is implemented")
        cfg.require("scale_attn_weights", True, (True,), "scores are scaled by 1/sqrt(head_dim)")
        cfg.require("scale_attn_by_inverse_layer_idx", False, (False,), "not implemented")
        cfg.require("add_cross_attention", False, (False,), "a decoder-only model is expected")
        if self.width % self.heads != 0:
            raise InputError("%s: n_embd %d is not divisible by n_head %d"
                             % (cfg.path, self.width, self.heads))
        self.max_positions = self.positions

    @staticmethod
    def canonical_name(name):
        return name[len("transformer."):] if name.startswith("transformer.") else name

    def expected_tensors(self):
        """[(name, shape)] the config implies, and the set of names tolerated and ignored."""
        C, F_, V = self.width, self.inner, self.vocab
        out = [("wte.weight", (V, C)), ("wpe.weight", (self.positions, C))]
        ignored = set()
        for i in range(self.layers):
            p = "h.%d." % i
            out += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                    (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                    (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                    (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                    (p + "mlp.c_fc.weight", (C, F_)), (p + "mlp.c_fc.bias", (F_,)),
                    (p + "mlp.c_proj.weight", (F_, C)), (p + "mlp.c_proj.bias", (C,))]
            # Old checkpoints carry the causal mask buffers; they are not weights.
            ignored |= {p + "attn.bias", p + "attn.masked_bias"}
        out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
        if not self.tied:
            out.append(("lm_head.weight", (V, C)))
        return out, ignored

    def forward(self, w, tokens):
        """tokens [B, T] -> logits [B, T, V]."""
        C = self.width
        x = w["wte.weight"][tokens] + w["wpe.weight"][: tokens.shape[1]]
        for i in range(self.layers):
            p = "h.%d." % i
            a = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], self.eps)
            qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = (split_heads(qkv[..., j * C:(j + 1) * C], self.heads) for j in range(3))
            y = merge_heads(causal_attention(q, k, v))
            x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            m = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], self.eps)
            hidden = gelu_new(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
            x = x + hidden @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], self.eps)
        head = w["wte.weight"] if self.tied else w["lm_head.weight"]
        return x @ head.T


class Llama:
    """LlamaForCausalLM. nn.Linear weights are stored [out, in] (y = x W^T), no biases."""

    qkv_bias = False
    qk_norm = False
    qk_norm_whole = False  # OLMoE: one norm over the whole q and one over the whole k
    norms_after = False  # OLMo 2: no norms before the branches, each branch's output normed
    branch_norms = False  # GLM-4: norms before the branches and after each
    paired_rope = False  # GLM, ERNIE 4.5, Helium: RoPE in neighbouring pairs (apply_rope_pairs)
    # None: attention_bias must be false; else it names biases on q, k and v (GLM's, Helium's,
    # Seed-OSS's), defaulting to this value.
    attention_bias_default = None
    default_theta = 10000.0
    default_eps = 1e-6
    local_rope_unscaled = False  # OLMo 3: rope_scaling turns the full-attention layers only
    tied_by_default = False
    default_head_dim = None  # None: hidden_size / num_attention_heads
    # Granite's: each branch's output times residual_multiplier, the scores times
    # attention_scale (None: 1 / sqrt(head_dim)), the logits divided by logits_scaling.
    residual_multiplier = 1.0
    attention_scale = None
    logits_scaling = 1.0

    def __init__(self, cfg):
        self.vocab = cfg.int("vocab_size")
        self.width = cfg.int("hidden_size")
        self.ffn = cfg.int("intermediate_size")
        self.layers = cfg.int("num_hidden_layers")
        self.heads = cfg.int("num_attention_heads")
        kv = cfg.raw.get("num_key_value_heads")
        self.kv_heads = self.heads if kv is None else cfg.int("num_key_value_heads")
        self.head_dim = self.read_head_dim(cfg)
        if self.head_dim % 2 != 0:
            raise InputError("%s: RoPE needs an even head dimension, got %d"
                             % (cfg.path, self.head_dim))
        if self.heads % self.kv_heads != 0:
            raise InputError("%s: num_attention_heads %d is not divisible by "
                             "num_key_value_heads %d" % (cfg.path, self.heads, self.kv_heads))
        self.max_positions = cfg.int("max_position_embeddings")
        self.eps = cfg.positive("rms_norm_eps", self.default_eps)
        self.theta = cfg.positive("rope_theta", self.default_theta)
        self.tied = cfg.bool("tie_word_embeddings", self.tied_by_default)
        self.embedding_scale = 1.0
        self.read_activation(cfg)
        self.read_biases(cfg)
        self.scaling = None
        self.rope_dim = self.rotary_dim(cfg)
        scaling = cfg.raw.get("rope_scaling")
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind == "llama3":
            sub = Config(scaling, cfg.path + ": rope_scaling")
            self.scaling = (sub.positive("factor", _REQUIRED),
                            sub.positive("low_freq_factor", 1.0),
                            sub.positive("high_freq_factor", 4.0),
                            float(sub.int("original_max_position_embeddings", 8192)))
            if self.scaling[2] <= self.scaling[1]:
                raise InputError("%s: rope_scaling: high_freq_factor must exceed low_freq_factor"
                                 % cfg.path)
        elif kind == "linear":
            self.scaling = float(Config(scaling, cfg.path + ": rope_scaling")
                                 .positive("factor", _REQUIRED))
        elif kind in ("longrope", "su"):
            self.scaling = LongRope(cfg, scaling, self.rope_dim)
        elif kind == "yarn":
            self.scaling = Yarn(cfg, scaling, self.theta)
        elif scaling is not None and kind != "default":
            raise InputError("%s: rope_scaling = %s is not supported (plain RoPE, linear, "
                             "llama3, longrope or yarn)" % (cfg.path, json.dumps(scaling)))
        self.windows = [None] * self.layers  # each layer's sliding window, None for none
        self.rope_layers = [True] * self.layers  # whether RoPE turns each layer's q and k

    def rotary_dim(self, cfg):
        """The dimensions of each head RoPE turns: all of them (Phi-3 may turn fewer)."""
        return self.head_dim

    def read_head_dim(self, cfg):
        """head_dim, else hidden_size / num_attention_heads."""
        head_dim = cfg.raw.get("head_dim", self.default_head_dim)
        if head_dim is not None:
            return cfg.int("head_dim", self.default_head_dim)
        if self.width % self.heads != 0:
            raise InputError("%s: hidden_size %d is not divisible by num_attention_heads %d "
                             "(and head_dim is not given)" % (cfg.path, self.width, self.heads))
        return self.width // self.heads

    def read_activation(self, cfg):
        cfg.require("hidden_act", "silu", ("silu",), "the MLP is SwiGLU")

    def read_biases(self, cfg):
        if self.attention_bias_default is None:
            cfg.require("attention_bias", False, (False,), "projections without biases")
        else:
            self.qkv_bias = cfg.bool("attention_bias", self.attention_bias_default)
        cfg.require("mlp_bias", False, (False,), "projections without biases")

    def norm(self, x, weight):
        """The model's RMSNorm with the stored weight."""
        return rms_norm(x, weight, self.eps)

    def read_window(self, cfg, sliding_from=0):
        """sliding_window (null for none) in the layers from `sliding_from` on."""
        if cfg.raw.get("sliding_window") is not None:
            window = cfg.int("sliding_window")
            self.windows = [window if i >= sliding_from else None for i in range(self.layers)]

    def set_windows(self, cfg, types, window):
        """Each layer's window from a layer_types list: `window` where it says
        "sliding_attention", none where it says "full_attention"."""
        if (not isinstance(types, list) or len(types) != self.layers
                or any(t not in ("full_attention", "sliding_attention") for t in types)):
            raise InputError("%s: layer_types must name full_attention or sliding_attention for "
                             "each layer" % cfg.path)
        self.windows = [window if t == "sliding_attention" else None for t in types]

    def read_qwen_window(self, cfg):
        """Qwen2's and Qwen3's window: only with use_sliding_window, and then in the layers from
        max_window_layers on."""
        if cfg.bool("use_sliding_window", False):
            self.read_window(cfg, cfg.int("max_window_layers", 28, minimum=0))

    @staticmethod
    def canonical_name(name):
        return name

    def ignored(self, name):
        """Whether a stored tensor is one the causal LM does not use (none here)."""
        return False

    def expected_tensors(self):
        C, V, D = self.width, self.vocab, self.head_dim
        H, KV = self.heads, self.kv_heads
        out = [("model.embed_tokens.weight", (V, C))]
        for i in range(self.layers):
            p = "model.layers.%d." % i
            if not self.norms_after:
                out.append((p + "input_layernorm.weight", (C,)))
            out += [(p + "self_attn.q_proj.weight", (H * D, C)),
                    (p + "self_attn.k_proj.weight", (KV * D, C)),
                    (p + "self_attn.v_proj.weight", (KV * D, C))]
            if self.qkv_bias:
                out += [(p + "self_attn.q_proj.bias", (H * D,)),
                        (p + "self_attn.k_proj.bias", (KV * D,)),
                        (p + "self_attn.v_proj.bias", (KV * D,))]
            if self.qk_norm:
                whole = self.qk_norm_whole
                out += [(p + "self_attn.q_norm.weight", (H * D,) if whole else (D,)),
                        (p + "self_attn.k_norm.weight", (KV * D,) if whole else (D,))]
            out += [(p + "self_attn.o_proj.weight", (C, H * D)),
                    (p + "post_attention_layernorm.weight", (C,))]
            if self.branch_norms:
                out += [(p + "post_self_attn_layernorm.weight", (C,)),
                        (p + "post_mlp_layernorm.weight", (C,))]
            if self.norms_after:
                out.append((p + "post_feedforward_layernorm.weight", (C,)))
            out += self.mlp_tensors(p)
        out.append(("model.norm.weight", (C,)))
        if not self.tied:
            out.append(("lm_head.weight", (V, C)))
        return out, set()

    def forward(self, w, tokens):
        """tokens [B, T] -> logits [B, T, V]."""
        cos, sin = rope_tables(tokens.shape[1], self.rope_dim, self.theta, self.scaling)
        # OLMo 3: the windowed layers' RoPE unscaled.
        local = (rope_tables(tokens.shape[1], self.rope_dim, self.theta)
                 if self.local_rope_unscaled else (cos, sin))
        group = self.heads // self.kv_heads
        x = w["model.embed_tokens.weight"][tokens] * self.embedding_scale
        for i in range(self.layers):
            p = "model.layers.%d." % i
            c, s = local if self.windows[i] is not None else (cos, sin)
            a = x if self.norms_after else self.norm(x, w[p + "input_layernorm.weight"])
            q = split_heads(self.project(w, p + "self_attn.q_proj", a), self.heads)
            k = split_heads(self.project(w, p + "self_attn.k_proj", a), self.kv_heads)
            if self.qk_norm and self.qk_norm_whole:  # OLMoE: over the whole q and k
                q = split_heads(self.norm(merge_heads(q), w[p + "self_attn.q_norm.weight"]),
                                self.heads)
                k = split_heads(self.norm(merge_heads(k), w[p + "self_attn.k_norm.weight"]),
                                self.kv_heads)
            elif self.qk_norm:  # Qwen3: each head's RMSNorm over its D, before RoPE
                q = self.norm(q, w[p + "self_attn.q_norm.weight"])
                k = self.norm(k, w[p + "self_attn.k_norm.weight"])
            if self.rope_layers[i]:
                q, k = self.rope(q, c, s), self.rope(k, c, s)
            v = split_heads(self.project(w, p + "self_attn.v_proj", a), self.kv_heads)
            # Query head h reads key/value head h // group.
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            y = merge_heads(causal_attention(q, k, v, self.windows[i], self.attention_scale))
            y = y @ w[p + "self_attn.o_proj.weight"].T
            if self.branch_norms:  # GLM-4: each branch's output normed too before it joins
                x = x + self.norm(y, w[p + "post_self_attn_layernorm.weight"])
                m = self.norm(x, w[p + "post_attention_layernorm.weight"])
                x = x + self.norm(self.mlp(w, p, m), w[p + "post_mlp_layernorm.weight"])
                continue
            if self.norms_after:  # OLMo 2: post_attention_layernorm is the output's norm
                y = self.norm(y, w[p + "post_attention_layernorm.weight"])
                m = x + y * self.residual_multiplier
                y = self.norm(self.mlp(w, p, m), w[p + "post_feedforward_layernorm.weight"])
                x = m + y * self.residual_multiplier
                continue
            x = x + y * self.residual_multiplier
            m = self.norm(x, w[p + "post_attention_layernorm.weight"])
            x = x + self.mlp(w, p, m) * self.residual_multiplier
        x = self.norm(x, w["model.norm.weight"])
        head = w["model.embed_tokens.weight"] if self.tied else w["lm_head.weight"]
        return (x @ head.T) / self.logits_scaling

    def rope(self, x, cos, sin):
        """RoPE on the heads x [..., T, D]: Llama's rotate-half pairs (i, i + R/2), or with
        paired_rope neighbouring ones."""
        return (apply_rope_pairs if self.paired_rope else apply_rope)(x, cos, sin)

    def project(self, w, name, a):
        """The q, k or v projection `name` of the rows a: a W^T, plus the bias (Qwen2)."""
        y = a @ w[name + ".weight"].T
        return y + w[name + ".bias"] if self.qkv_bias else y

    def mlp_tensors(self, p):
        C, F_ = self.width, self.ffn
        return [(p + "mlp.gate_proj.weight", (F_, C)), (p + "mlp.up_proj.weight", (F_, C)),
                (p + "mlp.down_proj.weight", (C, F_))]

    def mlp(self, w, p, m):
        """The MLP of layer prefix p on the normed rows m [..., C]."""
        return swiglu(m, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                      w[p + "mlp.down_proj.weight"])


def swiglu(m, gate, up, down):
    """down(silu(gate(m)) * up(m)), nn.Linear weights [out, in]."""
    return (silu(m @ gate.T) * (m @ up.T)) @ down.T


class Gemma(Llama):
    """GemmaForCausalLM: Llama's tensors; the token embeddings times sqrt(hidden_size) on the way
    in (not in the tied head), each RMSNorm multiplying by 1 + its stored weight, the MLP
    down(gelu_tanh(gate(m)) * up(m)), heads 256 wide and tied embeddings unless the config says
    otherwise. The activation is hidden_activation, or without it the tanh approximation
    whatever hidden_act says (Gemma's first configs wrote "gelu" for it)."""

    tied_by_default = True
    default_head_dim = 256

    def __init__(self, cfg):
        super().__init__(cfg)
        self.embedding_scale = math.sqrt(self.width)

    def read_activation(self, cfg):
        tanh = ("gelu_pytorch_tanh", "gelu_new")
        if cfg.raw.get("hidden_activation") is not None:
            cfg.require("hidden_activation", None, tanh, "Gemma's GELU is the tanh approximation")
        else:
            cfg.require("hidden_act", "gelu", tanh + ("gelu",), "Gemma's MLP is GeGLU")

    def norm(self, x, weight):
        return rms_norm(x, 1.0 + weight, self.eps)

    def mlp(self, w, p, m):
        gate = m @ w[p + "mlp.gate_proj.weight"].T
        return (gelu_new(gate) * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T


class Gemma2(Gemma):
    """Gemma2ForCausalLM: Gemma's model and norms (1 + w), with a norm on the attention's output
    (post_attention_layernorm) and on the MLP's (post_feedforward_layernorm) before each joins the
    residual stream, the MLP's input normed by pre_feedforward_layernorm. Scores are scaled by
    query_pre_attn_scalar^-0.5 and, unless attn_logit_softcapping is null, soft-capped
    C tanh(s / C) before the mask; the logits likewise by final_logit_softcapping. Layer i is
    windowed by sliding_window where layer_types says "sliding_attention" (without the list: the
    even layers), the others attend to every position; RoPE is rope_theta's in all of them."""

    softcap_defaults = (50.0, 30.0)  # attn_logit_softcapping, final_logit_softcapping

    def __init__(self, cfg):
        super().__init__(cfg)
        self.attn_scale = float(cfg.int("query_pre_attn_scalar", 256)) ** -0.5
        self.attn_softcap = cfg.optional_positive("attn_logit_softcapping",
                                                  self.softcap_defaults[0])
        self.final_softcap = cfg.optional_positive("final_logit_softcapping",
                                                   self.softcap_defaults[1])
        cfg.require("use_bidirectional_attention", None, (None, False), "causal attention")
        window = cfg.int("sliding_window", 4096)
        types = cfg.raw.get("layer_types")
        if types is None:
            types = self.default_layer_types(cfg)
        self.set_windows(cfg, types, window)

    def default_layer_types(self, cfg):
        """Gemma 2's: windowed attention in the even layers (is_sliding = not layer_idx % 2)."""
        return ["full_attention" if i % 2 else "sliding_attention" for i in range(self.layers)]

    def read_activation(self, cfg):
        cfg.require("hidden_activation", "gelu_pytorch_tanh", ("gelu_pytorch_tanh", "gelu_new"),
                    "Gemma 2's and 3's GELU is the tanh approximation")

    def expected_tensors(self):
        out, ignored = super().expected_tensors()
        extra = []
        for i in range(self.layers):
            p = "model.layers.%d." % i
            extra += [(p + "pre_feedforward_layernorm.weight", (self.width,)),
                      (p + "post_feedforward_layernorm.weight", (self.width,))]
        return out + extra, ignored

    def rope_tables(self, seq_len):
        """{windowed: (cos, sin)}: the tables of the global layers (False) and the local (True)."""
        tables = rope_tables(seq_len, self.head_dim, self.theta, self.scaling)
        return {False: tables, True: tables}

    def forward(self, w, tokens):
        tables = self.rope_tables(tokens.shape[1])
        group = self.heads // self.kv_heads
        x = w["model.embed_tokens.weight"][tokens] * self.embedding_scale
        for i in range(self.layers):
            p = "model.layers.%d." % i
            a = self.norm(x, w[p + "input_layernorm.weight"])
            q = split_heads(a @ w[p + "self_attn.q_proj.weight"].T, self.heads)
            k = split_heads(a @ w[p + "self_attn.k_proj.weight"].T, self.kv_heads)
            v = split_heads(a @ w[p + "self_attn.v_proj.weight"].T, self.kv_heads)
            if self.qk_norm:  # Gemma 3's
                q = self.norm(q, w[p + "self_attn.q_norm.weight"])
                k = self.norm(k, w[p + "self_attn.k_norm.weight"])
            cos, sin = tables[self.windows[i] is not None]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            y = merge_heads(causal_attention(q, k, v, self.windows[i], self.attn_scale,
                                             self.attn_softcap))
            y = y @ w[p + "self_attn.o_proj.weight"].T
            x = x + self.norm(y, w[p + "post_attention_layernorm.weight"])
            m = self.norm(x, w[p + "pre_feedforward_layernorm.weight"])
            x = x + self.norm(self.mlp(w, p, m), w[p + "post_feedforward_layernorm.weight"])
        x = self.norm(x, w["model.norm.weight"])
        head = w["model.embed_tokens.weight"] if self.tied else w["lm_head.weight"]
        logits = x @ head.T
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


class Gemma3(Gemma2):
    """Gemma3ForCausalLM (model_type gemma3_text): Gemma 2's model (its norms, scale and
    soft-capping, null by default here) plus query and key norms (1 + w) before RoPE. Layer i
    attends to every position when layer_types says "full_attention" (without the list: when
    (i + 1) is a multiple of sliding_window_pattern, default 6), with rope_theta and
    rope_scaling; the others to sliding_window with rope_local_base_freq, unscaled."""

    qk_norm = True
    softcap_defaults = (None, None)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.local_theta = cfg.positive("rope_local_base_freq", 10000.0)

    def default_layer_types(self, cfg):
        pattern = cfg.int("sliding_window_pattern", 6)
        return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                for i in range(self.layers)]

    def rope_tables(self, seq_len):
        return {False: rope_tables(seq_len, self.head_dim, self.theta, self.scaling),
                True: rope_tables(seq_len, self.head_dim, self.local_theta)}


class Mistral(Llama):
    """MistralForCausalLM: Llama's model with a sliding window over the positions (or none)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.read_window(cfg)


class Ministral(Llama):
    """MinistralForCausalLM: Mistral's model with its sliding_window (default 4096; null for none)
    in the layers layer_types names "sliding_attention", in every layer without the list."""

    def __init__(self, cfg):
        super().__init__(cfg)
        if "sliding_window" in cfg.raw and cfg.raw["sliding_window"] is None:
            return
        types = cfg.raw.get("layer_types", ["sliding_attention"] * self.layers)
        self.set_windows(cfg, types, cfg.int("sliding_window", 4096))


class Phi3(Mistral):
    """Phi3ForCausalLM: Mistral's model (its sliding window too) with the q, k and v projections
    stacked in self_attn.qkv_proj (rows q, then k, then v) and gate and up in mlp.gate_up_proj
    (gate rows, then up rows), as Phi-3 and Phi-4 are published. RoPE turns the first
    int(head_dim * partial_rotary_factor) dimensions of each head (Phi-4 mini's 0.75), the rest
    pass through."""

    def rotary_dim(self, cfg):
        return partial_rotary_dim(cfg, self.head_dim, 1.0)

    def expected_tensors(self):
        H, KV, D, C, F_ = self.heads, self.kv_heads, self.head_dim, self.width, self.ffn
        separate, ignored = super().expected_tensors()
        out = []
        for name, shape in separate:
            if name.endswith("self_attn.q_proj.weight"):
                out.append((name.replace("q_proj", "qkv_proj"), ((H + 2 * KV) * D, C)))
            elif name.endswith("mlp.gate_proj.weight"):
                out.append((name.replace("gate_proj", "gate_up_proj"), (2 * F_, C)))
            elif not name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
                out.append((name, shape))
        return out, ignored

    def forward(self, w, tokens):
        """Llama's forward over the fused tensors cut back into Llama's."""
        H, KV, D, F_ = self.heads, self.kv_heads, self.head_dim, self.ffn
        w = dict(w)
        for i in range(self.layers):
            p = "model.layers.%d." % i
            qkv = w.pop(p + "self_attn.qkv_proj.weight")
            w[p + "self_attn.q_proj.weight"] = qkv[:H * D]
            w[p + "self_attn.k_proj.weight"] = qkv[H * D:(H + KV) * D]
            w[p + "self_attn.v_proj.weight"] = qkv[(H + KV) * D:]
            gate_up = w.pop(p + "mlp.gate_up_proj.weight")
            w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = gate_up[:F_], gate_up[F_:]
        return super().forward(w, tokens)


class Qwen2(Llama):
    """Qwen2ForCausalLM: Llama's model with biases on the q, k and v projections (not on o_proj
    or the MLP; no attention_bias key). Its sliding window applies only with use_sliding_window,
    from layer max_window_layers on."""

    qkv_bias = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.read_qwen_window(cfg)


class Qwen3(Llama):
    """Qwen3ForCausalLM: Llama's model (attention_bias false here) with an RMSNorm over each query
    and each key head before RoPE, self_attn.q_norm and k_norm [head_dim], shared by the heads.
    Its sliding window is Qwen2's."""

    qk_norm = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.read_qwen_window(cfg)


class Glm(Llama):
    """GlmForCausalLM: Llama's model with biases on q, k and v (attention_bias, default true; none
    on o_proj or the MLP), heads 128 wide unless head_dim says otherwise, the MLP's gate and up
    stacked in mlp.gate_up_proj (gate rows first), and RoPE over the first
    int(head_dim * partial_rotary_factor) dimensions (default 0.5) in neighbouring pairs: pair i
    is dimensions 2i and 2i + 1, turned by inv_freq[i] (transformers repeats each of the first
    half of the tables' angles twice). Plain RoPE only."""

    default_head_dim = 128
    paired_rope = True
    attention_bias_default = True

    def __init__(self, cfg):
        if cfg.raw.get("rope_scaling") is not None:
            raise InputError("%s: rope_scaling must be null (GLM's plain RoPE)" % cfg.path)
        super().__init__(cfg)

    def rotary_dim(self, cfg):
        return partial_rotary_dim(cfg, self.head_dim, 0.5)

    def mlp_tensors(self, p):
        C, F_ = self.width, self.ffn
        return [(p + "mlp.gate_up_proj.weight", (2 * F_, C)), (p + "mlp.down_proj.weight", (C, F_))]

    def mlp(self, w, p, m):
        gate_up = w[p + "mlp.gate_up_proj.weight"]
        return swiglu(m, gate_up[:self.ffn], gate_up[self.ffn:], w[p + "mlp.down_proj.weight"])


class Glm4(Glm):
    """Glm4ForCausalLM: GLM's model with each branch's output normed before it joins the residual
    stream, post_self_attn_layernorm the attention's and post_mlp_layernorm the MLP's, the MLP's
    input normed by post_attention_layernorm as in Llama."""

    branch_norms = True


class Ernie45(Llama):
    """Ernie4_5ForCausalLM: Llama's model with RoPE over the whole head in GLM's neighbouring
    pairs, heads 128 wide, rope_theta 500000 and tied embeddings unless the config says otherwise,
    and use_bias (every projection's) false."""

    default_head_dim = 128
    tied_by_default = True
    paired_rope = True
    default_theta = 500000.0

    def read_biases(self, cfg):
        super().read_biases(cfg)
        cfg.require("use_bias", False, (False,), "projections without biases")


class Ernie45Moe(Ernie45):
    """Ernie4_5_MoeForCausalLM (ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B): ERNIE 4.5's attention and
    RoPE (neighbouring pairs over the whole head) with heads hidden_size / num_attention_heads wide
    unless head_dim says otherwise and rms_norm_eps 1e-5 unless the config says otherwise. Layer i
    has the sparse MLP when (i + 1) % moe_layer_interval == 0 (default 1) and
    moe_layer_start_index <= i <= moe_layer_end_index (defaults 1 and -1, the last layer); the
    others keep Llama's MLP of intermediate_size. The router mlp.gate [moe_num_experts, hidden]
    gives softmax probabilities; the moe_k best of probability + mlp.moe_statics.
    e_score_correction_bias ([1, experts]) are picked, weighted by their probabilities divided by
    the picks' sum (at least moe_norm_min), and the experts mlp.experts.j.* are SwiGLU MLPs of
    moe_intermediate_size, beside mlp.shared_experts.* of moe_num_shared_experts times it (none
    for 0). The multi-token prediction tensors (model.mtp_*) are not part of the causal LM."""

    default_head_dim = None
    default_eps = 1e-5

    def __init__(self, cfg):
        super().__init__(cfg)
        self.experts, self.top_k = read_expert_counts(cfg, "moe_num_experts", "moe_k", (64, 6))
        self.expert_ffn = cfg.int("moe_intermediate_size", 1536)
        self.shared_ffn = cfg.int("moe_num_shared_experts", 2, minimum=0) * self.expert_ffn
        self.start = cfg.int("moe_layer_start_index", 1, minimum=0)
        end = cfg.raw.get("moe_layer_end_index", -1)
        self.end = self.layers - 1 if end == -1 else cfg.int("moe_layer_end_index", minimum=0)
        self.interval = cfg.int("moe_layer_interval", 1)
        self.norm_min = cfg.positive("moe_norm_min", 1e-12)

    def ignored(self, name):
        return name.startswith("model.mtp")

    def sparse(self, p):
        i = int(p.split(".")[2])
        return (i + 1) % self.interval == 0 and self.start <= i <= self.end

    def mlp_tensors(self, p):
        if not self.sparse(p):
            return super().mlp_tensors(p)
        C, S = self.width, self.shared_ffn
        out = qwen_expert_tensors(p, self.experts, C, self.expert_ffn)
        out.append((p + "mlp.moe_statics.e_score_correction_bias", (1, self.experts)))
        if S > 0:
            s = p + "mlp.shared_experts."
            out += [(s + "gate_proj.weight", (S, C)), (s + "up_proj.weight", (S, C)),
                    (s + "down_proj.weight", (C, S))]
        return out

    def mlp(self, w, p, m):
        if not self.sparse(p):
            return super().mlp(w, p, m)
        probs = torch.softmax(m @ w[p + "mlp.gate.weight"].T, dim=-1)
        bias = w[p + "mlp.moe_statics.e_score_correction_bias"][0]
        _, chosen = torch.topk(probs + bias, self.top_k, dim=-1)
        top = probs.gather(-1, chosen)
        top = top / top.sum(dim=-1, keepdim=True).clamp(min=self.norm_min)
        out = mix_experts(w, p, m, self.experts, top, chosen)
        if self.shared_ffn == 0:
            return out
        s = p + "mlp.shared_experts."
        return out + swiglu(m, w[s + "gate_proj.weight"], w[s + "up_proj.weight"],
                            w[s + "down_proj.weight"])


class Helium(Llama):
    """HeliumForCausalLM: Llama's model with RoPE over the whole head in GLM's neighbouring pairs,
    biases on q, k and v only with attention_bias (default false), and transformers' defaults
    where the config is silent: heads 128 wide, rope_theta 100000, rms_norm_eps 1e-8."""

    default_head_dim = 128
    paired_rope = True
    attention_bias_default = False
    default_theta = 100000.0
    default_eps = 1e-8


class SeedOss(Llama):
    """SeedOssForCausalLM: Llama's model with biases on q, k and v (attention_bias, default true),
    none on o_proj (attention_out_bias false) or the MLP, heads 128 wide unless head_dim says
    otherwise. Its dropout probabilities apply in training only."""

    default_head_dim = 128
    attention_bias_default = True

    def read_biases(self, cfg):
        super().read_biases(cfg)
        cfg.require("attention_out_bias", False, (False,), "an o_proj without bias")


def mix_experts(w, p, m, experts, top, chosen):
    """Σ over each row's picks `chosen` of weight `top` times that expert's SwiGLU MLP
    (mlp.experts.j.gate_proj, up_proj, down_proj under layer prefix p) of the rows m."""
    e = p + "mlp.experts.%d."
    return mix_swiglu(m, [(w[e % j + "gate_proj.weight"], w[e % j + "up_proj.weight"],
                           w[e % j + "down_proj.weight"]) for j in range(experts)], top, chosen)


def mix_swiglu(m, experts, top, chosen):
    """Σ over each row's picks `chosen` (columns of expert indices) of weight `top` times that
    expert's SwiGLU MLP of the rows m (experts: [(gate, up, down)])."""
    out = torch.zeros_like(m)
    for j, (gate, up, down) in enumerate(experts):
        # The weight of expert j for each token: 0 unless it is among the token's picks.
        weight = (top * (chosen == j)).sum(dim=-1, keepdim=True)
        out = out + weight * swiglu(m, gate, up, down)
    return out


def read_expert_counts(cfg, key="num_local_experts", top_key="num_experts_per_tok",
                       defaults=(_REQUIRED, _REQUIRED)):
    """(experts under `key`, picks under `top_key`), `defaults` where the config is silent; at
    most as many picks as experts."""
    experts, top_k = cfg.int(key, defaults[0]), cfg.int(top_key, defaults[1])
    if top_k > experts:
        raise InputError("%s: %s %d exceeds %s %d" % (cfg.path, top_key, top_k, key, experts))
    return experts, top_k


def qwen_expert_tensors(p, experts, width, ffn):
    """The router mlp.gate and each expert's mlp.experts.j.gate_proj, up_proj and down_proj
    (Qwen3-MoE's, Qwen2-MoE's and OLMoE's names) under layer prefix p."""
    out = [(p + "mlp.gate.weight", (experts, width))]
    for j in range(experts):
        e = p + "mlp.experts.%d." % j
        out += [(e + "gate_proj.weight", (ffn, width)), (e + "up_proj.weight", (ffn, width)),
                (e + "down_proj.weight", (width, ffn))]
    return out


def qwen_sparse_mlp(w, p, m, experts, top_k, normalize):
    """sparse_mlp over the tensors qwen_expert_tensors names."""
    e = p + "mlp.experts.%d."
    weights = [(w[e % j + "gate_proj.weight"], w[e % j + "up_proj.weight"],
                w[e % j + "down_proj.weight"]) for j in range(experts)]
    return sparse_mlp(m, w[p + "mlp.gate.weight"], weights, top_k, normalize)


class Mixtral(Llama):
    """MixtralForCausalLM: Llama's attention, and in every layer a sparse MLP
    (block_sparse_moe): the router `gate` scores each token's experts with a softmax over all
    of them, the num_experts_per_tok best are kept and their probabilities divided by their sum,
    and the token's output is those weights times the experts' SwiGLU MLPs (w1 gate, w3 up, w2
    down; intermediate_size is each expert's hidden size)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.experts, self.top_k = read_expert_counts(cfg)
        self.read_window(cfg)

    def mlp_tensors(self, p):
        C, F_ = self.width, self.ffn
        out = [(p + "block_sparse_moe.gate.weight", (self.experts, C))]
        for j in range(self.experts):
            e = p + "block_sparse_moe.experts.%d." % j
            out += [(e + "w1.weight", (F_, C)), (e + "w2.weight", (C, F_)),
                    (e + "w3.weight", (F_, C))]
        return out

    def mlp(self, w, p, m):
        e = p + "block_sparse_moe.experts.%d."
        experts = [(w[e % j + "w1.weight"], w[e % j + "w3.weight"], w[e % j + "w2.weight"])
                   for j in range(self.experts)]
        return sparse_mlp(m, w[p + "block_sparse_moe.gate.weight"], experts, self.top_k, True)


def sparse_mlp(m, router, experts, top_k, normalize):
    """A softmax over every expert's router score, the top_k best kept (divided by their sum when
    `normalize`), and the rows' output those weights times the experts' SwiGLU MLPs (experts:
    [(gate, up, down)])."""
    probs = torch.softmax(m @ router.T, dim=-1)
    top, chosen = torch.topk(probs, top_k, dim=-1)
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return mix_swiglu(m, experts, top, chosen)


class Qwen3Moe(Qwen3):
    """Qwen3MoeForCausalLM: Qwen3's attention, and a sparse MLP in layer i when
    (i + 1) % decoder_sparse_step == 0 (mlp_only_layers must be empty; the others keep Llama's
    MLP of intermediate_size): the router `mlp.gate` scores the experts with a softmax over all
    of them, the num_experts_per_tok best are kept (divided by their sum when norm_topk_prob),
    and the token's output is those weights times the experts' SwiGLU MLPs (gate_proj, up_proj,
    down_proj of moe_intermediate_size)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.experts, self.top_k = read_expert_counts(cfg, "num_experts")
        self.expert_ffn = cfg.int("moe_intermediate_size")
        self.step = cfg.int("decoder_sparse_step", 1)
        if cfg.raw.get("mlp_only_layers") not in (None, []):
            raise InputError("%s: mlp_only_layers must be empty" % cfg.path)
        self.normalize = cfg.bool("norm_topk_prob", False)

    def sparse(self, p):
        """Whether the layer of prefix p ("model.layers.I.") has the sparse MLP."""
        return (int(p.split(".")[2]) + 1) % self.step == 0

    def mlp_tensors(self, p):
        if not self.sparse(p):
            return super().mlp_tensors(p)
        return qwen_expert_tensors(p, self.experts, self.width, self.expert_ffn)

    def mlp(self, w, p, m):
        if not self.sparse(p):
            return super().mlp(w, p, m)
        return qwen_sparse_mlp(w, p, m, self.experts, self.top_k, self.normalize)


class Qwen2Moe(Qwen3Moe):
    """Qwen2MoeForCausalLM: Qwen2's attention (biases on q, k and v: qkv_bias, true by default;
    no query and key norms) and Qwen3-MoE's sparse MLP, to which each sparse layer adds a shared
    expert every token uses, mlp.shared_expert (a SwiGLU MLP of shared_expert_intermediate_size),
    its output times sigmoid(m . mlp.shared_expert_gate) ([1, hidden]). Without a sliding window
    (use_sliding_window true is refused)."""

    qkv_bias = True
    qk_norm = False

    def __init__(self, cfg):
        if cfg.bool("use_sliding_window", False):
            raise InputError("%s: use_sliding_window must be false for qwen2_moe" % cfg.path)
        if not cfg.bool("qkv_bias", True):
            raise InputError("%s: qkv_bias must be true for qwen2_moe" % cfg.path)
        super().__init__(cfg)
        self.shared_ffn = cfg.int("shared_expert_intermediate_size")

    def mlp_tensors(self, p):
        out = super().mlp_tensors(p)
        if self.sparse(p):
            C, S = self.width, self.shared_ffn
            s = p + "mlp.shared_expert."
            out += [(s + "gate_proj.weight", (S, C)), (s + "up_proj.weight", (S, C)),
                    (s + "down_proj.weight", (C, S)), (p + "mlp.shared_expert_gate.weight", (1, C))]
        return out

    def mlp(self, w, p, m):
        out = super().mlp(w, p, m)
        if not self.sparse(p):
            return out
        s = p + "mlp.shared_expert."
        shared = swiglu(m, w[s + "gate_proj.weight"], w[s + "up_proj.weight"],
                        w[s + "down_proj.weight"])
        return out + torch.sigmoid(m @ w[p + "mlp.shared_expert_gate.weight"].T) * shared


class Glm4Moe(Llama):
    """Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air, GLM-4.6): Llama's attention with biases on q, k
    and v when attention_bias (default false), an RMSNorm over each query and key head before RoPE
    when use_qk_norm (default false), and RoPE over the first int(head_dim *
    partial_rotary_factor) dimensions (default 0.5) in Llama's rotate-half pairs (not GLM's
    neighbouring ones); rms_norm_eps 1e-5 unless the config says otherwise. Layers below
    first_k_dense_replace (default 1) keep Llama's MLP of intermediate_size. The others route:
    scores sigmoid(m . mlp.gate.weight^T); the num_experts_per_tok experts of highest score +
    mlp.gate.e_score_correction_bias are picked (the bias chooses, never weighs), weighted by
    their scores, divided by the picks' sum when norm_topk_prob (default true), times
    routed_scaling_factor (default 1); the experts mlp.experts.j.* are SwiGLU MLPs of
    moe_intermediate_size, and mlp.shared_experts.* one of n_shared_experts (default 1) times it
    that every token uses. Group-limited routing (n_group, topk_group; default 1 and 1): the
    experts form n_group equal groups, each scored by the sum of its two highest score + bias, and
    only the topk_group best groups' experts may be picked (the others are masked to -inf, as
    DeepSeek-V3's own inference code does; transformers masks them to 0, which differs only when a
    kept expert's biased score is negative). Layers from num_hidden_layers on hold multi-token
    prediction, which the causal LM does not use."""

    default_eps = 1e-5
    attention_bias_default = False
    # The config class's defaults: experts and picks, each expert's hidden size, shared experts,
    # dense first layers, norm_topk_prob, routed_scaling_factor, and n_group with topk_group.
    expert_defaults = (128, 8)
    expert_ffn_default = 1408
    shared_default = 1
    dense_default = 1
    normalize_default = True
    scale_default = 1.0
    group_defaults = (1, 1)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.read_attention(cfg)
        self.experts, self.top_k = read_expert_counts(cfg, "n_routed_experts",
                                                      defaults=self.expert_defaults)
        self.expert_ffn = cfg.int("moe_intermediate_size", self.expert_ffn_default)
        self.shared_ffn = cfg.int("n_shared_experts", self.shared_default) * self.expert_ffn
        self.dense_layers = cfg.int("first_k_dense_replace", self.dense_default, minimum=0)
        self.normalize = cfg.bool("norm_topk_prob", self.normalize_default)
        self.scale = cfg.positive("routed_scaling_factor", self.scale_default)
        self.groups = cfg.int("n_group", self.group_defaults[0], minimum=1)
        self.kept_groups = cfg.int("topk_group", self.group_defaults[1], minimum=1)
        size = self.experts // self.groups
        if self.experts % self.groups or (self.groups > 1 and size < 2):
            raise InputError("%s: n_group %d must split the %d experts into groups of at least two"
                             % (cfg.path, self.groups, self.experts))
        if self.kept_groups > self.groups or self.kept_groups * size < self.top_k:
            raise InputError("%s: topk_group %d must be at most n_group %d and keep room for %d "
                             "picks" % (cfg.path, self.kept_groups, self.groups, self.top_k))

    def read_attention(self, cfg):
        self.qk_norm = cfg.bool("use_qk_norm", False)

    def rotary_dim(self, cfg):
        return partial_rotary_dim(cfg, self.head_dim, 0.5)

    def ignored(self, name):
        parts = name.split(".")
        return (name.startswith("model.layers.") and parts[2].isdigit()
                and int(parts[2]) >= self.layers)

    def sparse(self, p):
        return int(p.split(".")[2]) >= self.dense_layers

    def mlp_tensors(self, p):
        if not self.sparse(p):
            return super().mlp_tensors(p)
        C, S = self.width, self.shared_ffn
        s = p + "mlp.shared_experts."
        return (qwen_expert_tensors(p, self.experts, C, self.expert_ffn)
                + [(p + "mlp.gate.e_score_correction_bias", (self.experts,)),
                   (s + "gate_proj.weight", (S, C)), (s + "up_proj.weight", (S, C)),
                   (s + "down_proj.weight", (C, S))])

    def mlp(self, w, p, m):
        if not self.sparse(p):
            return super().mlp(w, p, m)
        scores = torch.sigmoid(m @ w[p + "mlp.gate.weight"].T)
        choice = scores + w[p + "mlp.gate.e_score_correction_bias"]
        if self.kept_groups < self.groups:
            grouped = choice.unflatten(-1, (self.groups, -1))
            group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)
            best = group_score.topk(self.kept_groups, dim=-1).indices
            keep = torch.zeros_like(group_score, dtype=torch.bool).scatter(-1, best, True)
            choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).flatten(-2)
        _, chosen = torch.topk(choice, self.top_k, dim=-1)
        top = scores.gather(-1, chosen)
        if self.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        top = top * self.scale
        out = mix_experts(w, p, m, self.experts, top, chosen)
        s = p + "mlp.shared_experts."
        return out + swiglu(m, w[s + "gate_proj.weight"], w[s + "up_proj.weight"],
                            w[s + "down_proj.weight"])


class DeepseekV3(Glm4Moe):
    """DeepseekV3ForCausalLM (DeepSeek-V3, R1, Moonlight; Kimi K2's kimi_k2): Llama's layers with
    multi-head latent attention, and Glm4Moe's experts with DeepSeek-V3's defaults (256 experts,
    8 picks, first_k_dense_replace 3, routed_scaling_factor 2.5, n_group 8, topk_group 4). The
    attention: queries q_b_proj(rms(q_a_proj(x))) (q_a_layernorm; q_proj(x) when q_lora_rank is
    null), each head qk_nope_head_dim + qk_rope_head_dim wide, split [nope | rope]; the compressed
    kv_a_proj_with_mqa(x) split [kv_lora_rank | rope], the latent normed (kv_a_layernorm) and
    decompressed by kv_b_proj into each head's [nope key | value of v_head_dim]; the rope part of
    the key shared by every head. Both latent norms take eps 1e-6 whatever rms_norm_eps says (the
    norms' class default). RoPE turns the rope parts only, over qk_rope_head_dim (transformers'
    head_dim), after reordering each from neighbouring pairs to halves when rope_interleave
    (default true); query and key are [nope | rope]. Scores are scaled by (nope + rope)^-1/2,
    times yarn_get_mscale(factor, mscale_all_dim)^2 when rope_scaling gives mscale_all_dim.
    A null n_routed_experts, or first_k_dense_replace of at least the layers, leaves every layer
    dense. Layers from num_hidden_layers on (multi-token prediction) are not read."""

    default_eps = 1e-6
    attention_bias_default = None
    expert_defaults = (256, 8)
    expert_ffn_default = 2048
    shared_default = 1
    dense_default = 3
    normalize_default = True
    scale_default = 2.5
    group_defaults = (8, 4)
    latent_eps = 1e-6
    scoring = "sigmoid"
    topk_methods = ("noaux_tc",)
    # Whether a config without n_routed_experts is dense (V2's class default None) rather than
    # of the class's default count (V3's 256); null is dense either way.
    experts_absent_dense = False

    def __init__(self, cfg):
        raw = cfg.raw
        absent = "n_routed_experts" not in raw and self.experts_absent_dense
        self.dense = absent or ("n_routed_experts" in raw and raw["n_routed_experts"] is None) or (
            cfg.int("first_k_dense_replace", self.dense_default, minimum=0)
            >= cfg.int("num_hidden_layers"))
        if self.dense:
            Llama.__init__(self, cfg)
        else:
            super().__init__(cfg)
        self.nope = cfg.int("qk_nope_head_dim", 128)
        self.rot = cfg.int("qk_rope_head_dim", 64)
        self.value_dim = cfg.int("v_head_dim", 128)
        self.kv_rank = cfg.int("kv_lora_rank", 512)
        self.q_rank = None if ("q_lora_rank" in raw and raw["q_lora_rank"] is None) else cfg.int(
            "q_lora_rank", 1536)
        self.interleave = self.read_interleave(cfg)
        cfg.require("scoring_func", self.scoring, (self.scoring,), "DeepSeek's router")
        self.topk_method = cfg.require("topk_method", self.topk_methods[0], self.topk_methods,
                                       "DeepSeek's router")
        cfg.require("moe_layer_freq", 1, (1,), "an MoE layer after every dense one")
        if self.kv_heads != self.heads:
            raise InputError("%s: num_key_value_heads must equal num_attention_heads" % cfg.path)
        self.attention_scale = (self.nope + self.rot) ** -0.5
        scaling = raw.get("rope_scaling")
        if isinstance(scaling, dict) and scaling.get("mscale_all_dim"):
            factor = float(scaling["factor"])
            m = 0.1 * scaling["mscale_all_dim"] * math.log(factor) + 1 if factor > 1 else 1.0
            self.attention_scale *= m * m

    def read_interleave(self, cfg):
        return cfg.bool("rope_interleave", True)

    def read_head_dim(self, cfg):
        """transformers' DeepSeek config sets head_dim to qk_rope_head_dim: what RoPE turns."""
        return cfg.int("qk_rope_head_dim", 64)

    def read_attention(self, cfg):
        """No per-head norms (use_qk_norm is GLM-4.5's)."""

    def rotary_dim(self, cfg):
        return self.head_dim

    def sparse(self, p):
        return not self.dense and super().sparse(p)

    def expected_tensors(self):
        C, V, H = self.width, self.vocab, self.heads
        D, K, R = self.nope + self.rot, self.kv_rank, self.rot
        out = [("model.embed_tokens.weight", (V, C))]
        for i in range(self.layers):
            p = "model.layers.%d." % i
            a = p + "self_attn."
            out.append((p + "input_layernorm.weight", (C,)))
            if self.q_rank is None:
                out.append((a + "q_proj.weight", (H * D, C)))
            else:
                out += [(a + "q_a_proj.weight", (self.q_rank, C)),
                        (a + "q_a_layernorm.weight", (self.q_rank,)),
                        (a + "q_b_proj.weight", (H * D, self.q_rank))]
            out += [(a + "kv_a_proj_with_mqa.weight", (K + R, C)),
                    (a + "kv_a_layernorm.weight", (K,)),
                    (a + "kv_b_proj.weight", (H * (self.nope + self.value_dim), K)),
                    (a + "o_proj.weight", (C, H * self.value_dim)),
                    (p + "post_attention_layernorm.weight", (C,))]
            out += self.mlp_tensors(p)
        out.append(("model.norm.weight", (C,)))
        if not self.tied:
            out.append(("lm_head.weight", (V, C)))
        return out, set()

    def attention(self, w, a, x, cos, sin):
        """The attention of the layer whose self_attn prefix is `a` on the normed rows x."""
        H, N, R = self.heads, self.nope, self.rot
        if self.q_rank is None:
            q = x @ w[a + "q_proj.weight"].T
        else:
            latent = rms_norm(x @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"],
                              self.latent_eps)
            q = latent @ w[a + "q_b_proj.weight"].T
        q = split_heads(q, H)
        q_pass, q_rot = q[..., :N], q[..., N:]
        compressed = x @ w[a + "kv_a_proj_with_mqa.weight"].T
        latent, k_rot = compressed[..., :self.kv_rank], compressed[..., self.kv_rank:]
        kv = split_heads(rms_norm(latent, w[a + "kv_a_layernorm.weight"], self.latent_eps)
                         @ w[a + "kv_b_proj.weight"].T, H)
        k_pass, v = kv[..., :N], kv[..., N:]
        k_rot = k_rot.unsqueeze(1)  # [B, 1, T, R]: one rotary key for every head
        if self.interleave:  # neighbouring pairs (2i, 2i + 1) to halves (i, i + R/2)
            q_rot = q_rot.unflatten(-1, (R // 2, 2)).transpose(-1, -2).flatten(-2)
            k_rot = k_rot.unflatten(-1, (R // 2, 2)).transpose(-1, -2).flatten(-2)
        q_rot, k_rot = apply_rope(q_rot, cos, sin), apply_rope(k_rot, cos, sin)
        q = torch.cat([q_pass, q_rot], dim=-1)
        k = torch.cat([k_pass, k_rot.expand(-1, H, -1, -1)], dim=-1)
        y = merge_heads(causal_attention(q, k, v, None, self.attention_scale))
        return y @ w[a + "o_proj.weight"].T

    def forward(self, w, tokens):
        cos, sin = rope_tables(tokens.shape[1], self.rot, self.theta, self.scaling)
        x = w["model.embed_tokens.weight"][tokens]
        for i in range(self.layers):
            p = "model.layers.%d." % i
            y = self.attention(w, p + "self_attn.", self.norm(x, w[p + "input_layernorm.weight"]),
                               cos, sin)
            x = x + y
            x = x + self.mlp(w, p, self.norm(x, w[p + "post_attention_layernorm.weight"]))
        x = self.norm(x, w["model.norm.weight"])
        head = w["model.embed_tokens.weight"] if self.tied else w["lm_head.weight"]
        return x @ head.T


class DeepseekV2(DeepseekV3):
    """DeepseekV2ForCausalLM (DeepSeek-V2, V2-Lite, Coder-V2): DeepseekV3's latent attention with
    its RoPE always in neighbouring pairs, its scores scaled under YaRN as DeepSeek's own code and
    vLLM scale them (transformers' port leaves the mscale_all_dim factor out), and softmax
    routing: past the first first_k_dense_replace (default 0) layers, probabilities softmax(m .
    mlp.gate.weight^T) over n_routed_experts; the num_experts_per_tok highest picked (topk_method
    "greedy"), or with "group_limited_greedy" only from the topk_group groups (of n_group) whose
    best probability is highest, the others masked to 0; weighted by their probabilities times
    routed_scaling_factor (default 1; norm_topk_prob must be false), beside the shared experts.
    No selection bias. Without n_routed_experts (the class's default) every layer is dense."""

    expert_defaults = (_REQUIRED, _REQUIRED)
    expert_ffn_default = 1407
    shared_default = _REQUIRED
    dense_default = 0
    normalize_default = False
    scale_default = 1.0
    group_defaults = (1, 1)
    scoring = "softmax"
    topk_methods = ("greedy", "group_limited_greedy")
    experts_absent_dense = True

    def __init__(self, cfg):
        super().__init__(cfg)
        cfg.require("norm_topk_prob", False, (False,), "DeepSeek-V2's weights are unnormalised")

    def read_interleave(self, cfg):
        return True

    def mlp_tensors(self, p):
        return [(name, shape) for name, shape in super().mlp_tensors(p)
                if not name.endswith("e_score_correction_bias")]

    def mlp(self, w, p, m):
        if not self.sparse(p):
            return Llama.mlp(self, w, p, m)
        probs = torch.softmax(m @ w[p + "mlp.gate.weight"].T, dim=-1)
        choice = probs
        if self.topk_method == "group_limited_greedy" and self.kept_groups < self.groups:
            grouped = probs.unflatten(-1, (self.groups, -1))
            best = grouped.max(dim=-1).values.topk(self.kept_groups, dim=-1).indices
            keep = torch.zeros(grouped.shape[:-1], dtype=torch.bool).scatter(-1, best, True)
            choice = grouped.masked_fill(~keep.unsqueeze(-1), 0.0).flatten(-2)
        top, chosen = torch.topk(choice, self.top_k, dim=-1)
        out = mix_experts(w, p, m, self.experts, top * self.scale, chosen)
        s = p + "mlp.shared_experts."
        return out + swiglu(m, w[s + "gate_proj.weight"], w[s + "up_proj.weight"],
                            w[s + "down_proj.weight"])


class Dots1(Glm4Moe):
    """Dots1ForCausalLM (dots.llm1): Qwen3's attention (each query and key head RMSNormed before
    RoPE over the whole head, no biases, rms_norm_eps 1e-6) over Glm4Moe's layers, with no
    defaults for n_routed_experts, num_experts_per_tok or n_shared_experts,
    first_k_dense_replace 0 and norm_topk_prob false by default. Unless sliding_window (default
    4096) is null, the layers layer_types names "sliding_attention" (without the list: those from
    max_window_layers, default 62, on) attend within it."""

    default_eps = 1e-6
    attention_bias_default = None
    expert_defaults = (_REQUIRED, _REQUIRED)
    shared_default = _REQUIRED
    dense_default = 0
    normalize_default = False

    def read_attention(self, cfg):
        self.qk_norm = True
        if "sliding_window" in cfg.raw and cfg.raw["sliding_window"] is None:
            return
        window = cfg.int("sliding_window", 4096)
        start = cfg.int("max_window_layers", 62, minimum=0)
        types = cfg.raw.get("layer_types")
        if types is None:
            types = ["sliding_attention" if i >= start else "full_attention"
                     for i in range(self.layers)]
        self.set_windows(cfg, types, window)

    def rotary_dim(self, cfg):
        return self.head_dim


class OlmoAttention(Llama):
    """OLMo 2's and OLMoE's attention: Llama's with one RMSNorm over each token's whole q
    projection (self_attn.q_norm [hidden_size]) and one over its whole k (k_norm
    [kv_heads * head_dim]), before RoPE. clip_qkv must be null."""

    qk_norm = True
    qk_norm_whole = True

    def __init__(self, cfg):
        super().__init__(cfg)
        if cfg.raw.get("clip_qkv") is not None:
            raise InputError("%s: clip_qkv must be null" % cfg.path)


class Olmo2(OlmoAttention):
    """Olmo2ForCausalLM: OLMo's attention and Llama's MLP, with no norms before either: each
    layer's attention reads the residual stream itself and its output is normed by
    post_attention_layernorm before it joins; the MLP's likewise by post_feedforward_layernorm."""

    norms_after = True


class Olmo3(Olmo2):
    """Olmo3ForCausalLM: OLMo 2's model, the layers layer_types names "sliding_attention"
    attending within sliding_window (default 4096), the others to every position; rope_scaling
    turns the full-attention layers only, the windowed ones with plain RoPE at rope_theta."""

    local_rope_unscaled = True

    def __init__(self, cfg):
        super().__init__(cfg)
        window = cfg.int("sliding_window", 4096)
        types = cfg.raw.get("layer_types")
        self.set_windows(cfg, types, window)


class Exaone4(Llama):
    """Exaone4ForCausalLM (EXAONE 4.0): OLMo 2's layers (no norms before the attention or the
    MLP; each one's output normed by post_attention_layernorm or post_feedforward_layernorm before
    it joins) with Qwen3's RMSNorm over each query and key head (self_attn.q_norm, k_norm
    [head_dim]) before RoPE; rms_norm_eps 1e-5. Unless sliding_window is null (its default is
    4096), the layers layer_types names "sliding_attention" (without the list: all but every
    sliding_window_pattern-th, default 4) attend within it and turn with RoPE, the others attend
    to every position and leave q and k unturned (NoPE). With a null window every layer attends
    everywhere with RoPE."""

    qk_norm = True
    norms_after = True
    default_eps = 1e-5

    def __init__(self, cfg):
        super().__init__(cfg)
        if "sliding_window" in cfg.raw and cfg.raw["sliding_window"] is None:
            return
        window = cfg.int("sliding_window", 4096)
        types = cfg.raw.get("layer_types")
        if types is None:
            pattern = cfg.int("sliding_window_pattern", 4)
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                     for i in range(self.layers)]
        self.set_windows(cfg, types, window)
        self.rope_layers = [t == "sliding_attention" for t in types]


class Olmoe(OlmoAttention):
    """OlmoeForCausalLM: OLMo's attention, and in every layer Qwen3-MoE's sparse MLP (mlp.gate,
    mlp.experts.j.gate_proj, up_proj, down_proj) of intermediate_size, the top k divided by their
    sum when norm_topk_prob (default false)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.experts, self.top_k = read_expert_counts(cfg, "num_experts")
        self.normalize = cfg.bool("norm_topk_prob", False)

    def mlp_tensors(self, p):
        return qwen_expert_tensors(p, self.experts, self.width, self.ffn)

    def mlp(self, w, p, m):
        return qwen_sparse_mlp(w, p, m, self.experts, self.top_k, self.normalize)


class MiniMaxM2(OlmoAttention):
    """MiniMaxM2ForCausalLM (MiniMax-M2): OLMo's attention (one RMSNorm over each token's whole q
    and one over its whole k; qk_norm_type "per_layer") with RoPE over the first rotary_dim
    dimensions of each head in Llama's rotate-half pairs (else partial_rotary_factor's), base
    5,000,000 by default, and in every layer Mixtral-named experts (block_sparse_moe.experts.j.w1
    gate, w3 up, w2 down) routed by sigmoid(m . block_sparse_moe.gate.weight^T): the
    num_experts_per_tok experts of highest score + block_sparse_moe.e_score_correction_bias are
    picked (the bias chooses, never weighs), weighted by their scores divided by the picks' sum.
    Layers from num_hidden_layers on hold multi-token prediction, which the causal LM does not
    use."""

    default_theta = 5000000.0

    def __init__(self, cfg):
        super().__init__(cfg)
        self.experts, self.top_k = read_expert_counts(cfg, defaults=(256, 8))
        for key, want in (("scoring_func", "sigmoid"), ("qk_norm_type", "per_layer")):
            if cfg.raw.get(key, want) != want:
                raise InputError("%s: %s must be %r" % (cfg.path, key, want))
        for key in ("use_qk_norm", "use_routing_bias"):
            if not cfg.bool(key, True):
                raise InputError("%s: %s must be true" % (cfg.path, key))
        if cfg.raw.get("shared_intermediate_size", 0):
            raise InputError("%s: shared_intermediate_size must be 0" % cfg.path)

    def rotary_dim(self, cfg):
        if cfg.raw.get("rotary_dim") is not None:
            return cfg.int("rotary_dim")
        return partial_rotary_dim(cfg, self.head_dim, 1.0)

    ignored = Glm4Moe.ignored  # the multi-token prediction layers past the model's

    def mlp_tensors(self, p):
        C, F_, b = self.width, self.ffn, p + "block_sparse_moe."
        out = [(b + "gate.weight", (self.experts, C)),
               (b + "e_score_correction_bias", (self.experts,))]
        for j in range(self.experts):
            e = b + "experts.%d." % j
            out += [(e + "w1.weight", (F_, C)), (e + "w2.weight", (C, F_)),
                    (e + "w3.weight", (F_, C))]
        return out

    def mlp(self, w, p, m):
        b = p + "block_sparse_moe."
        scores = torch.sigmoid(m @ w[b + "gate.weight"].T)
        _, chosen = torch.topk(scores + w[b + "e_score_correction_bias"], self.top_k, dim=-1)
        top = scores.gather(-1, chosen)
        e = b + "experts.%d."
        return mix_swiglu(m, [(w[e % j + "w1.weight"], w[e % j + "w3.weight"],
                               w[e % j + "w2.weight"]) for j in range(self.experts)],
                          top / top.sum(dim=-1, keepdim=True), chosen)


class SmolLM3(Llama):
    """SmolLM3ForCausalLM: Llama's model (tied embeddings by default) whose NoPE layers leave q
    and k unturned: no_rope_layers holds one entry per layer, 1 for RoPE and 0 for none, or
    without it every no_rope_layer_interval-th layer (4) is NoPE. With use_sliding_window and a
    sliding_window, the NoPE layers attend within the window (layer_types may say otherwise)."""

    tied_by_default = True

    def __init__(self, cfg):
        super().__init__(cfg)
        flags = cfg.raw.get("no_rope_layers")
        if flags is None:
            interval = cfg.int("no_rope_layer_interval", 4)
            flags = [int((i + 1) % interval != 0) for i in range(self.layers)]
        if not isinstance(flags, list) or len(flags) < self.layers or any(
                f not in (0, 1) or isinstance(f, bool) for f in flags):
            raise InputError("%s: no_rope_layers must list 0 or 1 for each of the %d layers"
                             % (cfg.path, self.layers))
        self.rope_layers = [f == 1 for f in flags[:self.layers]]
        if cfg.bool("use_sliding_window", False) and cfg.raw.get("sliding_window") is not None:
            window = cfg.int("sliding_window")
            types = cfg.raw.get("layer_types")
            if types is None:
                types = ["full_attention" if r else "sliding_attention" for r in self.rope_layers]
            self.windows = [window if t == "sliding_attention" else None
                            for t in types[:self.layers]]


class Granite(Llama):
    """GraniteForCausalLM: Llama's model and tensors with four multipliers, each 1 by default:
    the embeddings times embedding_multiplier, each layer's attention and MLP output times
    residual_multiplier before it joins the residual stream, the scores times attention_multiplier
    (in place of 1 / sqrt(head_dim)) and the logits divided by logits_scaling."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.embedding_scale = cfg.positive("embedding_multiplier", 1.0)
        self.residual_multiplier = cfg.positive("residual_multiplier", 1.0)
        self.attention_scale = cfg.positive("attention_multiplier", 1.0)
        self.logits_scaling = cfg.positive("logits_scaling", 1.0)


class GraniteMoe(Granite):
    """GraniteMoeForCausalLM: Granite's model with a sparse MLP in every layer
    (block_sparse_moe): the router `router.layer` scores each token's experts, the
    num_experts_per_tok highest scores are kept and their weights are a softmax over those scores
    alone; each kind of expert weight is stacked in one tensor, input_linear
    [experts, 2 * intermediate_size, hidden] (an expert's gate rows, then its up rows) and
    output_linear [experts, hidden, intermediate_size]."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.experts, self.top_k = read_expert_counts(cfg)

    def mlp_tensors(self, p):
        C, F_, E = self.width, self.ffn, self.experts
        moe = p + "block_sparse_moe."
        return [(moe + "router.layer.weight", (E, C)),
                (moe + "input_linear.weight", (E, 2 * F_, C)),
                (moe + "output_linear.weight", (E, C, F_))]

    def mlp(self, w, p, m):
        moe, F_ = p + "block_sparse_moe.", self.ffn
        scores = m @ w[moe + "router.layer.weight"].T
        top, chosen = torch.topk(scores, self.top_k, dim=-1)
        gates = torch.softmax(top, dim=-1)
        stacked_in, stacked_out = w[moe + "input_linear.weight"], w[moe + "output_linear.weight"]
        out = torch.zeros_like(m)
        for j in range(self.experts):
            weight = (gates * (chosen == j)).sum(dim=-1, keepdim=True)
            out = out + weight * swiglu(m, stacked_in[j][:F_], stacked_in[j][F_:], stacked_out[j])
        return out


MODELS = {"gpt2": Gpt2, "llama": Llama, "gemma": Gemma, "gemma2": Gemma2,
          "gemma3_text": Gemma3,
          "mistral": Mistral, "ministral": Ministral, "phi3": Phi3, "qwen2": Qwen2,
          "qwen2_moe": Qwen2Moe, "qwen3": Qwen3, "qwen3_moe": Qwen3Moe, "mixtral": Mixtral,
          "olmo2": Olmo2, "olmo3": Olmo3, "olmoe": Olmoe, "exaone4": Exaone4, "smollm3": SmolLM3,
          "granite": Granite, "granitemoe": GraniteMoe, "glm": Glm, "glm4": Glm4,
          "glm4_moe": Glm4Moe, "dots1": Dots1, "minimax_m2": MiniMaxM2, "ernie4_5": Ernie45, "ernie4_5_moe": Ernie45Moe, "helium": Helium,
          "seed_oss": SeedOss, "deepseek_v2": DeepseekV2, "deepseek_v3": DeepseekV3,
          "kimi_k2": DeepseekV3}


def load_weights(model, model_dir):
    """{canonical name: float64 array} holding exactly the tensors the config implies."""
    files, missing_where = load_checkpoint(model_dir)
    by_canonical = {}
    for name in sorted(files):
        canonical = model.canonical_name(name)
        if canonical in by_canonical:
            raise InputError("%s: tensors %r and %r are the same tensor"
                             % (files[name].path, by_canonical[canonical], name))
        by_canonical[canonical] = name
    expected, ignored = model.expected_tensors()
    weights = {}
    for canonical, shape in expected:
        if canonical not in by_canonical:
            raise InputError("%s: tensor %r is missing (the config implies %s)"
                             % (missing_where, canonical, list(shape)))
        name = by_canonical[canonical]
        st = files[name]
        got = st.tensors[name][1]
        if got != shape:
            raise InputError("%s: tensor %r has shape %s, the config implies %s"
                             % (st.path, name, list(got), list(shape)))
        weights[canonical] = st.read(name)
    implied = {canonical for canonical, _ in expected} | ignored
    for canonical, name in sorted(by_canonical.items()):
        if canonical not in implied and not getattr(model, "ignored", lambda _: False)(canonical):
            raise InputError("%s: tensor %r is not part of the model the config describes"
                             % (files[name].path, name))
    return weights


# ---- the CLI ------------------------------------------------------------------------------------

class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        raise InputError(message)


def parse_args(argv):
    parser = _ArgumentParser(prog="hf_oracle.py", description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("tokens_file")
    parser.add_argument("out_dir")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--generate", type=int, default=None, metavar="N")
    args = parser.parse_args(argv)
    for key in ("batch", "seq"):
        if getattr(args, key) < 1:
            raise InputError("--%s must be at least 1" % key)
    if args.generate is not None and args.generate < 0:
        raise InputError("--generate must be at least 0")
    return args


def read_tokens(path, batch, seq, vocab):
    want = batch * seq * 4
    try:
        size = os.path.getsize(path)
        tokens = np.fromfile(path, dtype="<i4")
    except OSError as e:
        raise InputError("%s: %s" % (path, e.strerror or e))
    if size != want:
        raise InputError("%s: expected int32 [%d, %d] (%d bytes), the file has %d bytes"
                         % (path, batch, seq, want, size))
    if tokens.min() < 0 or tokens.max() >= vocab:
        raise InputError("%s: token ids must lie in [0, %d), found [%d, %d]"
                         % (path, vocab, tokens.min(), tokens.max()))
    return tokens.reshape(batch, seq).astype(np.int64)


def first_argmax(x):
    """The index of the largest entry of each row of x [B, V]; the lowest one on ties."""
    top = x.max(dim=-1, keepdim=True).values
    ids = torch.arange(x.shape[-1]).expand_as(x)
    return torch.where(x == top, ids, x.shape[-1]).min(dim=-1).values


def greedy_generate(model, weights, tokens, count, first_logits):
    """The `count` new ids of each row [B, count] (torch int64); first_logits = forward(tokens)."""
    logits, seq, new = first_logits, tokens, []
    for step in range(count):
        if step > 0:
            logits = model.forward(weights, seq)
        chosen = first_argmax(logits[:, -1, :])
        new.append(chosen)
        seq = torch.cat([seq, chosen[:, None]], dim=1)
    return torch.stack(new, dim=1) if new else torch.zeros((tokens.shape[0], 0), dtype=torch.int64)


def run(argv):
    args = parse_args(argv)
    model = read_config(args.model_dir)
    new_tokens = args.generate or 0
    if args.seq + new_tokens > model.max_positions:
        raise InputError("--seq %d + --generate %d exceeds the model's %d positions"
                         % (args.seq, new_tokens, model.max_positions))
    weights = load_weights(model, args.model_dir)
    tokens = read_tokens(args.tokens_file, args.batch, args.seq, model.vocab)
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        raise InputError("%s: %s" % (args.out_dir, e.strerror or e))
    load_torch()
    weights = {name: torch.from_numpy(value) for name, value in weights.items()}
    tokens = torch.from_numpy(tokens)
    with torch.no_grad():
        logits = model.forward(weights, tokens)
    np.ascontiguousarray(logits.numpy(), dtype="<f8").tofile(
        os.path.join(args.out_dir, "logits.f64"))
    if args.generate is not None:
        with torch.no_grad():
            new = greedy_generate(model, weights, tokens, args.generate, logits).tolist()
        with open(os.path.join(args.out_dir, "generated.txt"), "w", encoding="utf-8") as f:
            for row in new:
                f.write(" ".join(str(int(v)) for v in row) + "\n")


def main(argv):
    try:
        run(argv[1:])
    except InputError as e:
        sys.stderr.write("hf_oracle: %s\n" % str(e).replace("\n", "\\n"))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
