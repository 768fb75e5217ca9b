#!/usr/bin/python3
"""Recovery after a worker crash: Trainyard's memory tier against torchrun restarting from a
checkpoint written every step.

Usage: python3 bench/recovery.py [--trials N] [--kill-step S] [--build DIR] [--out FILE]
                                 [--torchrun PATH] [--seed K] [--verbose]

Both sides run the same 2-rank CPU data-parallel job on this machine: the GPT-2 of the
gpt2-debug preset (2 layers, width 64, 4 heads), global batch 8 of 16 tokens drawn from a
32-token vocabulary, AdamW, one thread per rank, gloo between the ranks. Once the job has
completed step S (default 200), and after a random delay drawn uniformly from torchrun's
monitoring interval (so that the kills sample its cycle evenly; seeded by --seed), rank 1's
process is killed with SIGKILL, and the benchmark measures
  recovery  = the wall time from the kill to the first step completed after the restart;
  work lost = the last step completed before the kill - the step the restart resumed from.

Trainyard: a fresh trainyard-server and one trainyard-agent with 2 CPU slots and its memory tier
(every rank snapshots its state into the agent's memory after every step), fault_tolerance
max_restarts 5 with no backoff, and a disk checkpoint directory that is never due. The end of
recovery is the time of the coordinator's "resumed" event of attempt 2, recorded when rank 0 of
the new attempt reports its first completed step; the last step before the kill is the largest
step in attempt 1's rank-0 log. Phases come from the job's events: the kill to the failure
(the coordinator's record of it), the failure to the new attempt being scheduled, scheduled to
running (every rank joined), running to the first step, and the restore time and worker start-up
time that the "resumed" event states.

torchrun: `torchrun --nproc_per_node 2 --max_restarts 5` (torch's defaults otherwise, its static
rendezvous on a free local port; `--redirects 1 --tee 1` where the installed torch cannot parse
its own defaults, see torch_facts) running bench/torch_recovery_peer.py, which DDP-trains the same
model with rank 0 saving model, optimizer and step after every step (torch.save to a temporary
file, then a rename) and every rank loading that checkpoint when it starts: the fairest setting
for torchrun, losing at most a step too. Its times come from the wall-clock lines that rank 0
writes after each completed step and when it has resumed.

Trials alternate between the two, each with fresh processes and scratch directories. Writes a
Markdown report (default bench/results/recovery.md) with the machine, the command, the tables
and the raw trials. The goal: Trainyard's median recovery at most a third of torchrun's, and at
most one step lost in every trial.
"""
import argparse
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT_S = 120  # the longest any one wait may take before the trial fails
POLL_S = 0.02
FAILURE_KINDS = ("crash", "hang", "node_lost", "collective_timeout", "user_error")

SPEC = """name: recovery
model: {{preset: gpt2-debug}}
data: {{source: markov, markov: {{vocab: 32, train_tokens: 50000, val_tokens: 2000}}}}
training: {{steps: 100000, batch: 8, seq_len: 16, eval_every: 0, log_every: 1, threads: 1}}
parallelism: {{dp: 2}}
resources: {{nodes: 1, devices_per_node: 2}}
checkpoint: {{dir: {ckpt}, every_steps: 1000000}}
fault_tolerance: {{max_restarts: 5, heartbeat_timeout_s: 5, backoff_initial_s: 0, memory_every_steps: 1}}
"""


def field(obj, name):
    """A field of the CLI's JSON under its proto name or its lowerCamelCase JSON name."""
    if name in obj:
        return obj[name]
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)
    return obj.get(camel)


def wait_for(what, check, timeout=WAIT_S):
    """Calls check() every POLL_S until it returns something other than None."""
    deadline = time.time() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        if time.time() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_S)


