#!/usr/bin/env python3
"""PyTorch training-step benchmark on the GPU: the peer of trainyard-bench-gpu-train.

Usage: torch_gpu_train.py --preset gpt2-124m|llama-1b [--seq T] [--batch B] [--micro-batch M]
                          [--steps 10] [--warmup 3] [--compile model|regional|none]
                          [--peak-tflops X] [--cpu-smoke] [--timeline FILE]

The same two models as Trainyard's presets, written the way a PyTorch user would: fp32
parameters under bf16 autocast, F.scaled_dot_product_attention(is_causal=True) (GQA through
enable_gqa=True, or repeat_interleave where this torch or its kernel lacks it), torch.compile,
AdamW(fused=True), global-norm clipping at 1.0. GPT-2: learned positions, LayerNorm, GELU
(tanh), biased linears, tied embeddings. Llama: RoPE (rotate-half), RMSNorm, SwiGLU (the first
MLP linear's rows are gate then up), grouped-query attention, no biases, untied LM head.

--compile model compiles the whole model (the fastest steps, the longest compile); regional
compiles each transformer block and the final norm + LM head + loss separately (identical
blocks share one compiled graph, so it compiles in a fraction of the time); none runs eagerly.

Each step: for every micro-batch, forward + loss (mean over the step's tokens) + backward; clip;
AdamW; zero the gradients; read the loss (which waits for the device, as Trainyard's loop does).
Random tokens in [0, min(vocab, 65536)) (Trainyard's token shards are uint16), drawn on the
device before timing. Prints a summary, then one JSON line with the keys of
trainyard-bench-gpu-train's. MFU uses PaLM's 6·N + 12·L·H·Q·T FLOPs per token with N every
parameter (a tied embedding once) against the device's dense bf16 peak: H100 SXM 989 TFLOP/s,
H100 PCIe 756, H100 NVL 835, H200 989, else --peak-tflops.

--timeline FILE records every kernel, copy and fill of the measured steps with PyTorch's profiler
(CUPTI underneath) and writes them as JSON in the form trainyard-bench-gpu-train --timeline
writes (bench/timeline_report.py sets the two side by side); those steps' times are not the
benchmark's.

--cpu-smoke swaps the preset for its family's debug size and runs a few fp32 steps on the CPU
without compile: it checks this script (and that the parameter count matches Trainyard's
gpt2-debug / llama-debug presets), not PyTorch's speed.
"""

import argparse
import contextlib
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The presets of config/model_config.cc this benchmark runs.
PRESETS = {
    "gpt2-124m": dict(family="gpt2", layers=12, width=768, heads=12, kv_heads=12, ffn=3072,
                      vocab=50257, max_seq=1024, tied=True, batch=16),
    "llama-1b": dict(family="llama", layers=16, width=2048, heads=32, kv_heads=8, ffn=8192,
                     vocab=128256, max_seq=2048, tied=False, batch=4, rope_theta=10000.0),
    "gpt2-debug": dict(family="gpt2", layers=2, width=64, heads=4, kv_heads=4, ffn=256,
                       vocab=256, max_seq=64, tied=True, batch=8),
    "llama-debug": dict(family="llama", layers=2, width=64, heads=4, kv_heads=2, ffn=128,
                        vocab=256, max_seq=64, tied=False, batch=8, rope_theta=10000.0),
}
EPS = 1e-5


def peak_tflops(name):
    """Dense bf16 peak of the devices we know (as trainyard-bench-gpu-train), else None."""
    if "H200" in name:
        return 989.0
    if "H100" in name:
        if "PCIe" in name:
            return 756.0
        if "NVL" in name:
            return 835.0
        return 989.0
    return None


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def gqa_supported(device):
    """Whether the flash SDPA kernel takes enable_gqa=True here (forward and backward); when it
    does not, k and v are repeat_interleave'd so that flash still runs."""
    if not has_sdpa() or device.type != "cuda":
        return False
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:
        q = torch.randn(1, 4, 128, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, 2, 128, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, 2, 128, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out.sum().backward()
        return True
    except (RuntimeError, TypeError):
        return False


def causal_attention(q, k, v, gqa):
    """q [b, h, t, d], k/v [b, kv, t, d] → [b, h, t, d]."""
    h, kv = q.shape[1], k.shape[1]
    if h != kv and not gqa:
        k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
    if has_sdpa():
        if k.shape[1] != h:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # torch without SDPA (smoke)
    mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


class RMSNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).type_as(x) * self.weight


