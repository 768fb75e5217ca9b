#!/usr/bin/python3
"""Writes a random oracle IN_DIR (the same format the C++ test writes), for testing the oracle
pipeline without the engine.

Usage: make_example_input.py OUT_DIR [--family gpt2|llama] [--seed N] [--steps N]
                             [--untied | --tied] [--kv-heads N]
                             [--moe [--moe-balance aux_loss|bias] [--moe-score softmax|sigmoid]
                              [--capacity-factor X]]
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model  # noqa: E402


def example_config(family="gpt2", **overrides):
    """A small model + training config for the given family; `overrides` replace any key."""
    cfg = {
        "family": family, "layers": 2, "width": 16, "heads": 4, "kv_heads": 4,
        "ffn_hidden": 64 if family == "gpt2" else 24, "vocab": 29, "max_seq": 12,
        "tied_embeddings": family == "gpt2", "norm_eps": 1e-5, "rope_theta": 10000.0,
        "batch": 2, "seq_len": 7, "steps": 4, "lr": 1e-2, "min_lr_ratio": 0.1,
        "warmup_steps": 1, "schedule": "cosine", "weight_decay": 0.1, "beta1": 0.9,
        "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0,
    }
    if family == "llama":
        cfg["kv_heads"] = 2
    cfg.update(overrides)
    return cfg


def example_moe(**overrides):
    """A small "moe" object: 4 experts of hidden 8, top 2, one shared expert, every block."""
    moe = {
        "experts": 4, "top_k": 2, "shared_experts": 1, "every": 1, "ffn": 8, "score": "softmax",
        "normalize_top_k": True, "balance": "aux_loss", "aux_loss_coeff": 0.01,
        "bias_update_rate": 0.001, "capacity_factor": 0.0,
    }
    moe.update(overrides)
    return moe


def write_example(out_dir, cfg, seed=0):
    """Writes config.json, params.txt, params/*.f32, inputs.i32, targets.i32 under out_dir.

    Parameters are random (std 0.2 for tensors of 2+ dims, 1 + noise for norm weights, noise for
    biases, the MoE selection biases included) so that every term of the forward pass is
    exercised. Returns the float32 model it wrote."""
    os.makedirs(os.path.join(out_dir, "params"), exist_ok=True)
    model = torch_model.build_model(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_contract_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim >= 2:
                p.copy_(0.2 * noise)
            elif name.endswith(".w"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    torch_model.write_params_txt(model, os.path.join(out_dir, "params.txt"))
    torch_model.save_params(model, os.path.join(out_dir, "params"), "f32")
    rng = np.random.default_rng(seed)
    shape = (cfg["steps"], cfg["batch"], cfg["seq_len"])
    for name in ("inputs.i32", "targets.i32"):
        rng.integers(0, cfg["vocab"], size=shape).astype("<i4").tofile(os.path.join(out_dir, name))
    return model


def main(argv=None):
    """The CLI; `argv` (without the program name) defaults to sys.argv[1:]."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--family", choices=torch_model.FAMILIES, default="gpt2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--kv-heads", type=int)
    tie = ap.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None)
    tie.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--moe", action="store_true", help="every block an MoE layer (example_moe)")
    ap.add_argument("--moe-balance", choices=("aux_loss", "bias"), default="aux_loss")
    ap.add_argument("--moe-score", choices=("softmax", "sigmoid"), default="softmax")
    ap.add_argument("--capacity-factor", type=float, default=0.0)
    args = ap.parse_args(argv)
    overrides = {"steps": args.steps}
    if args.kv_heads is not None:
        overrides["kv_heads"] = args.kv_heads
    if args.tied is not None:
        overrides["tied_embeddings"] = args.tied
    if args.moe:
        overrides["moe"] = example_moe(balance=args.moe_balance, score=args.moe_score,
                                       capacity_factor=args.capacity_factor)
    write_example(args.out_dir, example_config(args.family, **overrides), args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
