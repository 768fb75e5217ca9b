#!/usr/bin/env python3
"""PyTorch's counterparts of trainyard-bench-gpu-kernels, at the same shapes and dtypes.

Usage: torch_gpu_kernels.py [--warmup 5] [--reps 30] [--model gpt2-124m|llama-1b|attn-d128]
                            [--only SUBSTRING] [--json] [--cpu-smoke]

Every case of bench/gpu_kernel_cases.cc under the same name, shape and work count, timed the
same way: torch.cuda.Event pairs around each rep, the L2 cache flushed before each, median of
the reps after a warm-up (the GPU is also kept busy for a moment before each rep's first event,
so that Python's launch overhead is not counted as kernel time). Prints the same fixed-width
table and, with --json, each row followed by its JSON line:
{"engine": "pytorch", "case": "model/kernel", ..., "median_ms", "tflops" | "gbps"}.

The counterparts (bf16 activations, fp32 parameters and statistics):
  attention      F.scaled_dot_product_attention(is_causal=True) under
                 sdpa_kernel(SDPBackend.FLASH_ATTENTION); q, k, v are strided views of one packed
                 [b, t, (h + 2kv)·d] tensor, as the model holds them. GQA through enable_gqa=True;
                 should the flash backend refuse it, k and v are repeat_interleave'd to h heads
                 before the timing (the last line, and the rows' "gqa" key, say which ran).
  norms, GELU,   torch.compile'd functions (fp32 arithmetic on bf16 storage), forward then
  SwiGLU, CE     backward through autograd (torch.autograd.grad).
  cross-entropy  compiled F.cross_entropy(logits.float(), targets, reduction="sum") / rows and
                 its gradient, which PyTorch writes to a new bf16 tensor (ours is in place).
  AdamW          torch.optim.AdamW(fused=True) over GPT-2 124M's tensors (fp32), decay on the
                 matrices only.
  embedding bwd  aten.embedding_dense_backward (PyTorch's own CUDA kernel), bf16 gradient out,
                 plus the position gradient (a sum over the batch) for GPT-2.
  GEMMs          F.linear / torch.matmul in bf16 (cuBLAS); the weight gradient comes out bf16
                 (ours accumulates into fp32).

--cpu-smoke runs every case on the CPU at tiny shapes in fp32 without torch.compile (and without
SDPA or fused AdamW where this torch lacks them): it checks this script, not PyTorch's speed.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

MODELS = {
    "gpt2-124m": dict(family="gpt2", batch=16, seq=1024, width=768, heads=12, kv_heads=12,
                      ffn=3072, vocab=50257, layers=12, max_seq=1024, ce_rows=4096),
    "llama-1b": dict(family="llama", batch=4, seq=2048, width=2048, heads=32, kv_heads=8,
                     ffn=8192, vocab=128256, layers=16, max_seq=2048, ce_rows=4096),
    # Attention alone at head dim 128 (the other fields are unused).
    "attn-d128": dict(family="llama", batch=2, seq=4096, width=4096, heads=32, kv_heads=8,
                      ffn=8192, vocab=128256, layers=1, max_seq=4096, ce_rows=4096,
                      attention_only=True),
}
SMOKE = {
    "gpt2-124m": dict(family="gpt2", batch=2, seq=64, width=64, heads=4, kv_heads=4, ffn=256,
                      vocab=300, layers=2, max_seq=64, ce_rows=32),
    "llama-1b": dict(family="llama", batch=2, seq=64, width=64, heads=4, kv_heads=2, ffn=128,
                     vocab=300, layers=2, max_seq=64, ce_rows=32),
    "attn-d128": dict(family="llama", batch=1, seq=64, width=256, heads=2, kv_heads=1, ffn=128,
                      vocab=300, layers=1, max_seq=64, ce_rows=32, attention_only=True),
}
EPS = 1e-5
SLEEP_CYCLES = 2_000_000
AB, FB = 2, 4  # bytes of a bf16 activation, of an fp32 value (the counts assume bf16 storage)


def splitmix64(x):
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def bench_tokens(n, vocab, seed):
    """The ids trainyard-bench-gpu-kernels uses (BenchTokens in bench/gpu_bench_util.cc)."""
    return [splitmix64(seed + i) % vocab for i in range(n)]


def sig6(x):
    """absl::SixDigits formatting."""
    return "%g" % float("%.6g" % x)


class Env:
    """Device, storage type, compile switch and the timer shared by every case."""

    def __init__(self, args):
        self.smoke = args.cpu_smoke
        self.device = torch.device("cpu" if self.smoke else "cuda")
        self.act = torch.float32 if self.smoke else torch.bfloat16
        self.warmup, self.reps = args.warmup, args.reps
        self.flush = None
        if not self.smoke:
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (64 << 20)
            self.flush = torch.empty(2 * l2, dtype=torch.uint8, device=self.device)
        self.gqa_mode = None

    def compile(self, fn):
        # dynamic=False: each shape gets its own specialised kernels, as in a training run.
        if self.smoke or not hasattr(torch, "compile"):
            return fn
        return torch.compile(fn, dynamic=False)

    def randn(self, *shape, dtype=None, scale=1.0, grad=False):
        t = torch.randn(*shape, device=self.device, dtype=torch.float32) * scale
        t = t.to(dtype or self.act)
        return t.requires_grad_(grad)

    def time(self, op, prepare=None):
        """(median ms, min ms) of `reps` runs of op() after `warmup` untimed ones."""
        for _ in range(self.warmup):
            if prepare:
                prepare()
            op()
        times = []
        if self.smoke:
            for _ in range(self.reps):
                if prepare:
                    prepare()
                start = time.perf_counter()
                op()
                times.append((time.perf_counter() - start) * 1e3)
        else:
            events = []
            for i in range(self.reps):
                if prepare:
                    prepare()
                self.flush.fill_(i & 0xFF)
                # Keeps the GPU busy (~1 ms) while Python queues the op, so that the events
                # time the kernels and not the interpreter's launch overhead.
                if hasattr(torch.cuda, "_sleep"):
                    torch.cuda._sleep(SLEEP_CYCLES)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                op()
                end.record()
                events.append((start, end))
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in events]
        return statistics.median(times), min(times)


# ---- Cases: each returns (shape, flop, bytes, (median_ms, min_ms)) --------------------------

def attention(env, m, mode):
    b, t, h, kv, c = m["batch"], m["seq"], m["heads"], m["kv_heads"], m["width"]
    d = c // h
    shape = "b%d t%d h%d/%d d%d causal" % (b, t, h, kv, d)
    qkv = env.randn(b, t, (h + 2 * kv) * d)

    def view(lo, n):
        return qkv[..., lo * d:(lo + n) * d].view(b, t, n, d).transpose(1, 2).detach()

    q, k, v = view(0, h), view(h, kv), view(h + kv, kv)
    dout = env.randn(b, h, t, d)
    sdpa_fn, ctx = sdpa(env, h, kv)
    if h != kv and env.gqa_mode == "repeat_interleave":
        k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
    q, k, v = q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    fwd_flop = 2.0 * b * h * t * t * d
    with ctx():
        if mode == "fwd":
            return shape, fwd_flop, 0, env.time(lambda: sdpa_fn(q, k, v))
        if mode == "bwd":
            out = sdpa_fn(q, k, v)
            return shape, 2.5 * fwd_flop, 0, env.time(
                lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        return shape, 3.5 * fwd_flop, 0, env.time(
            lambda: torch.autograd.grad(sdpa_fn(q, k, v), (q, k, v), dout))


def sdpa(env, h, kv):
    """(attention function, context manager factory). For GQA (h != kv) it also settles, once,
    env.gqa_mode: "enable_gqa" or "repeat_interleave" (k and v expanded by the caller)."""
    import contextlib
    if not hasattr(F, "scaled_dot_product_attention"):  # old torch (the CPU smoke run)
        if h != kv:
            env.gqa_mode = "repeat_interleave"

        def math_attention(q, k, v):
            scores = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5)
            mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
            return torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v
        return math_attention, contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def ctx():
        return sdpa_kernel(SDPBackend.MATH if env.smoke else SDPBackend.FLASH_ATTENTION)
    if h != kv and env.gqa_mode is None:
        env.gqa_mode = probe_gqa(env, ctx)
    gqa = h != kv and env.gqa_mode == "enable_gqa"
    if gqa:
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                               enable_gqa=True)), ctx
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), ctx


def probe_gqa(env, ctx):
    """Whether the flash backend takes enable_gqa=True here (forward and backward)."""
    q = env.randn(1, 4, 128, 64, grad=True)
    k, v = env.randn(1, 2, 128, 64, grad=True), env.randn(1, 2, 128, 64, grad=True)
    try:
        with ctx():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out.sum().backward()
        return "enable_gqa"
    except (RuntimeError, TypeError) as e:
        sys.stderr.write("torch_gpu_kernels: flash SDPA refused enable_gqa (%s); k and v are "
                         "repeat_interleave'd instead\n" % str(e).splitlines()[0])
        return "repeat_interleave"


def norm(env, m, layer_norm):
    """Forward then backward of LayerNorm (with bias) or RMSNorm over the batch's token rows."""
    rows, c = m["batch"] * m["seq"], m["width"]
    x, dout = env.randn(rows, c, grad=True), env.randn(rows, c)
    w = env.randn(c, dtype=torch.float32, grad=True)
    b = env.randn(c, dtype=torch.float32, grad=True)
    act = env.act

    if layer_norm:
        def fn(x, w, b):
            return F.layer_norm(x.float(), (c,), w, b, EPS).to(act)
        inputs = (x, w, b)
    else:
        def fn(x, w):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w).to(act)
        inputs = (x, w)
    fn = env.compile(fn)
    params, stats = (2, 2) if layer_norm else (1, 1)
    fwd_bytes = 2.0 * rows * c * AB + params * c * FB + stats * rows * FB
    bwd_bytes = 3.0 * rows * c * AB + (1 + params) * c * FB + stats * rows * FB
    return "%d x %d" % (rows, c), 0, fwd_bytes + bwd_bytes, env.time(
        lambda: torch.autograd.grad(fn(*inputs), inputs, dout))


