#!/usr/bin/env python3
"""Context parallelism on this machine's CPU: how long a sequence cp 1, 2 and 4 train within a
fixed memory per rank, and their speed at a sequence all of them can train.

Usage: python3 bench/context_bench.py [--build DIR] [--moe] [--limit-mib M]
                                      [--ladder 512,1024,...] [--degrees 1,2,4] [--steps N]
                                      [--rounds R] [--no-calibrate] [--out FILE]
                                      [--wait-idle SECONDS] [--max-other-load CORES]

The model is gpt2-tiny (4 layers, width 128, 4 heads) with room for 8192 positions, one sequence
per step; with --moe every block's MLP is 4 routed experts of hidden size 256, top-2 (the dense
MLP's active FLOPs), and the report goes to bench/results/context_moe_cpu.md. Part 1, memory: for each cp, `trainyard-worker --standalone` trains two steps at each
sequence length of the ladder, shortest first, until a rank needs more than --limit-mib (default
64 MiB) by the engine's own accounting (every buffer it allocates: parameters, gradients,
optimizer state, activations with ring attention's buffers, ZeRO's transient ones; rank 0's
`memory total`, which the planner's prediction beside it must equal); the longest length within
the limit is the one cp trains. Part 2, speed: at the longest length cp 1 trains, each cp runs
--steps steps --rounds times (default 5 and 3, the rounds interleaved across the degrees), and
the table has the median step with the spread of the rounds, tokens per second, the step against
cp 1's, and the planner's predicted step beside each.

Before the first run `trainyard plan --calibrate --fresh` measures the cpu profile into a profile
file of the benchmark's own (--no-calibrate: the user's stored profile). The Markdown report
(default bench/results/context_cpu.md) has the machine, the command, the tables and the raw
output. Run it alone: the step times are the machine's. cp 4 runs four ranks, which on a 2-core
machine share the cores.
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

SPEC = """name: context-{tag}
model: {{preset: gpt2-tiny, max_seq: 8192{moe}}}
data: {{source: markov, markov: {{vocab: 64, train_tokens: 200000, val_tokens: 20000}}}}
training: {{steps: {steps}, batch: 1, micro_batch: 1, seq_len: {seq}, eval_every: 0, log_every: 1000}}
parallelism: {{dp: 1, cp: {cp}}}
resources: {{nodes: 1, devices_per_node: {cp}}}
fault_tolerance: {{memory_every_steps: 0}}
"""

TOKENS_PER_SECOND = re.compile(r"^done: .*\| ([0-9.]+) tok/s", re.M)
MIB = 1 << 20


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def train(args, worker, tmp, env, cp, seq, steps, raw, label):
    """One standalone run; its rank 0's predicted-vs-measured rows and tokens per second."""
    tag = f"cp{cp}-t{seq}"
    spec = os.path.join(tmp, f"{tag}.yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(tag=tag, steps=steps, seq=seq, cp=cp,
                            moe=", moe: {experts: 4, top_k: 2, ffn: 256}" if args.moe else ""))
    run, other = common.quiet_run([worker, "--standalone", spec], args, timeout=1800, env=env)
    raw.append(f"$ trainyard-worker --standalone ({label}: cp {cp}, seq_len {seq})"
               f"   (other processes: {other:.2f} cores)\n" + run.stdout + run.stderr)
    rows = common.parse(run.stdout)
    speed = TOKENS_PER_SECOND.search(run.stdout)
    if run.returncode != 0 or "memory total" not in rows or speed is None:
        sys.exit(f"cp {cp} at seq_len {seq} failed:\n{run.stdout}\n{run.stderr}")
    return {
        "memory predicted": int(rows["memory total"][0]),
        "memory measured": int(rows["memory total"][1]),
        "step predicted": common.milliseconds(rows["step"][0]),
        "step measured": common.milliseconds(rows["step"][1]),
        "tokens per second": float(speed.group(1)),
        "other": other,
    }


def longest_within(args, worker, tmp, env, cp, ladder, raw):
    """The ladder's runs for one cp up to the first over the limit: (longest within, runs)."""
    runs = []
    longest = None
    for seq in ladder:
        if seq % (2 * cp) != 0:
            continue
        result = train(args, worker, tmp, env, cp, seq, 2, raw, "memory")
        runs.append((seq, result))
        if result["memory measured"] > args.limit_mib * MIB:
            break
        longest = seq
    return longest, runs


