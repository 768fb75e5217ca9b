#!/usr/bin/env python3
"""The planner's predictions against the engine on this machine's CPU.

Usage: python3 bench/plan_accuracy.py [--build DIR] [--steps N] [--rounds R] [--no-calibrate]
                                     [--out FILE] [--wait-idle SECONDS] [--max-other-load CORES]
                                     [--meshes A,B]

For each mesh of a set of CPU meshes (dp, tp, pp and ZeRO over 2 to 4 ranks, the tiny GPT-2),
`trainyard-worker --standalone` trains the spec and its rank 0 prints the planner's prediction
beside what it measured (the table above its `done:` line). Each mesh runs --rounds times
(default 5), the rounds interleaved across the meshes (round 1 of every mesh, then round 2, ...),
and the table reports the run with the median step of its mesh beside every round's.

The cpu profile: before each round `trainyard plan --calibrate` measures the machine again, into
a profile file of the benchmark's own (the first with --fresh), so the file ends with one
calibration per round, taken in the same minutes as the runs, and its profile is their median
(docs/planner.md: on a virtual machine a calibration is one draw of waits that switch between
regimes lasting minutes). When every round has run, `trainyard plan SPEC --mesh ... --json`
predicts each mesh's step with that profile, and again with each calibration alone (what one
calibration taken beside the runs would have predicted). With --no-calibrate the user's stored
profile is used as it is.

The script prints, per mesh, predicted vs measured memory (total, and the worst kind), bytes per
step on each axis, and the step time, with the error of each; then the worst errors against the
goals (memory within 1%, bytes exact, step time within 15%). It writes a Markdown report
(default bench/results/plan_accuracy.md) with the machine, the command, the table and the raw
output. Run it alone: the step times are the machine's. It waits (up to --wait-idle seconds) for
other processes to use under --max-other-load cores before each run and reports for each run the
CPU that other processes took meanwhile (the machine's busy time less this benchmark's, in
cores), and repeats a run taken beside more.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

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


def busy_seconds():
    """CPU seconds the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / ticks


def children_seconds():
    usage = os.times()
    return usage.children_user + usage.children_system


def measured(command, **kwargs):
    """Runs `command`; returns it and the cores other processes kept busy meanwhile."""
    busy, ours, start = busy_seconds(), children_seconds(), time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, **kwargs)
    wall = time.monotonic() - start
    other = (busy_seconds() - busy - (children_seconds() - ours)) / max(wall, 1e-9)
    return run, max(other, 0.0)


def other_cores(seconds=2.0):
    """Cores kept busy by other processes over the next `seconds` (none of ours runs)."""
    busy, start = busy_seconds(), time.monotonic()
    time.sleep(seconds)
    return (busy_seconds() - busy) / (time.monotonic() - start)


def wait_idle(seconds, limit):
    """Waits up to `seconds` for other processes to use less than `limit` cores; returns their use."""
    deadline = time.monotonic() + seconds
    load = other_cores()
    while load >= limit and time.monotonic() < deadline:
        time.sleep(5)
        load = other_cores()
    return load


def milliseconds(text):
    """'136.97 ms', '1.20 s' or '950 µs' in milliseconds."""
    value, unit = text.split()
    return float(value) * {"s": 1e3, "ms": 1.0, "µs": 1e-3}[unit]


def percent(text):
    return None if text == "n/a" else float(text.rstrip("%"))


def quiet_run(command, args, **kwargs):
    """Runs `command` when the machine is idle, again (up to twice) when other processes took
    --max-other-load cores or more meanwhile; returns the run and their load."""
    for _ in range(3):
        wait_idle(args.wait_idle, args.max_other_load)
        run, other = measured(command, **kwargs)
        if other < args.max_other_load:
            break
    return run, other


def write_spec(tmp, name, dp, tp, pp, zero, steps):
    spec = os.path.join(tmp, name.replace(" ", "_") + ".yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(tag=name.replace(" ", "-"), steps=steps, dp=dp, tp=tp, pp=pp,
                            zero=zero, world=dp * tp * pp))
    return spec


def predicted_step_ms(cli, spec, mesh, env):
    """The planner's step for `mesh` (dp, tp, pp, zero) with the cpu profile `env` points to."""
    dp, tp, pp, zero = mesh
    run = subprocess.run([cli, "plan", spec, "--json", "--device", "cpu", "--mesh",
                          f"dp={dp},tp={tp},pp={pp},zero={zero}"],
                         capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"trainyard plan failed for {spec}: {run.stderr}")
    return 1e3 * json.loads(run.stdout)["candidates"][0]["step_seconds"]["total"]


