#!/usr/bin/env python3
"""Turns a CUDA source of kernels/cuda/ (.cu or .cuh) into C++20 for the CPU emulator (emu.h).

Not a CUDA front end: it rewrites exactly the constructs the project's kernels use, namely
kernel<<<grid, block[, smem[, stream]]>>>(args) launches, the execution-space and launch-bound
qualifiers, __shared__ and extern __shared__ declarations, #pragma unroll, and the device-only
includes (kernels/cuda/warp_mma.cuh's inline PTX becomes warp_mma.h's emulation). Line numbers are kept and a #line directive names the original file, so compiler
errors and debuggers point into the .cu source.

usage: translate.py INPUT OUTPUT [NAME_FOR_#line]
"""

import re
import sys

INCLUDES = {
    "<cuda_runtime.h>": '"tools/cuda_emu/emu.h"',
    "<cub/cub.cuh>": '"tools/cuda_emu/cub.h"',
    '"kernels/cuda/warp_mma.cuh"': '"tools/cuda_emu/warp_mma.h"',
}

OPEN, CLOSE = "([{", ")]}"


def match_forward(s, i):
    """Index just past the bracket that closes the one at s[i]."""
    depth = 0
    while i < len(s):
        c = s[i]
        if c in OPEN:
            depth += 1
        elif c in CLOSE:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced brackets")


def split_top_level(s):
    """Splits on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in OPEN:
            depth += 1
        elif c in CLOSE:
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:i].strip())
            start = i + 1
    parts.append(s[start:].strip())
    return [p for p in parts if p]


def kernel_start(s, end):
    """Start of the kernel expression (name, maybe with template arguments) ending before end."""
    i = end
    while i > 0 and s[i - 1].isspace():
        i -= 1
    if s[i - 1] == ">":  # template arguments: walk back to the matching '<'
        depth = 0
        while True:
            i -= 1
            if s[i] == ">":
                depth += 1
            elif s[i] == "<":
                depth -= 1
                if depth == 0:
                    break
    while i > 0 and (s[i - 1].isalnum() or s[i - 1] in "_:"):
        i -= 1
    return i


def keep_lines(old, new):
    """`new` padded with the newlines `old` had, so that later lines keep their numbers."""
    missing = old.count("\n") - new.count("\n")
    return new + "\n" * max(0, missing)


def rewrite_launches(s):
    out, pos = [], 0
    while True:
        j = s.find("<<<", pos)
        if j < 0:
            out.append(s[pos:])
            return "".join(out)
        line_start = s.rfind("\n", 0, j) + 1
        if "//" in s[line_start:j]:  # a launch in a comment
            out.append(s[pos : j + 3])
            pos = j + 3
            continue
        start = kernel_start(s, j)
        kernel = " ".join(s[start:j].split())
        close = s.find(">>>", j)
        config = split_top_level(s[j + 3 : close])
        if not 2 <= len(config) <= 4:
            raise ValueError(f"launch of {kernel}: expected 2-4 launch parameters: {config}")
        config += ["0", "nullptr"][len(config) - 2 :]
        k = close + 3
        while s[k].isspace():
            k += 1
        if s[k] != "(":
            raise ValueError(f"launch of {kernel}: no argument list")
        args_end = match_forward(s, k)
        args = s[k + 1 : args_end - 1]
        launch = "::trainyard::emu::Launch(" + ", ".join(config) + ", " + kernel
        if args.strip():
            launch += ", " + args
        launch += ")"
        out.append(s[pos:start])
        out.append(keep_lines(s[start : k + 1], launch))
        pos = args_end


def remove_call(s, name):
    """Removes every `name(...)`."""
    while True:
        m = re.search(r"\b" + name + r"\s*\(", s)
        if not m:
            return s
        end = match_forward(s, m.end() - 1)
        s = s[: m.start()] + keep_lines(s[m.start() : end], "") + s[end:]


def translate(src, name):
    s = src
    for cuda, emu in INCLUDES.items():
        s = s.replace("#include " + cuda, "#include " + emu)
    s = re.sub(r"^[ \t]*#pragma unroll.*$", "", s, flags=re.M)
    # extern __shared__ T name[];  ->  a pointer to the block's dynamic shared memory.
    s = re.sub(
        r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([\w:]+(?:\s+[\w:]+)*?)\s+(\w+)\s*\[\s*\]\s*;",
        r"\1* \2 = reinterpret_cast<\1*>(::trainyard::emu::DynamicShared());",
        s,
    )
    # One block runs at a time on a host thread and its threads share these: the host thread's
    # function statics serve (ranks on their own host threads may run one kernel at once).
    # Arrays are poisoned (NaN) when a block first reaches them, so reading what no thread of the
    # block wrote fails as it would on the device, rather than seeing the previous block's values.
    s = re.sub(
        r"\b__shared__\s+([^;{}()]+?)\s+(\w+)\s*(\[[^;]*\])\s*;",
        r"static thread_local \1 \2\3; ::trainyard::emu::PoisonShared(\2, sizeof(\2));",
        s,
    )
    s = re.sub(r"\b__shared__\b", "static thread_local", s)
    s = re.sub(r"\b__align__\s*\(([^)]*)\)", r"__attribute__((aligned(\1)))", s)
    s = remove_call(s, "__launch_bounds__")
    s = re.sub(r"\b__forceinline__\b", "inline", s)
    s = re.sub(r"\b(__global__|__device__|__host__|__noinline__)[ \t]*", "", s)
    s = re.sub(r"\b__restrict__\b", "__restrict", s)
    # Vector accesses fault on the device when misaligned; the emulator checks the casts that
    # are dereferenced on the spot (a cast pointer kept for later may legally be misaligned
    # when it is never used, e.g. an empty run of packs).
    s = re.sub(
        r"(?<=\*)reinterpret_cast<(\s*(?:const\s+)?(?:u?int|float|double|u?short|u?char)[1-4]\s*\*\s*)>",
        r"::trainyard::emu::AlignedCast<\1>",
        s,
    )
    s = rewrite_launches(s)
    return f'#include "tools/cuda_emu/emu.h"\n#line 1 "{name}"\n' + s


def main():
    src_path, out_path = sys.argv[1], sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else src_path
    with open(src_path, encoding="utf-8") as f:
        src = f.read()
    result = translate(src, name)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(result)


if __name__ == "__main__":
    main()