def rope_tables(seq, head_dim, theta, device):
    """cos, sin [seq, head_dim/2] (fp32, angles in fp64): angle = p · theta^(−2i/d)."""
    i = torch.arange(head_dim // 2, dtype=torch.float64, device=device)
    angle = torch.arange(seq, dtype=torch.float64, device=device)[:, None] * theta ** (
        -2.0 * i / head_dim)[None, :]
    return torch.cos(angle).float(), torch.sin(angle).float()


def apply_rope(x, cos, sin):
    """Rotate-half on x [b, t, heads, d]: pairs (i, i + d/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).type_as(x)


class Block(nn.Module):
    def __init__(self, cfg, gqa):
        super().__init__()
        gpt2 = cfg["family"] == "gpt2"
        c, h, kv, f = cfg["width"], cfg["heads"], cfg["kv_heads"], cfg["ffn"]
        self.h, self.kv, self.d, self.f, self.gpt2, self.gqa = h, kv, c // h, f, gpt2, gqa
        self.ln1 = nn.LayerNorm(c, eps=EPS) if gpt2 else RMSNorm(c)
        self.ln2 = nn.LayerNorm(c, eps=EPS) if gpt2 else RMSNorm(c)
        self.qkv = nn.Linear(c, (h + 2 * kv) * self.d, bias=gpt2)
        self.proj = nn.Linear(h * self.d, c, bias=gpt2)
        self.fc = nn.Linear(c, f if gpt2 else 2 * f, bias=gpt2)
        self.fc_proj = nn.Linear(f, c, bias=gpt2)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h, kv, d = self.h, self.kv, self.d
        qkv = self.qkv(self.ln1(x))
        q = qkv[..., :h * d].view(b, t, h, d)
        k = qkv[..., h * d:(h + kv) * d].view(b, t, kv, d)
        v = qkv[..., (h + kv) * d:].view(b, t, kv, d)
        if not self.gpt2:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.gqa)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, h * d))
        hidden = self.fc(self.ln2(x))
        if self.gpt2:
            hidden = F.gelu(hidden, approximate="tanh")
        else:
            hidden = F.silu(hidden[..., :self.f]) * hidden[..., self.f:]
        return x + self.fc_proj(hidden)


class Transformer(nn.Module):
    def __init__(self, cfg, gqa):
        super().__init__()
        self.cfg = cfg
        c, v = cfg["width"], cfg["vocab"]
        self.wte = nn.Embedding(v, c)
        self.wpe = nn.Embedding(cfg["max_seq"], c) if cfg["family"] == "gpt2" else None
        self.blocks = nn.ModuleList(Block(cfg, gqa) for _ in range(cfg["layers"]))
        self.lnf = nn.LayerNorm(c, eps=EPS) if cfg["family"] == "gpt2" else RMSNorm(c)
        self.lm_head = nn.Linear(c, v, bias=False)
        if cfg["tied"]:
            self.lm_head.weight = self.wte.weight
        if cfg["family"] == "llama":
            cos, sin = rope_tables(cfg["max_seq"], c // cfg["heads"], cfg["rope_theta"], None)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.head_loss = self._head_loss

    def _head_loss(self, x, targets):
        logits = self.lm_head(self.lnf(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.wte(tokens)
        cos = sin = None
        if self.wpe is not None:
            x = x + self.wpe.weight[:t]
        else:
            cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head_loss(x, targets)


def init_weights(model):
    """GPT-2 style: normal(0, 0.02) matrices and embeddings, zero biases, unit norm weights."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)


def compiled(model, mode):
    if mode == "none":
        return model
    if mode == "model":
        return torch.compile(model)
    for block in model.blocks:
        block.compile()
    model.head_loss = torch.compile(model._head_loss)
    return model


def write_timeline(profiler, preset, path):
    """The measured steps' GPU activities as trainyard-bench-gpu-train --timeline writes them:
    step marks and [kind, start, end, bytes, name] records in ns from the first mark."""
    cuda = torch.autograd.DeviceType.CUDA
    events = list(profiler.events())
    steps = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.name == "trainyard_timeline_step" and e.device_type != cuda)
    if not steps:
        raise SystemExit("torch_gpu_train: the profiler recorded no step marks")
    first = steps[0][0]
    marks = [start - first for start, _ in steps] + [steps[-1][1] - first]
    records = []
    for e in events:
        # The device-side copies of record_function ranges (the step marks, the optimizer's
        # own) are annotations, not work.
        if e.device_type != cuda or getattr(e, "is_user_annotation", False) or \
                e.name == "trainyard_timeline_step" or e.name.startswith("Optimizer."):
            continue
        kind = ("memcpy" if e.name.startswith("Memcpy") else
                "memset" if e.name.startswith("Memset") else "kernel")
        # A record that straddles the window's edges counts for its part inside.
        start = max(e.time_range.start - first, 0)
        end = min(e.time_range.end - first, marks[-1])
        if end > start:
            records.append([kind, int(start * 1000), int(end * 1000), 0, e.name])
    records.sort(key=lambda r: r[1])
    with open(path, "w") as out:
        json.dump({"engine": "pytorch", "preset": preset, "clock": "ns",
                   "marks": [int(m * 1000) for m in marks], "records": records}, out)
    sys.stderr.write("timeline of %d steps written to %s\n" % (len(steps), path))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt2-124m", choices=["gpt2-124m", "llama-1b"])
    ap.add_argument("--seq", type=int, default=0, help="default: the preset's max_seq")
    ap.add_argument("--batch", type=int, default=0, help="default: 16 (GPT-2), 4 (Llama)")
    ap.add_argument("--micro-batch", type=int, default=0, help="default: the batch")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", default="model", choices=["model", "regional", "none"])
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--timeline", default="", help="write the measured steps' GPU records here")
    args = ap.parse_args()
    if args.timeline and args.cpu_smoke:
        ap.error("--timeline records the GPU; it has no --cpu-smoke form")
    if args.cpu_smoke:
        args.preset = "gpt2-debug" if args.preset.startswith("gpt2") else "llama-debug"
        args.seq, args.batch = min(args.seq or 32, 32), min(args.batch or 2, 4)
        if not args.micro_batch or args.micro_batch > args.batch or args.batch % args.micro_batch:
            args.micro_batch = args.batch
        args.steps, args.warmup, args.compile = min(args.steps, 2), min(args.warmup, 1), "none"
    cfg = PRESETS[args.preset]
    args.seq = args.seq or cfg["max_seq"]
    args.batch = args.batch or cfg["batch"]
    args.micro_batch = args.micro_batch or args.batch
    if not 0 < args.seq <= cfg["max_seq"]:
        ap.error("--seq must be in [1, %d]" % cfg["max_seq"])
    if args.batch % args.micro_batch != 0:
        ap.error("--batch must be a multiple of --micro-batch")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be at least 1 and --warmup at least 0")
    return args, cfg


