#!/usr/bin/env python3
"""Mixture of experts on this machine's CPU: a dense model against the same model with routed
experts of the same active size, and expert parallelism over two ranks.

Usage: python3 bench/moe_bench.py [--build DIR] [--ffn F] [--steps N] [--rounds R]
                                  [--no-calibrate | --calibrate-on dense|moe] [--out FILE]
                                  [--wait-idle SECONDS] [--max-other-load CORES]

The model is gpt2-tiny (4 layers, width 128, 4 heads) with an MLP of hidden size F (--ffn,
default 512, the preset's), 16 sequences of 64 tokens per step in micro-batches of 8, the same
data (a Markov chain over 64 tokens) and seed in every case. The cases:

- dense: one rank, the dense model;
- moe: one rank, every block's MLP (`every: 1`) replaced by 8 experts of hidden size F/2 of
  which each token uses 2, so a token's active MLP weights are the dense model's (plus the
  router and the second expert's output bias), balanced by the default auxiliary loss, dropless;
- moe dp2 ep1: two data-parallel ranks, each holding all 8 experts;
- moe dp2 ep2: two data-parallel ranks, each holding 4 of the experts, the tokens carried to
  their experts' rank and back by all-to-alls.

One rank uses both cores; two ranks take one each. `trainyard-worker --standalone` trains each
case --steps steps (default 30) --rounds times (default 3), the rounds interleaved across the
cases, and the table has, per case, the parameters (total and active per token, computed here
from the shapes as config::ModelConfig::ParameterCount and ActiveParameterCount count them,
beside the worker's `parameters per rank`), the median over the rounds of each run's median step
(its `done:` line) with the spread of the rounds, tokens per second, the step against dense's
(one rank) or against ep 1's (two ranks), ep 2's all-to-all share of the step, the planner's
predicted step, and the routing's balance (the largest share of a layer's tokens one expert
took; 0.250 is even).

The all-to-alls' time and bytes are the worker's own measurement (its `done:` line: per rank over
the run); their share of the step is those seconds over steps × the run's median step. The planner's step is rank 0's predicted-vs-measured row; for the MoE cases the column says
`not modelled` when `trainyard plan` refuses the MoE spec (the worker's unchecked figure is
listed under the table).

Before the first run `trainyard plan --calibrate --fresh` measures the cpu profile into a profile
file of the benchmark's own (--no-calibrate: the user's stored profile), with the default
reference (gpt2-tiny, 4 × 64 tokens), or with --calibrate-on dense|moe with that case's spec as
the reference (`trainyard plan --calibrate --fresh SPEC`: its model and per-rank micro-batch). The Markdown report
(default bench/results/moe_cpu.md) has the machine, the command, the table and the raw output.
Run it alone: the step times are the machine's.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_accuracy as common  # noqa: E402  (the idle waits, the run table's parser)

ROOT = common.ROOT
EXPERTS = 8
TOP_K = 2

# gpt2-tiny's shape (config/README.md's presets); the MLP's hidden size is --ffn.
WIDTH, LAYERS, VOCAB, MAX_SEQ = 128, 4, 256, 256

SPEC = """name: moe-{tag}
model: {{preset: gpt2-tiny, ffn_hidden: {ffn}{moe}}}
data: {{source: markov, markov: {{vocab: 64, train_tokens: 200000, val_tokens: 2000}}}}
training: {{steps: {steps}, batch: 16, micro_batch: 8, seq_len: 64, eval_every: 0, log_every: 1000}}
parallelism: {{dp: {dp}, ep: {ep}}}
resources: {{nodes: 1, devices_per_node: {dp}}}
fault_tolerance: {{memory_every_steps: 0}}
"""
MOE = ", moe: {{experts: {experts}, top_k: {top_k}, ffn: {ffn}, every: 1}}"

# (name, MoE, dp, ep)
CASES = [
    ("dense", False, 1, 1),
    ("moe", True, 1, 1),
    ("moe dp2 ep1", True, 2, 1),
    ("moe dp2 ep2", True, 2, 2),
]

DONE = re.compile(r"^done: .*\| ([0-9.]+) tok/s \| median step ([0-9.]+) ms", re.M)
ALL_TO_ALL = re.compile(r"\| all-to-all ([0-9.]+) MiB, ([0-9.]+) s per rank")
EXPERT_SHARE = re.compile(r"\| moe max expert share ([0-9.]+) \(layer \d+\), (\d+) dropped")
PER_RANK = re.compile(r"([0-9.]+)M parameters per rank")


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def parameter_counts(ffn, moe, ep=1):
    """GPT-2's (total, active per token, per rank under `ep`) parameters, as config::ModelConfig
    counts them: an MoE block holds its router [experts, width] and `experts` MLPs of hidden size
    ffn / top_k, of which a token uses the router and top_k, and a rank experts / ep."""
    c = WIDTH

    def mlp(f):  # fc and proj, with biases
        return f * c + f + c * f + c

    attention = 2 * c + 3 * c * c + 3 * c + c * c + c + 2 * c  # norms, qkv, projection
    outside = VOCAB * c + MAX_SEQ * c + 2 * c  # tied embedding, positions, final LayerNorm
    if not moe:
        total = outside + LAYERS * (attention + mlp(ffn))
        return total, total, total
    expert = mlp(ffn // TOP_K)
    router = EXPERTS * c
    total = outside + LAYERS * (attention + router + EXPERTS * expert)
    active = outside + LAYERS * (attention + router + TOP_K * expert)
    per_rank = outside + LAYERS * (attention + router + EXPERTS // ep * expert)
    return total, active, per_rank


def write_specs(tmp, args):
    specs = {}
    for name, moe, dp, ep in CASES:
        tag = name.replace(" ", "-")
        specs[name] = os.path.join(tmp, f"{tag}.yaml")
        extra = MOE.format(experts=EXPERTS, top_k=TOP_K, ffn=args.ffn // TOP_K) if moe else ""
        with open(specs[name], "w") as f:
            f.write(SPEC.format(tag=tag, ffn=args.ffn, moe=extra, steps=args.steps, dp=dp, ep=ep))
    return specs


def run_cases(args, worker, specs, env):
    """Every case --rounds times, interleaved; per case each run's figures, and the raw text."""
    results = {name: [] for name in specs}
    raw = []
    for round_index in range(args.rounds):
        for name, spec in specs.items():
            run, other = common.quiet_run([worker, "--standalone", spec], args, timeout=900,
                                          env=env)
            raw.append(f"$ trainyard-worker --standalone ({name}, round {round_index + 1})"
                       f"   (other processes: {other:.2f} cores)\n" + run.stdout + run.stderr)
            done = DONE.search(run.stdout)
            if run.returncode != 0 or done is None:
                sys.exit(f"{name} failed:\n{run.stdout}\n{run.stderr}")
            rows = common.parse(run.stdout)
            share = EXPERT_SHARE.search(run.stdout)
            exchange = ALL_TO_ALL.search(run.stdout)
            per_rank = PER_RANK.search(run.stdout)
            results[name].append({
                "tokens per second": float(done.group(1)),
                "step": float(done.group(2)),
                "predicted": common.milliseconds(rows["step"][0]) if "step" in rows else None,
                "expert share": float(share.group(1)) if share else None,
                "dropped": int(share.group(2)) if share else None,
                "per rank": float(per_rank.group(1)) * 1e6 if per_rank else None,
                "all-to-all MiB": float(exchange.group(1)) if exchange else None,
                "all-to-all s": float(exchange.group(2)) if exchange else None,
                "other": other,
            })
    return results, raw


