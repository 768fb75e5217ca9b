#!/usr/bin/python3
"""What the memory tier costs a running job.

Usage: python3 bench/memory_tier_cost.py [--trials N] [--build DIR] [--out FILE]

Runs the same 2-rank CPU data-parallel job on a fresh trainyard-server and one trainyard-agent
(2 CPU slots, its memory tier in a scratch directory) with `fault_tolerance.memory_every_steps`
1 (a snapshot of every rank's parameters and AdamW moments after every step), 0 (no tier) and
auto (the default: the interval that keeps the measured cost of snapshots within 5% of the step
time), alternating, N trials each, for two model sizes: the gpt2-debug preset (1.4 MiB of state a rank)
and gpt2-small-cpu (about 3.2 M parameters, 38 MiB a rank). The time is the job's wall time from
its `running` event (every rank joined) to `succeeded`, which includes everything a snapshot
costs: the copy into the host buffer that blocks training, and the background write competing
for the machine's cores. Writes a Markdown report (default bench/results/memory_tier_cost.md).
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery import Plane, cpu_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = {  # preset: steps
    "gpt2-debug": 1500,
    "gpt2-small-cpu": 60,
}

SPEC = """name: cost
model: {{preset: {model}}}
data: {{source: markov, markov: {{vocab: 32, train_tokens: 50000, val_tokens: 2000}}}}
training: {{steps: {steps}, batch: 8, seq_len: 16, eval_every: 0, log_every: 1000, threads: 1}}
parallelism: {{dp: 2}}
resources: {{nodes: 1, devices_per_node: 2}}
fault_tolerance: {{max_restarts: 0, memory_every_steps: {every}}}
"""


def event_ms(reply, kind):
    for event in reply.get("events", []):
        if event.get("kind") == kind:
            return int(event.get("timeUnixMs", event.get("time_unix_ms", 0)))
    return None


def trial(build, model, steps, every):
    with tempfile.TemporaryDirectory(prefix="trainyard_tier_cost_") as tmp:
        plane = Plane(build, tmp)
        try:
            spec = os.path.join(tmp, "job.yaml")
            with open(spec, "w") as f:
                f.write(SPEC.format(model=model, steps=steps, every=every))
            job = plane.run_cli("submit", spec).strip().split()[-1]

            # `watch` blocks until the job ends: no polling beside the job.
            watch = subprocess.run([os.path.join(build, "tools/cli/trainyard"), "--server",
                                    plane.address, "--token-file", plane.token, "watch", job],
                                   capture_output=True, text=True, timeout=900)
            reply = plane.cli("status", job)
            if watch.returncode != 0 or "SUCCEEDED" not in str(reply["job"].get("state", "")):
                raise RuntimeError(f"job {job} did not succeed: {watch.stdout[-500:]}")
            running, finished = event_ms(reply, "running"), event_ms(reply, "succeeded")
            return (finished - running) / 1e3
        finally:
            plane.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/memory_tier_cost.md"))
    args = parser.parse_args()
    results = {}
    for model, steps in MODELS.items():
        for t in range(args.trials):
            for every in ("1", "0", "auto"):
                seconds = trial(args.build, model, steps, every)
                results.setdefault((model, every), []).append(seconds)
                print(f"{model} memory_every_steps {every} trial {t + 1}: {seconds:.3f} s "
                      f"({1e3 * seconds / steps:.2f} ms/step)", flush=True)
    lines = [
        "# What the memory tier costs a running job",
        "",
        f"Machine: {platform.node()}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"{platform.platform()}.",
        f"Command: `python3 bench/memory_tier_cost.py --trials {args.trials}`",
        "",
        __doc__.split("\n\n", 2)[2].strip().replace("\n", " "),
        "",
        "| model | steps | tier off: median s (ms/step) | every step: median s (ms/step), "
        "cost | auto: median s (ms/step), cost |",
        "| --- | --- | --- | --- | --- |",
    ]
    for model, steps in MODELS.items():
        off = statistics.median(results[(model, "0")])
        cells = []
        for every in ("1", "auto"):
            on = statistics.median(results[(model, every)])
            cells.append(f"{on:.2f} ({1e3 * on / steps:.2f}), {100 * (on / off - 1):+.1f}%")
        lines.append(f"| {model} | {steps} | {off:.2f} ({1e3 * off / steps:.2f}) | "
                     f"{cells[0]} | {cells[1]} |")
    lines += ["", "Raw trials (seconds):", "", "```"]
    for (model, every), values in sorted(results.items()):
        lines.append(f"{model} memory_every_steps {every}: " +
                     ", ".join(f"{v:.3f}" for v in values))
    lines += ["```", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
