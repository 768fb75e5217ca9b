#!/usr/bin/env python3
"""Per-kernel account of training steps, Trainyard beside PyTorch, from the JSON timelines
`trainyard-bench-gpu-train --timeline` and `torch_gpu_train.py --timeline` write.

Usage: timeline_report.py TIMELINE.json... > report.md

For each preset: where each engine's step goes by kind of work (GEMMs, attention, norms, ...),
the device's busy time (the union of its activities) against the step's wall time, the idle
gaps between activities (host work, launches, syncs) with the kernels on either side of the
largest, and each engine's costliest kernels. Every figure is per step, averaged over the
recorded steps.
"""

import collections
import json
import re
import sys

# First match wins: the optimizer's norm kernels before the layer norms, fused Triton kernels
# (torch.compile) before the element-wise ones they replace.
CATEGORIES = [
    ("attention", r"attention|attn|flash|fmha|sdpa|dot_do_o"),
    ("gemm", r"gemm|xmma|cutlass|nvjet|cublas|sm90_|sm80_|matmul"),
    ("fp8 quantize", r"quantize|absmax|fp8"),
    ("optimizer", r"adam|multi_tensor|foreach|clip|lpnorm|squarepartials|sumpartials|gradnorm|"
                  r"grad_norm|optimizer"),
    ("loss", r"cross_?entropy|softmax|nll|logsumexp"),
    ("norms", r"norm"),
    ("embedding", r"embed|index_select|indexing|sort|scatter|gather|tokengrad|positiongrad"),
    ("fused (triton)", r"^triton_"),
    ("element-wise", r"gelu|swiglu|silu|rope|rotary|add|cast|convert|copy|elementwise|fill|"
                     r"scale|bias|vectorized|unrolled|mul|reduce|columnpartials"),
]
GAP_NS = 20_000  # idle spans at least this long are counted and listed


def category(kind, name):
    if kind != "kernel":
        return name.split(" (")[0] if kind == "memcpy" else "memset"
    low = name.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, low):
            return label
    return "other"


def short(name, width=90):
    """The kernel's name without namespaces, return type and parameter list; template arguments
    stay (they say which operation a generic kernel ran)."""
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template brackets
        depth += ch == "<"
        depth -= ch == ">" and depth > 0
        if ch == "(" and depth == 0:
            cut = i
            break
    text = re.sub(r"\b[A-Za-z_]\w*::", "", name[:cut]).strip() or name
    return text if len(text) <= width else text[:width - 1] + "…"


def summarise(timeline):
    marks, records = timeline["marks"], sorted(timeline["records"], key=lambda r: r[1])
    steps = len(marks) - 1
    wall = (marks[-1] - marks[0]) / steps
    by_category, by_kernel = collections.Counter(), collections.defaultdict(lambda: [0, 0])
    busy, gaps, cursor, previous = 0, [], marks[0], "(step start)"
    for kind, start, end, _bytes, name in records:
        by_category[category(kind, name)] += end - start
        entry = by_kernel[(category(kind, name), short(name))]
        entry[0] += 1
        entry[1] += end - start
        if start > cursor:
            if start - cursor >= GAP_NS:
                gaps.append((start - cursor, previous, short(name, 50)))
            busy += end - start
        else:
            busy += max(0, end - cursor)
        if end > cursor:
            cursor, previous = end, short(name, 50)
    gaps.sort(reverse=True)
    return {"steps": steps, "wall": wall, "busy": busy / steps, "kernels": len(records) / steps,
            "categories": {k: v / steps for k, v in by_category.items()},
            "top": sorted(((v[1] / steps, v[0] / steps, k) for k, v in by_kernel.items()),
                          reverse=True),
            "gaps": gaps, "gap_total": sum(g[0] for g in gaps) / steps}


def ms(ns):
    return "%.2f" % (ns / 1e6)


def render(preset, engines):
    print("## %s\n" % preset)
    print("| engine | steps | wall ms/step | device busy ms | busy | activities/step | "
          "idle ms | gaps >= %d µs: count/step, ms/step |" % (GAP_NS // 1000))
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for engine, s in engines.items():
        print("| %s | %d | %s | %s | %.1f%% | %.0f | %s | %.1f, %s |" % (
            engine, s["steps"], ms(s["wall"]), ms(s["busy"]), 100 * s["busy"] / s["wall"],
            s["kernels"], ms(s["wall"] - s["busy"]), len(s["gaps"]) / s["steps"],
            ms(s["gap_total"])))
    names = list(engines)
    cats = sorted({c for s in engines.values() for c in s["categories"]},
                  key=lambda c: -max(s["categories"].get(c, 0) for s in engines.values()))
    print("\n| kind of work | " + " | ".join("%s ms/step" % n for n in names) +
          (" | difference ms |" if len(names) == 2 else " |"))
    print("|---|" + "---:|" * (len(names) + (len(names) == 2)))
    for c in cats:
        vals = [engines[n]["categories"].get(c, 0) for n in names]
        diff = " %s |" % ms(vals[0] - vals[1]) if len(names) == 2 else ""
        print("| %s | %s |%s" % (c, " | ".join(ms(v) for v in vals), diff))
    for engine, s in engines.items():
        print("\n%s, costliest kernels (of %d distinct):\n" % (engine, len(s["top"])))
        print("| kernel | kind | calls/step | ms/step | µs/call | of wall |")
        print("|---|---|---:|---:|---:|---:|")
        for total, calls, (kind_of_work, name) in s["top"][:25]:
            print("| `%s` | %s | %.1f | %s | %.1f | %.1f%% |" % (
                name.replace("|", "/"), kind_of_work, calls, ms(total),
                total / calls / 1e3, 100 * total / s["wall"]))
        if s["gaps"]:
            print("\n%s, largest idle gaps (all recorded steps):\n" % engine)
            print("| µs | after | before |")
            print("|---:|---|---|")
            for gap, before, after in s["gaps"][:8]:
                print("| %.0f | `%s` | `%s` |" % (gap / 1e3, before.replace("|", "/"),
                                                   after.replace("|", "/")))
    print()


def main(paths):
    if not paths:
        sys.exit(__doc__)
    presets = collections.defaultdict(dict)
    for path in paths:
        with open(path) as f:
            timeline = json.load(f)
        if len(timeline.get("marks", [])) < 2:
            sys.exit("%s: fewer than two step marks" % path)
        presets[timeline["preset"]][timeline["engine"]] = summarise(timeline)
    print("# Where a training step's time goes, per kernel\n")
    print("Per step, averaged over the recorded steps (CUPTI records through the engine's own "
          "hook or PyTorch's profiler; recording slows a step a little, so the walls here are "
          "not the benchmark's). Busy: the union of the device's kernels, copies and fills.\n")
    for preset, engines in presets.items():
        render(preset, engines)


if __name__ == "__main__":
    main(sys.argv[1:])
