#!/usr/bin/python3
"""Generation on CPU: `trainyard-worker sample` against a PyTorch key/value-cached decode.

Usage: generate_bench.py --build BUILD_DIR [--runs N] [--threads K] [--prompt P] [--tokens N]
                         [--cases gpt2,llama,mla]

For each case a model of that shape gets a random init (tests/oracle/torch_model.py, seed 0),
is written as a Hugging Face directory (float32 safetensors, tests/oracle/hf_selftest.py's
writers), and generates greedily from the same prompt of P random ids, N tokens:
- Trainyard: `trainyard-worker sample DIR --prompt-tokens ... --tokens N --eos none --threads K`,
  its times as it reports them on stderr (the prompt's pass with the first token drawn, then
  each later token);
- PyTorch: the same weights in torch_model's modules (float32), decoded here with a key/value
  cache preallocated for the whole sequence and written in place, under torch.inference_mode,
  with K intra-op threads and OMP_WAIT_POLICY=PASSIVE (its best here, for this side only: see
  below); each layer's keys and values cached whole, as transformers' models cache them (for
  latent attention, the decompressed keys and values, as transformers' DeepseekV3Attention
  does). Timed the same way, the cache's allocation inside the prompt's time on both sides.
The runs alternate (Trainyard, PyTorch, Trainyard, ...), after one untimed PyTorch generation of
4 tokens (its first calls set up its thread pool); each Trainyard run is a fresh process. The
table gives medians and the spread over the runs, the ratio of the medians, and how many
generated tokens the two sides agree on (random weights give nearly flat logits, so an early
difference in rounding may change the rest).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

# PyTorch's OpenMP threads spin after each operation and hold the cores its BLAS threads need:
# on the 2-core VM a 64-token GPT-2 prompt took 195–440 ms that way and 100–106 ms with passive
# waiting, which the peer is given. Trainyard's own runs keep the environment as it was: passive
# waiting slows its decode (GPT-2 124M: 65 against 84 tokens/s in one comparison here).
WORKER_ENV = dict(os.environ)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))
import hf_selftest  # noqa: E402
import torch_model  # noqa: E402

# Shapes: GPT-2 124M; a Llama-style 0.3B with grouped-query heads; a DeepSeek-V3-style model
# with latent attention (heads of 192 = 128 + 64 rotary, values of 128, ranks 512 and 384),
# dense MLPs.
CASES = {
    "gpt2": dict(family="gpt2", layers=12, width=768, heads=12, vocab=50257, max_seq=1024),
    "llama": dict(family="llama", layers=16, width=1024, heads=16, kv_heads=4, ffn_hidden=2816,
                  vocab=32000, max_seq=2048, rope_theta=500000.0),
    "mla": dict(family="llama", layers=12, width=1024, heads=16, head_dim=192, rope_dim=64,
                ffn_hidden=2816, vocab=32000, max_seq=2048, rope_theta=10000.0,
                latent_attention=dict(q_rank=384, kv_rank=512, value_dim=128)),
}


def write_model(name, cfg, out_dir):
    """The model (float32, random) and its Hugging Face directory."""
    model = torch_model.build_model(cfg)
    torch_model.init_parameters(model, seed=0)
    params = hf_selftest.contract_params(model)
    full = dict(model.cfg)  # every default filled in; dense (the writers read "moe" as experts)
    del full["moe"]
    cfg = dict(full, latent_attention=cfg["latent_attention"]) if name == "mla" else full
    if name == "gpt2":
        tensors, config = hf_selftest.gpt2_hf_tensors(cfg, params), hf_selftest.gpt2_hf_config(cfg)
    elif name == "mla":
        tensors = hf_selftest.deepseek_v3_hf_tensors(cfg, params)
        config = hf_selftest.deepseek_v3_hf_config(cfg)
    else:
        tensors, config = hf_selftest.llama_hf_tensors(cfg, params), hf_selftest.llama_hf_config(cfg)
    os.makedirs(out_dir)
    hf_selftest.write_safetensors(os.path.join(out_dir, "model.safetensors"),
                                  [(n, "F32", a) for n, a in tensors])
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return model.float().eval()


class CachedDecoder:
    """Greedy decoding of a torch_model.Transformer with a preallocated key/value cache."""

    def __init__(self, model, length):
        self.m = model
        self.gpt2 = model.cfg["family"] == "gpt2"
        first = model.h[0].attn
        self.latent = isinstance(first, torch_model.LatentAttention)
        h, kv, d = first.heads, first.kv_heads, first.head_dim
        dv = first.value_dim if self.latent else d
        kv = h if self.latent else kv
        self.keys = [torch.zeros(kv, length, d) for _ in model.h]
        self.values = [torch.zeros(kv, length, dv) for _ in model.h]
        if not self.gpt2:
            self.cos, self.sin = torch_model.rope_cos_sin(length, first.rope_dim, first.rope_theta,
                                                          torch.float32)

    def attention(self, attn, i, x, pos):
        """Block i's attention over the cache for rows x [n, width] at positions pos.."""
        n = x.shape[0]
        h, d = attn.heads, attn.head_dim
        if self.latent:
            r, dv = attn.rot, attn.value_dim
            q = (attn.q_b(attn.q_a_norm(attn.q_a(x))) if attn.q_rank else attn.q(x)).view(n, h, d)
            latent, k_rot = torch.split(attn.kv_a(x), [attn.kv_rank, r], dim=-1)
            kv = attn.kv_b(attn.kv_a_norm(latent)).view(n, h, d - r + dv)
            cos, sin = self.cos[pos:pos + n], self.sin[pos:pos + n]
            q = torch.cat((torch_model.apply_rope(q[None, :, :, :r], cos, sin)[0], q[..., r:]), -1)
            k_rot = torch_model.apply_rope(k_rot.view(1, n, 1, r), cos, sin)[0]
            k = torch.cat((k_rot.expand(n, h, r), kv[..., :d - r]), -1)
            v = kv[..., d - r:]
            groups = 1
        else:
            kvh = attn.kv_heads
            qkv = attn.qkv(x)
            q = qkv[:, :h * d].view(n, h, d)
            k = qkv[:, h * d:(h + kvh) * d].view(n, kvh, d)
            v = qkv[:, (h + kvh) * d:].view(n, kvh, d)
            if not self.gpt2:
                cos, sin = self.cos[pos:pos + n], self.sin[pos:pos + n]
                q = torch_model.apply_rope(q[None], cos, sin)[0]
                k = torch_model.apply_rope(k[None], cos, sin)[0]
            groups = h // kvh
        end = pos + n
        self.keys[i][:, pos:end] = k.transpose(0, 1)
        self.values[i][:, pos:end] = v.transpose(0, 1)
        keys, values = self.keys[i][:, :end], self.values[i][:, :end]
        # Grouped heads: the queries of a group side by side against their key head.
        qg = q.transpose(0, 1).reshape(keys.shape[0], groups * n, d)
        scores = torch.matmul(qg, keys.transpose(1, 2)) * attn.scale
        if n > 1:
            rows = torch.arange(pos, end).repeat(groups)
            scores.masked_fill_(torch.arange(end)[None, :] > rows[:, None], float("-inf"))
        y = torch.matmul(torch.softmax(scores, dim=-1), values)  # [kv, groups·n, dv]
        y = y.reshape(h, n, -1).transpose(0, 1).reshape(n, -1)
        return attn.proj(y)

    def forward(self, tokens, pos):
        """Logits of the last of `tokens` (a list) at positions pos.."""
        m = self.m
        ids = torch.tensor(tokens)
        x = m.wte(ids)
        if self.gpt2:
            x = x + m.wpe.weight[pos:pos + len(tokens)]
        for i, block in enumerate(m.h):
            x = x + self.attention(block.attn, i, block.ln1(x), pos)
            x = x + block.mlp(block.ln2(x))
        x = m.lnf(x[-1:])
        head = m.wte.weight if m.lm_head is None else m.lm_head.weight
        return torch.nn.functional.linear(x, head)[0]

    def decode(self, prompt, tokens, start):
        """(generated ids, prompt seconds, seconds of the tokens after the first), the prompt's
        time counted from `start`."""
        with torch.inference_mode():
            out = [int(torch.argmax(self.forward(prompt, 0)))]
            first = time.perf_counter()
            while len(out) < tokens:
                out.append(int(torch.argmax(self.forward(out[-1:], len(prompt) + len(out) - 1))))
            return out, first - start, time.perf_counter() - first


