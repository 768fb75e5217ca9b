#!/usr/bin/python3
"""Writes bench/results/checkpoint.md from run_checkpoint_bench.sh's collected output.

Usage: checkpoint_report.py RESULTS.jsonl RAW.txt DATE CPU CORES DISK PATH TORCH COMMAND
                            STEPS EVERY ROUNDS THREADS

RESULTS.jsonl holds checkpoint_bench's JSON lines ({"reference": ...} and {"engine":
"trainyard", ...}) and torch_checkpoint_peer.py's ({"engine": "pytorch", ...}); RAW.txt the
programs' output, copied into the report.
"""

import json
import sys

MIB = 1 << 20
BYTES_PER_PARAM = 12  # fp32 parameter and both AdamW moments
GOAL_PRESET = "gpt2-124m"
GOAL_BLOCKED_OF_STEP = 0.05
GOAL_OF_DISK = 0.80
GOAL_OF_TORCH_SAVE = 0.10


def load(path):
    refs, ours, torch = {}, [], {}
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        if row.get("reference"):
            refs[row["preset"]] = row
        elif row["engine"] == "trainyard":
            ours.append(row)
        else:
            torch[row["preset"]] = row
    return refs, ours, torch


def mbps(nbytes, seconds):
    return nbytes / seconds / 1e6


