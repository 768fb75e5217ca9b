#!/usr/bin/python3
"""PyTorch checkpoint benchmark: the peer of checkpoint_bench (bench/run_checkpoint_bench.sh).

Usage: torch_checkpoint_peer.py --config JSON_FILE_OR_STRING --batch B --seq T --dir PARENT
                                [--steps N] [--rounds R] [--threads K] [--seed S] [--label L]

Builds the float32 model (tests/oracle/torch_model.py: the same parameters as Trainyard's preset)
and an AdamW optimizer, trains N steps on random tokens (so both moments exist), then R rounds of
what a PyTorch user does to checkpoint and restore:
  save:    torch.save({'model': model.state_dict(), 'optim': opt.state_dict(), 'step': n}, path)
           -- training is blocked for the whole call; torch.save does not fsync, so the file is
           then fsync'd and that time reported separately (save + fsync = durable);
  restore: torch.load(path) + model.load_state_dict + opt.load_state_dict, first with the file's
           pages dropped from the page cache (posix_fadvise DONTNEED after the fsync: cold), then
           again (warm).
Files go to a fresh directory (mkdtemp in PARENT), removed at the end. Prints one JSON line:
  {"engine": "pytorch", "params": ..., "bytes": ..., "save_s": ..., "save_fsync_s": ..., ...}
with the median over rounds of each time.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "oracle"))
import torch_model  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_cpu_train import load_config, positive  # noqa: E402


def train(model, opt, vocab, batch, seq, steps, seed):
    """Runs `steps` full training steps; returns each step's wall time in seconds."""
    gen = torch.Generator().manual_seed(seed + 1)
    params = [p for _, p in model.named_contract_parameters()]
    times = []
    for _ in range(steps):
        data = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, _ = model.loss(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - start)
    return times


def save_round(model, opt, step, path):
    """One checkpoint: (torch.save seconds, fsync seconds, bytes); leaves the file uncached."""
    os.sync()  # no one else's dirty pages queued ahead of ours
    start = time.perf_counter()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, path)
    saved = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        synced = time.perf_counter()
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return saved - start, synced - saved, os.path.getsize(path)


def restore(model, opt, path):
    """(torch.load seconds, torch.load + both load_state_dict seconds)."""
    start = time.perf_counter()
    state = torch.load(path)
    loaded = time.perf_counter()
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    done = time.perf_counter()
    del state
    return loaded - start, done - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="model config: JSON file or JSON string")
    ap.add_argument("--batch", type=positive, required=True)
    ap.add_argument("--seq", type=positive, required=True)
    ap.add_argument("--dir", required=True, help="where the scratch directory is made")
    ap.add_argument("--steps", type=positive, default=3)
    ap.add_argument("--rounds", type=positive, default=3)
    ap.add_argument("--threads", type=positive, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="", help="echoed as \"preset\" in the JSON line")
    args = ap.parse_args()

    torch.set_num_interop_threads(1)
    torch.set_num_threads(args.threads)
    try:
        cfg = torch_model.normalize_config(load_config(args.config))
    except (OSError, ValueError) as e:
        sys.stderr.write("torch_checkpoint_peer: bad --config: %s\n" % e)
        return 2
    if args.seq > cfg["max_seq"]:
        sys.stderr.write("torch_checkpoint_peer: --seq %d exceeds max_seq %d\n"
                         % (args.seq, cfg["max_seq"]))
        return 2

    torch.manual_seed(args.seed)
    model = torch_model.build_model(cfg)
    torch_model.init_parameters(model, seed=args.seed)
    model.train()
    opt = torch.optim.AdamW(torch_model.decay_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95),
                            eps=1e-8)
    step_times = train(model, opt, cfg["vocab"], args.batch, args.seq, args.steps, args.seed)

    scratch = tempfile.mkdtemp(prefix="trainyard-torch-checkpoint.", dir=args.dir)
    rows = []
    try:
        for r in range(args.rounds):
            path = os.path.join(scratch, "checkpoint-%d.pt" % r)
            save_s, fsync_s, size = save_round(model, opt, args.steps, path)
            load_cold_s, restore_cold_s = restore(model, opt, path)
            load_warm_s, restore_warm_s = restore(model, opt, path)
            rows.append((save_s, fsync_s, size, load_cold_s, restore_cold_s, load_warm_s,
                         restore_warm_s, save_s + fsync_s))
            os.remove(path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def median(i):
        return statistics.median(row[i] for row in rows)

    print(json.dumps({
        "engine": "pytorch",
        "preset": args.label,
        "params": torch_model.parameter_count(model),
        "bytes": rows[-1][2],
        "batch": args.batch,
        "seq": args.seq,
        "threads": args.threads,
        "rounds": args.rounds,
        "median_step_s": statistics.median(step_times[1:] or step_times),
        "save_s": median(0),
        "save_fsync_s": median(7),
        "fsync_s": median(1),
        "load_cold_s": median(3),
        "restore_cold_s": median(4),
        "load_warm_s": median(5),
        "restore_warm_s": median(6),
        "save_s_all": [row[0] for row in rows],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