def single_calibration_envs(profile_path, tmp):
    """One environment per calibration kept in the profile file, whose profile is it alone."""
    with open(profile_path) as f:
        calibrations = json.load(f).get("calibrations", [])
    envs = []
    for i, calibration in enumerate(calibrations):
        home = os.path.join(tmp, f"calibration-{i + 1}")
        os.makedirs(os.path.join(home, "trainyard"), exist_ok=True)
        with open(os.path.join(home, "trainyard", "cpu-profile.json"), "w") as f:
            json.dump(calibration, f)
        envs.append(dict(os.environ, XDG_CONFIG_HOME=home))
    return envs


def error_percent(predicted, measured_value):
    return 100.0 * (predicted - measured_value) / measured_value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5,
                        help="runs per mesh, interleaved, each round after a calibration; the "
                        "table reports the median run")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="use the stored cpu profile as it is")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/plan_accuracy.md"))
    parser.add_argument("--wait-idle", type=float, default=600,
                        help="seconds to wait for an idle machine before each run")
    parser.add_argument("--max-other-load", type=float, default=0.1,
                        help="rerun the calibration or a mesh (up to twice) when other processes "
                        "used more cores meanwhile")
    parser.add_argument("--meshes", default="", help="comma-separated subset of the mesh names")
    args = parser.parse_args()
    if args.rounds < 1:
        sys.exit("--rounds must be at least 1")
    meshes = [m for m in MESHES if not args.meshes or m[0] in args.meshes.split(",")]
    start_load = wait_idle(args.wait_idle, args.max_other_load)
    cli = os.path.join(args.build, "tools/cli/trainyard")
    worker = os.path.join(args.build, "worker/trainyard-worker")
    raw, loads = [], []
    runs = {name: [] for name, *_ in meshes}  # (measured step ms, run, other load)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if not args.no_calibrate:
            env["XDG_CONFIG_HOME"] = os.path.join(tmp, "config")
        specs = {name: write_spec(tmp, name, *mesh, args.steps) for name, *mesh in meshes}
        for round_index in range(args.rounds):
            if not args.no_calibrate:
                command = [cli, "plan", "--calibrate"] + (["--fresh"] if round_index == 0 else [])
                cal, other = quiet_run(command, args, env=env)
                raw.append(f"$ {' '.join(['trainyard'] + command[1:])}   (round "
                           f"{round_index + 1}; other processes: {other:.2f} cores)\n" +
                           cal.stdout + cal.stderr)
                if cal.returncode != 0:
                    sys.exit("calibration failed:\n" + cal.stdout + cal.stderr)
            for name, *_ in meshes:
                run, other = quiet_run([worker, "--standalone", specs[name]], args, timeout=600,
                                       env=env)
                loads.append(other)
                raw.append(f"$ trainyard-worker --standalone ({name}, round {round_index + 1})"
                           f"   (other processes: {other:.2f} cores)\n" + run.stdout + run.stderr)
                rows = parse(run.stdout)
                ok = run.returncode == 0 and "step" in rows
                runs[name].append((milliseconds(rows["step"][1]) if ok else None, run, other))
        singles = [] if args.no_calibrate else single_calibration_envs(
            os.path.join(env["XDG_CONFIG_HOME"], "trainyard", "cpu-profile.json"), tmp)
        predictions = {name: (predicted_step_ms(cli, specs[name], mesh, env),
                              [predicted_step_ms(cli, specs[name], mesh, e) for e in singles])
                       for name, *mesh in meshes}
        # The report names the scratch folder, not where this machine put it.
        raw = [text.replace(tmp, "SCRATCH") for text in raw]
    table, worst, single_worst = report_table(meshes, runs, predictions, len(singles))
    summary = [
        f"worst memory error: {worst['memory'][0]:.1f}% ({worst['memory'][1]}); goal 1%",
        f"worst bytes error: {worst['bytes'][0]:.1f}% ({worst['bytes'][1]}); goal exact",
        f"worst step-time error: {worst['step'][0]:.1f}% ({worst['step'][1]}); goal 15%",
    ]
    for i, (err, name, within) in enumerate(single_worst):
        summary.append(f"calibration {i + 1} alone: worst step-time error {err:.1f}% ({name}), "
                       f"{within} of {len(meshes)} meshes within 15%")
    summary.append(
        f"machine load: other processes kept {start_load:.2f} cores busy just before the start "
        f"and {max(loads, default=0):.2f} at most during a run (of {os.cpu_count()} cores)")
    text = "\n".join(table + [""] + summary) + "\n"
    print(text)
    write_report(args, text, raw)


