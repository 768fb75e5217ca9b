#!/usr/bin/python3
"""PyTorch CPU training-step benchmark: the peer of trainyard-bench-cpu.

Usage: torch_cpu_train.py --config JSON_FILE_OR_STRING --batch B --seq T --steps N
                          [--warmup W] [--threads K] [--seed S] [--documents D]

Builds the float32 model (tests/oracle/torch_model.py) from a random init, runs W untimed and
then N timed full training steps (zero_grad, forward, loss, backward, clip_grad_norm_ 1.0, AdamW
step) on random tokens, and prints one JSON line:
  {"engine": "pytorch", "tokens_per_s": ..., "median_step_ms": ..., "steps": N, ...}
where tokens_per_s = B*T / median step time. Extra keys: params, tokens_per_step, threads,
mean_step_ms, min_step_ms, final_loss. With --documents D each sequence packs documents of D
tokens, token 0 beginning each (document_token 0; the other tokens drawn from the rest of the
vocabulary), as trainyard-bench-cpu --documents D does.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "oracle"))
import torch_model  # noqa: E402


def load_config(text):
    """The config is a path to a JSON file or a JSON object literal."""
    if os.path.isfile(text):
        with open(text, "r", encoding="utf-8") as f:
            return json.load(f)
    return json.loads(text)


def positive(value):
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1, got %s" % value)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="model config: JSON file or JSON string")
    ap.add_argument("--batch", type=positive, required=True)
    ap.add_argument("--seq", type=positive, required=True)
    ap.add_argument("--steps", type=positive, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=positive, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--documents", type=positive, default=None)
    args = ap.parse_args()

    # Inter-op threads must be fixed before any parallel work starts.
    torch.set_num_interop_threads(1)
    torch.set_num_threads(args.threads)

    try:
        cfg = load_config(args.config)
        if args.documents:
            cfg["document_token"] = 0
        cfg = torch_model.normalize_config(cfg)
    except (OSError, ValueError) as e:
        sys.stderr.write("torch_cpu_train: bad --config: %s\n" % e)
        return 2
    if args.seq > cfg["max_seq"]:
        sys.stderr.write("torch_cpu_train: --seq %d exceeds max_seq %d\n" % (args.seq, cfg["max_seq"]))
        return 2
    if args.warmup < 0:
        sys.stderr.write("torch_cpu_train: --warmup must be >= 0\n")
        return 2

    torch.manual_seed(args.seed)
    model = torch_model.build_model(cfg)
    torch_model.init_parameters(model, seed=args.seed)
    model.train()
    params = [p for _, p in model.named_contract_parameters()]
    opt = torch.optim.AdamW(torch_model.decay_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95),
                            eps=1e-8)

    total = args.warmup + args.steps
    gen = torch.Generator().manual_seed(args.seed + 1)
    data = torch.randint(0, cfg["vocab"], (total, args.batch, args.seq + 1), generator=gen)
    if args.documents:
        data = 1 + data % (cfg["vocab"] - 1)
        data[:, :, 0:args.seq:args.documents] = 0

    times = []
    loss = None
    for step in range(total):
        tokens, targets = data[step, :, :-1], data[step, :, 1:]
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, _ = model.loss(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)

    median = statistics.median(times)
    tokens_per_step = args.batch * args.seq
    print(json.dumps({
        "engine": "pytorch",
        "tokens_per_s": tokens_per_step / median,
        "median_step_ms": median * 1e3,
        "steps": args.steps,
        "params": torch_model.parameter_count(model),
        "tokens_per_step": tokens_per_step,
        "threads": args.threads,
        "mean_step_ms": statistics.mean(times) * 1e3,
        "min_step_ms": min(times) * 1e3,
        "final_loss": loss.item(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
