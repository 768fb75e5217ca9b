#!/usr/bin/env python3
"""The planner's predictions against the engine on this machine's CPU.

Usage: python3 bench/plan_accuracy.py [--build DIR] [--steps N] [--no-calibrate] [--out FILE]

First `trainyard plan --calibrate` measures the cpu profile (unless --no-calibrate). Then, for
each mesh of a set of CPU meshes (dp, tp, pp and ZeRO over 2 to 4 ranks, the tiny GPT-2),
`trainyard-worker --standalone` trains the spec and its rank 0 prints the planner's prediction
beside what it measured (the table above its `done:` line). This script collects those tables
and prints, per mesh, predicted vs measured memory (total, and the worst kind), bytes per step on
each axis, and the step time, with the error of each; then the worst errors against the goals
(memory within 1%, bytes exact, step time within 15%). Writes a Markdown report (default
bench/results/plan_accuracy.md) with the machine, the command, the table and the raw output.
Run it alone: the step times are the machine's.
"""
import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, dp, tp, pp, zero)
MESHES = [
    ("dp2", 2, 1, 1, 0),
    ("dp2 zero1", 2, 1, 1, 1),
    ("dp2 zero2", 2, 1, 1, 2),
    ("dp2 zero3", 2, 1, 1, 3),
    ("tp2", 1, 2, 1, 0),
    ("pp2", 1, 1, 2, 0),
    ("dp4", 4, 1, 1, 0),
    ("dp2 tp2", 2, 2, 1, 0),
    ("dp2 pp2 zero1", 2, 1, 2, 1),
    ("tp2 pp2", 1, 2, 2, 0),
]

SPEC = """name: plan-{tag}
model: {{preset: gpt2-tiny}}
data: {{source: markov, markov: {{vocab: 64, train_tokens: 200000, val_tokens: 2000}}}}
training: {{steps: {steps}, batch: 16, micro_batch: 4, seq_len: 64, eval_every: 0, log_every: 1000}}
parallelism: {{dp: {dp}, tp: {tp}, pp: {pp}, zero: {zero}}}
resources: {{nodes: 1, devices_per_node: {world}}}
fault_tolerance: {{memory_every_steps: 0}}
"""

ROW = re.compile(r"^  (memory \w+|bytes sent \w+|step(?: \w+)?|bubble fraction|MFU)\s{2,}"
                 r"(\S+(?: \S+)?)\s+(\S+(?: \S+)?)\s+(\S+)$")


def parse(output):
    rows = {}
    for line in output.splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return rows


def percent(text):
    return None if text == "n/a" else float(text.rstrip("%"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-calibrate", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/plan_accuracy.md"))
    args = parser.parse_args()
    cli = os.path.join(args.build, "tools/cli/trainyard")
    worker = os.path.join(args.build, "worker/trainyard-worker")
    raw = []
    if not args.no_calibrate:
        cal = subprocess.run([cli, "plan", "--calibrate"], capture_output=True, text=True)
        raw.append("$ trainyard plan --calibrate\n" + cal.stdout + cal.stderr)
        if cal.returncode != 0:
            sys.exit("calibration failed:\n" + cal.stdout + cal.stderr)
    table = ["| mesh | memory total pred / meas (err) | worst memory kind | bytes dp / tp / pp "
             "pred vs meas | step pred / meas (err) | compute / comm / bubble measured |",
             "| --- | --- | --- | --- | --- | --- |"]
    worst = {"memory": (0.0, ""), "bytes": (0.0, ""), "step": (0.0, "")}
    with tempfile.TemporaryDirectory() as tmp:
        for name, dp, tp, pp, zero in MESHES:
            world = dp * tp * pp
            spec = os.path.join(tmp, name.replace(" ", "_") + ".yaml")
            with open(spec, "w") as f:
                f.write(SPEC.format(tag=name.replace(" ", "-"), steps=args.steps, dp=dp, tp=tp,
                                    pp=pp, zero=zero, world=world))
            run = subprocess.run([worker, "--standalone", spec], capture_output=True, text=True,
                                 timeout=600)
            raw.append(f"$ trainyard-worker --standalone ({name})\n" + run.stdout + run.stderr)
            rows = parse(run.stdout)
            if run.returncode != 0 or "step" not in rows:
                table.append(f"| {name} | failed (exit {run.returncode}) | | | | |")
                continue
            kinds = [k for k in rows if k.startswith("memory ") and k != "memory total"]
            kind_err = max(kinds, key=lambda k: abs(percent(rows[k][2]) or 0))
            bytes_cells, bytes_err = [], 0.0
            for axis in ("dp", "tp", "pp"):
                p, m, e = rows["bytes sent " + axis]
                bytes_cells.append(f"{p} vs {m}")
                bytes_err = max(bytes_err, abs(percent(e) or 0) if e != "n/a" else 100.0)
            mem_err = max(abs(percent(rows[k][2]) or 0) for k in kinds + ["memory total"])
            step_err = abs(percent(rows["step"][2]))
            for key, err in (("memory", mem_err), ("bytes", bytes_err), ("step", step_err)):
                if err >= worst[key][0]:
                    worst[key] = (err, name)
            p, m, e = rows["memory total"]
            table.append(
                f"| {name} | {p} / {m} ({e}) | {kind_err.split()[1]} {rows[kind_err][2]} | "
                f"{' · '.join(bytes_cells)} | {rows['step'][0]} / {rows['step'][1]} "
                f"({rows['step'][2]}) | {rows['step compute'][1]} / "
                f"{rows['step communication'][1]} / {rows['step bubble'][1]} |")
    summary = [
        f"worst memory error: {worst['memory'][0]:.1f}% ({worst['memory'][1]}); goal 1%",
        f"worst bytes error: {worst['bytes'][0]:.1f}% ({worst['bytes'][1]}); goal exact",
        f"worst step-time error: {worst['step'][0]:.1f}% ({worst['step'][1]}); goal 15%",
    ]
    text = "\n".join(table + [""] + summary) + "\n"
    print(text)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                machine = f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
                break
    except OSError:
        pass
    with open(args.out, "w") as f:
        f.write("# Planner: predicted vs measured on CPU meshes\n\n")
        f.write(f"Machine: {machine}, no GPU.\n\n")
        f.write("Command: `python3 bench/plan_accuracy.py " + " ".join(sys.argv[1:]) + "`\n\n")
        f.write("Model `gpt2-tiny`, batch 16 in micro-batches of 4, 64 tokens, "
                f"{args.steps} steps per mesh; the figures are rank 0's, per step (memory in "
                "bytes; the measured step is the median step, its phases in the run's "
                "proportions).\n\n")
        f.write(text + "\n## Raw output\n\n```\n" + "\n".join(raw) + "```\n")


if __name__ == "__main__":
    main()
