#!/usr/bin/env python3
"""The pipeline schedules side by side on this machine's CPU: 1F1B, interleaved 1F1B and ZB-H1.

Usage: python3 bench/schedule_bench.py [--build DIR] [--steps N] [--rounds R] [--no-calibrate]
                                      [--out FILE] [--wait-idle SECONDS] [--max-other-load CORES]
                                      [--stages 2,4]

For pp 2 and 4 (gpt2-small-cpu widened to 8 layers of width 256, so that pp 4 splits into two
chunks per rank; 16 sequences of 64 tokens per step in micro-batches of 4, so m = 4 micro-batches
per step, the fewest ZB-H1 and interleaved take at pp 4), `trainyard-worker --standalone` trains
the same spec under each schedule (interleaved with virtual_stages 2); its rank 0 prints the
planner's prediction beside what it measured (the table above its `done:` line): the step and the
bubble fraction (the share of training time the stage spent blocked on its pipeline peers). Every
case runs --rounds times (default 5: ZB-H1's gain at pp 4 on two cores is about 2%, and one
round's paired ratio moves by about as much), the rounds interleaved across the cases (in the reverse
order every other round, so that a machine slowing or speeding up over minutes favours no case),
and the table reports the median step with the spread of the rounds, the predicted step and its
error, both bubble fractions, and each schedule's step against 1F1B's of the same pp: measured,
the median over the rounds of the round's own ratio (paired: the two runs were minutes apart at
most, where the machine's regime moves the medians of separate rounds by several percent), with
the rounds' spread, and predicted. Each run trains --steps steps (default 40) and reports its
median step: four ranks time-sharing two cores move single steps by ±8%.

Before each round `trainyard plan --calibrate` measures the cpu profile again, into a profile
file of the benchmark's own (the first with --fresh), so that the file ends with one calibration
per round, taken in the same minutes as the runs, and its profile is their median (one calibration
is one draw of a machine whose speed moves between regimes lasting minutes: docs/planner.md).
When every round has run, `trainyard plan SPEC --mesh ... --json` predicts each case's step and
bubble with that profile; those are the table's predicted figures (each run's own table, in the
raw output, used the profile of its moment). --no-calibrate: the user's stored profile. The Markdown
report (default bench/results/schedule_cpu.md) has the machine, the command, the table and the
raw output. Run it alone: the step times are the machine's.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_accuracy as common  # noqa: E402  (the idle waits, the run table's parser)

ROOT = common.ROOT
SCHEDULES = ["1f1b", "interleaved", "zero-bubble"]
VIRTUAL_STAGES = {"interleaved": 2}

SPEC = """name: schedule-{tag}
model: {{preset: gpt2-small-cpu, layers: 8}}
data: {{source: markov, markov: {{vocab: 64, train_tokens: 200000, val_tokens: 2000}}}}
training: {{steps: {steps}, batch: 16, micro_batch: 4, seq_len: 64, eval_every: 0, log_every: 1000}}
parallelism: {{dp: 1, tp: 1, pp: {pp}, zero: 0, schedule: {schedule}, virtual_stages: {v}}}
resources: {{nodes: 1, devices_per_node: {pp}}}
fault_tolerance: {{memory_every_steps: 0}}
"""


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def calibrate(cli, env, fresh):
    command = [cli, "plan", "--calibrate"] + (["--fresh"] if fresh else [])
    calibration = subprocess.run(command, capture_output=True, text=True, env=env)
    if calibration.returncode != 0:
        sys.exit(f"calibration failed: {calibration.stderr}")


def predicted(cli, spec, pp, env):
    """The planner's step (ms) and bubble fraction for `spec` at pp `pp` with `env`'s profile."""
    run = subprocess.run([cli, "plan", spec, "--json", "--device", "cpu", "--mesh",
                          f"dp=1,tp=1,pp={pp},zero=0"], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"trainyard plan failed for {spec}: {run.stderr}")
    candidate = json.loads(run.stdout)["candidates"][0]
    return 1e3 * candidate["step_seconds"]["total"], candidate["bubble_fraction"]


def run_cases(args, worker, specs, env, before_round):
    """Every case --rounds times, interleaved; per case the runs' parsed tables and raw text."""
    results = {name: [] for name in specs}
    raw = []
    for round_index in range(args.rounds):
        before_round(round_index)
        names = list(specs) if round_index % 2 == 0 else list(reversed(specs))
        for name in names:
            spec = specs[name]
            run, other = common.quiet_run([worker, "--standalone", spec], args, timeout=900,
                                          env=env)
            raw.append(f"$ trainyard-worker --standalone ({name}, round {round_index + 1})"
                       f"   (other processes: {other:.2f} cores)\n" + run.stdout + run.stderr)
            rows = common.parse(run.stdout)
            if run.returncode != 0 or "step" not in rows:
                sys.exit(f"{name} failed:\n{run.stdout}\n{run.stderr}")
            results[name].append({
                "predicted": common.milliseconds(rows["step"][0]),
                "measured": common.milliseconds(rows["step"][1]),
                "bubble predicted": float(rows["bubble fraction"][0]),
                "bubble measured": float(rows["bubble fraction"][1]),
                "other": other,
            })
    return results, raw