def planner_refusal(cli, spec, env, raw):
    """What `trainyard plan` says of the MoE spec: its refusal, None when it plans it, and
    'unknown' without the CLI."""
    if not os.path.exists(cli):
        return "unknown"
    run = subprocess.run([cli, "plan", spec, "--json", "--device", "cpu"], capture_output=True,
                         text=True, env=env)
    raw.append("$ trainyard plan SPEC --json --device cpu   (the moe case's spec)\n" +
               (run.stdout if run.returncode != 0 else "(a plan)\n") + run.stderr)
    if run.returncode == 0:
        return None
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    return next((line for line in lines if "model.moe" in line),
                lines[-1] if lines else f"exit {run.returncode}").strip()


def millions(n):
    return f"{n / 1e6:.3f}M"


def table(args, results, refusal):
    """The Markdown table and the lines under it."""
    steps = {name: median([r["step"] for r in runs]) for name, runs in results.items()}
    references = {"dense": "dense", "moe": "dense", "moe dp2 ep1": "moe dp2 ep1",
                  "moe dp2 ep2": "moe dp2 ep1"}
    lines = ["| case | ranks | parameters total / active per token | worker: parameters per rank | "
             "step, median (min–max of rounds) | tokens/s | step vs reference | all-to-all "
             "share of the step | planner's step (error) | max expert share, drops |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    unchecked, mismatches = [], []
    for name, moe, dp, ep in CASES:
        runs = results[name]
        measured = [r["step"] for r in runs]
        step = steps[name]
        total, active, expected = parameter_counts(args.ffn, moe, ep)
        per_rank = runs[0]["per rank"]
        if per_rank is not None and abs(per_rank - expected) >= 500:  # printed to 0.001M
            mismatches.append(f"{name}: the worker's {millions(per_rank)} against "
                              f"{millions(expected)} counted here")
        reference = references[name]
        ratio = f"{step / steps[reference]:.3f}× {reference.replace('moe dp2 ', '')}"
        share = "—"
        if ep > 1 and all(r["all-to-all s"] is not None for r in runs):
            shares = [100 * r["all-to-all s"] / (args.steps * r["step"] / 1e3) for r in runs]
            share = (f"{median(shares):.1f}% ({min(shares):.1f}–{max(shares):.1f}), "
                     f"{median([r['all-to-all MiB'] for r in runs]):.2f} MiB per rank")
        predicted = median([r["predicted"] for r in runs]) if all(
            r["predicted"] is not None for r in runs) else None
        if predicted is None:
            planner = "not modelled"
        elif moe and refusal is not None:
            planner = "not modelled"
            unchecked.append(f"{name} {predicted:.1f} ms")
        else:
            planner = f"{predicted:.1f} ms ({100 * (predicted - step) / step:+.1f}%)"
        balance = "—"
        if moe and runs[0]["expert share"] is not None:
            balance = (f"{median([r['expert share'] for r in runs]):.3f}, "
                       f"{max(r['dropped'] for r in runs)}")
        lines.append(
            f"| {name} | {dp} | {millions(total)} / {millions(active)} | "
            f"{millions(per_rank) if per_rank is not None else '—'} | "
            f"{step:.1f} ms ({min(measured):.1f}–{max(measured):.1f}) | "
            f"{median([r['tokens per second'] for r in runs]):.0f} | {ratio} | {share} | "
            f"{planner} | {balance} |")
    lines += [
        "",
        f"Parameters: total and active per token computed from the shapes (gpt2-tiny, MLP "
        f"{args.ffn}; experts {EXPERTS} × {args.ffn // TOP_K}, top_k {TOP_K}), as "
        "config::ModelConfig counts them; the worker's column is the `parameters per rank` of "
        f"the run's first `model` line (under ep 2 a rank holds {EXPERTS // 2} of the {EXPERTS} "
        "experts). " +
        ("The worker's count differs for " + "; ".join(mismatches) + "." if mismatches else
         "In every case it equals what a rank holds by the count here (the total, and under "
         "ep 2 the total less the other rank's experts)."),
        "",
        "All-to-all: the seconds and bytes each rank spent in and sent by its all-to-alls over "
        "the run (the row exchanges of the forward and backward passes, waits for the slower "
        "peer included; not the all-gather of counts per expert; the worker's `done:` line), "
        "the seconds over steps × the run's median step; the bytes are the run's, per rank.",
        "",
    ]
    if refusal is None:
        lines.append("Planner: `trainyard plan` plans the MoE spec; its step is rank 0's "
                     "predicted row of each run.")
    elif refusal == "unknown":
        lines.append("Planner: no `trainyard` CLI in the build, so whether it models MoE was not "
                     "asked; the MoE cases' predicted rows are shown as printed.")
    else:
        lines.append(f"Planner: `trainyard plan` refuses the MoE spec (`{refusal}`), so the MoE "
                     "cases show `not modelled`." +
                     (" The worker's end-of-run comparison prints a predicted step for them all "
                      "the same (" + ", ".join(unchecked) + "; its per-mesh estimate does not "
                      "make the planner's check), which is not a prediction the planner stands "
                      "behind." if unchecked else ""))
    loads = [r["other"] for runs in results.values() for r in runs]
    lines += ["", f"machine load: other processes kept {max(loads):.2f} cores busy at most during "
              f"a run (of {os.cpu_count()} cores)"]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--ffn", type=int, default=512,
                        help="the dense MLP's hidden size; each expert's is half")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-calibrate", action="store_true")
    parser.add_argument("--calibrate-on", choices=["dense", "moe"],
                        help="calibrate with this case's spec as the reference")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "moe_cpu.md"))
    parser.add_argument("--wait-idle", type=float, default=120)
    parser.add_argument("--max-other-load", type=float, default=0.3)
    args = parser.parse_args()
    if args.ffn < TOP_K or args.ffn % TOP_K != 0:
        sys.exit(f"--ffn must be a positive multiple of top_k {TOP_K}, got {args.ffn}")
    if args.no_calibrate and args.calibrate_on:
        sys.exit("--calibrate-on calibrates: not with --no-calibrate")
    if args.rounds < 1 or args.steps < 1:
        sys.exit("--steps and --rounds must be at least 1")
    worker = os.path.join(args.build, "worker", "trainyard-worker")
    cli = os.path.join(args.build, "tools", "cli", "trainyard")
    if not os.path.exists(worker):
        sys.exit(f"no worker at {worker}: build it first")
    raw = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        specs = write_specs(tmp, args)
        if not args.no_calibrate:
            env["XDG_CONFIG_HOME"] = os.path.join(tmp, "config")
            reference = [specs[args.calibrate_on]] if args.calibrate_on else []
            calibration = subprocess.run([cli, "plan", "--calibrate", "--fresh"] + reference,
                                         capture_output=True, text=True, env=env)
            if calibration.returncode != 0:
                sys.exit(f"calibration failed: {calibration.stderr}")
        refusal = planner_refusal(cli, specs["moe"], env, raw)
        results, runs_raw = run_cases(args, worker, specs, env)
        raw = [text.replace(tmp, "SCRATCH") for text in raw + runs_raw]
        refusal = refusal.replace(tmp, "SCRATCH") if refusal else refusal
    text = "\n".join(table(args, results, refusal)) + "\n"
    print(text)
    common.write_benchmark_report(
        args.out, "Mixture of experts on CPU ranks: dense against MoE of the same active size, "
        "and expert parallelism", "moe_bench.py", text, raw)


if __name__ == "__main__":
    main()