def report_table(meshes, runs, predictions, calibrations):
    """The Markdown table, the worst errors by kind, and each single calibration's worst step
    error and count within 15%."""
    table = ["| mesh | memory total pred / meas (err) | worst memory kind | bytes dp / tp / pp "
             "pred vs meas | step pred / meas (err) | each calibration alone | measured step "
             "per round | compute / comm / bubble measured | other load |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    worst = {"memory": (0.0, ""), "bytes": (0.0, ""), "step": (0.0, "")}
    single_worst = [[0.0, "", 0] for _ in range(calibrations)]
    for name, *_ in meshes:
        done = sorted((r for r in runs[name] if r[0] is not None), key=lambda r: r[0])
        if len(done) < len(runs[name]):
            failed = next(r[1] for r in runs[name] if r[0] is None)
            table.append(f"| {name} | failed (exit {failed.returncode}) | | | | | | | |")
            continue
        step_ms, run, other = done[(len(done) - 1) // 2]
        rows = parse(run.stdout)
        per_round = " · ".join(f"{r[0]:.1f}" for r in runs[name])
        kinds = [k for k in rows if k.startswith("memory ") and k != "memory total"]
        kind_err = max(kinds, key=lambda k: abs(percent(rows[k][2]) or 0))
        bytes_cells, bytes_err = [], 0.0
        for axis in ("dp", "tp", "pp"):
            p, m, e = rows["bytes sent " + axis]
            bytes_cells.append(f"{p} vs {m}")
            bytes_err = max(bytes_err, abs(percent(e) or 0) if e != "n/a" else 100.0)
        mem_err = max(abs(percent(rows[k][2]) or 0) for k in kinds + ["memory total"])
        predicted, alone = predictions[name]
        step_err = error_percent(predicted, step_ms)
        for key, err in (("memory", mem_err), ("bytes", bytes_err), ("step", abs(step_err))):
            if err >= worst[key][0]:
                worst[key] = (err, name)
        alone_errors = [error_percent(a, step_ms) for a in alone]
        for i, err in enumerate(alone_errors):
            if abs(err) >= single_worst[i][0]:
                single_worst[i][:2] = [abs(err), name]
            single_worst[i][2] += abs(err) <= 15.0
        p, m, e = rows["memory total"]
        table.append(
            f"| {name} | {p} / {m} ({e}) | {kind_err.split()[1]} {rows[kind_err][2]} | "
            f"{' · '.join(bytes_cells)} | {predicted:.2f} ms / {step_ms:.2f} ms "
            f"({step_err:+.1f}%) | {' · '.join(f'{x:+.1f}%' for x in alone_errors) or '—'} | "
            f"{per_round} ms | {rows['step compute'][1]} / {rows['step communication'][1]} / "
            f"{rows['step bubble'][1]} | {other:.2f} |")
    return table, worst, [tuple(w) for w in single_worst]


def machine_name():
    """'AMD EPYC ..., 2 cores': the CPU's model name and core count."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def write_benchmark_report(path, title, script, text, raw):
    """A benchmark's Markdown report: title, machine, command, its tables, the raw output."""
    command = f"python3 bench/{script} " + " ".join(sys.argv[1:])
    with open(path, "w") as f:
        f.write(f"# {title}\n\n")
        f.write(f"Machine: {machine_name()}. Command (from the build folder's parent): "
                f"`{command.strip()}`.\n\n")
        f.write(text)
        f.write("\n## Raw output\n\n```\n" + "\n".join(raw) + "```\n")


def write_report(args, text, raw):
    machine = machine_name()
    profile = ("the stored cpu profile" if args.no_calibrate else
               f"the median of {args.rounds} calibrations, one before each round")
    with open(args.out, "w") as f:
        f.write("# Planner: predicted vs measured on CPU meshes\n\n")
        f.write(f"Machine: {machine}, no GPU.\n\n")
        f.write("Command: `python3 bench/plan_accuracy.py " + " ".join(sys.argv[1:]) + "`\n\n")
        f.write("Model `gpt2-tiny`, batch 16 in micro-batches of 4, 64 tokens, "
                f"{args.steps} steps per run, {args.rounds} runs per mesh in interleaved "
                "rounds; the figures are rank 0's, per step, from the run whose step is its "
                "mesh's median (memory in bytes; a run's measured step is its median step, its "
                "phases in the run's proportions; `measured step per round`: every run's, in "
                "round order; `other load`: the cores other processes kept busy during the "
                f"reported run). Predicted step: `trainyard plan --mesh` with {profile}; `each "
                "calibration alone`: the step error with each calibration's own profile.\n\n")
        f.write(text + "\n## Raw output\n\n```\n" + "\n".join(raw) + "```\n")


if __name__ == "__main__":
    main()