def gelu(env, m):
    rows, f = m["batch"] * m["seq"], m["ffn"]
    x, dout = env.randn(rows, f, grad=True), env.randn(rows, f)
    fn = env.compile(lambda x: F.gelu(x, approximate="tanh"))
    return "%d x %d" % (rows, f), 0, 5.0 * rows * f * AB, env.time(
        lambda: torch.autograd.grad(fn(x), (x,), dout))


def swiglu(env, m):
    rows, f = m["batch"] * m["seq"], m["ffn"]
    x, dout = env.randn(rows, 2 * f, grad=True), env.randn(rows, f)

    def swiglu_fn(x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    fn = env.compile(swiglu_fn)
    return "%d x 2*%d -> %d" % (rows, f, f), 0, 8.0 * rows * f * AB, env.time(
        lambda: torch.autograd.grad(fn(x), (x,), dout))


def cross_entropy(env, m):
    rows, v = m["ce_rows"], m["vocab"]
    logits = env.randn(rows, v, grad=True)
    targets = torch.tensor(bench_tokens(rows, v, 12), dtype=torch.long, device=env.device)
    scale = 1.0 / rows
    fn = env.compile(lambda x, t: F.cross_entropy(x.float(), t, reduction="sum") * scale)
    nbytes = 2.0 * rows * v * AB + rows * 4.0 + rows * FB
    return "%d x %d" % (rows, v), 0, nbytes, env.time(
        lambda: torch.autograd.grad(fn(logits, targets), (logits,)))


def gpt2_parameter_shapes(m):
    """GPT-2's tensors in the order of worker/parameters.cc's layout."""
    c, f, v = m["width"], m["ffn"], m["vocab"]
    shapes = [(v, c), (m["max_seq"], c)]
    for _ in range(m["layers"]):
        shapes += [(c,), (c,), (3 * c, c), (3 * c,), (c, c), (c,), (c,), (c,), (f, c), (f,),
                   (c, f), (c,)]
    return shapes + [(c,), (c,)]


def adamw(env, m):
    params = [torch.randn(s, device=env.device) * 0.02 for s in gpt2_parameter_shapes(m)]
    for p in params:
        p.requires_grad_()
        p.grad = torch.randn_like(p) * 0.01
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    kwargs = {} if env.smoke else {"fused": True}
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **kwargs)
    n = sum(p.numel() for p in params)
    shape = "%sM params, %d tensors" % (sig6(n / 1e6), len(params))
    return shape, 0, 7.0 * n * FB, env.time(opt.step)