def memory_table(args, degrees, longest, runs):
    lines = [f"| cp | longest seq_len within {args.limit_mib} MiB per rank | rank 0 memory there, "
             "measured / predicted | next length: memory measured / predicted |",
             "| --- | --- | --- | --- |"]
    for cp in degrees:
        at = {seq: r for seq, r in runs[cp]}
        best = longest[cp]
        here = at.get(best)
        over = next(((seq, r) for seq, r in runs[cp] if best is None or seq > best), None)
        here_text = (f"{here['memory measured'] / MIB:.1f} / {here['memory predicted'] / MIB:.1f} MiB"
                     if here else "—")
        over_text = (f"{over[0]}: {over[1]['memory measured'] / MIB:.1f} / "
                     f"{over[1]['memory predicted'] / MIB:.1f} MiB" if over else "(ladder's end)")
        lines.append(f"| {cp} | {best if best else 'none'} | {here_text} | {over_text} |")
    return lines


def speed_table(degrees, seq, results):
    base = median([r["step measured"] for r in results[degrees[0]]])
    base_predicted = median([r["step predicted"] for r in results[degrees[0]]])
    lines = [f"| cp | step at seq_len {seq}, median (min–max of rounds) | tokens/s | "
             f"step predicted (error) | step vs cp {degrees[0]} measured / predicted |",
             "| --- | --- | --- | --- | --- |"]
    for cp in degrees:
        steps = [r["step measured"] for r in results[cp]]
        step = median(steps)
        predicted = median([r["step predicted"] for r in results[cp]])
        speed = median([r["tokens per second"] for r in results[cp]])
        lines.append(f"| {cp} | {step:.1f} ms ({min(steps):.1f}–{max(steps):.1f}) | {speed:.0f} | "
                     f"{predicted:.1f} ms ({100 * (predicted - step) / step:+.1f}%) | "
                     f"{step / base:.3f}× / {predicted / base_predicted:.3f}× |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--moe", action="store_true")
    parser.add_argument("--limit-mib", type=int, default=64)
    parser.add_argument("--ladder", default="512,1024,1536,2048,3072,4096,6144,8192")
    parser.add_argument("--degrees", default="1,2,4")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-calibrate", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--wait-idle", type=float, default=120)
    parser.add_argument("--max-other-load", type=float, default=0.3)
    args = parser.parse_args()
    if args.out is None:
        name = "context_moe_cpu.md" if args.moe else "context_cpu.md"
        args.out = os.path.join(ROOT, "bench", "results", name)
    worker = os.path.join(args.build, "worker", "trainyard-worker")
    cli = os.path.join(args.build, "tools", "cli", "trainyard")
    degrees = [int(c) for c in args.degrees.split(",")]
    ladder = sorted(int(s) for s in args.ladder.split(","))
    raw = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if not args.no_calibrate:
            env["XDG_CONFIG_HOME"] = os.path.join(tmp, "config")
            calibration = subprocess.run([cli, "plan", "--calibrate", "--fresh"],
                                         capture_output=True, text=True, env=env)
            if calibration.returncode != 0:
                sys.exit(f"calibration failed: {calibration.stderr}")
        longest, runs = {}, {}
        for cp in degrees:
            longest[cp], runs[cp] = longest_within(args, worker, tmp, env, cp, ladder, raw)
        seq = longest[degrees[0]]
        if seq is None:
            sys.exit(f"cp {degrees[0]} trains no length of the ladder within {args.limit_mib} MiB")
        speed = {cp: [] for cp in degrees}
        for round_index in range(args.rounds):
            for cp in degrees:
                speed[cp].append(train(args, worker, tmp, env, cp, seq, args.steps, raw,
                                       f"speed, round {round_index + 1}"))
        raw = [text.replace(tmp, "SCRATCH") for text in raw]
    loads = [r["other"] for results in speed.values() for r in results]
    text = "\n".join(memory_table(args, degrees, longest, runs) + [""] +
                     speed_table(degrees, seq, speed) + [
        "", f"machine load: other processes kept {max(loads):.2f} cores busy at most during a "
        f"speed run (of {os.cpu_count()} cores)"]) + "\n"
    print(text)
    model = " with a mixture-of-experts model" if args.moe else ""
    common.write_benchmark_report(
        args.out, f"Context parallelism on CPU ranks{model}: sequence length within a memory "
        "limit, and speed", "context_bench.py", text, raw)


if __name__ == "__main__":
    main()
