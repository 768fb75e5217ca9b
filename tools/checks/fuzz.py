#!/usr/bin/env python3
"""Builds the libFuzzer targets in tests/fuzz with clang and runs each for a bounded time.

Each target is compiled, with the project sources it exercises, by clang++ with
-fsanitize=fuzzer,address,undefined (include paths and definitions taken from CMake's
compile_commands.json), into BUILD_DIR/fuzz/; a source's object is shared by the targets that
link it, and anything is rebuilt only when a source or a project header is newer. Each then
runs for --seconds on a scratch copy of its committed seed corpus (tests/fuzz/corpus/<target>);
a crash, a leak, a sanitizer report or an input slower than 10 s fails the check, and the input
that did it is kept in BUILD_DIR/fuzz/ and printed.

Usage: fuzz.py SOURCE_DIR BUILD_DIR [--seconds N] [--jobs N] [--target NAME]
Exit codes: 0 every target ran clean, 1 a target failed or did not build, 77 clang++ or its
libFuzzer runtime (Debian's libclang-rt-14-dev) is not installed.
"""
import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

SANITIZERS = "address,undefined"


def target_sources(src, build):
    config = sorted(glob.glob(os.path.join(src, "config", "*.cc")))
    common = [os.path.join(src, "common", n) for n in ("status.cc", "text_check.cc")]
    return {
        "spec_fuzzer": [os.path.join(src, "tests", "fuzz", "spec_fuzzer.cc"), *config, *common],
        "request_fuzzer": [os.path.join(src, "tests", "fuzz", "request_fuzzer.cc"), *config,
                           *common, os.path.join(src, "common", "moe_load.cc"),
                           os.path.join(src, "server", "convert.cc"),
                           os.path.join(src, "server", "types.cc"),
                           os.path.join(build, "proto", "trainyard.pb.cc")],
    }


def compile_flags(build):
    """-I, -isystem, -D and -std of the project's own C++ files, as CMake recorded them."""
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    flags = []
    for entry in entries:
        if not entry["file"].endswith(("server/convert.cc", "config/spec.cc")):
            continue
        args = entry.get("arguments") or shlex.split(entry["command"])
        i = 1
        while i < len(args):
            arg = args[i]
            if arg in ("-I", "-isystem", "-D"):
                flags += [arg, args[i + 1]]
                i += 2
                continue
            if arg.startswith(("-I", "-D", "-std=")) and arg not in flags:
                flags.append(arg)
            i += 1
    return flags


def pkg_libs(*names):
    out = subprocess.run(["pkg-config", "--libs", *names], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"pkg-config {' '.join(names)}: {out.stderr.strip()}")
    return out.stdout.split()


def newer(target, sources):
    if not os.path.exists(target):
        return True
    built = os.path.getmtime(target)
    return any(not os.path.exists(s) or os.path.getmtime(s) > built for s in sources)


def object_path(out_dir, source):
    """One object per source, shared by every target that links it (they use the same flags)."""
    parent, base = os.path.split(source)
    return os.path.join(out_dir, "obj", f"{os.path.basename(parent)}_{base}.o")


def build_target(clang, name, sources, flags, out_dir, jobs):
    binary = os.path.join(out_dir, name)
    headers = glob.glob(os.path.join(os.path.dirname(sources[0]), "..", "..", "*", "*.h"))
    objects = [object_path(out_dir, source) for source in sources]
    if not newer(binary, sources + headers + objects):
        return binary
    commands = []
    for source, obj in zip(sources, objects):
        if newer(obj, [source] + headers):
            # protoc's output, instrumented like the rest but not optimised: at -O1 it alone took
            # a third of the check (33 s of 104 on a 2-core machine), at -O0 11 s.
            level = "-O0" if source.endswith(".pb.cc") else "-O1"
            commands.append([clang, *flags, level, "-g", f"-fsanitize=fuzzer-no-link,{SANITIZERS}",
                             "-w", "-c", source, "-o", obj])
    os.makedirs(os.path.join(out_dir, "obj"), exist_ok=True)
    running = []
    for command in commands:
        running.append(subprocess.Popen(command, stderr=subprocess.PIPE, text=True))
        if len(running) >= jobs:
            wait_one(running)
    while running:
        wait_one(running)
    libs = pkg_libs("yaml-cpp", "protobuf", "absl_status", "absl_statusor", "absl_strings",
                    "absl_str_format", "absl_time", "absl_synchronization", "absl_hash",
                    "absl_flat_hash_map")
    link = [clang, f"-fsanitize=fuzzer,{SANITIZERS}", *objects, "-o", binary, *libs, "-pthread"]
    result = subprocess.run(link, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"linking {name}:\n{result.stderr[-4000:]}")
    return binary


def wait_one(running):
    process = running.pop(0)
    _, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"compiling {process.args[-3]}:\n{err[-4000:]}")


def run_target(binary, seeds, seconds, out_dir):
    with tempfile.TemporaryDirectory(prefix="trainyard-fuzz-") as scratch:
        corpus = os.path.join(scratch, "corpus")
        shutil.copytree(seeds, corpus)
        command = [binary, f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=2048",
                   "-max_len=65536", f"-artifact_prefix={out_dir}/{os.path.basename(binary)}-",
                   "-print_final_stats=1", corpus]
        result = subprocess.run(command, capture_output=True, text=True, cwd=scratch,
                                timeout=seconds + 120)
        stats = [line for line in result.stderr.splitlines() if line.startswith(("stat::", "#"))]
        return result.returncode, result.stderr, stats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("source_dir")
    parser.add_argument("build_dir")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--target")
    options = parser.parse_args()
    clang = shutil.which("clang++") or shutil.which("clang++-14")
    if clang is None:
        print("fuzz: clang++ is not installed (tools/setup.sh installs clang)")
        return 77
    probe = subprocess.run([clang, "-fsanitize=fuzzer", "-x", "c++", "-", "-o", os.devnull],
                           input='extern "C" int LLVMFuzzerTestOneInput(const char*, long) '
                                 '{ return 0; }', capture_output=True, text=True)
    if probe.returncode != 0:
        print("fuzz: clang's libFuzzer runtime is missing (tools/setup.sh installs "
              "libclang-rt-14-dev)")
        return 77
    src, build = os.path.abspath(options.source_dir), os.path.abspath(options.build_dir)
    out_dir = os.path.join(build, "fuzz")
    os.makedirs(out_dir, exist_ok=True)
    flags = compile_flags(build)
    failed = False
    for name, sources in target_sources(src, build).items():
        if options.target and name != options.target:
            continue
        try:
            binary = build_target(clang, name, sources, flags, out_dir, options.jobs)
        except RuntimeError as e:
            print(f"fuzz: {e}")
            failed = True
            continue
        seeds = os.path.join(src, "tests", "fuzz", "corpus", name.replace("_fuzzer", ""))
        code, err, stats = run_target(binary, seeds, options.seconds, out_dir)
        runs = next((s.split()[-1] for s in stats if s.startswith("stat::number_of_executed_units")),
                    "?")
        if code != 0:
            failed = True
            print(f"fuzz: {name} FAILED (exit {code}) after {runs} inputs:\n{err[-6000:]}")
        else:
            print(f"fuzz: {name}: {runs} inputs in {options.seconds} s, no crash")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