def residual_add(env, m):
    rows, c = m["batch"] * m["seq"], m["width"]
    x, y = env.randn(rows, c), env.randn(rows, c)
    return "%d x %d" % (rows, c), 0, 3.0 * rows * c * AB, env.time(lambda: x.add_(y))


def weight_convert(env, m):
    """A weight's copy in the activation type, as autocast makes it for a matmul."""
    c, f = m["width"], m["ffn"]
    rows = f if m["family"] == "gpt2" else 2 * f
    w = env.randn(rows, c, dtype=torch.float32, scale=0.02)
    return "%d x %d fp32 -> bf16" % (rows, c), 0, 1.0 * rows * c * (FB + AB), env.time(
        lambda: w.to(env.act))


def grad_norm(env, m):
    """The global gradient norm over GPT-2's tensors, as clip_grad_norm_ computes it (foreach)."""
    grads = [torch.randn(s, device=env.device) * 0.01 for s in gpt2_parameter_shapes(m)]
    n = sum(g.numel() for g in grads)
    shape = "%sM params, %d tensors" % (sig6(n / 1e6), len(grads))

    def run():
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return shape, 0, 1.0 * n * FB, env.time(run)


def embedding_backward(env, m):
    b, t, c, v = m["batch"], m["seq"], m["width"], m["vocab"]
    positions = m["family"] == "gpt2"
    ids_list = bench_tokens(b * t, v, 15)
    ids = torch.tensor(ids_list, dtype=torch.long, device=env.device)
    dout = env.randn(b * t, c)

    def op():
        dwte = torch.ops.aten.embedding_dense_backward(dout, ids, v, -1, False)
        if positions:
            return dwte, dout.view(b, t, c).sum(0, dtype=torch.float32)
        return dwte
    nbytes = (b * t * c * AB + b * t * 4.0 + len(set(ids_list)) * c * FB
              + (t * c * FB if positions else 0))
    shape = "b%d t%d c%d V%d%s" % (b, t, c, v, " +pos" if positions else "")
    return shape, 0, nbytes, env.time(op)


