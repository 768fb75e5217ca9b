#!/usr/bin/python3
"""Numerical oracle: runs a Trainyard model and its AdamW training steps in float64 PyTorch.

Usage: run_oracle.py IN_DIR OUT_DIR

IN_DIR (written by the C++ test): config.json, params.txt, params/<name>.f32, inputs.i32,
targets.i32 (int32 [steps, batch, seq_len]).
OUT_DIR: logits.f64 [batch, seq_len, vocab] and loss.txt (mean cross-entropy) for the step-0
batch with the initial parameters; grads/<name>.f64 (step-0 gradients of the training objective,
cross-entropy plus the logits' z-loss and MoE auxiliary losses, unclipped); expert_counts.txt
(step-0 routing of each MoE layer); losses.txt, z_losses.txt and aux_losses.txt (each step's
cross-entropy, logits' z-loss and summed auxiliary loss, before its update); final/<name>.f64
(parameters after the last step). See README.md.

Exit status: 0 on success, 2 on bad input (one line on stderr), 1 on an internal error.
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model  # noqa: E402

_TRAINING_KEYS = ("batch", "seq_len", "steps", "lr", "min_lr_ratio", "warmup_steps", "schedule",
                  "weight_decay", "beta1", "beta2", "eps", "grad_clip")


class InputError(Exception):
    pass


def load_inputs(in_dir):
    """Returns (cfg, model float64 with the given params, inputs, targets) or raises InputError."""
    try:
        with open(os.path.join(in_dir, "config.json"), "r", encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError("config.json: %s" % e)
    try:
        cfg = torch_model.normalize_config(cfg)
    except torch_model.ConfigError as e:
        raise InputError("config.json: %s" % e)
    for key in _TRAINING_KEYS:
        if key not in cfg:
            raise InputError("config.json: missing the training key '%s'" % key)
    for key in ("batch", "seq_len", "steps"):
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], int) or cfg[key] < 1:
            raise InputError("config.json: %s must be a positive integer" % key)
    if cfg["seq_len"] > cfg["max_seq"]:
        raise InputError("config.json: seq_len %d exceeds max_seq %d"
                         % (cfg["seq_len"], cfg["max_seq"]))
    try:
        torch_model.lr_multiplier(0, cfg)
    except torch_model.ConfigError as e:
        raise InputError("config.json: %s" % e)

    model = torch_model.build_model(cfg).double()
    try:
        entries = torch_model.read_params_txt(os.path.join(in_dir, "params.txt"))
        torch_model.check_params_txt(model, entries)
        torch_model.load_params(model, os.path.join(in_dir, "params"), "f32")
    except (OSError, ValueError) as e:
        raise InputError(str(e))

    shape = (cfg["steps"], cfg["batch"], cfg["seq_len"])
    tokens = []
    for name in ("inputs.i32", "targets.i32"):
        path = os.path.join(in_dir, name)
        want = int(np.prod(shape))
        try:
            arr = np.fromfile(path, dtype="<i4")
        except OSError as e:
            raise InputError("%s: %s" % (name, e))
        if arr.size != want or os.path.getsize(path) != 4 * want:
            raise InputError("%s: expected int32 %s (%d bytes), file has %d bytes"
                             % (name, list(shape), 4 * want, os.path.getsize(path)))
        if arr.min() < 0 or arr.max() >= cfg["vocab"]:
            raise InputError("%s: token ids must lie in [0, %d), found [%d, %d]"
                             % (name, cfg["vocab"], arr.min(), arr.max()))
        tokens.append(torch.from_numpy(arr.reshape(shape).astype(np.int64)))
    return cfg, model, tokens[0], tokens[1]


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def expert_count_lines(routing):
    """`layer count_0 ... count_{E-1} dropped` for each MoE layer (counts before drops)."""
    return [" ".join(str(v) for v in [r.layer] + r.counts.tolist() + [r.dropped])
            for r in routing]


def run(cfg, model, inputs, targets, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    opt, sched = torch_model.make_optimizer(model, cfg)
    params = [p for _, p in model.named_trainable_parameters()]
    grad_clip = float(cfg["grad_clip"])
    losses, z_losses, aux_losses = [], [], []
    for step in range(cfg["steps"]):
        opt.zero_grad(set_to_none=False)
        result = model.objective(inputs[step], targets[step])
        result.objective.backward()
        for p in params:  # AdamW would skip (not even decay) a tensor without a gradient
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if step == 0:
            torch_model.write_array(os.path.join(out_dir, "logits.f64"), result.logits, "f64")
            write_lines(os.path.join(out_dir, "loss.txt"), [repr(result.cross_entropy.item())])
            torch_model.save_grads(model, os.path.join(out_dir, "grads"), "f64")
            write_lines(os.path.join(out_dir, "expert_counts.txt"),
                        expert_count_lines(result.routing))
        losses.append(result.cross_entropy.item())
        z_losses.append(result.z_loss.item())
        aux_losses.append(result.aux_loss.item())
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        sched.step()
        model.update_selection_biases(result.routing)
    write_lines(os.path.join(out_dir, "losses.txt"), [repr(v) for v in losses])
    write_lines(os.path.join(out_dir, "z_losses.txt"), [repr(v) for v in z_losses])
    write_lines(os.path.join(out_dir, "aux_losses.txt"), [repr(v) for v in aux_losses])
    torch_model.save_params(model, os.path.join(out_dir, "final"), "f64")


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: run_oracle.py IN_DIR OUT_DIR\n")
        return 2
    torch.set_num_threads(1)
    try:
        cfg, model, inputs, targets = load_inputs(argv[1])
    except InputError as e:
        sys.stderr.write("run_oracle: %s\n" % e)
        return 2
    run(cfg, model, inputs, targets, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