def kill_quietly(pid, group=False):
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Plane:
    """A coordinator and one agent with a memory tier in a scratch directory; everything is
    killed on close."""

    def __init__(self, build, tmp):
        self.build, self.tmp = build, tmp
        self.pids = set()
        self.agent = None
        state = os.path.join(tmp, "state")
        self.log = open(os.path.join(tmp, "plane.log"), "w")
        self.server = subprocess.Popen(
            [os.path.join(build, "server/trainyard-server"), "--listen", "127.0.0.1:0",
             "--state-dir", state, "--no-local-agent", "--metrics-listen", "off",
             "--heartbeat-timeout", "5", "--stop-grace", "2"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        addr_file = os.path.join(state, "server.addr")

        def address():
            if os.path.exists(addr_file):
                return open(addr_file).read().strip() or None
            if self.server.poll() is not None:
                raise RuntimeError(f"trainyard-server exited with {self.server.returncode}; "
                                   f"see {self.log.name}")
            return None

        self.address = wait_for("the server's address", address, timeout=30)

        self.token = os.path.join(state, "admin.token")  # the server's admin token
        self.agent = subprocess.Popen(
            [os.path.join(build, "server/agent/trainyard-agent"), "--coordinator", self.address,
             "--node-id", "node-a", "--slots", "2", "--no-gpus", "--work-dir",
             os.path.join(tmp, "agent"), "--worker-binary",
             os.path.join(build, "worker/trainyard-worker"), "--threads-per-worker", "1",
             "--token-file", self.token,
             "--memory-tier-dir", os.path.join(tmp, "tier")],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def run_cli(self, *args):
        out = subprocess.run([os.path.join(self.build, "tools/cli/trainyard"), "--server",
                              self.address, "--token-file", self.token, *args],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"trainyard {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def cli(self, *args):
        return json.loads(self.run_cli("--json", *args).splitlines()[0])

    def status(self, job_id):
        """The job's status; remembers every worker pid it names, so close() can kill them."""
        for proc, name in ((self.server, "trainyard-server"), (self.agent, "trainyard-agent")):
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.log.name}")
        reply = self.cli("status", job_id)
        state = str(reply["job"].get("state", ""))
        if any(end in state for end in ("SUCCEEDED", "FAILED", "CANCELLED", "DRAINED")):
            raise RuntimeError(f"job {job_id} ended ({state}): "
                               f"{field(reply['job'], 'last_failure') or ''}")
        for attempt in reply.get("attempts", []):
            for placed in attempt.get("placement", []):
                if int(placed.get("pid", 0)) > 0:
                    self.pids.add(int(placed["pid"]))
        return reply

    def close(self):
        for proc in (self.agent, self.server):
            if proc is None:
                continue
            kill_quietly(proc.pid, group=True)
            proc.wait()
        for pid in self.pids:
            kill_quietly(pid)
        self.log.close()


def event_time(event):
    return int(field(event, "time_unix_ms")) / 1000.0


def find_event(events, kind, attempt, after=None):
    for e in events:
        if (e.get("kind") in kind if isinstance(kind, tuple) else e.get("kind") == kind) and \
                int(field(e, "attempt_id") or 0) == attempt and \
                (after is None or event_time(e) >= after):
            return e
    return None


def trainyard_trial(args, delay, verbose):
    with tempfile.TemporaryDirectory(prefix="trainyard_recovery_") as tmp:
        plane = Plane(args.build, tmp)
        try:
            spec = os.path.join(tmp, "job.yaml")
            with open(spec, "w") as f:
                f.write(SPEC.format(ckpt=os.path.join(tmp, "ckpt")))
            job_id = plane.cli("submit", spec)["id"]

            def victim():
                reply = plane.status(job_id)
                attempts = reply.get("attempts", [])
                step = int((field(reply["job"], "progress") or {}).get("step", 0))
                if not attempts or step < args.kill_step:
                    return None
                for placed in attempts[0].get("placement", []):
                    if int(placed.get("rank", 0)) == 1 and int(placed.get("pid", 0)) > 0:
                        return int(placed["pid"])
                return None

            pid = wait_for(f"Trainyard's job to reach step {args.kill_step}", victim)
            time.sleep(delay)
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)

            def resumed():
                events = plane.status(job_id).get("events", [])
                return events if find_event(events, "resumed", 2) else None

            events = wait_for("the \"resumed\" event of attempt 2", resumed)
            if verbose:
                print(f"trainyard events (kill at {t_kill:.3f}):", file=sys.stderr)
                for e in events:
                    print(f"  {event_time(e):.3f} {event_time(e) - t_kill:+8.3f} s  "
                          f"attempt {field(e, 'attempt_id') or 0}  {e.get('kind'):12s} "
                          f"{e.get('cause', '')}", file=sys.stderr)
                plane.log.flush()
                print("the coordinator's and agent's log, last 40 lines:", file=sys.stderr)
                print("".join(open(plane.log.name).readlines()[-40:]), file=sys.stderr)
            log = plane.run_cli("logs", job_id, "--attempt", "1", "--rank", "0")
            steps = [int(m.group(1)) for m in re.finditer(r"\bstep\s+(\d+)/\d+", log)]
            if not steps:
                raise RuntimeError("attempt 1's rank-0 log has no step lines")
            resumed_event = find_event(events, "resumed", 2)
            cause = resumed_event.get("cause", "").replace(tmp, "$SCRATCH")
            m = re.search(r"resumed from step (\d+) \((memory tier|checkpoint)", cause)
            if not m:
                raise RuntimeError(f"attempt 2 did not resume from a saved step: {cause}")
            timing = re.search(r"in ([\d.]+) ms; worker ready ([\d.]+) ms", cause)
            failure = find_event(events, FAILURE_KINDS, 1)
            scheduled = find_event(events, "scheduled", 2)
            running = find_event(events, "running", 2)
            t_end = event_time(resumed_event)
            phases = {
                "detect": event_time(failure) - t_kill if failure else None,
                "reschedule": event_time(scheduled) - event_time(failure)
                              if failure and scheduled else None,
                "start": event_time(running) - event_time(scheduled)
                         if scheduled and running else None,
                "first_step": t_end - event_time(running) if running else None,
                "restore": float(timing.group(1)) / 1000.0 if timing else None,
                "worker_ready": float(timing.group(2)) / 1000.0 if timing else None,
            }
            try:
                plane.run_cli("cancel", job_id, "--reason", "benchmark done")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            return {
                "side": "trainyard", "recovery_s": t_end - t_kill, "delay_s": delay,
                "last_step": max(steps), "resumed_step": int(m.group(1)),
                "lost": max(steps) - int(m.group(1)), "tier": m.group(2),
                "failure_kind": failure.get("kind") if failure else "?",
                "phases": phases, "cause": cause,
            }
        finally:
            plane.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parent_pid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def read_progress(path):
    """rank 0's progress lines: [(kind, unix time, step, restart)]."""
    rows = []
    if os.path.exists(path):
        for line in open(path):
            parts = line.split()
            if len(parts) == 4 and line.endswith("\n"):
                rows.append((parts[0], float(parts[1]), int(parts[2]), int(parts[3])))
    return rows


def torchrun_trial(args, delay, verbose):
    with tempfile.TemporaryDirectory(prefix="torchrun_recovery_") as tmp:
        log = open(os.path.join(tmp, "torchrun.log"), "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        agent = subprocess.Popen(
            [args.torchrun, "--nproc_per_node", "2", "--max_restarts", "5",
             "--master_port", str(free_port()), "--log_dir", os.path.join(tmp, "torchelastic"),
             *args.std_flags, os.path.join(ROOT, "bench/torch_recovery_peer.py"), "--dir", tmp],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        progress = os.path.join(tmp, "progress")
        pids = set()
        try:
            def alive(rows):
                if agent.poll() is not None:
                    raise RuntimeError(f"torchrun exited with {agent.returncode}; see its log:\n"
                                       + open(log.name).read()[-3000:])
                return rows

            def reached():
                rows = alive(read_progress(progress))
                return rows if rows and rows[-1][0] == "step" and \
                    rows[-1][2] >= args.kill_step else None

            wait_for(f"torchrun's job to reach step {args.kill_step}", reached)
            time.sleep(delay)
            pid_file = os.path.join(tmp, "pid.0.1")
            pid = int(open(pid_file).read().split()[0])
            if parent_pid(pid) != agent.pid:
                raise RuntimeError(f"rank 1 (pid {pid}) is not a child of torchrun ({agent.pid})")
            pids.add(pid)
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)

            def first_step_after_restart():
                rows = alive(read_progress(progress))
                after = [r for r in rows if r[3] >= 1 and r[0] == "step"]
                return rows if after else None

            rows = wait_for("torchrun's first step after the restart", first_step_after_restart)
            last = max(r[2] for r in rows if r[0] == "step" and r[3] == 0)
            restart = min(r[3] for r in rows if r[3] >= 1)
            resume = next(r for r in rows if r[0] == "resume" and r[3] == restart)
            first = next(r for r in rows if r[0] == "step" and r[3] == restart)
            starts = []
            for rank in (0, 1):
                path = os.path.join(tmp, f"pid.{restart}.{rank}")
                if os.path.exists(path):
                    pid_s, start_s = open(path).read().split()
                    pids.add(int(pid_s))
                    starts.append(float(start_s))
            marks = {r[0]: r[1] for r in rows if r[3] == restart and r[0] != "step"}
            phases = {
                "spawn": min(starts) - t_kill if starts else None,
                "import": marks["imported"] - min(starts) if starts else None,
                "rendezvous": marks["joined"] - marks["imported"],
                "restore": resume[1] - marks["joined"],
                "first_step": first[1] - resume[1],
            }
            if verbose:
                print(f"torchrun (kill at {t_kill:.3f}): restart {restart}, resumed from step "
                      f"{resume[2]}, phases {phases}; its log:", file=sys.stderr)
                print(open(log.name).read()[-3000:], file=sys.stderr)
            return {
                "side": "torchrun", "recovery_s": first[1] - t_kill, "delay_s": delay,
                "last_step": last,
                "resumed_step": resume[2], "lost": last - resume[2], "restart": restart,
                "phases": phases,
            }
        finally:
            kill_quietly(agent.pid, group=True)
            agent.wait()
            for pid in pids:
                kill_quietly(pid)
            log.close()


def torch_facts(torchrun):
    """(torch version, torchrun's default --monitor_interval, whether torchrun can parse its own
    default --redirects/--tee "0") of the torch that torchrun runs. torch 1.13 under Python 3.11
    cannot: Std.from_str("0") returns None there, since 3.11 no longer iterates a Flag's zero
    member, and torchrun then fails before starting a worker."""
    python = open(torchrun).readline()[2:].strip() or sys.executable
    out = subprocess.run(
        [python, "-c", "import torch; from torch.distributed.run import get_args_parser; "
         "from torch.distributed.elastic.multiprocessing.api import Std; "
         "print(torch.__version__, get_args_parser().get_default('monitor_interval'), "
         "Std.from_str('0') is not None)"],
        capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"cannot import torch with {python}: {out.stderr.strip()}")
    version, interval, std_ok = out.stdout.split()
    return version, float(interval), std_ok == "True"


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def spread(values):
    return statistics.median(values), min(values), max(values)


def fmt(value, digits=3):
    return "—" if value is None else f"{value:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--kill-step", type=int, default=200)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/recovery.md"))
    parser.add_argument("--torchrun", default="/usr/bin/torchrun")
    parser.add_argument("--seed", type=int, default=1, help="of the random delays before kills")
    parser.add_argument("--verbose", action="store_true",
                        help="print each trial's events and torchrun's log to stderr")
    args = parser.parse_args()
    if args.trials < 1 or args.kill_step < 1:
        sys.exit("recovery: --trials and --kill-step must be at least 1")
    for binary in ("server/trainyard-server", "server/agent/trainyard-agent",
                   "worker/trainyard-worker", "tools/cli/trainyard"):
        if not os.access(os.path.join(args.build, binary), os.X_OK):
            sys.exit(f"recovery: {binary} is not built in {args.build}")
    if not os.access(args.torchrun, os.X_OK):
        sys.exit(f"recovery: no torchrun at {args.torchrun} (--torchrun PATH)")
    torch_version, monitor_interval, std_ok = torch_facts(args.torchrun)
    # The closest working equivalent of the default: stdout to a file and echoed, stderr as is.
    args.std_flags = [] if std_ok else ["--redirects", "1", "--tee", "1"]

    # A kill at a fixed step would fall at much the same point of torchrun's monitoring cycle
    # every trial; a random delay after the step samples that cycle evenly (both sides alike).
    rng = random.Random(args.seed)
    results = {"trainyard": [], "torchrun": []}
    for i in range(args.trials):
        for side, run in (("trainyard", trainyard_trial), ("torchrun", torchrun_trial)):
            r = run(args, rng.uniform(0, monitor_interval), args.verbose)
            results[side].append(r)
            print(f"trial {i + 1}/{args.trials} {side:9s} recovery {r['recovery_s']:6.3f} s, "
                  f"lost {r['lost']} step(s) (last {r['last_step']}, resumed "
                  f"{r['resumed_step']})", file=sys.stderr)

    ty, tr = results["trainyard"], results["torchrun"]
    ty_rec, tr_rec = spread([r["recovery_s"] for r in ty]), spread([r["recovery_s"] for r in tr])
    ratio = ty_rec[0] / tr_rec[0]
    worst_lost = max(r["lost"] for r in ty)
    met = ratio <= 1 / 3 and worst_lost <= 1
    command = f"python3 bench/recovery.py --trials {args.trials}" + \
        (f" --kill-step {args.kill_step}" if args.kill_step != 200 else "") + \
        (f" --seed {args.seed}" if args.seed != 1 else "")
    lines = [
        "# Recovery after a worker crash", "",
        f"Machine: {platform.node()}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"{platform.platform()}; torch {torch_version}.",
        f"Command: `{command}`", "",
        "A 2-rank CPU data-parallel job (the gpt2-debug GPT-2: 2 layers, width 64, 4 heads; global "
        "batch 8 × 16 tokens from a 32-token vocabulary; AdamW; one thread per rank; gloo) runs "
        f"until step {args.kill_step}, then after a random delay (uniform over torchrun's "
        f"{monitor_interval:g} s monitoring interval, so that the kills sample its cycle evenly) "
        "rank 1's process is killed with SIGKILL. Recovery is "
        "the wall time from the kill to the first step completed after the restart; work lost is "
        "the last step completed before the kill minus the step the restart resumed from. "
        f"{args.trials} trial{'s' if args.trials > 1 else ''} per side, alternating, fresh "
        "processes and directories each.", "",
        "- **Trainyard**: trainyard-server and one trainyard-agent (2 CPU slots, memory tier on: "
        "each rank snapshots its state into the agent's memory after every step), "
        "`max_restarts: 5`, `backoff_initial_s: 0`, `heartbeat_timeout_s: 5`, the server's "
        "`--stop-grace 2`; a disk checkpoint directory whose interval is never reached. The end "
        "is the time of the coordinator's `resumed` event of attempt 2 (recorded when its rank 0 "
        "reports its first completed step).",
        f"- **torchrun**: `torchrun --nproc_per_node 2 --max_restarts 5"
        f"{' ' + ' '.join(args.std_flags) if args.std_flags else ''}` (otherwise torch's "
        f"defaults: static rendezvous, `--monitor_interval` {monitor_interval:g} s, spawned "
        "workers) running `bench/torch_recovery_peer.py` with DDP; rank 0 saves model, "
        "optimizer and step with `torch.save` after every step (a temporary file renamed over "
        "the last; no fsync) and every rank loads it on start. The end is rank 0's wall-clock "
        "record of its first completed step after the restart."
        + ("" if std_ok else " (This torch under this Python cannot parse its own default "
           "`--redirects 0 --tee 0`, so the workers' stdout goes to a file that torchrun echoes; "
           "they write nothing to it.)"), "",
        f"The goal: Trainyard's median recovery at most a third of torchrun's, with at most one "
        f"step lost. **This measurement {'meets' if met else 'does not meet'} it**: the ratio of "
        f"the medians is {ratio:.2f} (goal ≤ 0.33), and Trainyard lost at most {worst_lost} "
        f"step{'' if worst_lost == 1 else 's'} in a trial (goal ≤ 1).", "",
        "| | median recovery s | min s | max s | median work lost (steps) | max lost |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs, rec in (("Trainyard (memory tier)", ty, ty_rec),
                            ("torchrun (checkpoint every step)", tr, tr_rec)):
        lost = [r["lost"] for r in runs]
        lines.append(f"| {name} | {rec[0]:.3f} | {rec[1]:.3f} | {rec[2]:.3f} | "
                     f"{statistics.median(lost):g} | {max(lost)} |")
    lines += ["", f"Trainyard / torchrun, medians: **{ratio:.2f}**.", "",
              "## Where the time goes", "",
              "Trainyard, medians over the trials, from the job's events (the failure event is "
              f"`{'`, `'.join(sorted({r['failure_kind'] for r in ty}))}`):", "",
              "| phase | median s | min s | max s |", "| --- | --- | --- | --- |"]
    ty_phases = [("detect", "kill → failure recorded"),
                 ("reschedule", "failure → attempt 2 scheduled (attempt 1 stopped)"),
                 ("start", "scheduled → running (the agent starts the workers; every rank "
                           "joined)"),
                 ("first_step", "running → first step completed (`resumed` event)"),
                 ("worker_ready", "rank 0's process start → state restored, ready to train "
                                  "(its report; spans the two rows above)"),
                 ("restore", "of which: restore from the memory tier (its report)")]
    tr_phases = [("spawn", "kill → new workers started (torchrun's monitor notices, stops the "
                           "group, starts new workers)"),
                 ("import", "worker start → torch imported"),
                 ("rendezvous", "torch imported → process group up"),
                 ("restore", "process group up → model built, checkpoint loaded"),
                 ("first_step", "checkpoint loaded → first step completed (and saved)")]
    for key, label in ty_phases:
        values = [r["phases"][key] for r in ty if r["phases"][key] is not None]
        if values:
            lines.append(f"| {label} | " + " | ".join(f"{v:.3f}" for v in spread(values)) + " |")
        else:
            lines.append(f"| {label} | — | — | — |")
    lines += ["", "torchrun, from rank 0's wall-clock records and each worker's start time. "
              f"Its agent looks at its workers every {monitor_interval:g} s (`--monitor_interval`), "
              "so the first phase spreads over that interval with where the kill falls in it:", "",
              "| phase | median s | min s | max s |", "| --- | --- | --- | --- |"]
    for key, label in tr_phases:
        values = [r["phases"][key] for r in tr if r["phases"][key] is not None]
        lines.append(f"| {label} | " + " | ".join(f"{v:.3f}" for v in spread(values)) + " |"
                     if values else f"| {label} | — | — | — |")
    lines += ["", "## Raw trials", "", "```"]
    for i in range(args.trials):
        a, b = ty[i], tr[i]
        p = a["phases"]
        lines.append(f"trainyard {i + 1}: {a['recovery_s']:6.3f} s  delay {a['delay_s']:.2f} s  "
                     f"lost {a['lost']} (last "
                     f"{a['last_step']}, resumed {a['resumed_step']} from the {a['tier']})  "
                     f"detect {fmt(p['detect'])} reschedule {fmt(p['reschedule'])} start "
                     f"{fmt(p['start'])} first_step {fmt(p['first_step'])}")
        lines.append(f"           {a['cause']}")
        p = b["phases"]
        lines.append(f"torchrun  {i + 1}: {b['recovery_s']:6.3f} s  delay {b['delay_s']:.2f} s  "
                     f"lost {b['lost']} (last "
                     f"{b['last_step']}, resumed {b['resumed_step']})  spawn {fmt(p['spawn'])} "
                     f"import {fmt(p['import'])} rendezvous {fmt(p['rendezvous'])} restore "
                     f"{fmt(p['restore'])} first_step {fmt(p['first_step'])}")
    lines.append("```")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