def gemm(env, mm, n, k, kind):
    shape = "m%d n%d k%d" % (mm, n, k)
    with torch.no_grad():
        if kind in ("fwd", "fwd+bias"):
            x, w = env.randn(mm, k), env.randn(n, k)
            bias = env.randn(n) if kind == "fwd+bias" else None
            op = lambda: F.linear(x, w, bias)  # noqa: E731
        elif kind == "bwd-input":
            dout, w = env.randn(mm, n), env.randn(n, k)
            op = lambda: torch.matmul(dout, w)  # noqa: E731
        else:
            dout, x = env.randn(mm, n), env.randn(mm, k)
            op = lambda: torch.matmul(dout.t(), x)  # noqa: E731
        return shape, 2.0 * mm * n * k, 0, env.time(op)


def fp8_gemm(env, mm, n, k, bias):
    """torch._scaled_mm on E4M3 codes of both operands (quantized before the timed runs), into
    bf16 with fast accumulation: the forward product of torchao's float8 linear."""
    shape = "m%d n%d k%d e4m3" % (mm, n, k)
    with torch.no_grad():
        x, w = env.randn(mm, k), env.randn(n, k)
        b = env.randn(n) if bias else None
        sx = (448.0 / x.abs().amax().float().clamp(min=1e-12))
        sw = (448.0 / w.abs().amax().float().clamp(min=1e-12))
        x8 = (x.float() * sx).to(torch.float8_e4m3fn)
        w8 = (w.float() * sw).to(torch.float8_e4m3fn)
        inv_x, inv_w = sx.reciprocal(), sw.reciprocal()
        op = lambda: torch._scaled_mm(x8, w8.t(), scale_a=inv_x, scale_b=inv_w, bias=b,  # noqa
                                      out_dtype=torch.bfloat16, use_fast_accum=True)
        return shape, 2.0 * mm * n * k, 0, env.time(op)


