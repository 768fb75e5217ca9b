#!/usr/bin/env python3
"""PyTorch DistributedDataParallel (gloo) training throughput on CPU: the peer of Trainyard's
data-parallel engine in bench/run_ddp_vs_torch.sh.

Spawns --world processes on this machine, each with --threads intra-op threads, trains the same
model (tests/oracle/torch_model.py) with AdamW and global-norm clipping on random tokens, and
prints one JSON line: {"engine": "pytorch-ddp", "tokens_per_s", "median_step_ms", ...}, where
tokens are the global batch's and the step time is rank 0's median.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "oracle"))
import torch_model  # noqa: E402


def run(rank, args, init_file, queue):
    torch.set_num_interop_threads(1)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=args.world)
    cfg = torch_model.normalize_config(json.loads(args.config))
    torch.manual_seed(0)
    model = torch_model.build_model(cfg)
    torch_model.init_parameters(model, seed=0)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    params = [p for _, p in model.named_contract_parameters()]
    opt = torch.optim.AdamW(torch_model.decay_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95))
    per_rank = args.batch // args.world
    gen = torch.Generator().manual_seed(rank + 1)
    total = args.warmup + args.steps
    data = torch.randint(0, cfg["vocab"], (total, per_rank, args.seq + 1), generator=gen)
    times = []
    for step in range(total):
        tokens, targets = data[step, :, :-1], data[step, :, 1:]
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = ddp(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        queue.put((times, torch_model.parameter_count(model)))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="model config as a JSON string")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--batch", type=int, required=True, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    args = ap.parse_args()
    if args.batch % args.world:
        sys.stderr.write("torch_ddp_train: --batch must be divisible by --world\n")
        return 2
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        procs = [ctx.Process(target=run, args=(r, args, init_file, queue)) for r in range(args.world)]
        for p in procs:
            p.start()
        times, params = queue.get()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            sys.stderr.write("torch_ddp_train: a rank failed\n")
            return 1
    median = statistics.median(times)
    tokens = args.batch * args.seq
    print(json.dumps({"engine": "pytorch-ddp", "tokens_per_s": tokens / median,
                      "median_step_ms": median * 1e3, "steps": args.steps, "params": params,
                      "world": args.world, "threads": args.threads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