def paired_ratios(runs, base):
    """Each round's step of `runs` over the same round's 1F1B step (`base`)."""
    return [r["measured"] / b["measured"] for r, b in zip(runs, base)]


def table(stages, results):
    lines = ["| pp | schedule | step measured, median (min–max of rounds) | step predicted "
             "(error) | bubble fraction measured / predicted | step vs 1F1B measured, median of the rounds' "
             "ratios (min–max) / predicted |",
             "| --- | --- | --- | --- | --- | --- |"]
    for pp in stages:
        base = results[f"pp{pp} 1f1b"]
        base_predicted = median([r["predicted"] for r in base])
        for schedule in SCHEDULES:
            runs = results[f"pp{pp} {schedule}"]
            measured = [r["measured"] for r in runs]
            step = median(measured)
            predicted = median([r["predicted"] for r in runs])
            bubble = median([r["bubble measured"] for r in runs])
            bubble_predicted = median([r["bubble predicted"] for r in runs])
            ratios = paired_ratios(runs, base)
            spread = "" if schedule == "1f1b" else f" ({min(ratios):.3f}–{max(ratios):.3f})"
            lines.append(
                f"| {pp} | {schedule} | {step:.1f} ms ({min(measured):.1f}–{max(measured):.1f}) | "
                f"{predicted:.1f} ms ({100 * (predicted - step) / step:+.1f}%) | "
                f"{bubble:.3f} / {bubble_predicted:.3f} | "
                f"{median(ratios):.3f}×{spread} / {predicted / base_predicted:.3f}× |")
    return lines


def goals(stages, results):
    """The benchmark's two goals, checked: every step within 15% of its prediction, and ZB-H1
    faster than 1F1B (the median of the rounds' ratios below 1) wherever the model predicts it."""
    errors, faster = [], []
    for pp in stages:
        base = results[f"pp{pp} 1f1b"]
        for schedule in SCHEDULES:
            runs = results[f"pp{pp} {schedule}"]
            step = median([r["measured"] for r in runs])
            errors.append(abs(median([r["predicted"] for r in runs]) - step) / step)
        runs = results[f"pp{pp} zero-bubble"]
        if median([r["predicted"] for r in runs]) < median([r["predicted"] for r in base]):
            ratios = paired_ratios(runs, base)
            faster.append(f"pp {pp}: {'yes' if median(ratios) < 1 else 'NO'}")
    return [f"goal, every step within 15% of its prediction: "
            f"{'yes' if max(errors) <= 0.15 else 'NO'} (largest error {100 * max(errors):.1f}%)",
            f"goal, ZB-H1 faster than 1F1B where predicted: {', '.join(faster) or 'not predicted'}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--no-calibrate", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "schedule_cpu.md"))
    parser.add_argument("--wait-idle", type=float, default=120)
    parser.add_argument("--max-other-load", type=float, default=0.3)
    args = parser.parse_args()
    worker = os.path.join(args.build, "worker", "trainyard-worker")
    cli = os.path.join(args.build, "tools", "cli", "trainyard")
    stages = [int(p) for p in args.stages.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if not args.no_calibrate:
            env["XDG_CONFIG_HOME"] = os.path.join(tmp, "config")
        specs, depth = {}, {}
        for pp in stages:
            for schedule in SCHEDULES:
                name = f"pp{pp} {schedule}"
                depth[name] = pp
                specs[name] = os.path.join(tmp, f"pp{pp}-{schedule}.yaml")
                with open(specs[name], "w") as f:
                    f.write(SPEC.format(tag=f"pp{pp}-{schedule}", steps=args.steps, pp=pp,
                                        schedule=schedule, v=VIRTUAL_STAGES.get(schedule, 1)))
        results, raw = run_cases(
            args, worker, specs, env,
            lambda i: None if args.no_calibrate else calibrate(cli, env, fresh=i == 0))
        # The predictions of the rounds' median profile (the same for every round).
        for name, runs in results.items():
            step, bubble = predicted(cli, specs[name], depth[name], env)
            for r in runs:
                r["predicted"], r["bubble predicted"] = step, bubble
        raw = [text.replace(tmp, "SCRATCH") for text in raw]
    loads = [r["other"] for runs in results.values() for r in runs]
    text = "\n".join(table(stages, results) + [""] + goals(stages, results) + [
        "", f"machine load: other processes kept {max(loads):.2f} cores busy at most during a run "
        f"(of {os.cpu_count()} cores)"]) + "\n"
    print(text)
    common.write_benchmark_report(
        args.out, "Pipeline schedules on CPU ranks: 1F1B, interleaved 1F1B and ZB-H1",
        "schedule_bench.py", text, raw)


if __name__ == "__main__":
    main()