def fp8_quantize(env, rows, c):
    """An activation's amax, then its E4M3 codes and their transpose (torch.compile'd, as
    torchao's tensorwise scaling computes them)."""
    x = env.randn(rows, c)

    def quantize(x):
        scale = 448.0 / x.abs().amax().float().clamp(min=1e-12)
        q = (x.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q, q.t().contiguous(), scale.reciprocal()
    fn = env.compile(quantize)
    return ("%d x %d bf16 -> e4m3 +T" % (rows, c), 0, 1.0 * rows * c * (2 * AB + 2),
            env.time(lambda: fn(x)))


def experts_gemm(env, tokens, n, k, kind):
    """A mixture of experts' linear as a plain PyTorch MoE layer runs it, one matmul per expert
    over its slice of the permuted rows: 8 experts, top 2, expert j taking a share of the picks
    proportional to j + 1 (as bench/gpu_kernel_cases.cc's ExpertsGemm)."""
    experts, top_k = 8, 2
    picks = tokens * top_k
    ms = [picks * (j + 1) // (experts * (experts + 1) // 2) for j in range(experts)]
    ms[-1] += picks - sum(ms)
    shape = "E%d m%d n%d k%d" % (experts, picks, n, k)
    with torch.no_grad():
        x = env.randn(picks, k)
        if kind == "fwd":
            ws = [env.randn(n, k) for _ in range(experts)]
            xs = torch.split(x, ms)
            op = lambda: [F.linear(xj, w) for xj, w in zip(xs, ws)]  # noqa: E731
        else:
            dout = env.randn(picks, n)
            pairs = list(zip(torch.split(dout, ms), torch.split(x, ms)))
            op = lambda: [torch.matmul(d.t(), xj) for d, xj in pairs]  # noqa: E731
        return shape, 2.0 * picks * n * k, 0, env.time(op)


def cases_for(m):
    """[(kernel, fn(env) -> result)] in the order of CasesFor in bench/gpu_kernel_cases.cc."""
    gpt2 = m["family"] == "gpt2"
    rows, c, v = m["batch"] * m["seq"], m["width"], m["vocab"]
    fc_out = m["ffn"] if gpt2 else 2 * m["ffn"]
    nm = "layernorm" if gpt2 else "rmsnorm"
    cases = [
        ("attention fwd", lambda e: attention(e, m, "fwd")),
        ("attention bwd", lambda e: attention(e, m, "bwd")),
        ("attention fwd+bwd", lambda e: attention(e, m, "both")),
    ]
    if m.get("attention_only"):
        return cases
    cases += [
        (nm + " fwd+bwd", lambda e: norm(e, m, gpt2)),
        ("gelu fwd+bwd", lambda e: gelu(e, m)) if gpt2 else
        ("swiglu fwd+bwd", lambda e: swiglu(e, m)),
        ("cross-entropy fwd+bwd", lambda e: cross_entropy(e, m)),
    ]
    cases += [
        ("residual add", lambda e: residual_add(e, m)),
        ("weight convert", lambda e: weight_convert(e, m)),
    ]
    if gpt2:
        cases.append(("adamw step", lambda e: adamw(e, m)))
        cases.append(("grad norm", lambda e: grad_norm(e, m)))
    cases += [
        ("embedding bwd", lambda e: embedding_backward(e, m)),
        ("gemm fc fwd", lambda e: gemm(e, rows, fc_out, c, "fwd+bias" if gpt2 else "fwd")),
        ("gemm fc bwd-input", lambda e: gemm(e, rows, fc_out, c, "bwd-input")),
        ("gemm fc bwd-weight", lambda e: gemm(e, rows, fc_out, c, "bwd-weight")),
    ]
    cases += [
        ("gemm fc fwd fp8", lambda e: fp8_gemm(e, rows, fc_out, c, gpt2)),
        ("fp8 quantize", lambda e: fp8_quantize(e, rows, c)),
    ]
    if gpt2:
        cases += [("gemm experts " + kind,
                   lambda e, kind=kind: experts_gemm(e, rows, fc_out, c, kind))
                  for kind in ("fwd", "bwd-weight")]
    cases += [
        ("gemm lm-head fwd", lambda e: gemm(e, m["ce_rows"], v, c, "fwd")),
        ("gemm lm-head bwd-input", lambda e: gemm(e, m["ce_rows"], v, c, "bwd-input")),
        ("gemm lm-head bwd-weight", lambda e: gemm(e, m["ce_rows"], v, c, "bwd-weight")),
    ]
    padded = -(-v // 128) * 128  # the vocabulary rounded up to a multiple of 128, as llm.c does
    if padded != v:
        cases += [("gemm lm-head-pad128 " + kind,
                   lambda e, kind=kind: gemm(e, m["ce_rows"], padded, c, kind))
                  for kind in ("fwd", "bwd-input", "bwd-weight")]
    return cases


def table_row(row):
    if "error" in row:
        return "%-10s %-22s %-34s  error: %s" % (row["model"], row["kernel"], row["shape"],
                                                row["error"])
    achieved = ("%s TFLOP/s" % sig6(row["tflops"]) if "tflops" in row
                else "%s GB/s" % sig6(row["gbps"]))
    return "%-10s %-22s %-34s %10.4f %10.4f %12s" % (row["model"], row["kernel"], row["shape"],
                                                    row["median_ms"], row["min_ms"], achieved)


def run_case(env, name, m, kernel, fn):
    row = {"engine": "pytorch", "case": "%s/%s" % (name, kernel), "model": name,
           "kernel": kernel, "shape": ""}
    try:
        shape, flop, nbytes, (median, least) = fn(env)
    except Exception as e:  # one failing case must not hide the others
        row["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        if not env.smoke:
            torch.cuda.synchronize()
        return row
    row.update(shape=shape, median_ms=median, min_ms=least, reps=env.reps, flop=flop,
               bytes=nbytes)
    if kernel.startswith("attention") and m["heads"] != m["kv_heads"]:
        row["gqa"] = env.gqa_mode
    if flop > 0:
        row["tflops"] = flop / (median / 1e3) / 1e12
    else:
        row["gbps"] = nbytes / (median / 1e3) / 1e9
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--model", choices=sorted(MODELS))
    ap.add_argument("--only", default="", help="run the cases whose model/kernel contains this")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny shapes on the CPU, fp32, no compile: checks this script")
    args = ap.parse_args()
    if args.reps < 1 or args.warmup < 0:
        ap.error("--reps must be at least 1 and --warmup at least 0")
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.stderr.write("torch_gpu_kernels: no CUDA device visible to torch; this benchmark "
                         "needs a GPU (or --cpu-smoke)\n")
        return 2
    env = Env(args)
    models = SMOKE if args.cpu_smoke else MODELS
    device = "cpu" if args.cpu_smoke else torch.cuda.get_device_name(0)
    print("# device: %s; torch %s; median of %d reps after %d warm-up, L2 flushed before each"
          % (device, torch.__version__, args.reps, args.warmup))
    print("%-10s %-22s %-34s %10s %10s %12s" % ("model", "kernel", "shape", "median ms",
                                                "min ms", "achieved"))
    rows = []
    for name, m in models.items():
        if args.model and name != args.model:
            continue
        for kernel, fn in cases_for(m):
            if args.only not in "%s/%s" % (name, kernel):
                continue
            row = run_case(env, name, m, kernel, fn)
            print(table_row(row), flush=True)
            if args.json:  # right after its row, so that a run stopped early still reports
                print(json.dumps(row), flush=True)
            rows.append(row)
    if env.gqa_mode:
        print("# grouped-query attention ran with %s" % env.gqa_mode)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
