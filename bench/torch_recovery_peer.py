#!/usr/bin/python3
"""PyTorch DDP training that checkpoints every step: the torchrun peer in bench/recovery.py.

Usage: torchrun --nproc_per_node 2 --max_restarts R bench/torch_recovery_peer.py
           --dir DIR [--steps N] [--batch B] [--seq T] [--vocab V] [--threads K]

Each rank (gloo, DistributedDataParallel, K intra-op threads) trains the GPT-2 of Trainyard's
gpt2-debug preset (tests/oracle/torch_model.py: 2 layers, width 64, 4 heads, model vocabulary
256, max_seq 64) with AdamW and global-norm clipping on tokens drawn from [0, V), B sequences of
the global batch per step split over the ranks. The batch of a step is a function of (step,
rank) only, so a restarted run consumes the same batches.

The most a torchrun user can do to lose little work: after every step rank 0 writes
{model, optimizer, step} with torch.save to DIR/ckpt/latest.pt.tmp and renames it over
DIR/ckpt/latest.pt (no fsync: like a memory tier, it only has to survive a process's death), and
on every start each rank loads that file when it exists. What the driver reads, in DIR:
  pid.<restart>.<rank>  "<pid> <unix time>", written first thing at start (before torch loads);
  progress              rank 0's lines "<event> <unix time> <step> <restart>": "imported" once
                        torch is imported, "joined" once the process group is up, "resume" once
                        it has loaded the checkpoint (step 0 without one), and "step" after each
                        completed step, once that step's checkpoint is in place.
<restart> is torchrun's TORCHELASTIC_RESTART_COUNT.
"""
import os
import sys
import time

START = time.time()  # before torch is imported: the process's start as the driver sees it

import argparse  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "oracle"))
import torch_model  # noqa: E402

GPT2_DEBUG = {"family": "gpt2", "layers": 2, "width": 64, "heads": 4, "vocab": 256,
              "max_seq": 64}


def append_line(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32, help="tokens are drawn from [0, vocab)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(os.path.join(args.dir, "pid.%d.%d" % (restart, rank)), "w") as f:
        f.write("%d %.6f\n" % (os.getpid(), START))
    if args.batch % world:
        sys.stderr.write("torch_recovery_peer: --batch must be divisible by the world size\n")
        return 2

    progress = os.path.join(args.dir, "progress")
    if rank == 0:
        append_line(progress, "imported %.6f 0 %d" % (time.time(), restart))
    torch.set_num_interop_threads(1)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    if rank == 0:
        append_line(progress, "joined %.6f 0 %d" % (time.time(), restart))
    cfg = torch_model.normalize_config(GPT2_DEBUG)
    torch.manual_seed(0)
    model = torch_model.build_model(cfg)
    torch_model.init_parameters(model, seed=0)
    opt = torch.optim.AdamW(torch_model.decay_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95))
    ckpt_dir = os.path.join(args.dir, "ckpt")
    latest = os.path.join(ckpt_dir, "latest.pt")
    step = 0
    if os.path.exists(latest):
        state = torch.load(latest)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step = int(state["step"])
        del state
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    params = [p for _, p in model.named_contract_parameters()]
    if rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        append_line(progress, "resume %.6f %d %d" % (time.time(), step, restart))

    per_rank = args.batch // world
    while step < args.steps:
        gen = torch.Generator().manual_seed(1 + 2 * step + rank)
        data = torch.randint(0, args.vocab, (per_rank, args.seq + 1), generator=gen)
        opt.zero_grad(set_to_none=True)
        logits = ddp(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 data[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if rank == 0:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
                       latest + ".tmp")
            os.replace(latest + ".tmp", latest)
            append_line(progress, "step %.6f %d %d" % (time.time(), step, restart))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