def print_header(args, refs, ours, torch):
    (_, _, date, cpu, cores, disk, path, torch_version, command, steps, every, rounds,
     threads) = args
    print("## Checkpoints: Trainyard's asynchronous saves vs torch.save")
    print()
    print("- date: %s" % date)
    print("- CPU: %s; %s" % (cpu, cores))
    print("- disk: %s; checkpoints written under `%s`" % (disk, path))
    print("- torch: %s" % torch_version)
    print("- command: `%s`" % command)
    print("- Trainyard: CPU backend, %s threads in all (dp 2: %s per rank, ranks as threads of one "
          "process, Gloo over loopback, ZeRO-1); %s steps, a checkpoint every %s steps and after "
          "the last" % (threads, max(1, int(threads) // 2), steps, every))
    print("- PyTorch: the same model (tests/oracle/torch_model.py) and AdamW, %s threads; "
          "state after 3 training steps; median of %s save/restore rounds" % (threads, rounds))
    for preset, row in refs.items():
        size = next((r for r in ours if r["preset"] == preset), None)
        shape = (" (batch %d per rank, seq %d)" % (size["batch_per_rank"], size["seq"])
                 if size else "")
        print("- %s%s: this disk's fsync'd sequential write bandwidth %.0f MB/s (%d MiB in 16 MiB "
              "write(2) calls + fsync, median of 3, measured just before); memcpy %.0f MB/s "
              "(one thread)" % (preset, shape, row["disk_bytes_per_s"] / 1e6, row["disk_mib"],
                                row["memcpy_bytes_per_s"] / 1e6))
    print()


def print_count(refs, ours, torch):
    print("### Count first")
    print()
    print("| model | params | 12 B/param MiB | Trainyard checkpoint MiB | torch.save file MiB "
          "| memcpy floor of a snapshot, s (1 rank / dp 2 per rank) |")
    print("|---|---:|---:|---:|---:|---:|")
    for preset in refs:
        rows = [r for r in ours if r["preset"] == preset]
        if not rows:
            continue
        params = rows[0]["params"]
        t = torch.get(preset)
        floors = " / ".join("%.4f" % r["memcpy_floor_s"] for r in rows)
        print("| %s | %s | %.1f | %.1f | %s | %s |" % (
            preset, format(params, ","), BYTES_PER_PARAM * params / MIB, rows[0]["bytes"] / MIB,
            "%.1f" % (t["bytes"] / MIB) if t else "-", floors))
    print()


def print_table(ours, torch):
    print("| engine | model | ranks | params | checkpoint MiB | median step s | blocked s "
          "(% of step) | memcpy floor s | write s | write MB/s | disk MB/s | % of disk "
          "| restore s (cold / warm) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in ours:
        disk = r["disk_bytes_per_s"]
        bw = r["bytes"] / r["write_s"]
        print("| trainyard | %s | %d | %s | %.1f | %.3f | %.4f (%.2f%%) | %.4f | %.3f | %.0f | %.0f "
              "| %.0f%% | %.3f / %.3f |" % (
                  r["preset"], r["ranks"], format(r["params"], ","), r["bytes"] / MIB,
                  r["median_step_s"], r["blocked_s"], 100 * r["blocked_s"] / r["median_step_s"],
                  r["memcpy_floor_s"], r["write_s"], bw / 1e6, disk / 1e6, 100 * bw / disk,
                  r["restore_cold_s"], r["restore_warm_s"]))
    disks = {r["preset"]: r["disk_bytes_per_s"] for r in ours}
    for preset, t in torch.items():
        disk = disks.get(preset, float("nan"))
        step = t["median_step_s"]
        for label, seconds, restore in (
                ("torch.save", t["save_s"], (t["load_cold_s"], t["load_warm_s"])),
                ("torch.save + fsync", t["save_fsync_s"],
                 (t["restore_cold_s"], t["restore_warm_s"]))):
            bw = t["bytes"] / seconds
            print("| %s | %s | 1 | %s | %.1f | %.3f | %.4f (%.1f%%) | - | %.3f | %.0f | %.0f "
                  "| %.0f%% | %.3f / %.3f |" % (
                      label, preset, format(t["params"], ","), t["bytes"] / MIB, step, seconds,
                      100 * seconds / step, seconds, bw / 1e6, disk / 1e6, 100 * bw / disk,
                      restore[0], restore[1]))
    print()
    print("- blocked: Trainyard's `SaveOutcome.blocked_seconds` (waiting for the previous save + "
          "copying the state to the host buffer), median over the saves after the first, as "
          "rank 0 reports it; PyTorch's: the whole torch.save call (and the fsync, for a durable "
          "file). % of step: of the engine's own median step.")
    print("- write s: Trainyard from snapshot to committed manifest (all ranks' shard files "
          "fsync'd, manifest renamed, directories synced), median over saves; write MB/s = "
          "checkpoint bytes / write s. torch.save's MB/s without fsync is into the page cache.")
    print("- export: `trainyard export --format hf` of the last checkpoint (fp32, files fsync'd); "
          "init_from: model.init_from's reader over that directory, the whole model in one "
          "process (table below).")
    print("- restore: Trainyard's restore (choose, verify checksums, load), from the last rank's "
          "start to the last rank's end (`TrainResult.restore_began_ns` / `_ended_ns`: a rank's "
          "own `restore_seconds` also holds its wait for peers still starting up); PyTorch's torch.save row: torch.load alone, + fsync row: torch.load + "
          "model.load_state_dict + optimizer.load_state_dict. Cold: the checkpoint's pages "
          "dropped with posix_fadvise(DONTNEED) first; warm: read again from the page cache. "
          "Both sides: the median of the rounds (Trainyard's cold and warm restores alternate, "
          "each round's times in the raw output).")
    print()


def print_details(ours):
    print("Trainyard details: the first save also allocates and touches the snapshot buffer; "
          "steps run while a save is being written share the cores with the writer thread; the "
          "save after the last step is written while training waits for it (the writer alone).")
    print()
    print("| model | ranks | saves | 1st save blocked s | later saves blocked s | memcpy floor s "
          "| median step s | median step s, write in flight | last save: write s (MB/s) "
          "| export s (MB/s) | init_from s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in ours:
        print("| %s | %d | %d | %.4f | %.4f | %.4f | %.3f | %s | %.3f (%.0f) | %s | %s |" % (
            r["preset"], r["ranks"], r["saves"], r["first_blocked_s"], r["blocked_s"],
            r["memcpy_floor_s"], r["median_step_s"],
            "%.3f" % r["step_writing_s"] if r["step_writing_s"] > 0 else "-",
            r["last_write_s"], mbps(r["bytes"], r["last_write_s"]),
            "%.3f (%.0f)" % (r["export_s"], mbps(r["export_bytes"], r["export_s"]))
            if "export_s" in r else "-",
            "%.3f" % r["init_from_s"] if "init_from_s" in r else "-"))
    print()


def goal_rows(ours, torch):
    preset = GOAL_PRESET if any(r["preset"] == GOAL_PRESET for r in ours) else ours[-1]["preset"]
    return preset, [r for r in ours if r["preset"] == preset], torch.get(preset)


def print_goals(ours, torch):
    preset, rows, t = goal_rows(ours, torch)
    print("### Goals (judged on %s)" % preset)
    print()
    missed = 0
    for r in rows:
        share = r["blocked_s"] / r["median_step_s"]
        ok = share <= GOAL_BLOCKED_OF_STEP
        missed += not ok
        print("1. %d rank(s): blocked %.4f s = %.2f%% of the %.3f s median step (goal <= 5%%): "
              "**%s**" % (r["ranks"], r["blocked_s"], 100 * share, r["median_step_s"],
                          "met" if ok else "missed"))
    for r in rows:
        share = r["bytes"] / r["write_s"] / r["disk_bytes_per_s"]
        ok = share >= GOAL_OF_DISK
        missed += not ok
        print("2. %d rank(s): write %.0f MB/s = %.0f%% of the disk's %.0f MB/s (goal >= 80%%): "
              "**%s**" % (r["ranks"], r["bytes"] / r["write_s"] / 1e6, 100 * share,
                          r["disk_bytes_per_s"] / 1e6, "met" if ok else "missed"))
    for r in rows:
        if t is None:
            print("3. %d rank(s): no torch.save measurement for %s" % (r["ranks"], preset))
            continue
        share = r["blocked_s"] / t["save_s"]
        ok = share <= GOAL_OF_TORCH_SAVE
        missed += not ok
        print("3. %d rank(s): blocked %.4f s = 1/%.0f of torch.save's %.3f s (goal <= 1/10): "
              "**%s**" % (r["ranks"], r["blocked_s"], 1 / share if share > 0 else float("inf"),
                          t["save_s"], "met" if ok else "missed"))
    for r in rows:
        if t is None or "export_s" not in r:
            continue
        restore = (t["restore_cold_s"], t["restore_warm_s"])
        ok = r["restore_cold_s"] <= restore[0] and r["restore_warm_s"] <= restore[1]
        missed += not ok
        print("4. %d rank(s): restore %.3f / %.3f s (cold / warm) against torch.load + "
              "load_state_dict's %.3f / %.3f s (goal: at most): **%s**"
              % (r["ranks"], r["restore_cold_s"], r["restore_warm_s"], restore[0], restore[1],
                 "met" if ok else "missed"))
    for r in rows:
        if t is None or "init_from_s" not in r:
            continue
        ok = r["init_from_s"] <= t["restore_warm_s"]
        missed += not ok
        print("5. checkpoint of %d rank(s): init_from %.3f s against torch.load + load_state_dict's "
              "%.3f s (warm; goal: at most): **%s**"
              % (r["ranks"], r["init_from_s"], t["restore_warm_s"], "met" if ok else "missed"))
    for r in rows:
        if "export_s" not in r:
            continue
        bw = r["export_bytes"] / r["export_s"]
        # The disk as measured around the export (older results: the run's reference).
        disk = r.get("export_disk_bytes_per_s") or r["disk_bytes_per_s"]
        ok = bw >= GOAL_OF_DISK * disk
        missed += not ok
        print("6. checkpoint of %d rank(s): export %.0f MB/s = %.0f%% of the disk's %.0f MB/s "
              "(written just before and after the export; goal >= 80%%): **%s**"
              % (r["ranks"], bw / 1e6, 100 * bw / disk, disk / 1e6, "met" if ok else "missed"))
    print()
    return missed


def main(args):
    refs, ours, torch = load(args[0])
    if not ours:
        sys.stderr.write("checkpoint_report: no Trainyard rows\n")
        return 1
    print_header(args, refs, ours, torch)
    print_count(refs, ours, torch)
    print("### Results")
    print()
    print_table(ours, torch)
    print_details(ours)
    missed = print_goals(ours, torch)
    print("### Raw output")
    print()
    print("```")
    print(open(args[1], encoding="utf-8").read().rstrip("\n"))
    print("```")
    del missed  # a missed goal is a finding, not a failure of the benchmark
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 14:
        sys.stderr.write(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