def main():
    args, cfg = parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.stderr.write("torch_gpu_train: no CUDA device visible to torch; this benchmark needs "
                         "a GPU (or --cpu-smoke)\n")
        return 2
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    device_name = "cpu" if args.cpu_smoke else torch.cuda.get_device_name(0)
    peak = args.peak_tflops or peak_tflops(device_name)
    if not peak:
        if not args.cpu_smoke:
            sys.stderr.write("torch_gpu_train: no known bf16 peak for '%s': pass --peak-tflops\n"
                             % device_name)
            return 2
        peak = 1.0
    torch.manual_seed(0)
    gqa = cfg["heads"] != cfg["kv_heads"] and gqa_supported(device)
    model = Transformer(cfg, gqa).to(device)
    init_weights(model)
    params = list(model.parameters())  # a tied embedding appears once
    n_params = sum(p.numel() for p in params)
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    fused = {} if args.cpu_smoke else {"fused": True}
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **fused)
    model = compiled(model, args.compile)

    micro_batches = args.batch // args.micro_batch
    total = args.warmup + args.steps
    high = min(cfg["vocab"], 65536)
    data = torch.randint(0, high, (total, micro_batches, args.micro_batch, args.seq + 1),
                         device=device)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if not args.cpu_smoke
                else contextlib.nullcontext())

    times, loss_value = [], float("nan")
    profiler = None
    for step in range(total):
        if step == args.warmup and args.timeline:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA])
            profiler.__enter__()
        marker = (torch.profiler.record_function("trainyard_timeline_step") if profiler
                  else contextlib.nullcontext())
        marker.__enter__()
        start = time.perf_counter()
        loss_sum = 0.0
        for i in range(micro_batches):
            tokens, targets = data[step, i, :, :-1], data[step, i, :, 1:]
            with autocast:
                loss = model(tokens, targets) / micro_batches
            loss.backward()
            loss_sum = loss_sum + loss.detach()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = float(loss_sum)  # waits for the device
        if not args.cpu_smoke:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        marker.__exit__(None, None, None)
        if step >= args.warmup:
            times.append(elapsed)
        else:
            sys.stderr.write("warm-up step %d: %.1f ms, loss %.4f\n"
                             % (step + 1, elapsed * 1e3, loss_value))

    if profiler is not None:
        profiler.__exit__(None, None, None)
        write_timeline(profiler, args.preset, args.timeline)
    median = statistics.median(times)
    tokens_per_step = args.batch * args.seq
    tokens_per_s = tokens_per_step / median
    attention_flop = 12.0 * cfg["layers"] * cfg["width"] * args.seq  # 12·L·H·Q·T, H·Q = width
    lookup_only = ((cfg["max_seq"] * cfg["width"] if cfg["family"] == "gpt2" else 0)
                   + (0 if cfg["tied"] else cfg["vocab"] * cfg["width"]))
    flop_per_token = 6.0 * n_params + attention_flop
    achieved = flop_per_token * tokens_per_s / 1e12
    mfu_matmul = (6.0 * (n_params - lookup_only) + attention_flop) * tokens_per_s / 1e12 / peak
    print("%s on %s: batch %d (micro %d) x seq %d = %d tokens/step, %d parameters"
          % (args.preset, device_name, args.batch, args.micro_batch, args.seq, tokens_per_step,
             n_params))
    print("median step %.2f ms over %d steps (after %d warm-up) | %.0f tokens/s"
          % (median * 1e3, args.steps, args.warmup, tokens_per_s))
    print("%.3f GFLOP/token (6N + 12LHQT) | %.1f TFLOP/s | MFU %.1f%% of %.0f TFLOP/s"
          % (flop_per_token / 1e9, achieved, 100 * achieved / peak, peak))
    print(json.dumps({
        "engine": "pytorch", "preset": args.preset, "device": device_name, "batch": args.batch,
        "micro_batch": args.micro_batch, "seq": args.seq, "steps": args.steps,
        "warmup": args.warmup, "params": n_params, "tokens_per_step": tokens_per_step,
        "median_step_ms": median * 1e3, "mean_step_ms": statistics.mean(times) * 1e3,
        "tokens_per_s": tokens_per_s, "flop_per_token": flop_per_token,
        "achieved_tflops": achieved, "peak_tflops": peak, "mfu": achieved / peak,
        "mfu_matmul_params": mfu_matmul, "final_loss": loss_value,
        "compile": args.compile, "gqa": ("enable_gqa" if gqa else "repeat_interleave")
        if cfg["heads"] != cfg["kv_heads"] else "n/a", "torch": torch.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
