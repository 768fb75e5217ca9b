#!/usr/bin/env python3
"""Clang's thread-safety analysis over the code that shares state between threads.

The coordinator (server/), the worker's parallel runtime (worker/parallel/) and its checkpoint
writer (worker/checkpoint/) annotate their locks with ABSL_GUARDED_BY /
ABSL_EXCLUSIVE_LOCKS_REQUIRED. GCC ignores those annotations; this check compiles each of those
files with clang++ -fsyntax-only -Wthread-safety -Werror, using the flags CMake recorded in
compile_commands.json, so an unguarded access is a failing test.

Usage: thread_safety.py BUILD_DIR [--jobs N]
Exit codes: 0 clean, 1 a violation (clang's diagnostics printed), 77 clang++ is not installed.
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys

CHECKED = ("server/", "worker/parallel/", "worker/checkpoint/")
# Flags of GCC's command lines that clang does not take or that do not matter for a syntax check.
DROPPED_PREFIXES = ("-W", "-O", "-g", "-march", "-fno-fat-lto", "-flto", "-o", "-c", "-MD", "-MT",
                    "-MF", "-fdiagnostics-color")


def clang_command(entry, root, clang):
    args = entry.get("arguments") or shlex.split(entry["command"])
    kept, skip_next = [], False
    for arg in args[1:]:
        if skip_next:
            skip_next = False
            continue
        if arg in ("-o", "-MT", "-MF"):
            skip_next = True
            continue
        if arg == entry["file"] or os.path.abspath(os.path.join(entry["directory"], arg)) == \
                os.path.abspath(entry["file"]):
            continue
        if arg.startswith(DROPPED_PREFIXES):
            continue
        kept.append(arg)
    return [clang, *kept, "-fsyntax-only", "-Wno-everything", "-Wthread-safety",
            "-Werror=thread-safety", entry["file"]]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    options = parser.parse_args()
    clang = shutil.which("clang++") or shutil.which("clang++-14")
    if clang is None:
        print("thread_safety: clang++ is not installed (tools/setup.sh installs it)")
        return 77
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(options.build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    # A source built into more than one library (the CUDA emulation rebuilds worker/parallel)
    # is checked once, with its first library's flags.
    first = {}
    for entry in entries:
        rel = os.path.relpath(entry["file"], root)
        if rel.startswith(CHECKED) and rel.endswith(".cc"):
            first.setdefault(rel, entry)
    chosen = sorted(first.items(), key=lambda item: item[0])
    if not chosen:
        print("thread_safety: no server/ or worker/parallel/ sources in compile_commands.json")
        return 1

    def check(item):
        rel, entry = item
        run = subprocess.run(clang_command(entry, root, clang), cwd=entry["directory"],
                             capture_output=True, text=True)
        return rel, run.returncode, run.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        for rel, code, err in pool.map(check, chosen):
            if code != 0:
                failed += 1
                print(f"--- {rel}\n{err}")
    print(f"thread_safety: {len(chosen)} files, {failed} with violations or errors")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