def peer_generate(model, prompt, tokens):
    """PyTorch's greedy tokens and times. The cache is allocated inside the prompt's time, as
    Trainyard's generator allocates (and zeroes) its own inside its first pass."""
    start = time.perf_counter()
    return CachedDecoder(model, len(prompt) + tokens).decode(prompt, tokens, start)


REPORT = re.compile(r"prompt: (\d+) tokens in ([\d.]+) ms .*; then (\d+) tokens in ([\d.]+) ms")


def trainyard(worker, model_dir, prompt, tokens, threads):
    cmd = [worker, "sample", model_dir, "--prompt-tokens", " ".join(map(str, prompt)),
           "--tokens", str(tokens), "--eos", "none", "--threads", str(threads)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False, env=WORKER_ENV)
    if run.returncode != 0:
        sys.exit("trainyard-worker sample failed (%d): %s" % (run.returncode, run.stderr))
    match = REPORT.search(run.stderr)
    if not match:
        sys.exit("no timing line in trainyard-worker's stderr: %s" % run.stderr)
    ids = [int(t) for t in run.stdout.split()]
    return ids, float(match.group(2)) / 1e3, float(match.group(4)) / 1e3


def spread(values):
    return "%.1f (%.1f–%.1f)" % (statistics.median(values), min(values), max(values))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True, help="the build directory")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated")
    ap.add_argument("--cases", default="gpt2,llama,mla")
    args = ap.parse_args()
    torch.set_num_interop_threads(1)
    torch.set_num_threads(args.threads)
    worker = os.path.join(args.build, "worker", "trainyard-worker")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            cfg = CASES[name]
            model = write_model(name, cfg, os.path.join(tmp, name))
            params = torch_model.parameter_count(model)
            gen = torch.Generator().manual_seed(1)
            prompt = torch.randint(0, cfg["vocab"], (args.prompt,), generator=gen).tolist()
            ours, peer, same = {"p": [], "d": []}, {"p": [], "d": []}, None
            peer_generate(model, prompt, 4)  # PyTorch's first calls
            for _ in range(args.runs):
                ids, p, d = trainyard(worker, os.path.join(tmp, name), prompt, args.tokens,
                                      args.threads)
                ours["p"].append(len(prompt) / p)
                ours["d"].append((args.tokens - 1) / d)
                peer_ids, p, d = peer_generate(model, prompt, args.tokens)
                peer["p"].append(len(prompt) / p)
                peer["d"].append((args.tokens - 1) / d)
                same = next((i for i, (a, b) in enumerate(zip(ids, peer_ids)) if a != b), len(ids))
            rows.append((name, params, ours, peer, same))
            del model
    print("Generation on CPU, %d threads, prompt %d tokens, %d generated, greedy, float32; "
          "median (min–max) of %d runs" % (args.threads, args.prompt, args.tokens, args.runs))
    print()
    print("| model | parameters | prompt tok/s Trainyard | PyTorch | ratio | decode tok/s Trainyard "
          "| PyTorch | ratio | same tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, params, ours, peer, same in rows:
        print("| %s | %.0fM | %s | %s | %.2f× | %s | %s | %.2f× | %d of %d |" % (
            name, params / 1e6, spread(ours["p"]), spread(peer["p"]),
            statistics.median(ours["p"]) / statistics.median(peer["p"]), spread(ours["d"]),
            spread(peer["d"]), statistics.median(ours["d"]) / statistics.median(peer["d"]), same,
            args.tokens))


if __name__ == "__main__":
    main()
